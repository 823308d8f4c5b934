"""Engine cost on the reference DiT: all-ones overhead, speed-up at K = N/2 against the ideal, Profile memory.

    python -m gcache.bench.engine [--steps 30 50] [--batch 8] [--repeats 7] [--threads 1]
    # about 1 min; --repeats 15: 3

Whole sampling runs of N steps, timed side by side in one process after warm-up, variants interleaved
(plain, all-ones, K = N/2, blocks skipped entirely; shuffled every repetition) so that drift on a shared machine hits
all alike; medians of `--repeats` (ratios: median of the per-repetition ratios). T = plain time / N; T_io = time with
the block stack replaced by the identity / N (a step without the block stack); ideal = N·T / (K·T + (N − K)·T_io).
The last line is one JSON object; its top-level figures are the worst over the step counts measured
(largest overhead, smallest speed-up ratio), per-N figures are under "by_n".
"""
from __future__ import annotations

import json
import random
import statistics
import sys
import time

import torch

from ..core.engine import ResidualCache
from ..core.recorder import ProfileRecorder
from ..core.step_clock import StackClock, StepClock
from ..reference_model.harness import ReferenceHarness, labels_for
from ..reference_model.sampler import sample
from ..search.baselines import uniform_mask
from .cli import BenchParser, Progress, run_main, whole


def measure(h: ReferenceHarness, seeds: list[int], repeats: int) -> dict:
    n, k = h.n_steps, h.n_steps // 2
    labels = labels_for(seeds)
    half = uniform_mask(n, k)

    def plain():
        sample(h.model, labels, seeds, n, h.cfg_scale, h.shift)

    def ones():
        with ResidualCache([1] * n, observers=(StepClock(),)) as c:  # as GCache Apply runs it
            sample(h.model, labels, seeds, n, h.cfg_scale, h.shift, cache=c)

    def halfrun():
        with ResidualCache(half, observers=(StepClock(),)) as c:
            sample(h.model, labels, seeds, n, h.cfg_scale, h.shift, cache=c)

    def io_only():
        sample(h.model, labels, seeds, n, h.cfg_scale, h.shift, cache=_Identity())

    variants = {"plain": plain, "ones": ones, "half": halfrun, "io": io_only}
    times = {name: [] for name in variants}
    for fn in variants.values():  # warm-up
        fn()
    order = list(variants)
    rng = random.Random(0)
    for _ in range(repeats):
        rng.shuffle(order)  # a fixed rotation biases whoever runs after whom (allocator, caches)
        for name in order:
            fn = variants[name]
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(v) for name, v in times.items()}
    # Ratios within one repetition (back-to-back runs) cancel slow load drift better than ratios of medians.
    paired = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))  # noqa: E731
    T, T_io = med["plain"] / n, med["io"] / n
    ideal = n * T / (k * T + (n - k) * T_io)
    speedup = paired("plain", "half")

    rec = ProfileRecorder(h.times, h.sigmas)
    with ResidualCache(None, observers=(rec, StackClock())) as c:  # as GCache Profile runs it
        sample(h.model, labels, seeds, n, h.cfg_scale, h.shift, cache=c)
    rec.finish()
    return {"N": n, "K": k, "batch": len(seeds), "plain_s": round(med["plain"], 4),
            "overhead_all_ones": round(paired("ones", "plain") - 1, 4), "speedup_half": round(speedup, 3),
            "ideal_half": round(ideal, 3), "speedup_ratio": round(speedup / ideal, 3),
            "io_share": round(T_io / T, 4), "profile_peak_extra_mb": round(rec.peak_bytes / 2**20, 3)}


def engine_call_us(h_shape=(16, 64, 64), calls: int = 1000, repeats: int = 5) -> float:
    """The engine's own cost of one all-ones step (set_step + enter + exit, identity blocks), in µs:
    what all-ones overhead would be without run-to-run noise."""
    h = torch.randn(h_shape)
    times = []
    for _ in range(repeats):
        with ResidualCache([1] * calls, observers=(StepClock(),)) as cache:
            t0 = time.perf_counter()
            for i in range(calls):
                cache.set_step(i)
                cache.run(h, ("cond", "uncond"), lambda x: x)
            times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times) * 1e6


class _Identity:
    """A 'cache' that skips every block stack: times f_in + f_out + the sampler alone (T_io)."""

    def expect_steps(self, n):
        pass

    def set_step(self, i):
        pass

    def run(self, h, branches, blocks):
        return h


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.engine", __doc__)
    ap.add_argument("--steps", type=whole(2), nargs="+", default=[30, 50])
    ap.add_argument("--batch", type=whole(1), default=8, help="images per run (CFG doubles the model batch)")
    ap.add_argument("--repeats", type=whole(1), default=7)
    ap.add_argument("--threads", type=whole(1), default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    seeds = list(range(a.batch))
    rows = []
    progress = Progress(len(a.steps), "engine: step counts", expected_s=0.0045 * a.batch * a.repeats * 5 * sum(a.steps))
    for n in a.steps:
        row = measure(ReferenceHarness(n_steps=n), seeds, a.repeats)
        rows.append(row)
        progress.step(f"N={n:3d} K={row['K']:3d} batch={a.batch}: plain {row['plain_s'] * 1e3:.0f} ms/run, "
              f"all-ones overhead {row['overhead_all_ones'] * 100:+.2f}%, speed-up at K=N/2 {row['speedup_half']:.3f}x "
              f"vs ideal {row['ideal_half']:.3f}x (ratio {row['speedup_ratio']:.3f}, io share {row['io_share']:.3f}), "
              f"profile peak extra {row['profile_peak_extra_mb']:.2f} MiB")
    us = engine_call_us()
    step_ms = min(r["plain_s"] / r["N"] for r in rows) * 1e3
    print(f"engine cost of one all-ones step: {us:.1f} µs = {us / 10 / step_ms:.3f} % of a {step_ms:.1f} ms step "
          "(the run-level overhead above is mostly run-to-run noise)", flush=True)
    worst = {"overhead_all_ones": max(r["overhead_all_ones"] for r in rows),
             "engine_us_per_step": round(us, 2), "engine_share_of_step": round(us / 1e3 / step_ms, 5)}
    ratio_row = min(rows, key=lambda r: r["speedup_ratio"])
    worst.update(speedup_half=ratio_row["speedup_half"], ideal_half=ratio_row["ideal_half"],
                 speedup_ratio=ratio_row["speedup_ratio"],
                 profile_peak_extra_mb=max(r["profile_peak_extra_mb"] for r in rows),
                 threads=a.threads, by_n={str(r["N"]): r for r in rows})
    print(json.dumps(worst))
    return worst


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.engine"))
