"""How clearly a finalist must beat the search's pick on the fresh seeds to replace it (search/paired.py FRESH_Z, in
search/end_game.py), measured.

On the reference model (N = 30, objective 1 − SSIM, the profile-fitted forecaster), for each set of search seeds, K
and GP seed the search runs once, with its final choice on fresh seeds (the finalists: the forecaster check's pick and
each profile-fitted forecaster's best candidate, each sampled on as many fresh seeds). Each rule's winner is recomputed
from the same fresh losses (end_game.fresh_winner): a paired gain over the pick beyond z = 0 (a lower mean), 0.5, 1
(the search's), 2 standard errors, or never replacing the pick. Every finalist is sampled on the held-out seeds (PSNR
dB against full compute); a rule's regret in one search is the best finalist's held-out PSNR minus that of the
finalist the rule keeps (≥ 0). Prints per rule the median, mean and worst regret and how often it replaced the pick.

    python -m gcache.bench.fresh_choice        # 2 seed sets × K = 6, 8, 10, 15, 20 × GP seeds 0-2: 30 searches at
                                               # budget 64, about 30 min on one core

Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from .cli import BenchParser, Progress, run_main, seed_text
from .search_setup import FittedSetup, add_arguments, check_ks


def rules() -> dict:
    """The rules compared: name -> a paired.Rule (None: the pick always stays)."""
    from ..search import paired
    return {**{f"z={z:g}": paired.beyond_z(z) for z in (0.0, 0.5, paired.FRESH_Z, 2.0)}, "never": None}


def main(argv=None, harness_factory=None) -> dict:
    ap = BenchParser("gcache.bench.fresh_choice", __doc__)
    add_arguments(ap, budget=64)
    ap.add_argument("--seed-sets", type=seed_text, nargs="+", default=["1000-1015", "2000-2015"],
                    help="sets of search seeds, each a search's own (replaces --search-seeds)")
    a = ap.parse_args(argv)
    check_ks(ap, a)
    from ..search import end_game
    from ..search.config import SearchConfig
    from ..search.infra.cli import parse_seeds
    from ..search.loop import run_search
    compared = rules()
    gp_seeds = parse_seeds(a.gp_seeds)
    runs = []
    progress = Progress(len(a.seed_sets) * len(a.ks) * len(gp_seeds), "fresh choice: searches",
                        expected_s=45.0 * len(a.seed_sets) * len(a.ks) * len(gp_seeds) * a.budget / 64)
    for seeds in a.seed_sets:
        setup = FittedSetup(argparse.Namespace(**dict(vars(a), search_seeds=seeds)), harness_factory)
        for k in a.ks:
            for g in gp_seeds:
                res = run_search(setup.profile, SearchConfig(k=k, budget=a.budget, seed=g, objective="ssim",
                                                             forecast="fitted"), setup.evaluate)
                fresh = res.end.fresh
                run = {"search_seeds": seeds, "K": k, "gp_seed": g, "finalists": [], "picks": {}}
                if fresh is not None and not fresh.skipped and len(fresh.losses) > 1:
                    keys = [c.key for c in fresh.finalists if c.key in fresh.losses]
                    psnr = {key: setup.held_out(key) for key in keys}
                    best = max(psnr.values())
                    run["finalists"] = [{"key": key, "fresh_loss": fresh.losses[key], "psnr": psnr[key]}
                                        for key in keys]
                    for name, rule in compared.items():
                        won = end_game.fresh_winner(res.state.fresh, keys, g, rule)
                        run["picks"][name] = {"key": won, "regret_db": round(best - psnr[won], 3)}
                runs.append(run)
                progress.step(f"seeds {seeds}, K = {k}, GP seed {g}: " + (", ".join(
                    f"{f['key']} {f['psnr']:.2f} dB" for f in run["finalists"]) or "one finalist"))
    judged = [r for r in runs if r["picks"]]
    out = {"budget": a.budget, "gp_seeds": gp_seeds, "seed_sets": a.seed_sets, "runs": runs, "searches": len(runs),
           "with_finalists": len(judged), "rules": {}}
    for name in compared:
        regrets = [r["picks"][name]["regret_db"] for r in judged]
        if not regrets:
            continue
        out["rules"][name] = {"median_regret_db": round(statistics.median(regrets), 3),
                              "mean_regret_db": round(statistics.mean(regrets), 3), "worst_regret_db": max(regrets),
                              "replaced": sum(r["picks"][name]["key"] != r["finalists"][0]["key"] for r in judged)}
        print(f"rule {name}: held-out regret against the best finalist over {len(judged)} searches: median "
              f"{out['rules'][name]['median_regret_db']:.2f} dB, mean {out['rules'][name]['mean_regret_db']:.2f}, "
              f"worst {max(regrets):.2f}; replaced the pick in {out['rules'][name]['replaced']}", flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.fresh_choice"))
