"""Quality at equal K on the reference model: GCache (DP + GP-LCB) against the baselines, and the search cost.

For N in {30 (, 50)} and K in {N/3, N/2, 2N/3}: every method gives a policy with exactly K computed steps;
we sample held-out seeds under it and report PSNR / SSIM (and LPIPS when its backbone is present) against
full compute with the same seeds. The profile and the search use other seeds (--search-seeds).
Also: search evaluations (distinct masks), wall time, GP seconds per iteration at the end, and how many
evaluations the search needed to come within 0.3 dB (held-out PSNR) of its full-budget result.
`--gp-n 500` times the GP step at n = 500 observations (cold fit with restarts vs warm start, side by side).

    python -m gcache.bench.quality --quick          # ~10 min on 2 CPU cores
    python -m gcache.bench.quality --steps 30 50 --budget 200

Ends with one JSON line (the last N run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import warnings

import numpy as np

METHODS = ("uniform", "teacache", "local_dp", "theory_dp", "instant_1batch", "instant_1sample", "gcache",
           "forecast_on_gcache_mask", "instant_linear", "instant_fitted", "instant_auto", "gcache_forecast")
ONE_BATCH = 8  # samples in "one profiled batch" (instant_1batch); instant_1sample profiles a single seed


def held_out(h, mask, seeds, lpips_net=None, forecast="reuse", params=None) -> dict:
    from ..search.objectives import lpips_distance, psnr, ssim
    ref = h.full(seeds)
    img, _ = h.run(seeds, list(mask), forecast=forecast, forecast_params=params)
    per_image = [psnr(img[i:i + 1], ref[i:i + 1]) for i in range(len(seeds))]
    out = {"psnr": psnr(img, ref), "ssim": ssim(img, ref), "psnr_per_image": per_image}
    if lpips_net is not None:
        out["lpips"] = lpips_distance(img, ref, lpips_net)
    return out


def convergence(res, h, seeds, final_psnr: float, tol: float = 0.3) -> int:
    """Evaluations (distinct masks) after which the best-so-far mask's held-out PSNR is within tol of the final."""
    best, seen, cache = None, set(), {}
    for e in res.history:
        seen.add(e["mask"])
        if best is None or e["loss"] < best["loss"]:
            best = e
        if best["mask"] not in cache:
            cache[best["mask"]] = held_out(h, [int(c) for c in best["mask"]], seeds)["psnr"]
        if cache[best["mask"]] >= final_psnr - tol:
            return len(seen)
    return len(seen) + 1  # only the final argmin-μ mask reached it


def gp_timing(n: int, dim: int = 4, iters: int = 10) -> dict:
    """Seconds per GP step (fit + LCB minimization) near n observations, warm-started as in the search
    (hyperparameters re-optimized every 5th step, frozen otherwise), and one cold fit, side by side."""
    from ..search.gp import GPLCB
    rng = np.random.default_rng(0)
    S = rng.random((n + iters, dim)) * 10
    y = np.round(((S - 3) ** 2).sum(1) / 100, 2) + 0.01 * rng.standard_normal(n + iters)  # piecewise flat, like masks
    from sklearn.gaussian_process import GaussianProcessRegressor
    from ..search.gp import _kernel
    gp = GPLCB(dim, 0.0, 10.0, seed=0, cold_every=0)
    t0 = time.perf_counter()  # the plain way: sklearn's default optimizer with 2 restarts, every iteration
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hyperparameters at their bounds: expected for this synthetic loss
        GaussianProcessRegressor(_kernel(dim), normalize_y=True, n_restarts_optimizer=2, random_state=0).fit(S[:n] / 10,
                                                                                                           y[:n])
    plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    theta = gp.fit(S[:n], y[:n], None)
    cold = time.perf_counter() - t0
    fits, acqs = [], []
    for j in range(1, iters + 1):
        t0 = time.perf_counter()
        theta = gp.fit(S[: n + j], y[: n + j], theta)
        t1 = time.perf_counter()
        gp.minimize_acq(2.0, j)
        fits.append(t1 - t0)
        acqs.append(time.perf_counter() - t1)
    steps = [f + a for f, a in zip(fits, acqs)]
    return {"n": n, "plain_refit_restarts2_s": round(plain, 3), "cold_fit_s": round(cold, 3), "step_median_s": round(statistics.median(steps), 3),
            "step_mean_s": round(statistics.mean(steps), 3), "fit_max_s": round(max(fits), 3),
            "acq_median_s": round(statistics.median(acqs), 3)}


def run_n(n_steps, args, objective, lpips_net, harness_factory=None) -> dict:
    from ..reference_model.harness import ReferenceHarness
    from ..search.baselines import all_baselines
    from ..search.bilevel import SearchConfig, run_search
    from ..search.cli import parse_seeds
    from ..search.instant import choose_forecaster, instant_policy
    h = harness_factory(n_steps) if harness_factory else ReferenceHarness(n_steps)
    search_seeds, eval_seeds = parse_seeds(args.search_seeds), parse_seeds(args.eval_seeds)
    profile = h.profile(search_seeds, forecast=True)  # E, E1 and the fit statistics
    # instant policies from less: one batch of the search seeds (recorded as GCache Apply auto records it, with what
    # forecasting needs), and a single seed
    one_batch = h.profile(search_seeds[:ONE_BATCH], forecast=True)
    small = {"instant_1batch": one_batch, "instant_1sample": h.profile(search_seeds[:1])}
    auto_forecaster = {}
    h.full(eval_seeds)
    rows, cost = [], []
    ks = sorted({max(1, n_steps // 3), n_steps // 2, (2 * n_steps) // 3})
    for k in ks:
        for name, pol in all_baselines(profile, k).items():
            rows.append({"K": k, "method": name, **held_out(h, pol.mask, eval_seeds, lpips_net), "mask": pol.describe()})
        for name, prof in small.items():
            pol = instant_policy(prof, k, "theory")
            rows.append({"K": k, "method": name, **held_out(h, pol.mask, eval_seeds, lpips_net), "mask": pol.describe()})
        # the instant forecast policies from one batch: linear, profile-fitted, and what Apply auto picks
        auto_forecaster[k] = choose_forecaster(one_batch, k)[0]
        for name, fc in (("instant_linear", "linear"), ("instant_fitted", "fitted"),
                         ("instant_auto", auto_forecaster[k])):
            pol = instant_policy(one_batch, k, "theory", forecast=fc)
            rows.append({"K": k, "method": name, "mask": pol.describe(), "forecaster": fc,
                         **held_out(h, pol.mask, eval_seeds, lpips_net, fc, pol.forecast_params)})
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            cfg = SearchConfig(k=k, degree=args.degree, budget=args.budget, seed=args.seed, objective=objective.name)
            res = run_search(profile, cfg, h.evaluator(search_seeds, objective), state_path=os.path.join(tmp, "s.json"),
                             provenance={"seeds": search_seeds})
        wall = time.time() - t0
        m = held_out(h, res.policy.mask, eval_seeds, lpips_net)
        rows.append({"K": k, "method": "gcache", **m, "mask": res.policy.describe()})
        # forecasting: linear on the reuse search's mask, and searched with the forecaster auto picks (masks judged
        # under it; seeded with the reuse-optimal mask too)
        rows.append({"K": k, "method": "forecast_on_gcache_mask", "mask": res.policy.describe(),
                     **held_out(h, res.policy.mask, eval_seeds, lpips_net, "linear")})
        fc = auto_forecaster[k]
        with tempfile.TemporaryDirectory() as tmp:
            fcfg = SearchConfig(k=k, degree=args.degree, budget=args.budget, seed=args.seed, objective=objective.name,
                                forecast=fc)
            fres = run_search(profile, fcfg, h.evaluator(search_seeds, objective, forecast=fc, profile=profile),
                              state_path=os.path.join(tmp, "s.json"), provenance={"seeds": search_seeds},
                              extra_masks=[("reuse_search", res.policy.mask)])  # the reuse-optimal mask too
        rows.append({"K": k, "method": "gcache_forecast", "mask": fres.policy.describe(), "forecaster": fc,
                     **held_out(h, fres.policy.mask, eval_seeds, lpips_net, fc, fres.policy.forecast_params)})
        gp_secs = [e["gp_seconds"] for e in res.history if e["gp_seconds"] is not None]
        mu = held_out(h, res.mu_mask, eval_seeds)["psnr"]
        bst = held_out(h, res.best_mask, eval_seeds)["psnr"]
        cost.append({"K": k, "evaluations": len(res.history) + 1, "sampling_runs": res.evaluations,
                     "wall_s": round(wall, 1),
                     "gp_s_per_iter_end": round(statistics.median(gp_secs[-5:]), 3) if gp_secs else None,
                     "chosen": res.policy.provenance["chosen"], "won": res.policy.provenance["won"],
                     "s": None if res.s_best is None else [round(v, 2) for v in res.s_best],
                     "search_loss": res.policy.metrics["loss"], "psnr_mu_mask": mu, "psnr_best_mask": bst,
                     "evals_to_0.3dB": convergence(res, h, eval_seeds, m["psnr"])})
    return {"N": n_steps, "rows": rows, "cost": cost, "ks": ks, "auto_forecaster": auto_forecaster}


def report(out: dict, objective_name: str, lpips: bool) -> dict:
    n, rows, cost = out["N"], out["rows"], out["cost"]
    print(f"\nN = {n}: held-out PSNR / SSIM{' / LPIPS' if lpips else ''} vs full compute (search objective: "
          f"{objective_name})")
    print(f"{'K':>3} {'method':<10} {'PSNR dB':>8} {'SSIM':>7}{' LPIPS' if lpips else ''}  mask")
    for r in rows:
        lp = f" {r['lpips']:.4f}" if lpips else ""
        fc = f" ({r['forecaster']})" if r.get("forecaster") else ""
        print(f"{r['K']:>3} {r['method'] + fc:<32} {r['psnr']:8.2f} {r['ssim']:7.4f}{lp}  {r['mask']}")
    print("search cost per K:")
    for c in cost:
        print("  " + ", ".join(f"{k}={v}" for k, v in c.items()))
    half = n // 2
    at_half = {r["method"]: r["psnr"] for r in rows if r["K"] == half}
    reusing = ("uniform", "teacache", "local_dp", "theory_dp", "instant_1batch", "instant_1sample")  # no forecasting
    rival = max(reusing, key=lambda m: at_half[m])
    margin = at_half["gcache"] - at_half[rival]
    per = {r["method"]: np.array(r["psnr_per_image"]) for r in rows if r["K"] == half}
    diff = per["gcache"] - per[rival]  # paired over the held-out seeds: how much of the margin is seed noise
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    best_everywhere = all(max((r for r in rows if r["K"] == k and r["method"] in reusing + ("gcache",)),
                              key=lambda r: r["psnr"])["method"] == "gcache" for k in out["ks"])
    print(f"GCache (reuse) best of the reusing methods at every K: {best_everywhere}; GCache − best baseline ({rival}) "
          f"at K = N/2: {margin:+.2f} dB "
          f"(paired standard error over {len(diff)} held-out seeds: {se:.2f} dB)")
    # the (reuse) search against the best of everything else that reuses (instant, baselines), at every K; and
    # forecasting against reuse, both searched
    vs_best, gain, inst_gain, fit_gain = {}, {}, {}, {}
    for k in out["ks"]:
        at_k = {r["method"]: r["psnr"] for r in rows if r["K"] == k}
        vs_best[str(k)] = round(at_k["gcache"] - max(at_k[m] for m in reusing), 3)
        gain[str(k)] = round(at_k["gcache_forecast"] - at_k["gcache"], 3)
        inst_gain[str(k)] = round(at_k["instant_auto"] - at_k["instant_1batch"], 3)  # both from one batch
        fit_gain[str(k)] = round(at_k["instant_fitted"] - at_k["instant_linear"], 3)
    third = str(min(out["ks"]))
    print("forecast (auto's forecaster, searched) − reuse (searched), held-out PSNR dB per K: " +
          ", ".join(f"K={k}: {v:+.2f}" for k, v in gain.items()))
    print("instant, one batch: auto's forecaster − reuse: " + ", ".join(f"K={k}: {v:+.2f}" for k, v in inst_gain.items())
          + "; fitted − linear: " + ", ".join(f"K={k}: {v:+.2f}" for k, v in fit_gain.items())
          + "; auto picked " + ", ".join(f"K={k}: {v}" for k, v in out["auto_forecaster"].items()))
    print("GCache − best other method (instant or baseline), held-out PSNR dB per K: " +
          ", ".join(f"K={k}: {v:+.2f}" for k, v in vs_best.items()))
    gp_end = [c["gp_s_per_iter_end"] for c in cost if c["gp_s_per_iter_end"] is not None]
    return {"N": n, "rows": [{"K": r["K"], "method": r["method"], "psnr": round(r["psnr"], 3),
                              "ssim": round(r["ssim"], 4), **({"lpips": round(r["lpips"], 4)} if lpips else {})}
                             for r in rows],
            "gcache_minus_best_baseline_psnr_at_half": round(margin, 3), "margin_paired_se_db": round(se, 3),
            "search_minus_best_other_psnr": vs_best,
            "forecast_gain_db_at_third": gain[third], "forecast_min_gain_db": min(gain.values()), "forecast_gain_db": gain,
            "instant_forecast_minus_reuse_db": inst_gain, "fitted_minus_linear_db": fit_gain,
            "auto_forecaster": {str(k): v for k, v in out["auto_forecaster"].items()},
            "evaluations": sum(c["evaluations"] for c in cost),
            "gp_seconds_per_iter_at_end": max(gp_end) if gp_end else None, "objective": objective_name,
            "evals_to_within_0.3dB": [c["evals_to_0.3dB"] for c in cost]}


def main(argv=None, harness_factory=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 30, budget 48: ~10 min on 2 cores")
    ap.add_argument("--steps", type=int, nargs="+", default=[30])
    ap.add_argument("--budget", type=int, default=None, help="search iterations per K (default 48 quick, 200 full)")
    ap.add_argument("--degree", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--objective", default="auto", help="auto = lpips_ssim if the LPIPS backbone is present, else ssim")
    ap.add_argument("--search-seeds", default="1000-1015")
    ap.add_argument("--eval-seeds", default="0-15")
    ap.add_argument("--gp-n", type=int, default=0, help="also time one GP step at this many observations (e.g. 500)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    from ..search.cli import set_threads
    from ..search.objectives import lpips_available, load_lpips, make_objective
    set_threads(a.threads)
    if a.quick:
        a.steps = [30]
    a.budget = a.budget or (48 if a.quick else 200)
    name = a.objective if a.objective != "auto" else ("lpips_ssim" if lpips_available() else "ssim")
    objective = make_objective(name)
    lpips_net = load_lpips() if lpips_available() else None
    note = "" if lpips_net is not None else " (LPIPS backbone absent: LPIPS not reported" + \
        (", so the search uses 1 − SSIM)" if a.objective == "auto" else ")")
    print(f"search objective {objective.name}{note}")
    t0 = time.time()
    summary = None
    for n in a.steps:
        summary = report(run_n(n, a, objective, lpips_net, harness_factory), objective.name, lpips_net is not None)
    if a.gp_n:
        timing = gp_timing(a.gp_n)
        print(f"GP at n = {timing['n']}: plain sklearn refit (2 restarts) {timing['plain_refit_restarts2_s']} s | "
              f"our cold fit {timing['cold_fit_s']} s | warm-started steps: median "
              f"{timing['step_median_s']} s, mean {timing['step_mean_s']} s, slowest fit {timing['fit_max_s']} s, "
              f"LCB minimization {timing['acq_median_s']} s (median)")
        summary["gp_timing"] = timing
    summary["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
