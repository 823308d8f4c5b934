"""Which polished masks the final choice should keep (search/paired.py CHAIN_Z, applied in search/choice.py), measured.

A chain of accepted polish moves (each kept because both halves of the seeds improved) may replace the best start
mask without the full noise margin (2 paired standard errors when this bench ran, and here; bench/choice_regret.py set
the final choice's own margin to 0 since) when it beats it by CHAIN_Z of them. On the reference model (N = 30, the
profile-fitted forecaster, objective 1 − SSIM), for each K, budget and GP seed, the search runs once with polish and
once without (polish_share 0); its final choice is recomputed from the same state with CHAIN_Z = 0 (any verified
chain), 1 and ∞ (the noise margin only), and each choice is sampled on held-out seeds (PSNR
dB against full compute). Prints the median over GP seeds of each rule's gain over the search without polish, and for
every run the chosen chain's z (its paired gain over the fallback in standard errors).

    python -m gcache.bench.polish_choice --budget 48          # about 20 min on one CPU core
    python -m gcache.bench.polish_choice --budget 64

Ends with one JSON line.
"""
from __future__ import annotations

import json
import math
import statistics
import sys

from .cli import BenchParser, Progress, run_main, seed_text, whole


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.polish_choice", __doc__)
    ap.add_argument("--ks", type=whole(2), nargs="+", default=[6, 8, 10, 15, 20])
    ap.add_argument("--budget", type=whole(1), default=64)
    ap.add_argument("--gp-seeds", type=seed_text, default="0-2")
    ap.add_argument("--search-seeds", type=seed_text, default="1000-1015")
    ap.add_argument("--eval-seeds", type=seed_text, default="0-31")
    ap.add_argument("--threads", type=whole(1), default=1)
    a = ap.parse_args(argv)
    if any(k >= 30 for k in a.ks):
        ap.error(f"--ks {' '.join(map(str, a.ks))}: every K must be below the 30 steps this bench samples")
    from ..core import forecasters
    from ..reference_model.harness import ReferenceHarness
    from ..search.loop import run_search
    from ..search import paired
    from ..search.choice import choose
    from ..search.paired import paired_difference
    from ..search.infra.cli import parse_seeds, set_threads
    from ..search.config import SearchConfig
    from ..search.infra.objectives import make_objective, psnr
    from ..search.state import forecaster_of, mask_of
    set_threads(a.threads)
    h = ReferenceHarness(30)
    search_seeds, eval_seeds, gp_seeds = parse_seeds(a.search_seeds), parse_seeds(a.eval_seeds), parse_seeds(a.gp_seeds)
    profile = h.profile(search_seeds, forecast=True)
    fc = forecasters.get("fitted")
    evaluate = h.evaluator(search_seeds, make_objective("ssim"), forecast=fc.name, profile=profile)
    ref, held = h.full(eval_seeds), {}

    def held_out(key: str) -> float:  # a candidate key (search/state.py): its mask under its forecaster
        if key not in held:
            mask, name = mask_of(key), forecaster_of(key, fc.name)
            img, _ = h.run(eval_seeds, mask, forecast=name, forecast_params=forecasters.get(name).fit(profile, mask))
            held[key] = round(psnr(img, ref), 3)
        return held[key]

    rules = {"0": 0.0, "1": 1.0, "inf": math.inf}
    runs = []
    progress = Progress(len(a.ks) * len(gp_seeds), "polish choice: (K, GP seed) pairs, 2 searches each",
                        expected_s=1200.0 * len(a.ks) * len(gp_seeds) * a.budget / 48 / 15)
    for k in a.ks:
        for g in gp_seeds:
            cfg = dict(k=k, budget=a.budget, seed=g, objective="ssim", forecast=fc.name)
            base = run_search(profile, SearchConfig(**cfg, polish_share=0.0), evaluate)
            res = run_search(profile, SearchConfig(**cfg), evaluate)
            state = res.state
            fallback = state.best(kinds=("instant",))
            run = {"K": k, "gp_seed": g, "no_polish": held_out("".join(map(str, base.policy.mask))), "rules": {}}
            for name, z in rules.items():
                chosen = choose(state, rule=paired.beyond_z(2.0), chain=paired.beyond_z(z)).entry
                gain = paired_difference(state.masks[chosen["mask"]].get("per_seed"),
                                         state.masks[fallback["mask"]].get("per_seed"))
                run["rules"][name] = {"psnr": held_out(chosen["mask"]), "kind": chosen.get("kind", "final"),
                                      "z": round(-gain["mean"] / gain["se"], 2) if gain and gain["se"] else None}
            runs.append(run)
            progress.step(f"K = {k}, GP seed {g}: no polish {run['no_polish']:.2f} dB; " + "; ".join(
                f"CHAIN_Z {n}: {r['psnr']:.2f} dB ({r['kind']}, z {r['z']})" for n, r in run["rules"].items()))
    out = {"budget": a.budget, "gp_seeds": gp_seeds, "runs": runs, "median_gain_db": {}}
    for name in rules:
        out["median_gain_db"][name] = {str(k): round(statistics.median(
            r["rules"][name]["psnr"] - r["no_polish"] for r in runs if r["K"] == k), 3) for k in a.ks}
        print(f"CHAIN_Z {name}: median gain over no polish " + ", ".join(
            f"K={k}: {v:+.2f}" for k, v in out["median_gain_db"][name].items()))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.polish_choice"))
