"""How much of a search's budget the polish stage should get (SearchConfig.polish_share), measured.

On the reference model (N = 30, euler, shift 2, CFG 3) the profile and the search use the search seeds; for each K,
each polish share and each GP seed (SearchConfig.seed) the search runs with the same budget, and its policy is
sampled on held-out seeds: PSNR dB against full compute. The share 0 is the GP-only search. Prints, per K and
share, the median over GP seeds of the held-out PSNR and of its gain over share 0, and the share with the best median
gain over the Ks (ties: the smaller share).

    python -m gcache.bench.polish_split                      # about 50 min on one CPU core
    python -m gcache.bench.polish_split --ks 10 --gp-seeds 0-1 --shares 0 0.5
    python -m gcache.bench.polish_split --shares 0 0.5 --order seeded   # the moves of a ring in a seeded order

Ends with one JSON line.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from .cli import BenchParser, Progress, number, run_main, seed_text, whole


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.polish_split", __doc__)
    ap.add_argument("--steps", type=whole(4), default=30)
    ap.add_argument("--ks", type=whole(2), nargs="+", default=[6, 8, 10, 15, 20])
    ap.add_argument("--shares", type=number(0.0, 1.0), nargs="+", default=[0.0, 0.25, 0.5, 0.75])
    ap.add_argument("--budget", type=whole(1), default=64, help="evaluations per search (GCache Search's default)")
    ap.add_argument("--gp-seeds", type=seed_text, default="0-3", help="SearchConfig.seed of each repetition")
    ap.add_argument("--forecast", default="fitted", help="the forecaster masks are judged with (auto's pick here)")
    ap.add_argument("--order", default="bound", choices=("bound", "seeded"), help="SearchConfig.polish_order")
    ap.add_argument("--objective", default="ssim", choices=("ssim", "psnr", "lpips_ssim"))
    ap.add_argument("--search-seeds", type=seed_text, default="1000-1015")
    ap.add_argument("--eval-seeds", type=seed_text, default="0-31")
    ap.add_argument("--threads", type=whole(1), default=1)
    a = ap.parse_args(argv)
    if any(k >= a.steps for k in a.ks):
        ap.error(f"--ks {' '.join(map(str, a.ks))}: every K must be below --steps {a.steps}")
    from ..core import forecasters as registry
    if a.forecast not in registry.names():
        ap.error(f"--forecast {a.forecast}: one of {', '.join(registry.names())}")
    from ..core import forecasters
    from ..reference_model.harness import ReferenceHarness
    from ..search.config import SearchConfig
    from ..search.infra.cli import parse_seeds, set_threads
    from ..search.infra.objectives import make_objective, psnr
    from ..search.loop import run_search
    set_threads(a.threads)
    t0 = time.time()
    h = ReferenceHarness(a.steps)
    search_seeds, eval_seeds, gp_seeds = parse_seeds(a.search_seeds), parse_seeds(a.eval_seeds), parse_seeds(a.gp_seeds)
    profile = h.profile(search_seeds, forecast=True)
    fc = forecasters.get(a.forecast)
    evaluate = h.evaluator(search_seeds, make_objective(a.objective), forecast=fc.name, profile=profile)
    ref, held = h.full(eval_seeds), {}

    def held_out(mask) -> float:
        key = "".join(map(str, mask))
        if key not in held:
            img, _ = h.run(eval_seeds, list(mask), forecast=fc.name, forecast_params=fc.fit(profile, list(mask)))
            held[key] = psnr(img, ref)
        return held[key]

    table = {}
    progress = Progress(len(a.ks) * len(gp_seeds), "polish split: (K, GP seed) pairs",
                        expected_s=3000.0 * len(a.ks) * len(gp_seeds) * len(a.shares) / 80)
    for k in a.ks:
        for g in gp_seeds:
            for share in a.shares:
                cfg = SearchConfig(k=k, budget=a.budget, seed=g, objective=a.objective, forecast=fc.name,
                                   polish_share=share, polish_order=a.order)
                res = run_search(profile, cfg, evaluate)
                table.setdefault(k, {}).setdefault(share, []).append(
                    {"gp_seed": g, "psnr": round(held_out(res.policy.mask), 3), "loss": res.policy.metrics["loss"],
                     "won": res.policy.provenance["won"], "accepted": res.policy.provenance["polish"]["accepted"]})
            progress.step(f"K = {k}, GP seed {g}: " + ", ".join(
                f"share {s}: {table[k][s][-1]['psnr']:.2f} dB ({table[k][s][-1]['won']})" for s in a.shares))
    out = {"N": a.steps, "budget": a.budget, "forecast": fc.name, "order": a.order, "gp_seeds": gp_seeds, "rows": [],
           "median_gain": {}}
    print(f"\nmedian over {len(gp_seeds)} GP seeds: held-out PSNR dB (gain over the GP-only search, paired by seed)")
    for share in a.shares:
        gains = []
        cells = []
        for k in a.ks:
            base = {r["gp_seed"]: r["psnr"] for r in table[k][a.shares[0]]}
            g = statistics.median(r["psnr"] - base[r["gp_seed"]] for r in table[k][share])
            m = statistics.median(r["psnr"] for r in table[k][share])
            gains.append(g)
            cells.append(f"K={k}: {m:.2f} ({g:+.2f})")
            out["rows"].append({"K": k, "share": share, "median_psnr": round(m, 3), "median_gain": round(g, 3),
                                "runs": table[k][share]})
        out["median_gain"][str(share)] = {"median_over_k": round(statistics.median(gains), 3),
                                          "min_over_k": round(min(gains), 3)}
        print(f"  share {share}: " + "; ".join(cells) + f" | median gain {statistics.median(gains):+.2f}, "
              f"smallest {min(gains):+.2f}")
    best = max(a.shares, key=lambda s: (out["median_gain"][str(s)]["median_over_k"], -s))
    out["best_share"] = best
    out["wall_s"] = round(time.time() - t0, 1)
    print(f"best share by the median gain over K: {best}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.polish_split"))
