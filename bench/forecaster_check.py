"""Which rule the search's forecaster check should follow (search/forecaster_check.py RULE), measured.

On the reference model (N = 30, objective 1 − SSIM on the search seeds, the profile-fitted forecaster), for each K and
GP seed the search runs once (it measures its chosen mask under l2p too: the check). Each rule's pick is recomputed
from the same measurements (forecaster_check.pick) and the chosen mask is sampled on held-out seeds under every
forecaster measured (PSNR dB against full compute). Prints, per rule, the median and the worst held-out gain over
keeping the search's own forecaster ("never"), and how often the rule switched.

    python -m gcache.bench.forecaster_check                 # K = 6, 8, 10, 15, 20; budget 48; GP seeds 0-2: ~6 min
    python -m gcache.bench.forecaster_check --budget 64

Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics


def main(argv=None, harness_factory=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=[6, 8, 10, 15, 20])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--budget", type=int, default=48)
    ap.add_argument("--gp-seeds", default="0-2")
    ap.add_argument("--search-seeds", default="1000-1015")
    ap.add_argument("--eval-seeds", default="0-15")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    from ..core import forecasters
    from ..reference_model.harness import ReferenceHarness
    from ..search import forecaster_check
    from ..search.bilevel import run_search
    from ..search.cli import parse_seeds, set_threads
    from ..search.config import SearchConfig
    from ..search.objectives import make_objective, psnr
    set_threads(a.threads)
    h = harness_factory(a.steps) if harness_factory else ReferenceHarness(a.steps)
    search_seeds, eval_seeds, gp_seeds = parse_seeds(a.search_seeds), parse_seeds(a.eval_seeds), parse_seeds(a.gp_seeds)
    profile = h.profile(search_seeds, forecast=True)
    own = "fitted"
    evaluate = h.evaluator(search_seeds, make_objective("ssim"), forecast=own, profile=profile)
    ref = h.full(eval_seeds)

    def held_out(mask: list, name: str) -> float:
        fc = forecasters.get(name)
        img, _ = h.run(eval_seeds, mask, forecast=fc.name, forecast_params=fc.fit(profile, mask))
        return round(psnr(img, ref), 3)

    runs = []
    for k in a.ks:
        for g in gp_seeds:
            res = run_search(profile, SearchConfig(k=k, budget=a.budget, seed=g, objective="ssim", forecast=own),
                             evaluate)
            checked = res.state["forecasters"]
            key = checked["mask"]
            mask = [int(c) for c in key]
            psnrs = {own: held_out(mask, own), **{n: held_out(mask, n) for n in checked["results"]}}
            run = {"K": k, "gp_seed": g, "psnr": psnrs, "loss": {own: res.state["masks"][key]["loss"],
                                                                 **{n: r["loss"] for n, r in checked["results"].items()}},
                   "picks": {}}
            for rule in forecaster_check.RULES:
                pick = forecaster_check.pick(res.state["masks"][key], checked["results"], g, rule) or own
                run["picks"][rule] = {"forecaster": pick, "gain_db": round(psnrs[pick] - psnrs[own], 3)}
            runs.append(run)
            print(f"K = {k}, GP seed {g}: held-out " + ", ".join(f"{n} {v:.2f} dB" for n, v in psnrs.items()) +
                  "; search loss " + ", ".join(f"{n} {v:.4g}" for n, v in run["loss"].items()) + "; picks " +
                  ", ".join(f"{r}: {p['forecaster']}" for r, p in run["picks"].items()), flush=True)
    out = {"budget": a.budget, "gp_seeds": gp_seeds, "runs": runs, "rules": {}}
    for rule in forecaster_check.RULES:
        gains = [r["picks"][rule]["gain_db"] for r in runs]
        per_k = {str(k): round(statistics.median(r["picks"][rule]["gain_db"] for r in runs if r["K"] == k), 3)
                 for k in a.ks}
        out["rules"][rule] = {"median_gain_db": round(statistics.median(gains), 3), "worst_gain_db": min(gains),
                              "switched": sum(r["picks"][rule]["forecaster"] != own for r in runs),
                              "median_gain_db_per_k": per_k}
        print(f"rule {rule}: held-out gain over keeping {own}: median {statistics.median(gains):+.2f} dB, worst "
              f"{min(gains):+.2f} dB, switched in {out['rules'][rule]['switched']} of {len(runs)}; per K (median) " +
              ", ".join(f"K={k}: {v:+.2f}" for k, v in per_k.items()), flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
