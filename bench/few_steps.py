"""Where caching stops paying: caching against simply running fewer steps, at the same speed, from few-step sampling
(4-8 steps, as with distilled / lightning LoRAs) to the 4-5x regime of 30 steps.

On the reference model (euler, shift 2, CFG 3) for each N and each target speed-up: the full N-step run is the
reference; at the K the target gives (io share measured by the profiling run, or --io-share), each instant policy
(reuse, linear, fitted and Apply auto's pick, from one profiled batch of 8 seeds) and "fewer steps" (a full run of K
steps: what the same compute buys without caching) are sampled on 16 held-out seeds; PSNR dB against the N-step run. Caching pays at
(N, speed-up) when the best instant cache beats fewer steps; `pays_from` says, per speed-up, the smallest N from which
it pays at every larger N measured (None: it never does).

    python -m gcache.bench.few_steps                                   # N = 4 … 30, 2x … 5x: ~6 min on one core
    python -m gcache.bench.few_steps --steps 4 6 8 --speedups 2

Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[4, 6, 8, 10, 15, 20, 30])
    ap.add_argument("--speedups", type=float, nargs="+", default=[2.0, 3.0, 4.0, 5.0])
    ap.add_argument("--eval-seeds", default="0-15")
    ap.add_argument("--io-share", type=float, default=None, help="K from this io share instead of the one the "
                    "profiling run measures (timings on a busy machine move K; 0.05 was measured quietly at N = 30)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    from ..core.policy import k_for_speedup
    from ..reference_model.harness import ReferenceHarness
    from ..search.infra.cli import parse_seeds, set_threads
    from ..search.instant import choose_forecaster, instant_policy
    from ..search.infra.objectives import psnr
    set_threads(a.threads)
    seeds = parse_seeds(a.eval_seeds)
    out = {"speedups": a.speedups, "rows": [], "pays_from": {}}
    fewer_cache: dict = {}
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
            pick = choose_forecaster(prof, k)[0] if 1 < k < n else "reuse"
            for name, fc in (("reuse", "reuse"), ("linear", "linear"), ("fitted", "fitted"), ("auto", pick)):
                if k in (1, n):
                    row[name] = None if k == 1 else float("inf")
                    continue
                pol = instant_policy(prof, k, "theory", forecast=fc)
                img, _ = h.run(seeds, pol.mask, forecast=fc, forecast_params=pol.forecast_params)
                row[name] = round(psnr(img, ref), 2)
            row["auto_forecaster"] = pick
            caches = [row[m] for m in ("reuse", "linear", "fitted") if row[m] is not None]
            row["best_cache_minus_fewer_steps"] = None if not caches or k == n else \
                round(max(caches) - row["fewer steps"], 2)
            out["rows"].append(row)
            print(f"N = {n}, {speedup:g}x: K = {k} (io share {row['io_share']}): fewer steps {row['fewer steps']} dB | "
                  f"instant reuse {row['reuse']}, linear {row['linear']}, fitted {row['fitted']}, auto ({pick}) "
                  f"{row['auto']} dB | best cache − fewer steps {row['best_cache_minus_fewer_steps']}", flush=True)
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
    main()
