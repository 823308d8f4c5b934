"""Should Apply auto pick the error model too? Its choice of forecaster (search/instant.py choose_forecaster) scores
each candidate's instant mask by the held-out bound (fit statistics in two folds). This bench adds the other error
models' masks (search/error_models.py: rms, ls_rms) to the candidates and compares, on held-out seeds, the instant
policy the bound picks with and without them; and, without any choice, auto's forecaster on each model's mask.

On the reference model (euler, shift 2, CFG 3), one profiled batch of 8 seeds per N, K at 5x, ~3.75x, 3x, 2x, 1.5x:
each (forecaster, error model) instant theory-DP policy is sampled on 16 held-out seeds, PSNR dB against full compute.

    python -m gcache.bench.auto_error_models          # ~5 min on one CPU core

Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[20, 30, 50])
    ap.add_argument("--eval-seeds", default="0-15")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    import numpy as np
    from ..reference_model.harness import ReferenceHarness
    from ..search.infra.cli import parse_seeds, set_threads
    from ..core import forecasters
    from ..search import error_models
    from ..search.instant import _bound, auto_candidates, choose_forecaster, instant_policy, propagation_weights
    from ..search.infra.objectives import psnr
    from .quality import ks_of
    set_threads(a.threads)
    seeds = parse_seeds(a.eval_seeds)
    out = {"rows": []}
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
                    cand[f"{fc}/{model}"] = {"bound": bound, "psnr": round(psnr(img, ref), 2)}
            today = choose_forecaster(prof, k)[0] + "/mean_abs"
            with_models = min(cand, key=lambda c: cand[c]["bound"])
            row = {"N": n, "K": k, "today": today, "today_psnr": cand[today]["psnr"], "with_models": with_models,
                   "with_models_psnr": cand[with_models]["psnr"],
                   "best": max(cand, key=lambda c: cand[c]["psnr"]), "candidates": cand}
            row["gain_db"] = round(row["with_models_psnr"] - row["today_psnr"], 2)
            # auto's forecaster, each error model's mask instead of the mean-|error| one (no choice by the bound)
            fc_today = today.split("/")[0]
            row["model_minus_today_db"] = {m: round(cand[f"{fc_today}/{m}"]["psnr"] - row["today_psnr"], 2)
                                           for m in error_models.ERROR_MODELS if f"{fc_today}/{m}" in cand}
            out["rows"].append(row)
            print(f"N = {n}, K = {k}: auto today {today} {row['today_psnr']} dB; with error models {with_models} "
                  f"{row['with_models_psnr']} dB ({row['gain_db']:+.2f}); best on held-out seeds {row['best']} "
                  f"{cand[row['best']]['psnr']} dB", flush=True)
    gains = [r["gain_db"] for r in out["rows"]]
    out["median_gain_db"] = statistics.median(gains)
    out["better"], out["worse"] = sum(g > 0 for g in gains), sum(g < 0 for g in gains)
    print(f"picking the error model by the held-out bound: median {out['median_gain_db']:+.2f} dB, better at "
          f"{out['better']} and worse at {out['worse']} of {len(gains)} (N, K)")
    out["model_minus_today_median_db"] = {}
    for m in error_models.ERROR_MODELS:
        d = [r["model_minus_today_db"][m] for r in out["rows"] if m in r["model_minus_today_db"]]
        if d:
            out["model_minus_today_median_db"][m] = statistics.median(d)
            print(f"auto's forecaster on the {m} masks instead: median {statistics.median(d):+.2f} dB "
                  f"(min {min(d):+.2f}, max {max(d):+.2f}) over {len(d)} (N, K)")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
