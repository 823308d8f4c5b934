"""Predicted against measured speed-up, rerun: how still each figure holds, and how far apart they are.

    predicted = N / (K + (N − K)·io_share), io_share measured by a profiling run (core/io_share.py: per-step shares,
    the first and last step left out, medians), with its range from the io share's range.

One mask per K (the instant theory-DP policy of a first profile), then `--reruns` reruns, each: profile again (one
full-compute run, a fresh profile) and predict again; measure again (`--repeats` full and GCache runs alternating).
Measured figures: the whole-run speed-up (median of the per-pair ratios full / GCache) and the per-run figure GCache
Apply logs (N / (K + (N − K)·r), r = median skipped / median computed step of the run's own steps between the first
and the last; the median over the rerun's GCache runs). Beside them, on the same runs, what GCache computed before
2026-11-27: the io share from sums over every step (first and last included) and the per-run figure N · mean computed
step / total (warm-up and load spikes included). Spread = (max − min) / median over the reruns. Step costs (medians
over the steps between the first and the last): the profiling run's step less its recording, split into stack and
outside, against a step of a GCache Apply run that computes every step and the computed and skipped steps under the
first K's mask: whether what only profiling does inflates the time outside the stack. Whole runs also hold time
outside their steps (sampler set-up, the first step's input, the end): measured on the all-computed run (wall time
less its steps) and added to both runs of the formula in "predicted with the run outside its steps" (bench only).

1. the reference model (N = 30, K = 10, 15, 20, batch 8 with CFG), always;
2. when COMFYUI_PATH points to a ComfyUI tree, ComfyUI's KSampler (euler, simple, cfg 3, N = 12, K = 4, 6, 8) with
   GCache Profile (forecast recording on, as GCache Apply (auto) profiles) and GCache Apply on the bundled Wan
   workflow's tiny Wan 2.1 (width 128, 3 blocks) and a tiny Flux (width 256, 4 + 4 blocks, 32×32 latent).

The machine's load average is recorded at the start and the end. Ends with one JSON line.

    python -m gcache.bench.speedup_prediction [--reruns 5] [--repeats 5]      # the reference model: about 2 min
    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.bench.speedup_prediction  # and the tiny ComfyUI models: about 25 min

COMFYUI_PATH names a ComfyUI folder (the one with main.py) whose requirements this venv has (docs/development.md);
it is checked, and ComfyUI imported, before any work.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Optional

from ..core.engine import CacheStats, ResidualCache
from ..core.policy import predicted_speedup
from ..core.profile import Profile
from .cli import BenchParser, Progress, check_optional_comfyui, run_main, whole


def spread(values: list[float]) -> dict:
    """Median, min, max and (max − min) / median of one figure over the reruns."""
    med = statistics.median(values)
    return {"median": round(med, 4), "min": round(min(values), 4), "max": round(max(values), 4),
            "spread": round((max(values) - min(values)) / med, 4) if med else None,
            "values": [round(v, 4) for v in values]}


def io_share_before(stats: CacheStats) -> Optional[float]:
    """The io share GCache took from a profiling run before 2026-11-27: sums over every timed step."""
    steps = [s for s in stats.stack_seconds if s is not None and stats.stack_seconds[s] > 0]
    call = sum(stats.step_seconds.get(s, 0.0) - stats.record_seconds.get(s, 0.0) for s in steps)
    return min(max(1.0 - sum(stats.stack_seconds[s] for s in steps) / call, 0.0), 0.99) if call > 0 else None


def measured_before(stats: CacheStats, mask: list) -> Optional[float]:
    """The per-run figure GCache Apply logged before 2026-11-27: N · mean computed step / total, every step."""
    comp = [t for s, t in stats.step_seconds.items() if s is not None and s < len(mask) and mask[s]]
    total = sum(stats.step_seconds.values())
    return len(stats.step_seconds) * statistics.mean(comp) / total if comp and total > 0 else None


@contextlib.contextmanager
def run_stats():
    """The statistics of every GCache run closed inside (the bench reads their step timings)."""
    seen: list[CacheStats] = []
    close = ResidualCache.close

    def closing(self):
        stats = close(self)
        seen.append(stats)
        return stats
    ResidualCache.close = closing
    try:
        yield seen
    finally:
        ResidualCache.close = close


def middle_ms(values: dict, steps) -> Optional[float]:
    """Median in ms of per-step seconds over `steps` (those present)."""
    vals = [values[s] for s in steps if s in values]
    return 1e3 * statistics.median(vals) if vals else None


def step_costs(profiled: CacheStats, all_ones: CacheStats, masked: list[tuple[CacheStats, list]]) -> dict:
    """Where a step's time goes, medians over the steps between the first and the last (ms): the profiling run's
    step less its recording and its stack, a step of a run that computes every step under GCache Apply, and the
    computed and skipped steps of runs under a mask (is the profiling run's outside-the-stack time inflated?)."""
    mid = sorted(s for s in profiled.step_seconds if s is not None)[1:-1]
    call = {s: profiled.step_seconds[s] - profiled.record_seconds.get(s, 0.0) for s in mid}
    out = {"profile_step_ms": middle_ms(call, mid), "profile_stack_ms": middle_ms(profiled.stack_seconds, mid),
           "profile_outside_stack_ms": middle_ms({s: call[s] - profiled.stack_seconds.get(s, 0.0) for s in mid}, mid),
           "all_ones_step_ms": middle_ms(all_ones.step_seconds, sorted(all_ones.step_seconds)[1:-1])}
    comp, skip = [], []
    for st, mask in masked:
        steps = sorted(s for s in st.step_seconds if s is not None)[1:-1]
        comp += [st.step_seconds[s] for s in steps if mask[s]]
        skip += [st.step_seconds[s] for s in steps if not mask[s]]
    out["computed_step_ms"] = 1e3 * statistics.median(comp) if comp else None
    out["skipped_step_ms"] = 1e3 * statistics.median(skip) if skip else None
    return out


def rerun_rows(n: int, ks: tuple, profile_once: Callable[[], Profile], runner: Callable, all_ones: Callable,
               reruns: int, repeats: int, progress: Optional[Progress] = None) -> dict:
    """The reruns on one model. profile_once() profiles one run; runner(policy) -> (full run, GCache run);
    all_ones() samples once under GCache Apply computing every step."""
    from ..search.instant import instant_policy
    with run_stats() as seen:
        first = profile_once()
        policies = {k: instant_policy(first, k, "theory") for k in ks}
        rows = []
        for _ in range(reruns):
            seen.clear()
            prof = profile_once()
            profiled = CacheStats.merged(seen)
            before = io_share_before(profiled)
            seen.clear()
            t0 = time.perf_counter()
            all_ones()
            ones_wall = time.perf_counter() - t0
            ones = CacheStats.merged(seen)
            outside_ms = 1e3 * (ones_wall - sum(ones.step_seconds.values()))  # the run's time outside its steps
            masked = []
            row = {"io_share": prof.io.value, "io_range": [prof.io.low, prof.io.high], "io_share_before": before,
                   "by_k": {}}
            for k, pol in policies.items():
                mask = pol.mask
                full, fast = runner(pol)
                full(), fast()  # one unmeasured pair (warm-up)
                ratios, logged, logged_before = [], [], []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    full()
                    t1 = time.perf_counter()
                    seen.clear()
                    fast()
                    t2 = time.perf_counter()
                    ratios.append((t1 - t0) / (t2 - t1))
                    stats = CacheStats.merged(seen) if seen else None
                    if stats is not None and k == ks[0]:
                        masked.append((stats, mask))
                    if stats is not None and stats.measured_speedup() is not None:
                        logged.append(stats.measured_speedup())
                    if stats is not None and measured_before(stats, mask) is not None:
                        logged_before.append(measured_before(stats, mask))
                mid, lo, hi = prof.io.speedup(n, k)
                t_ms = step_costs(profiled, ones, [])["profile_step_ms"]
                row["by_k"][k] = {"predicted": mid, "predicted_range": [lo, hi],
                                  "predicted_before": predicted_speedup(n, k, before) if before is not None else None,
                                  # the same with the run's time outside its steps added to both runs (bench only)
                                  "predicted_whole_run": (n * t_ms + outside_ms) /
                                  ((k + (n - k) * prof.io.value) * t_ms + outside_ms),
                                  "measured": statistics.median(ratios),
                                  "logged": statistics.median(logged) if logged else None,
                                  "logged_before": statistics.median(logged_before) if logged_before else None}
            row["step_costs"] = dict(step_costs(profiled, ones, masked), run_outside_steps_ms=outside_ms)
            rows.append(row)
            if progress is not None:
                progress.step(f"N = {n}: rerun {len(rows)} of {reruns}, io share {row['io_share']:.4f}")
    return summarize(n, ks, rows)


def summarize(n: int, ks: tuple, rows: list) -> dict:
    """Medians and spreads over the reruns, per K; the per-rerun rows are kept."""
    out = {"N": n, "io_share": spread([r["io_share"] for r in rows]), "reruns": rows, "by_k": {},
           "step_costs_ms": {name: round(statistics.median(r["step_costs"][name] for r in rows), 3)
                             for name in rows[0]["step_costs"] if all(r["step_costs"][name] is not None for r in rows)}}
    if all(r["io_share_before"] is not None for r in rows):
        out["io_share_before"] = spread([r["io_share_before"] for r in rows])
    for k in ks:
        cells = [r["by_k"][k] for r in rows]
        fig = {name: spread([c[name] for c in cells]) for name in
               ("predicted", "predicted_before", "predicted_whole_run", "measured", "logged", "logged_before")
               if all(c[name] is not None for c in cells)}
        pm, mm = fig["predicted"]["median"], fig["measured"]["median"]
        fig["predicted_over_measured"] = round(pm / mm, 4)
        fig["predicted_within_measured"] = fig["measured"]["min"] <= pm <= fig["measured"]["max"]
        if "logged" in fig:
            fig["predicted_within_logged"] = fig["logged"]["min"] <= pm <= fig["logged"]["max"]
        out["by_k"][k] = fig
    return out


def reference(reruns: int, repeats: int, progress: Optional[Progress] = None) -> dict:
    from ..reference_model.harness import ReferenceHarness
    h = ReferenceHarness(30)
    seeds = list(range(1000, 1008))
    out = rerun_rows(30, (10, 15, 20), lambda: h.profile(seeds),
                     lambda pol: (lambda: h.run(seeds, [1] * 30), lambda: h.run(seeds, pol.mask)),
                     lambda: h.run(seeds, [1] * 30), reruns, repeats, progress)
    return {"model": "reference DiT (N = 30, batch 8, CFG)", **out}


def comfyui_modules(path: str):
    """ComfyUI's nodes module and the tests' tiny models, imported before any work (a ComfyUI that does not import
    ends the command before the reference model's minutes)."""
    sys.path.insert(0, path)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "comfyui"))
    import comfy.cli_args
    import torch
    comfy.cli_args.args.cpu = not torch.cuda.is_available()
    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False  # a bar per sampling run would bury the bench's own progress lines
    import tiny_models as tm

    import nodes as comfy_nodes
    return comfy_nodes, tm


def comfyui(reruns: int, repeats: int, modules, progress: Optional[Progress] = None) -> dict:
    comfy_nodes, tm = modules

    from ..core.policy import Policy
    from ..nodes.modes import apply as apply_mode
    from ..nodes.modes import profile as profile_mode
    from ..nodes.patching import hooks
    n = 12
    out = {}
    unets = tempfile.TemporaryDirectory()  # the tiny Wan goes through UNETLoader from a file
    for name, (m, pos, neg, lat) in (
            ("ComfyUI Wan 2.1, the bundled workflow's tiny one (width 128, 3 blocks), cfg 3 (N = 12)",
             tm.wan(unets.name)),
            ("ComfyUI Flux, width 256, 4+4 blocks, 32x32 latent, cfg 3 (N = 12)", tm.flux(hidden_size=256, depth=4,
                                                                                            side=32))):
        def sample(model):
            comfy_nodes.common_ksampler(model, 0, n, 3.0, "euler", "simple", pos, neg, {"samples": lat})

        def profile_once():
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "bench.profile.safetensors")
                sample(hooks.patch_model(m, profile_mode.profile_config(m, path, forecast=True)))
                return Profile.load(path)

        def runner(pol):
            fast = hooks.patch_model(m, apply_mode.apply_config(m, pol))
            return (lambda: sample(m)), (lambda: sample(fast))

        ones = hooks.patch_model(m, apply_mode.apply_config(m, Policy.all_ones(n)))
        out[name] = {"model": name, **rerun_rows(n, (4, 6, 8), profile_once, runner, lambda: sample(ones), reruns,
                                                 repeats, progress)}
    unets.cleanup()
    return out


def _line(name: str, f: dict) -> str:
    return f"{name} {f['median']:.3f} ({f['min']:.3f}–{f['max']:.3f}, spread {100 * f['spread']:.1f} %)"


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.speedup_prediction", __doc__)
    ap.add_argument("--reruns", type=whole(1), default=5, help="profile again, predict again, measure again")
    ap.add_argument("--repeats", type=whole(1), default=5, help="alternating full/GCache run pairs per rerun and K")
    ap.add_argument("--threads", type=whole(1), default=1)
    ap.add_argument("--skip-reference", action="store_true", help="only the ComfyUI models (COMFYUI_PATH)")
    a = ap.parse_args(argv)
    path = check_optional_comfyui(ap)
    if a.skip_reference and path is None:
        ap.error("--skip-reference leaves only the ComfyUI models: set COMFYUI_PATH to your ComfyUI folder")
    from ..search.infra.cli import set_threads
    set_threads(a.threads)
    modules = comfyui_modules(path) if path else None
    load_start = [round(v, 2) for v in os.getloadavg()]
    parts = (0 if a.skip_reference else 1) + (2 if path else 0)
    progress = Progress(parts * a.reruns, "speedup prediction: reruns (profile, predict, measure)",
                        expected_s=a.reruns * a.repeats * (4.5 * (not a.skip_reference) + 55.0 * bool(path)))
    out = {} if a.skip_reference else {"reference": reference(a.reruns, a.repeats, progress)}
    if path:
        for i, part in enumerate(comfyui(a.reruns, a.repeats, modules, progress).values()):
            out[f"comfyui_{i}"] = part
        # the tree's folder name only: an absolute path is this machine's, and a result is committed
        out["comfyui_path"] = os.path.basename(os.path.normpath(os.environ["COMFYUI_PATH"]))
    parts = {key: p for key, p in out.items() if isinstance(p, dict)}
    for p in parts.values():
        print(f"{p['model']}: {_line('io share', p['io_share'])}"
              + (f"; {_line('before (sums over every step)', p['io_share_before'])}" if "io_share_before" in p else ""))
        c = p["step_costs_ms"]
        if len(c) == 7:
            print(f"  step costs (ms, medians): profiling run {c['profile_step_ms']:.2f} less recording = stack "
                  f"{c['profile_stack_ms']:.2f} + outside {c['profile_outside_stack_ms']:.2f} | all computed under "
                  f"Apply {c['all_ones_step_ms']:.2f} | under the K = {min(p['by_k'])} mask: computed "
                  f"{c['computed_step_ms']:.2f}, skipped {c['skipped_step_ms']:.2f} | a run's time outside its steps "
                  f"{c['run_outside_steps_ms']:.2f}")
        for k, f in p["by_k"].items():
            print(f"  K = {k:>2}: {_line('predicted', f['predicted'])} | "
                  f"{_line('measured (whole runs)', f['measured'])} | predicted / measured "
                  f"{f['predicted_over_measured']:.3f}"
                  f"{'' if f['predicted_within_measured'] else ' (predicted outside the measured spread)'}")
            if "logged" in f:
                print(f"          {_line('logged per run (median over its steps)', f['logged'])} | "
                      f"{_line('predicted with the run outside its steps', f['predicted_whole_run'])}")
            before = [_line(nm, f[key]) for nm, key in (("predicted", "predicted_before"),
                                                        ("logged per run", "logged_before")) if key in f]
            if before:
                print(f"          before 2026-11-27 (same runs): {' | '.join(before)}")
    out["reruns"], out["repeats"] = a.reruns, a.repeats
    out["load_average"] = {"start": load_start, "end": [round(v, 2) for v in os.getloadavg()]}
    if "reference" in out:
        out["reference_predicted_spread_max"] = max(f["predicted"]["spread"] for f in out["reference"]["by_k"].values())
    out["predicted_within_measured"] = {key: {k: f["predicted_within_measured"] for k, f in p["by_k"].items()}
                                        for key, p in parts.items()}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.speedup_prediction"))
