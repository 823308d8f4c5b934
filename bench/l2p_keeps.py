"""How many residuals should the l2p forecaster keep? GCache's l2p (core/forecasters/l2p.py) keeps the last 4
computed residuals (each is a full latent stream held for the run) and fits its weights to the profile's Gram
statistics; bench/rivals.py's l2p_all fits every computed residual to the full runs' trajectories (the variant
bench/quality.py measured beating the profile-fitted forecaster at K = 15, 20 of 30). Between them, l2p_profile_all:
every residual, fitted to the profile's Gram (the same data as l2p), so keeps and training data are told apart.

On the reference model, one profiled batch of --profile-seeds (the trajectories of the same seeds for l2p_all), for
K of N on three masks (uniform; the theory-DP instant masks of fitted and of l2p), each forecaster is sampled on the
held-out --eval-seeds; rows are PSNR dB against full compute, and the summary the median over (K, mask) of each
forecaster minus fitted, with its spread (min, max).

    python -m gcache.bench.l2p_keeps                    # N = 30, K = 10, 15, 20: about 2 min

Ends with one JSON line. PSNR is deterministic here; the figures of the last stored run are in
bench/results/l2p_keeps.json (python -m gcache.bench.runs l2p_keeps reruns it).
"""
from __future__ import annotations

import json
import statistics
import sys

from .cli import BenchParser, Progress, run_main, seed_text, whole


def main(argv=None, harness_factory=None) -> dict:
    ap = BenchParser("gcache.bench.l2p_keeps", __doc__)
    ap.add_argument("--steps", type=whole(4), default=30)
    ap.add_argument("--k", type=whole(2), nargs="+", default=[10, 15, 20])
    ap.add_argument("--profile-seeds", type=seed_text, default="1000-1007")
    ap.add_argument("--eval-seeds", type=seed_text, default="0-15")
    ap.add_argument("--threads", type=whole(1), default=1)
    a = ap.parse_args(argv)
    if any(k >= a.steps for k in a.k):
        ap.error(f"--k {' '.join(map(str, a.k))}: every K must be below --steps {a.steps}")
    from ..core import forecasters
    from ..core.forecasters.l2p import L2P
    from ..reference_model.harness import ReferenceHarness
    from ..search.baselines import uniform_mask
    from ..search.infra.cli import parse_seeds, set_threads
    from ..search.infra.objectives import psnr
    from ..search.instant import instant_policy
    from .rivals import l2p_params, trajectory_gram

    class L2PProfileAll(L2P):  # the same fit over every computed residual before a skipped step
        name, keeps = "l2p_profile_all", 64

    forecasters.register(L2PProfileAll())
    set_threads(a.threads)
    prof_seeds, eval_seeds = parse_seeds(a.profile_seeds), parse_seeds(a.eval_seeds)
    h = harness_factory(a.steps) if harness_factory else ReferenceHarness(a.steps)
    profile = h.profile(prof_seeds, forecast=True)
    gram = trajectory_gram(h, prof_seeds)
    ref = h.full(eval_seeds)
    names = ("fitted", "l2p", "l2p_profile_all", "l2p_all")
    rows = []
    progress = Progress(3 * len(a.k), "l2p keeps: (K, mask) pairs", expected_s=12.0 * len(a.k) * a.steps / 10)
    for k in a.k:
        masks = {"uniform": uniform_mask(a.steps, k),
                 "fitted_dp": instant_policy(profile, k, "theory", forecast="fitted").mask,
                 "l2p_dp": instant_policy(profile, k, "theory", forecast="l2p").mask}
        for where, mask in masks.items():
            row = {"K": k, "mask": where}
            for name in names:
                params = l2p_params(gram, mask) if name == "l2p_all" else forecasters.get(name).fit(profile, mask)
                img, _ = h.run(eval_seeds, mask, forecast=name, forecast_params=params)
                row[name] = round(psnr(img, ref), 3)
            rows.append(row)
            progress.step(f"K = {k}, {where}: " + ", ".join(f"{n} {row[n]:.2f}" for n in names) + " dB")
    out = {"N": a.steps, "rows": rows, "minus_fitted_db": {}}
    for name in names[1:]:
        d = [r[name] - r["fitted"] for r in rows]
        out["minus_fitted_db"][name] = {"median": round(statistics.median(d), 3), "min": round(min(d), 3),
                                        "max": round(max(d), 3)}
        print(f"{name} − fitted: median {statistics.median(d):+.2f} dB (min {min(d):+.2f}, max {max(d):+.2f}) "
              f"over {len(d)} (K, mask)")
    forecasters.unregister(L2PProfileAll.name)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.l2p_keeps"))
