"""The cost of the self-check: run 1 (every step computed and profiled, as in GCache Profile and Apply (auto)'s first
run) with the check against the same run without it, side by side in one process, alternating, in units of one
block-stack pass (the target: at most one extra stack pass per stack in the run).

With COMFYUI_PATH set the runs are GCache Profile runs of ComfyUI's own Flux and Wan 2.1 classes through KSampler
(tiny random-weight models built as tests/comfyui/tiny_models.py builds them: a checkout is needed); without it, the
plain-torch Flux/Wan of bench/speed_models.py (random weights; --size real: Flux-dev 1024² and Wan 2.1 1.3B 81 frames
480p with CFG, for a GPU) through the engine directly, with the same hold and replay. A stack pass is the median
time the run's StackClock measured in the block stack per step. Prints each pair, then per model: the median extra
seconds, the extra in stack passes (median and the quartiles of the pairs), the replay's error against its
tolerance, and one JSON line.

    python -m gcache.bench.selfcheck_cost                        # tiny sizes, CPU: about 10 seconds
    python -m gcache.bench.selfcheck_cost --size small --reps 7  # CPU: under 2 minutes (with ComfyUI: under 1)
    python -m gcache.bench.selfcheck_cost --size real --reps 3   # Flux-dev and Wan 1.3B, bf16, cuda: 2 minutes (H200)
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

from ..core.errors import GCacheError
from .cli import BenchParser, check_optional_comfyui, run_main, whole

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = ("tiny", "small", "real")


def _parser() -> BenchParser:
    ap = BenchParser("gcache.bench.selfcheck_cost", __doc__)
    ap.add_argument("--model", choices=("flux", "wan", "all"), default="all")
    ap.add_argument("--size", choices=SIZES, default="tiny",
                    help="tiny (default; CPU, about 10 seconds), small (wider models; CPU, under 2 minutes) or real "
                         "(Flux-dev 1024² and Wan 2.1 1.3B 81 frames 480p, plain torch; a GPU, about 2 minutes on an "
                         "H200)")
    ap.add_argument("--steps", type=whole(3), default=8, help="sampler steps of run 1 (at least 3: the check replays "
                                                              "the last step; the io share needs one between)")
    ap.add_argument("--reps", type=whole(1), default=5, help="pairs of runs (with and without the check), alternating")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda for --size real, else cpu)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--threads", type=whole(1), default=1, help="torch CPU threads (default 1)")
    return ap


def main(argv=None) -> dict:
    ap = _parser()
    a = ap.parse_args(argv)
    problems = []
    a.device = a.device or ("cuda" if a.size == "real" else "cpu")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        problems.append(f"--device {a.device}: no CUDA device here")
    elif not (a.device == "cpu" or a.device.startswith("cuda")):
        problems.append(f"--device {a.device}: cpu or cuda")
    comfy = check_optional_comfyui(ap)
    if comfy and a.size == "real":
        problems.append("--size real runs the plain-torch models: unset COMFYUI_PATH (ComfyUI's classes are checked "
                        "at tiny and small sizes)")
    if problems:
        ap.error("; ".join(problems))
    a.dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    torch.set_num_threads(a.threads)
    backend = ComfyBackend(comfy, a) if comfy else TorchBackend(a)
    try:
        print(f"self-check cost: {backend.what}; {a.device}, {a.dtype}, {a.steps} steps, {a.reps} pairs, torch "
              f"{torch.__version__}, {torch.get_num_threads()} thread(s), {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
              flush=True)
        out = {"backend": backend.what, "device": a.device, "dtype": a.dtype, "size": a.size, "steps": a.steps,
               "reps": a.reps, "models": {}}
        for fam in (("flux", "wan") if a.model == "all" else (a.model,)):
            out["models"][fam] = measure(backend, fam, a)
            if a.device.startswith("cuda"):
                torch.cuda.empty_cache()
    finally:
        backend.close()
    print(json.dumps(out))
    return out


def measure(backend, fam: str, a) -> dict:
    """Alternating pairs (which goes first alternates too) after one warm-up of each."""
    model = backend.build(fam)
    backend.run(model, False)
    backend.run(model, True)
    pairs = []
    for r in range(a.reps):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {c: backend.run(model, c) for c in order}
        pairs.append(got)
        off, on = got[False], got[True]
        print(f"{fam} pair {r + 1}: without {off['seconds']:.4f} s, with {on['seconds']:.4f} s; stack pass "
              f"{off['stack_pass']:.4f} s", flush=True)
    off = [p[False]["seconds"] for p in pairs]
    on = [p[True]["seconds"] for p in pairs]
    stack = statistics.median(p[False]["stack_pass"] for p in pairs)
    diffs = sorted((p[True]["seconds"] - p[False]["seconds"]) / stack for p in pairs)
    q = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [diffs[0]] * 3
    verdict = pairs[-1][True]["verdict"]
    res = {"without_s": round(statistics.median(off), 5), "with_s": round(statistics.median(on), 5),
           "stack_pass_s": round(stack, 5), "extra_s": round(statistics.median(on) - statistics.median(off), 5),
           "extra_stack_passes": round((statistics.median(on) - statistics.median(off)) / stack, 3),
           "pairs_stack_passes_q1_median_q3": [round(v, 3) for v in q], "stacks": 1, "verdict": verdict}
    print(f"{fam}: median without {res['without_s']:.4f} s, with {res['with_s']:.4f} s: extra {res['extra_s']:+.4f} s "
          f"= {res['extra_stack_passes']:+.3f} stack passes (pairs: quartiles {q[0]:+.3f} / {q[1]:+.3f} / "
          f"{q[2]:+.3f}); one stack; the check: {verdict}", flush=True)
    return res


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------ plain torch (no ComfyUI)
class TorchBackend:
    """bench/speed_models.py's Flux/Wan through ResidualCache: run 1 records a profile (ProfileRecorder, StackClock);
    with the check, the last step's call is held, called again in replay, released, and the outputs compared."""

    def __init__(self, a):
        self.a = a
        self.what = "bench/speed_models.py's own torch Flux/Wan through the engine (COMFYUI_PATH not set)"

    def close(self) -> None:
        """Nothing to remove: the plain-torch runs keep no files."""

    def build(self, fam: str):
        from .speed_harness import build
        from .speed_models import FULL, QUICK
        size = (FULL if self.a.size == "real" else QUICK)[fam]
        if self.a.size == "tiny":
            size = dataclasses.replace(size, **({"width": 64, "heads": 2, "double": 1, "single": 2, "lat_h": 16,
                                                 "lat_w": 16, "txt_tokens": 16, "ctx_dim": 32, "vec_dim": 16}
                                                if fam == "flux" else
                                                {"width": 64, "heads": 2, "depth": 3, "ffn": 128, "frames": 2,
                                                 "lat_h": 8, "lat_w": 8, "txt_tokens": 16, "ctx_dim": 32,
                                                 "freq_dim": 32}))
        dtype = getattr(torch, self.a.dtype)
        model, _ = build(fam, size, torch.device(self.a.device), dtype, False)
        return model, model.inputs(self.a.device, dtype)

    def run(self, built, check: bool) -> dict:
        from ..core import ProfileRecorder, ResidualCache, StackClock
        from ..core.selfcheck import measure, unit
        from .speed_harness import forward
        model, inp = built
        n = self.a.steps
        times = torch.linspace(1.0, 0.0, n + 1).tolist()
        rec = ProfileRecorder(times[:-1])
        cache = ResidualCache(None, observers=(rec, StackClock()))

        def stack(h, branches, blocks):  # the gate's order: blocks only when the engine says compute
            return cache.exit(blocks(h) if cache.enter(h, branches) else None)
        verdict = "not checked"
        x = inp["x"]
        _sync(self.a.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            for i in range(n):
                cache.set_step(i)
                t = torch.full((x.shape[0],), times[i], device=x.device)
                if check and i == n - 1:
                    cache.hold()
                    v = forward(model, x, t, inp, stack)
                    cache.replay()
                    v2 = forward(model, x, t, inp, stack)
                    dtype = cache.held_count().dtype
                    cache.replay(unit(dtype))  # the nudged replay: the allowance's floor (core/selfcheck.py)
                    v3 = forward(model, x, t, inp, stack)
                    cache.release()
                    figs = measure([v], [v2], [v3], [torch.zeros_like(v)])
                    verdict = "; ".join(f"{s} error {f.error:.3g}, tolerance {f.tolerance:.3g}"
                                        for s, f in figs.items()) + f" ({str(dtype).replace('torch.', '')})"
                else:
                    v = forward(model, x, t, inp, stack)
                x = x + (times[i + 1] - times[i]) * v
            stats = cache.close()
            rec.finish()
        _sync(self.a.device)
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "stack_pass": statistics.median(stats.stack_seconds.values()), "verdict": verdict}


# ------------------------------------------------------------------------------ ComfyUI
class ComfyBackend:
    """GCache Profile runs of ComfyUI's Flux / WanModel through KSampler: the check on (the run's RunCheck) or off (the
    same config without a subject)."""

    def __init__(self, path: str, a):
        self.a = a
        sys.path.insert(0, path)
        if a.device == "cpu":  # before comfy.model_management probes for a GPU
            from comfy.cli_args import args as comfy_args
            comfy_args.cpu = True
        import comfyui_version
        helper = os.path.join(REPO, "tests", "comfyui", "tiny_models.py")
        if not os.path.isfile(helper):
            raise GCacheError("ComfyUI's models are built as tests/comfyui/tiny_models.py builds them, which this copy "
                              "of GCache lacks: run from a checkout, or unset COMFYUI_PATH")
        spec = importlib.util.spec_from_file_location("gcache_bench_tiny_models", helper)
        self.tm = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.tm)
        self.folder = tempfile.mkdtemp(prefix="gcache-selfcheck-cost-")
        self.what = f"ComfyUI {comfyui_version.__version__}'s own classes from COMFYUI_PATH={path}, {a.size} size"

    def close(self) -> None:
        """The models' and profiles' temporary folder goes with the run (nothing is left behind)."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def build(self, fam: str):
        tm, dtype, size = self.tm, getattr(torch, self.a.dtype), self.a.size
        if size == "tiny":
            m, pos, neg, lat = tm.flux() if fam == "flux" else tm.wan(self.folder)
            cfg = 1.0
        else:  # small: the block stack dominates a step
            m, pos, neg, lat = tm.flux(hidden_size=256, depth=4, side=32) if fam == "flux" else tm.wan(self.folder)
            cfg = 1.0
        if dtype != torch.float32:
            dm = m.model.diffusion_model
            dm.to(dtype)
            dm.dtype = dtype
        return m, pos, neg, lat, cfg

    def run(self, built, check: bool) -> dict:
        import nodes as comfy_nodes

        from ..nodes.modes.profile import profile_config
        from ..nodes.patching import hooks
        m, pos, neg, lat, cfg = built
        path = os.path.join(self.folder, f"run-{time.monotonic_ns()}.profile.safetensors")
        config = profile_config(m, path, folder="")
        if not check:
            config = dataclasses.replace(config, subject=None)
        sink = []
        begin = config.begin

        def begin_and_keep(*args, **kw):  # the run's statistics and its check, at its close
            run = begin(*args, **kw)
            run.on_close.append(lambda run, stats, ok: sink.append((stats, run.selfcheck)))
            return run
        config.begin = begin_and_keep
        patched = hooks.patch_model(m, config)
        _sync(self.a.device)
        t0 = time.perf_counter()
        comfy_nodes.common_ksampler(patched, 0, self.a.steps, cfg, "euler", "simple", pos, neg, {"samples": lat})
        _sync(self.a.device)
        seconds = time.perf_counter() - t0
        if os.path.isfile(path):
            os.remove(path)
        stats, check_of_run = sink[-1]
        verdict = "not checked"
        if check_of_run is not None and check_of_run.verdict is not None:
            v = check_of_run.verdict
            verdict = f"{v['result']}, error {v['error']:.3g}, tolerance {v['tolerance']:.3g} ({v['dtype']})" \
                if v.get("error") is not None else f"{v['result']}: {v['why']}"
        return {"seconds": seconds, "stack_pass": statistics.median(stats.stack_seconds.values()), "verdict": verdict}


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.selfcheck_cost"))
