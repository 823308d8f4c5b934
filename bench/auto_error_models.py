"""Which error model's mask should GCache Apply (auto) apply its forecaster on, and should it pick the error model by
the held-out bound? Auto chooses a forecaster by the held-out bound (search/instant.py choose_forecaster) and applies
it on the mask of search/instant.py auto_error_model (AUTO_ERROR_MODEL, the reuse DP's mask, where it applies).

On the reference model (euler, shift 2, CFG 3), one profiled batch of 8 seeds per N, K at 5x, ~3.75x, 3x, 2x, 1.5x:
each (forecaster, error model) instant theory-DP policy (search/error_models.py) is sampled on 16 held-out seeds,
PSNR dB against full compute. Per (N, K):
- "auto": what GCache Apply (auto) applies (search/instant.py auto_policy with choose_forecaster's pick);
- "own_dp": the same forecaster on its own DP's mask (error model mean_abs);
- "by_bound": the (forecaster, error model) with the lowest held-out bound among every candidate;
- model_minus_own_dp_db: auto's forecaster on each error model's mask, minus its own DP's mask;
- "own_masks_by_bound": auto's policy or a candidate forecaster's own instant policy (its own DP's mask), whichever
  has the lowest held-out bound: would auto gain by letting the bound pick another forecaster's own policy where the
  profile says it beats auto's? (own_masks_by_bound_minus_auto: kept out of auto unless it wins at the median and never
  loses more than 1 dB.)

    python -m gcache.bench.auto_error_models          # about 6 min on one CPU core

Ends with one JSON line.
"""
from __future__ import annotations

import json
import statistics
import sys

from .cli import BenchParser, Progress, run_main, seed_text, whole


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.auto_error_models", __doc__)
    ap.add_argument("--steps", type=whole(4), nargs="+", default=[20, 30, 50])
    ap.add_argument("--eval-seeds", type=seed_text, default="0-15")
    ap.add_argument("--threads", type=whole(1), default=1)
    a = ap.parse_args(argv)
    import numpy as np

    from ..core import forecasters
    from ..reference_model.harness import ReferenceHarness
    from ..search import error_models
    from ..search.infra.cli import parse_seeds, set_threads
    from ..search.infra.objectives import psnr
    from ..search.instant import (
        _bound,
        auto_candidates,
        auto_error_model,
        choose_forecaster,
        instant_policy,
        propagation_weights,
    )
    from .quality import ks_of
    set_threads(a.threads)
    seeds = parse_seeds(a.eval_seeds)
    out = {"rows": []}
    progress = Progress(sum(len(ks_of(n)) for n in a.steps), "auto's error model: (N, K) pairs",
                        expected_s=0.16 * sum(n * len(ks_of(n)) for n in a.steps) * 5)
    for n in a.steps:
        h = ReferenceHarness(n)
        prof = h.profile(list(range(1000, 1008)), forecast=True)
        ref, st = h.full(seeds), prof.fit_stats()
        ew = np.exp(propagation_weights(prof, "theory"))
        for k in ks_of(n):
            cand = {}
            for fc in auto_candidates():
                for model in error_models.ERROR_MODELS:
                    if not error_models.applies(model, forecasters.get(fc)):
                        continue
                    pol = instant_policy(prof, k, "theory", forecast=fc, error_model=model)
                    c_of = forecasters.get(fc).two_step_c  # fitted on the other fold, as forecaster_scores judges
                    bound = float(np.mean([_bound(pol.mask, np.sqrt(st.sq_of(f)), st.rms(c_of(prof, st, 1 - f), f), ew)
                                           for f in (0, 1)]))
                    img, _ = h.run(seeds, pol.mask, forecast=fc, forecast_params=pol.forecast_params)
                    # three decimals, as bench/quality.py stores the same PSNR: one figure, one value on every page
                    cand[f"{fc}/{model}"] = {"bound": bound, "psnr": round(psnr(img, ref), 3)}
            pick = choose_forecaster(prof, k)[0]
            auto, own = f"{pick}/{auto_error_model(pick)}", f"{pick}/{error_models.DEFAULT}"
            by_bound = min(cand, key=lambda c: cand[c]["bound"])
            own_masks = [auto] + [f"{fc}/{error_models.DEFAULT}" for fc in auto_candidates()]
            by_bound_own = min(own_masks, key=lambda c: (cand[c]["bound"], c != auto))  # ties: auto's
            row = {"N": n, "K": k, "auto": auto, "auto_psnr": cand[auto]["psnr"], "own_dp": own,
                   "own_dp_psnr": cand[own]["psnr"], "by_bound": by_bound, "by_bound_psnr": cand[by_bound]["psnr"],
                   "best": max(cand, key=lambda c: cand[c]["psnr"]), "candidates": cand}
            row["auto_minus_own_dp_db"] = round(row["auto_psnr"] - row["own_dp_psnr"], 2)
            row["by_bound_minus_auto_db"] = round(row["by_bound_psnr"] - row["auto_psnr"], 2)
            row["own_masks_by_bound"] = by_bound_own
            row["own_masks_by_bound_minus_auto_db"] = round(cand[by_bound_own]["psnr"] - row["auto_psnr"], 2)
            row["model_minus_own_dp_db"] = {m: round(cand[f"{pick}/{m}"]["psnr"] - row["own_dp_psnr"], 2)
                                            for m in error_models.ERROR_MODELS if f"{pick}/{m}" in cand}
            out["rows"].append(row)
            progress.step(f"N = {n}, K = {k}: auto {auto} {row['auto_psnr']} dB; on its own DP mask {own} "
                          f"{row['own_dp_psnr']} dB ({row['auto_minus_own_dp_db']:+.2f}); lowest bound {by_bound} "
                          f"{row['by_bound_psnr']} dB; best on held-out seeds {row['best']} "
                          f"{cand[row['best']]['psnr']} dB")
    out["auto_minus_own_dp"] = summary([r["auto_minus_own_dp_db"] for r in out["rows"]])
    out["by_bound_minus_auto"] = summary([r["by_bound_minus_auto_db"] for r in out["rows"]])
    print(f"auto's mask − the forecaster's own DP mask: {describe(out['auto_minus_own_dp'])}")
    print(f"picking (forecaster, error model) by the held-out bound − auto: {describe(out['by_bound_minus_auto'])}")
    out["own_masks_by_bound_minus_auto"] = summary([r["own_masks_by_bound_minus_auto_db"] for r in out["rows"]])
    s = out["own_masks_by_bound_minus_auto"]
    out["own_masks_by_bound_keep"] = s["median"] > 0 and s["min"] >= -1.0  # the rule for changing auto
    print(f"auto's policy or a candidate's own instant policy, by the held-out bound − auto: {describe(s)}; "
          + ("it wins at the median and never loses more than 1 dB" if out["own_masks_by_bound_keep"] else
             "auto stays as it is (the rule: a median win and no loss beyond 1 dB)"))
    out["model_minus_own_dp"] = {}
    for m in error_models.ERROR_MODELS:
        d = [r["model_minus_own_dp_db"][m] for r in out["rows"] if m in r["model_minus_own_dp_db"]]
        if d:
            out["model_minus_own_dp"][m] = summary(d)
            print(f"auto's forecaster on the {m} masks − on its own DP's: {describe(out['model_minus_own_dp'][m])}")
    print(json.dumps(out))
    return out


def summary(d: list) -> dict:
    worst = min(range(len(d)), key=lambda i: d[i])
    return {"median": statistics.median(d), "better": sum(v > 0 for v in d), "worse": sum(v < 0 for v in d),
            "of": len(d), "min": min(d), "max": max(d), "argmin": worst}


def describe(s: dict) -> str:
    return (f"median {s['median']:+.2f} dB, better at {s['better']} and worse at {s['worse']} of {s['of']} (N, K) "
            f"(from {s['min']:+.2f} to {s['max']:+.2f})")


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.auto_error_models"))
