"""Predicted against measured speed-up, with the io share a profiling run measures (the block stack timed against
whole steps) and, for comparison, the parameter-count estimate used before.

    predicted = N / (K + (N − K)·io_share)            measured = time of a full run / time of a run under the mask

1. the reference model (N = 30, K = 10, 15, 20, batch 8 with CFG), always;
2. a tiny ComfyUI Flux (width 256, 4 + 4 blocks, 32×32 latent, cfg 3) and the bundled Wan workflow's tiny Wan 2.1,
   sampled by ComfyUI's KSampler with GCache Profile / GCache Apply, when COMFYUI_PATH points to a ComfyUI tree
   (N = 12, K = 4, 6, 8).

Full and masked runs alternate; speed-ups are medians of per-pair ratios. Ends with one JSON line.

    python -m gcache.bench.speedup_prediction [--repeats 7]
    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.bench.speedup_prediction
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from ..core.policy import predicted_speedup


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _median_ratio(full, fast, repeats: int) -> float:
    """Median over alternating pairs of full-run time / masked-run time (one warm-up pair first)."""
    full(), fast()
    return statistics.median(_timed(full) / _timed(fast) for _ in range(repeats))


def reference(repeats: int) -> dict:
    from ..reference_model.harness import ReferenceHarness
    from ..search.instant import instant_policy
    h = ReferenceHarness(30)
    seeds = list(range(1000, 1008))
    prof = h.profile(seeds)
    rows = []
    for k in (10, 15, 20):
        pol = instant_policy(prof, k, "theory")
        measured = _median_ratio(lambda: h.run(seeds, [1] * 30), lambda: h.run(seeds, pol.mask), repeats)
        rows.append({"K": k, "predicted": round(predicted_speedup(30, k, prof.io_share), 3),
                     "measured": round(measured, 3)})
    return {"model": "reference DiT (N = 30, batch 8, CFG)", "io_share": round(prof.io_share, 4),
            "io_share_source": "measured", "rows": rows}


def comfyui(repeats: int) -> dict:
    sys.path.insert(0, os.environ["COMFYUI_PATH"])
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "comfyui"))
    import comfy.cli_args
    import torch
    comfy.cli_args.args.cpu = not torch.cuda.is_available()
    import nodes as comfy_nodes
    import tiny_models as tm

    from ..core.profile import Profile
    from ..nodes import apply_mode, hooks, profile_mode
    from ..search.instant import instant_policy
    n = 12
    out = {}
    unets = tempfile.TemporaryDirectory()  # the tiny Wan goes through UNETLoader from a file
    for name, (m, pos, neg, lat) in (
            ("ComfyUI Flux, width 256, 4+4 blocks, 32x32 latent, cfg 3 (N = 12)", tm.flux(hidden_size=256, depth=4,
                                                                                            side=32)),
            ("ComfyUI Wan 2.1, the bundled workflow's tiny one (width 128, 3 blocks), cfg 3 (N = 12)",
             tm.wan(unets.name))):
        def sample(model):
            comfy_nodes.common_ksampler(model, 0, n, 3.0, "euler", "simple", pos, neg, {"samples": lat})

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bench.profile.safetensors")
            cfg = profile_mode.profile_config(m, path)
            sample(hooks.patch_model(m, cfg))
            prof = Profile.load(path)
        rows = []
        for k in (4, 6, 8):
            pol = instant_policy(prof, k, "theory")
            fast = hooks.patch_model(m, apply_mode.apply_config(m, pol))
            measured = _median_ratio(lambda: sample(m), lambda: sample(fast), repeats)
            rows.append({"K": k, "predicted": round(predicted_speedup(n, k, prof.io_share), 3),
                         "predicted_by_parameters": round(predicted_speedup(n, k, cfg.io_share), 3),
                         "measured": round(measured, 3)})
        out[name] = {"model": name, "io_share": round(prof.io_share, 4),
                     "io_share_by_parameters": round(cfg.io_share, 4), "rows": rows}
    unets.cleanup()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    from ..search.cli import set_threads
    set_threads(a.threads)
    out = {"reference": reference(a.repeats)}
    if os.environ.get("COMFYUI_PATH"):
        for i, part in enumerate(comfyui(a.repeats).values()):
            out[f"comfyui_{i}"] = part
    for part in out.values():
        print(f"{part['model']}: io share {part['io_share']}")
        for r in part["rows"]:
            extra = f", by parameter count {r['predicted_by_parameters']:.2f}x" if "predicted_by_parameters" in r else ""
            print(f"  K = {r['K']:>2}: predicted {r['predicted']:.2f}x{extra}, measured {r['measured']:.2f}x "
                  f"(predicted / measured {r['predicted'] / r['measured']:.3f})")
    errs = [abs(r["predicted"] / r["measured"] - 1) for p in out.values() for r in p["rows"]]
    out["max_relative_error"] = round(max(errs), 4)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
