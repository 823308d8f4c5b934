"""Where caching stops paying: caching against simply running fewer steps, at the same speed, from few-step sampling
(4-8 steps, as with distilled / lightning LoRAs) to the 4-5x regime of 30 steps.

On the reference model (euler, shift 2, CFG 3) for each N and each target speed-up: the full N-step run is the
reference; at the K the target gives (io share measured by the profiling run, or --io-share), these are sampled on
16 held-out seeds, PSNR dB against the N-step run:
- "fewer steps": a full run of K steps, what the same compute buys without caching;
- the instant theory-DP policies of reuse, linear and fitted, each on its own DP's mask, from one profiled batch of
  8 seeds;
- "auto": what GCache Apply (auto) applies (search/instant.py: choose_forecaster, then auto_policy: the chosen
  forecaster on the reuse DP's mask; reuse at FEW_STEPS steps or fewer);
- "bound_pick": the forecaster with the lowest held-out bound, applied the way auto applies one, whatever N (what
  auto would do without its few-steps rule).
Caching pays at (N, speed-up) when the best instant cache beats fewer steps; `pays_from` says, per speed-up, the
smallest N from which it pays at every larger N measured (None: it never does).

    python -m gcache.bench.few_steps --io-share 0.05                   # N = 4 … 30, 2x … 5x: about 1 min
    python -m gcache.bench.few_steps --steps 4 6 8 --speedups 2

Deterministic with --io-share (without it K follows the io share this machine measures). Ends with one JSON line.
"""
from __future__ import annotations

import json
import sys

from .cli import BenchParser, Progress, number, run_main, seed_text, whole

CACHES = ("reuse", "linear", "fitted")


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.few_steps", __doc__)
    ap.add_argument("--steps", type=whole(2), nargs="+", default=[4, 6, 8, 10, 15, 20, 30])
    ap.add_argument("--speedups", type=number(1.0, open_low=True), nargs="+", default=[2.0, 3.0, 4.0, 5.0])
    ap.add_argument("--eval-seeds", type=seed_text, default="0-15")
    ap.add_argument("--io-share", type=number(0.0, 0.99), default=None, help="K from this io share instead of the "
                    "one the profiling run measures (timings on a busy machine move K; 0.05 was measured quietly at "
                    "N = 30)")
    ap.add_argument("--threads", type=whole(1), default=1)
    a = ap.parse_args(argv)
    from ..core.policy import k_for_speedup
    from ..reference_model.harness import ReferenceHarness
    from ..search.infra.cli import parse_seeds, set_threads
    from ..search.infra.objectives import psnr
    from ..search.instant import FEW_STEPS, auto_policy, choose_forecaster, instant_policy
    set_threads(a.threads)
    seeds = parse_seeds(a.eval_seeds)
    out = {"speedups": a.speedups, "few_steps_rule": FEW_STEPS, "rows": [], "pays_from": {}}
    fewer_cache: dict = {}
    progress = Progress(len(a.steps) * len(a.speedups), "few steps: (N, speed-up) pairs",
                        expected_s=0.08 * sum(a.steps) * len(a.speedups))
    for n in a.steps:
        h = ReferenceHarness(n)
        prof = h.profile(list(range(1000, 1008)), forecast=True)
        ref = h.full(seeds)
        io_share = prof.io_share if a.io_share is None else a.io_share
        for speedup in a.speedups:
            k = k_for_speedup(n, speedup, io_share)
            row = {"N": n, "speedup": speedup, "K": k, "io_share": round(io_share, 4)}
            if k not in fewer_cache:
                fewer_cache[k] = ReferenceHarness(k).full(seeds)  # the same compute, no caching: a K-step schedule
            row["fewer steps"] = round(psnr(fewer_cache[k], ref), 2)

            def sampled(pol):
                img, _ = h.run(seeds, pol.mask, forecast=pol.forecast, forecast_params=pol.forecast_params)
                return round(psnr(img, ref), 2)

            if 1 < k < n:
                pick, scores = choose_forecaster(prof, k)
                bound_pick = min(scores, key=lambda name: scores[name])
                for name in CACHES:
                    row[name] = sampled(instant_policy(prof, k, "theory", forecast=name))
                row["auto"] = sampled(auto_policy(prof, k, pick))
                row["bound_pick"] = row["auto"] if bound_pick == pick else sampled(auto_policy(prof, k, bound_pick))
            else:  # K = 1 has one mask (nothing to compare); K = N computes every step
                pick = bound_pick = "reuse"
                for name in CACHES + ("auto", "bound_pick"):
                    row[name] = None if k == 1 else float("inf")
            row["auto_forecaster"], row["bound_forecaster"] = pick, bound_pick
            caches = [row[m] for m in CACHES + ("auto",) if row[m] is not None]
            row["best_cache_minus_fewer_steps"] = None if not caches or k == n else \
                round(max(caches) - row["fewer steps"], 2)
            out["rows"].append(row)
            progress.step(f"N = {n}, {speedup:g}x: K = {k} (io share {row['io_share']}): fewer steps "
                          f"{row['fewer steps']} dB | instant reuse {row['reuse']}, linear {row['linear']}, fitted "
                          f"{row['fitted']} | auto ({pick}) {row['auto']}, bound's pick ({bound_pick}) "
                          f"{row['bound_pick']} dB | best cache − fewer steps "
                          f"{row['best_cache_minus_fewer_steps']}")
    for speedup in a.speedups:
        pays = [(r["N"], r["best_cache_minus_fewer_steps"]) for r in out["rows"] if r["speedup"] == speedup]
        start = None
        for n, d in sorted(pays, reverse=True):  # from the largest N down: the smallest N of the paying tail
            if d is None or d <= 0:
                break
            start = n
        out["pays_from"][f"{speedup:g}"] = start
        print(f"{speedup:g}x: caching beats fewer steps from N = {start} on" if start is not None else
              f"{speedup:g}x: caching never beats fewer steps at the largest N measured")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.few_steps"))
