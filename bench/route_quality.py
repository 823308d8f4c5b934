"""What a family on the whole-model fallback loses against the block-stack route, at equal K.

A tiny model built from ComfyUI's own classes (Flux 2 and Z-Image of ComfyUI 0.33, random weights; see
tests/comfyui/tiny_image_models_033.py), N = 20 euler steps, cfg 3. Each route profiles the same seeds with its
own residual (block stack: h = the first block's input, z = the last block's output; fallback: the whole model's
input latent and output) and gets the instant theory-DP policy at K = 10 from its own profile; both are then
sampled on held-out seeds and compared with full compute (PSNR of the final latent, dB; mean over seeds and the
paired difference). The fallback is also run on the block route's mask (same mask, other residual).

    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.bench.route_quality [--seeds 8]    # about 4 min on one core

COMFYUI_PATH names a ComfyUI 0.33 folder (the one with main.py), whose requirements this venv has (see
docs/development.md); the bench checks it before any work.

Ends with one JSON line.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile

from .cli import BenchParser, Progress, require_comfyui, run_main, whole


def _psnr(x, ref) -> float:
    mse = float(((x - ref) ** 2).mean())
    peak = float(ref.abs().max()) or 1.0
    return 10 * math.log10(peak * peak / max(mse, 1e-20))


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.route_quality", __doc__)
    ap.add_argument("--steps", type=whole(3), default=20)
    ap.add_argument("--k", type=whole(2), default=10)
    ap.add_argument("--seeds", type=whole(2), default=8, help="held-out seeds (the profile uses as many others)")
    ap.add_argument("--families", nargs="+", default=["flux2", "z_image"], choices=("flux2", "z_image"))
    a = ap.parse_args(argv)
    if a.k >= a.steps:
        ap.error(f"--k {a.k}: K must be below --steps {a.steps}")
    sys.path.insert(0, require_comfyui(ap))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "comfyui"))
    import comfy.cli_args
    import torch
    comfy.cli_args.args.cpu = not torch.cuda.is_available()
    torch.set_num_threads(1)
    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False  # a bar per sampling run would bury the bench's own progress lines
    import tiny_image_models_033 as tim33

    import nodes as comfy_nodes

    out = {"N": a.steps, "K": a.k, "held_out_seeds": a.seeds}
    progress = Progress(len(a.families), "route quality: families", expected_s=120.0 * len(a.families))
    with tempfile.TemporaryDirectory(prefix="gcache-route-") as files:  # the tiny models' files, removed at the end
        for fam in a.families:
            out[fam] = family_row(a, fam, tim33.BUILDERS[fam](os.path.join(files, fam)), comfy_nodes, progress)
    print(json.dumps(out))
    return out


def family_row(a, fam, built, comfy_nodes, progress) -> dict:
    """One family's routes, sampled and compared."""
    from ..core.profile import Profile
    from ..nodes.modes.apply import ApplyConfig
    from ..nodes.modes.base import ModeConfig
    from ..nodes.modes.profile import ProfileConfig
    from ..nodes.patching import hooks
    from ..nodes.patching.adapters import FALLBACK
    from ..search.instant import instant_policy
    m, pos, neg, lat = built
    dm = m.get_model_object("diffusion_model")

    def sample(model, seed):
        return comfy_nodes.common_ksampler(model, seed, a.steps, 3.0, "euler", "simple", pos, neg,
                                           {"samples": lat})[0]["samples"]

    routes = {}
    for route in ("block stack", "whole model"):
        desc = ModeConfig.describe(dm)
        if route == "whole model":
            desc.update(adapter=FALLBACK, io_share=0.0)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "p.profile.safetensors")
            prof_model = hooks.patch_model(m, ProfileConfig(**desc, profile_path=path))
            for s in range(100, 100 + a.seeds):
                sample(prof_model, s)
            pol = instant_policy(Profile.load(path), a.k, "theory")
        routes[route] = (desc, pol)
    fb_desc, blk_pol = routes["whole model"][0], routes["block stack"][1]
    runs = {"block stack": routes["block stack"], "whole model": routes["whole model"],
            "whole model on the block mask": (fb_desc, blk_pol)}
    psnr = {name: [] for name in runs}
    for s in range(a.seeds):
        ref = sample(m, s)
        for name, (desc, pol) in runs.items():
            psnr[name].append(_psnr(sample(hooks.patch_model(m, ApplyConfig(**desc, policy=pol)), s), ref))
    diff = [b - f for b, f in zip(psnr["block stack"], psnr["whole model"])]
    se = statistics.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    row = {name: round(statistics.mean(v), 2) for name, v in psnr.items()}
    row.update(block_minus_whole_db=round(statistics.mean(diff), 2), paired_se_db=round(se, 2),
               masks={name: pol.describe() for name, (_, pol) in runs.items()})
    progress.step(f"{fam} (N = {a.steps}, K = {a.k}, {a.seeds} held-out seeds, PSNR of the final latent vs full "
                  "compute): "
                  + ", ".join(f"{n} {v:.2f} dB" for n, v in row.items() if isinstance(v, float) and n in psnr)
                  + f"; block − whole model {row['block_minus_whole_db']:+.2f} ± {row['paired_se_db']:.2f} dB")
    return row


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.route_quality"))
