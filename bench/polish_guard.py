"""Which polish moves to keep (SearchConfig.polish_guard: "halves" or "z"), measured.

On the reference model (N = 30, the profile-fitted forecaster, objective 1 − SSIM on the search seeds), for each K and
GP seed the search runs without polish (polish_share 0) and with polish under each guard, at the same budget; each
policy is sampled on held-out seeds (PSNR dB against full compute, under the policy's own forecaster). Prints per
guard the median over GP seeds of polish − no polish per K, and how many searches each guard won, lost and tied
against the other.

    python -m gcache.bench.polish_guard                   # K = 6, 8, 10, 15, 20; budget 48; GP seeds 0-2: about 10 min
    python -m gcache.bench.polish_guard --budget 64       # about 14 min

Ends with one JSON line.
"""
from __future__ import annotations

import json
import statistics
import sys

from .cli import BenchParser, Progress, run_main
from .search_setup import FittedSetup, add_arguments, check_ks


def main(argv=None, harness_factory=None) -> dict:
    ap = BenchParser("gcache.bench.polish_guard", __doc__)
    add_arguments(ap)
    a = ap.parse_args(argv)
    check_ks(ap, a)
    from ..search.config import SearchConfig
    from ..search.loop import run_search
    from ..search.paired import GUARDS
    setup = FittedSetup(a, harness_factory)
    profile, evaluate, gp_seeds = setup.profile, setup.evaluate, setup.gp_seeds

    def held_out(pol) -> float:  # under the policy's own forecaster and parameters
        return setup.held_out(pol.mask, pol.forecast, pol.forecast_params)

    runs = []
    progress = Progress(len(a.ks) * len(gp_seeds), "polish guard: (K, GP seed) pairs, 3 searches each",
                        expected_s=40.0 * len(a.ks) * len(gp_seeds) * a.budget / 48)
    for k in a.ks:
        for g in gp_seeds:
            cfg = dict(k=k, budget=a.budget, seed=g, objective="ssim", forecast="fitted")
            run = {"K": k, "gp_seed": g, "no_polish": held_out(run_search(profile, SearchConfig(
                **cfg, polish_share=0.0), evaluate).policy), "guards": {}}
            for guard in GUARDS:
                res = run_search(profile, SearchConfig(**cfg, polish_guard=guard), evaluate)
                run["guards"][guard] = {"psnr": held_out(res.policy), "won": res.policy.provenance["won"],
                                        "accepted": res.policy.provenance["polish"]["accepted"]}
            runs.append(run)
            progress.step(f"K = {k}, GP seed {g}: no polish {run['no_polish']:.2f} dB; " + "; ".join(
                f"{n}: {r['psnr']:.2f} dB ({r['won']}, {r['accepted']} moves kept)" for n, r in run["guards"].items()))
    out = {"budget": a.budget, "gp_seeds": gp_seeds, "runs": runs, "median_gain_db": {}, "z_vs_halves": {}}
    for guard in GUARDS:
        out["median_gain_db"][guard] = {str(k): round(statistics.median(
            r["guards"][guard]["psnr"] - r["no_polish"] for r in runs if r["K"] == k), 3) for k in a.ks}
        print(f"{guard}: median polish − no polish " + ", ".join(
            f"K={k}: {v:+.2f}" for k, v in out["median_gain_db"][guard].items()), flush=True)
    d = [round(r["guards"]["z"]["psnr"] - r["guards"]["halves"]["psnr"], 3) for r in runs]
    out["z_vs_halves"] = {"better": sum(v > 0 for v in d), "worse": sum(v < 0 for v in d),
                          "same": sum(v == 0 for v in d), "best_db": max(d), "worst_db": min(d)}
    print(f"z − halves over {len(d)} searches: better {out['z_vs_halves']['better']}, worse "
          f"{out['z_vs_halves']['worse']}, same {out['z_vs_halves']['same']} (from {min(d):+.2f} to {max(d):+.2f} dB)")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.polish_guard"))
