"""Few-step sampling (4-8 steps, as with distilled / lightning LoRAs): caching against simply running fewer steps, at
the same speed.

On the reference model at N = 4, 6 and 8 (euler, shift 2, CFG 3): the full N-step run is the reference; at the K a
2x target gives (io share measured by the profiling run), each instant policy (reuse, linear, fitted and Apply
auto's pick, from one profiled batch of 8 seeds) and "fewer steps" (a full run of K steps: what the same compute buys
without caching) are sampled on 16 held-out seeds; PSNR dB against the N-step run.

    python -m gcache.bench.few_steps

Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[4, 6, 8])
    ap.add_argument("--speedup", type=float, default=2.0)
    ap.add_argument("--eval-seeds", default="0-15")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    from ..core.policy import k_for_speedup
    from ..reference_model.harness import ReferenceHarness
    from ..search.cli import parse_seeds, set_threads
    from ..search.instant import choose_forecaster, instant_policy
    from ..search.objectives import psnr
    set_threads(a.threads)
    seeds = parse_seeds(a.eval_seeds)
    out = {"speedup": a.speedup, "rows": []}
    for n in a.steps:
        h = ReferenceHarness(n)
        prof = h.profile(list(range(1000, 1008)), forecast=True)
        k = k_for_speedup(n, a.speedup, prof.io_share)
        ref = h.full(seeds)
        row = {"N": n, "K": k, "io_share": round(prof.io_share, 4)}
        fewer = ReferenceHarness(k).full(seeds)  # the same compute, no caching: a K-step schedule
        row["fewer steps"] = round(psnr(fewer, ref), 2)
        pick = choose_forecaster(prof, k)[0] if 1 < k < n else "reuse"
        for name, fc in (("reuse", "reuse"), ("linear", "linear"), ("fitted", "fitted"), ("auto", pick)):
            if k in (1, n):
                row[name] = None if k == 1 else float("inf")
                continue
            pol = instant_policy(prof, k, "theory", forecast=fc)
            img, _ = h.run(seeds, pol.mask, forecast=fc, forecast_params=pol.forecast_params)
            row[name] = round(psnr(img, ref), 2)
        row["auto_forecaster"] = pick
        out["rows"].append(row)
        print(f"N = {n}, K = {k} (io share {row['io_share']}): fewer steps {row['fewer steps']} dB | instant reuse "
              f"{row['reuse']}, linear {row['linear']}, fitted {row['fitted']}, auto ({pick}) {row['auto']} dB")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
