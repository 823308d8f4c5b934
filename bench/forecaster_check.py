"""Which rule the search's forecaster check should follow (search/paired.py CHECK, in search/end_game.py), measured.

On the reference model (N = 30, objective 1 − SSIM on the search seeds, the profile-fitted forecaster), for each K and
GP seed the search runs once (it measures its chosen mask under l2p too: the check). Each rule's pick is recomputed
from the same measurements (end_game.pick) and the chosen mask is sampled on held-out seeds under every
forecaster measured (PSNR dB against full compute). Prints, per rule, the median and the worst held-out gain over
keeping the search's own forecaster ("never"), and how often the rule switched.

    python -m gcache.bench.forecaster_check                 # K = 6, 8, 10, 15, 20; budget 48; GP seeds 0-2: about 8 min
    python -m gcache.bench.forecaster_check --budget 64

Ends with one JSON line.
"""
from __future__ import annotations

import json
import statistics
import sys

from .cli import BenchParser, Progress, run_main
from .search_setup import FittedSetup, add_arguments, check_ks


def rules() -> dict:
    """The rules compared, by the names the stored results use: the search's (paired.CHECK, "halves"), a lower mean
    loss, a gain beyond 2 paired standard errors (the final choice's margin when this bench was written) and never
    switching (None)."""
    from ..search import paired
    return {"halves": paired.CHECK, "mean": paired.MEAN, "noise": paired.beyond_z(2.0, "noise"), "never": None}


def main(argv=None, harness_factory=None) -> dict:
    ap = BenchParser("gcache.bench.forecaster_check", __doc__)
    add_arguments(ap)
    a = ap.parse_args(argv)
    check_ks(ap, a)
    from ..search import end_game
    from ..search.config import SearchConfig
    from ..search.loop import run_search
    setup = FittedSetup(a, harness_factory)
    profile, evaluate, held_out, gp_seeds = setup.profile, setup.evaluate, setup.held_out, setup.gp_seeds
    own = "fitted"

    runs = []
    progress = Progress(len(a.ks) * len(gp_seeds), "forecaster check: searches", expected_s=32.0 * len(a.ks) *
                        len(gp_seeds) * a.budget / 48)
    for k in a.ks:
        for g in gp_seeds:
            res = run_search(profile, SearchConfig(k=k, budget=a.budget, seed=g, objective="ssim", forecast=own),
                             evaluate)
            checked = res.end.check  # the check of the candidate the search returned
            base, mask = checked.checked.forecaster, checked.checked.mask  # it may be another forecaster's mask
            psnrs = {base: held_out(mask, base), **{n: held_out(mask, n) for n in checked.results}}
            run = {"K": k, "gp_seed": g, "searched_with": base, "psnr": psnrs,
                   "loss": {base: checked.checked.loss, **{n: r.loss for n, r in checked.results.items()}},
                   "picks": {}}
            for rule, judge in rules().items():
                pick = end_game.pick(checked.checked.measured, checked.results, g, judge) or base
                run["picks"][rule] = {"forecaster": pick, "gain_db": round(psnrs[pick] - psnrs[base], 3)}
            runs.append(run)
            progress.step(f"K = {k}, GP seed {g}: held-out " + ", ".join(f"{n} {v:.2f} dB" for n, v in psnrs.items())
                          + "; search loss " + ", ".join(f"{n} {v:.4g}" for n, v in run["loss"].items()) + "; picks "
                          + ", ".join(f"{r}: {p['forecaster']}" for r, p in run["picks"].items()))
    out = {"budget": a.budget, "gp_seeds": gp_seeds, "runs": runs, "rules": {}}
    for rule in rules():
        gains = [r["picks"][rule]["gain_db"] for r in runs]
        per_k = {str(k): round(statistics.median(r["picks"][rule]["gain_db"] for r in runs if r["K"] == k), 3)
                 for k in a.ks}
        out["rules"][rule] = {"median_gain_db": round(statistics.median(gains), 3), "worst_gain_db": min(gains),
                              "switched": sum(r["picks"][rule]["forecaster"] != r["searched_with"] for r in runs),
                              "median_gain_db_per_k": per_k}
        print(f"rule {rule}: held-out gain over keeping the candidate's forecaster: median "
              f"{statistics.median(gains):+.2f} dB, worst {min(gains):+.2f} dB, switched in "
              f"{out['rules'][rule]['switched']} of {len(runs)}; per K (median) " +
              ", ".join(f"K={k}: {v:+.2f}" for k, v in per_k.items()), flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.forecaster_check"))
