"""How long an instant policy takes (GCache Policy, GCache Apply (auto)): the exact DP on a real profile.

On the reference model, a profile of 4 seeds (with forecast statistics at N = 50) per N; then, timed --repeats
times each (median, min and max in ms): the reuse theory-DP policy (search/instant.py instant_policy) at
N = 30, 50, 100 and K = N/3, and the linear forecaster's DP over pairs (p, i) at N = 50, K = 17 and 33.

    python -m gcache.bench.dp_speed            # about 15 s

Timings of this machine. Ends with one JSON line.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from .cli import BenchParser, run_main, whole


def timed(fn, repeats: int) -> dict:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"median_ms": round(statistics.median(ts) * 1e3, 3), "min_ms": round(min(ts) * 1e3, 3),
            "max_ms": round(max(ts) * 1e3, 3)}


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.dp_speed", __doc__)
    ap.add_argument("--repeats", type=whole(1), default=7)
    ap.add_argument("--threads", type=whole(1), default=1)
    a = ap.parse_args(argv)
    from ..reference_model.harness import ReferenceHarness
    from ..search.infra.cli import set_threads
    from ..search.instant import instant_policy
    set_threads(a.threads)
    out = {"repeats": a.repeats, "reuse": {}, "linear": {}}
    profiles = {n: ReferenceHarness(n).profile(list(range(4)), forecast=(n == 50)) for n in (30, 50, 100)}
    for n, prof in profiles.items():
        k = n // 3
        out["reuse"][str(n)] = {"K": k, **timed(lambda: instant_policy(prof, k, "theory"), a.repeats)}
        print(f"reuse theory DP, N = {n}, K = {k}: median {out['reuse'][str(n)]['median_ms']} ms", flush=True)
    for k in (17, 33):
        out["linear"][str(k)] = {"N": 50, **timed(lambda: instant_policy(profiles[50], k, "theory", forecast="linear"),
                                                  a.repeats)}
        print(f"linear forecast DP, N = 50, K = {k}: median {out['linear'][str(k)]['median_ms']} ms", flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.dp_speed"))
