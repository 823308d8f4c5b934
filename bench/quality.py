"""Quality at equal K on the reference model: GCache (DP + GP-LCB + polish) against the baselines and today's rival
forecasters, and the search cost.

For N in {30 (, 50)} and K in {N/5, 4N/15, N/3, N/2, 2N/3} (6, 8, 10, 15, 20 of 30: 4-5x down to 1.5x): every
method gives a policy with exactly K computed steps; we sample held-out seeds under it and report PSNR / SSIM (and
LPIPS when its backbone is present) against full compute with the same seeds. The profile and the search use other
seeds (--search-seeds).

Rows per K: the baselines (uniform, TeaCache-like, local DP, theory DP), instant policies (reuse from one batch /
one sample; linear, fitted, fitted with the RMS error model, and auto's pick; every other forecaster of
core/forecasters on its own DP mask, instant_<name>, and every forecaster on auto's mask, <name>_auto_mask: the
rows a forecast search must not fall below), the reuse search (gcache), linear on
its mask, the search with auto's forecaster (gcache_forecast: its mask under the forecaster its forecaster check
chose; the same search without polish: gcache_forecast_nopolish; its mask under auto's forecaster, i.e. without the
check: gcache_forecast_unchecked), the fitted forecaster on the uniform mask, and the rivals (bench/rivals.py: spectrum,
spectrum_mix, l2p_all over every computed residual) and GCache's l2p forecaster (its last 4; core/forecasters/l2p.py)
on the uniform mask (as they ship) and on gcache_forecast's mask (rival_minus_fitted_db: against
gcache_forecast_unchecked there).

polish_gain_db: per K, the median over --gp-seeds (SearchConfig.seed) of the held-out PSNR of the forecast search with
polish minus the same search without it (same budget).

Also: what the forecast search spent on other forecasters (its start masks applied with another forecaster, the
forecaster check's evaluations after the budget) and the least budget with and without those start masks; search
evaluations (distinct masks), wall time, GP seconds per iteration at the end, and how many evaluations
the reuse search needed to come within 0.3 dB (held-out PSNR) of its full-budget result. `--gp-n 500` times the GP
step at n = 500 observations (cold fit with restarts vs warm start, side by side).

    python -m gcache.bench.quality --quick          # N = 30, budget 48, GP seeds 0-2: about 20 min on one CPU core
    python -m gcache.bench.quality                  # N = 30, budget 64, GP seeds 0-4
    python -m gcache.bench.quality --steps 30 50 --budget 200

Ends with one JSON line (the last N run).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

from .cli import BenchParser, Progress, run_main, seed_text, whole

RIVALS = ("spectrum", "spectrum_mix", "l2p", "l2p_all")


def shipped() -> list[str]:
    """GCache's own forecasters (core/forecasters/), not the rivals bench/rivals.py registers for its rows."""
    from ..core import forecasters
    return [n for n in forecasters.names()
            if type(forecasters.get(n)).__module__.startswith(forecasters.__name__ + ".")]


# every forecaster's instant policy on its own DP mask (reuse's is instant_1batch; linear's and fitted's were rows
# already), and every forecaster on auto's mask: the rows the forecast search must not fall below
def _forecasts(name: str) -> bool:
    from ..core import forecasters
    return forecasters.get(name).forecasts


OWN_MASK = tuple(f"instant_{n}" for n in shipped() if _forecasts(n))
ON_AUTO_MASK = tuple(f"{n}_auto_mask" for n in shipped())
METHODS = tuple(dict.fromkeys(
    ("uniform", "teacache", "local_dp", "theory_dp", "instant_1batch", "instant_1sample", "gcache",
     "forecast_on_gcache_mask", "instant_linear", "instant_fitted", "instant_fitted_rms", "instant_auto")
    + OWN_MASK + ON_AUTO_MASK
    + ("gcache_forecast", "gcache_forecast_nopolish", "gcache_forecast_unchecked", "fitted_uniform")
    + tuple(f"{r}_{m}" for r in RIVALS for m in ("uniform", "gcache_mask"))))
SEARCHES = ("gcache", "gcache_forecast", "gcache_forecast_nopolish", "gcache_forecast_unchecked")
REUSING = ("uniform", "teacache", "local_dp", "theory_dp", "instant_1batch", "instant_1sample")  # no forecasting
ONE_BATCH = 8  # samples in "one profiled batch" (instant_1batch); instant_1sample profiles a single seed


def ks_of(n: int) -> list[int]:
    """4-5x, ~3.75x, 3x, 2x and 1.5x of N computed steps (at least 2: K = 1 has one mask)."""
    return sorted({max(2, round(n / 5)), max(2, round(4 * n / 15)), n // 3, n // 2, (2 * n) // 3})


def held_out(h, mask, seeds, lpips_net=None, forecast="reuse", params=None) -> dict:
    from ..search.infra.objectives import lpips_distance, psnr, ssim
    ref = h.full(seeds)
    img, _ = h.run(seeds, list(mask), forecast=forecast, forecast_params=params)
    per_image = [psnr(img[i:i + 1], ref[i:i + 1]) for i in range(len(seeds))]
    out = {"psnr": psnr(img, ref), "ssim": ssim(img, ref), "psnr_per_image": per_image}
    if lpips_net is not None:
        out["lpips"] = lpips_distance(img, ref, lpips_net)
    return out


def convergence(res, h, seeds, final_psnr: float, tol: float = 0.3) -> int:
    """Evaluations (distinct masks) after which the best-so-far mask's held-out PSNR is within tol of the final."""
    from ..search.state import mask_of
    best, seen, cache = None, set(), {}
    for e in res.history:
        seen.add(e["mask"])
        if best is None or e["loss"] < best["loss"]:
            best = e
        if best["mask"] not in cache:
            cache[best["mask"]] = held_out(h, mask_of(best["mask"]), seeds)["psnr"]  # a reuse search: reuse
        if cache[best["mask"]] >= final_psnr - tol:
            return len(seen)
    return len(seen) + 1  # only the final argmin-μ mask reached it


def forecast_cost(state) -> dict:
    """What the forecast search spent on other forecasters: its start masks applied with another forecaster than
    its own (search/starts.py), the forecaster check's evaluations after the budget (end_game.py), and the
    final choice's evaluations on the fresh seeds (end_game.py; beside them, one full-compute run per fresh
    seed)."""
    history = state.history
    in_history = {h["mask"] for h in history} | ({state.final["mask"]} if state.final else set())
    return {"start_masks": len(state.starts_names),
            "other_forecaster_starts": sum(h["kind"] == "instant" and "@" in h["mask"] for h in history),
            "check_evaluations": sum(key not in in_history for key in state.masks),
            "fresh_evaluations": len(state.fresh or {})}


def least_useful_budget(degree: int) -> int:
    """The least budget every search of this bench accepts: its reuse search and the forecast search of whichever
    forecaster auto picks (known only after profiling, so the largest over GCache's own forecasters)."""
    from ..search.budget import least_budget
    from ..search.starts import start_count
    return max([least_budget(start_count("reuse", False), degree)]
               + [least_budget(start_count(fc, True), degree) for fc in shipped() if _forecasts(fc)])


def budget_floor(forecast: str, degree: int) -> dict:
    """The least budget of a search of `forecast` on a profile with forecast statistics, with the other
    profile-fitted forecasters' start masks and without them (search/budget.py)."""
    from ..search.budget import least_budget
    from ..search.starts import start_count
    return {"with_other_forecasters": least_budget(start_count(forecast, True), degree),
            "own_start_masks_only": least_budget(start_count(forecast, True, others=False), degree)}


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
    return {"n": n, "plain_refit_restarts2_s": round(plain, 3), "cold_fit_s": round(cold, 3),
            "step_median_s": round(statistics.median(steps), 3),
            "step_mean_s": round(statistics.mean(steps), 3), "fit_max_s": round(max(fits), 3),
            "acq_median_s": round(statistics.median(acqs), 3)}


def run_n(n_steps, args, objective, lpips_net, harness_factory=None) -> dict:
    from ..core import forecasters
    from ..reference_model.harness import ReferenceHarness
    from ..search.baselines import all_baselines, uniform_mask
    from ..search.config import SearchConfig
    from ..search.infra.cli import parse_seeds
    from ..search.instant import auto_policy, choose_forecaster, instant_policy
    from ..search.loop import run_search
    from .rivals import l2p_params, trajectory_gram
    h = harness_factory(n_steps) if harness_factory else ReferenceHarness(n_steps)
    search_seeds, eval_seeds, gp_seeds = (parse_seeds(v) for v in (args.search_seeds, args.eval_seeds, args.gp_seeds))
    profile = h.profile(search_seeds, forecast=True)  # E, E1 and the fit statistics
    gram = trajectory_gram(h, search_seeds)  # L2P's training data: the search seeds' full-compute residuals
    # instant policies from less: one batch of the search seeds (recorded as GCache Apply auto records it, with what
    # forecasting needs), and a single seed
    one_batch = h.profile(search_seeds[:ONE_BATCH], forecast=True)
    small = {"instant_1batch": one_batch, "instant_1sample": h.profile(search_seeds[:1])}
    auto_forecaster = {}
    h.full(eval_seeds)
    rows, cost, polish_runs = [], [], {}

    def row(k, method, mask, fc="reuse", params=None, **extra):
        rows.append({"K": k, "method": method, "mask": "".join("█" if v else "·" for v in mask), **extra,
                     **({"forecaster": fc} if fc != "reuse" else {}),
                     **held_out(h, mask, eval_seeds, lpips_net, fc, params)})
        return rows[-1]

    def search(k, fc, seed, share=None, extra=()):
        kw = {} if share is None else {"polish_share": share}
        cfg = SearchConfig(k=k, degree=args.degree, budget=args.budget, seed=seed, objective=objective.name,
                           forecast=fc, **kw)
        ev = h.evaluator(search_seeds, objective, forecast=fc, profile=profile if fc != "reuse" else None)
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            res = run_search(profile, cfg, ev, state_path=os.path.join(tmp, "s.json"),
                             provenance={"seeds": search_seeds}, extra_masks=extra)
        return res, time.time() - t0

    gp_all = sorted(set(gp_seeds) | {args.seed})
    progress = args.progress(len(ks_of(n_steps)) * (1 + 2 * len(gp_all)), f"N = {n_steps}: searches")
    for k in ks_of(n_steps):
        for name, pol in all_baselines(profile, k).items():
            row(k, name, pol.mask)
        for name, prof in small.items():
            row(k, name, instant_policy(prof, k, "theory").mask)
        # the instant forecast policies from one batch: linear, profile-fitted (both error models), and auto's pick
        auto_forecaster[k] = choose_forecaster(one_batch, k)[0]
        for name, fc, model in (("instant_linear", "linear", "mean_abs"), ("instant_fitted", "fitted", "mean_abs"),
                                ("instant_fitted_rms", "fitted", "rms")):
            pol = instant_policy(one_batch, k, "theory", forecast=fc, error_model=model)
            row(k, name, pol.mask, fc, pol.forecast_params)
        pol = auto_policy(one_batch, k, auto_forecaster[k])  # what GCache Apply (auto) applies: the reuse DP's mask
        row(k, "instant_auto", pol.mask, auto_forecaster[k], pol.forecast_params)
        for name in shipped():  # every forecaster on its own DP mask and on auto's mask
            f = forecasters.get(name)
            if f"instant_{name}" in OWN_MASK and f"instant_{name}" not in {r["method"] for r in rows if r["K"] == k}:
                own = instant_policy(one_batch, k, "theory", forecast=name)
                row(k, f"instant_{name}", own.mask, name, own.forecast_params)
            row(k, f"{name}_auto_mask", pol.mask, name, f.fit(one_batch, pol.mask) if f.forecasts else None)
        res, wall = search(k, "reuse", args.seed)
        m = row(k, "gcache", res.policy.mask, chosen=res.policy.provenance["won"])
        progress.step(f"K = {k}: reuse search {m['psnr']:.2f} dB held-out ({res.policy.provenance['won']})")
        row(k, "forecast_on_gcache_mask", res.policy.mask, "linear")  # linear on the reuse search's mask
        # the search with the forecaster auto picks (masks judged under it), with and without polish, per GP seed
        fc = auto_forecaster[k]
        for g in gp_all:
            for share, tag in ((None, "polish"), (0.0, "nopolish")):
                fres, fwall = search(k, fc, g, share)
                fpol = fres.policy
                # the policy's forecaster: the search's, or the one its forecaster check chose for the mask
                psnr_g = held_out(h, fpol.mask, eval_seeds, None, fpol.forecast, fpol.forecast_params)["psnr"]
                progress.step(f"K = {k}: {fc} search, GP seed {g}, {'with' if tag == 'polish' else 'without'} "
                              f"polish: {psnr_g:.2f} dB held-out ({fpol.forecast}, {fpol.provenance['won']})")
                polish_runs.setdefault(k, {}).setdefault(g, {})[tag] = {
                    "psnr": round(psnr_g, 3), "loss": fpol.metrics["loss"], "won": fpol.provenance["won"],
                    "forecaster": fpol.forecast, "accepted": fpol.provenance["polish"]["accepted"],
                    "wall_s": round(fwall, 1)}
                if g == args.seed:
                    row(k, "gcache_forecast" + ("" if tag == "polish" else "_nopolish"), fpol.mask,
                            fpol.forecast, fpol.forecast_params, chosen=fpol.provenance["won"])
                    if tag == "polish":
                        searched, sstate = fpol, fres.state
        # the searched mask under the search's own forecaster: the search without its forecaster check
        row(k, "gcache_forecast_unchecked", searched.mask, fc, forecasters.get(fc).fit(profile, searched.mask))
        uni = uniform_mask(n_steps, k)
        fitted = forecasters.get("fitted")
        row(k, "fitted_uniform", uni, "fitted", fitted.fit(profile, uni))
        for rival in RIVALS:
            for where, mask in (("uniform", uni), ("gcache_mask", searched.mask)):
                # l2p_all: fitted to the trajectories' Gram; the others fit their own parameters (core's l2p: to the
                # profile's Gram statistics, last 4 residuals)
                params = l2p_params(gram, mask) if rival == "l2p_all" else forecasters.get(rival).fit(profile, mask)
                row(k, f"{rival}_{where}", mask, rival, params)
        gp_secs = [e["gp_seconds"] for e in res.history if e["gp_seconds"] is not None]
        mu = held_out(h, res.mu_mask, eval_seeds)["psnr"]
        bst = held_out(h, res.best_mask, eval_seeds)["psnr"]
        cost.append({"K": k, "evaluations": len(res.history) + 1, "sampling_runs": res.evaluations,
                     "wall_s": round(wall, 1),
                     "gp_s_per_iter_end": round(statistics.median(gp_secs[-5:]), 3) if gp_secs else None,
                     "chosen": res.policy.provenance["chosen"], "won": res.policy.provenance["won"],
                     "s": None if res.s_best is None else [round(v, 2) for v in res.s_best],
                     "search_loss": res.policy.metrics["loss"], "psnr_mu_mask": mu, "psnr_best_mask": bst,
                     "evals_to_0.3dB": convergence(res, h, eval_seeds, m["psnr"]),
                     "forecast_won": searched.provenance["won"], "forecast_chosen": searched.provenance["chosen"],
                     "forecast_forecaster": searched.forecast,
                     "polish_accepted": searched.provenance["polish"]["accepted"], **forecast_cost(sstate),
                     "fresh_replaced": bool(searched.provenance.get("fresh_seeds", {}).get("replaced"))})
    floors = {fc: budget_floor(fc, args.degree) for fc in sorted(set(auto_forecaster.values()))}
    return {"N": n_steps, "rows": rows, "cost": cost, "ks": ks_of(n_steps), "auto_forecaster": auto_forecaster,
            "polish_runs": polish_runs, "budget_floor": floors}


def report(out: dict, objective_name: str, lpips: bool) -> dict:
    n, rows, cost = out["N"], out["rows"], out["cost"]
    print(f"\nN = {n}: held-out PSNR / SSIM{' / LPIPS' if lpips else ''} vs full compute (search objective: "
          f"{objective_name})")
    print(f"{'K':>3} {'method':<38} {'PSNR dB':>8} {'SSIM':>7}{' LPIPS' if lpips else ''}  mask")
    for r in rows:
        lp = f" {r['lpips']:.4f}" if lpips else ""
        fc = f" ({r['forecaster']})" if r.get("forecaster") else ""
        print(f"{r['K']:>3} {r['method'] + fc:<38} {r['psnr']:8.2f} {r['ssim']:7.4f}{lp}  {r['mask']}")
    print("search cost per K:")
    for c in cost:
        print("  " + ", ".join(f"{k}={v}" for k, v in c.items()))
    half = n // 2
    at_half = {r["method"]: r["psnr"] for r in rows if r["K"] == half}
    rival = max(REUSING, key=lambda m: at_half[m])
    margin = at_half["gcache"] - at_half[rival]
    per = {r["method"]: np.array(r["psnr_per_image"]) for r in rows if r["K"] == half}
    diff = per["gcache"] - per[rival]  # paired over the held-out seeds: how much of the margin is seed noise
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    print(f"GCache (reuse) − best baseline ({rival}) at K = N/2: {margin:+.2f} dB "
          f"(paired standard error over {len(diff)} held-out seeds: {se:.2f} dB)")
    # the reuse search against the best of everything else that reuses (instant, baselines); the forecast search
    # against every row that is no GCache search (rivals on its own mask included); forecasting against reuse
    vs_best, fvs_best, gain, inst_gain, fit_gain, polish, rivals = {}, {}, {}, {}, {}, {}, {}
    for k in out["ks"]:
        at_k = {r["method"]: r["psnr"] for r in rows if r["K"] == k}
        vs_best[str(k)] = round(at_k["gcache"] - max(at_k[m] for m in REUSING), 3)
        others = [m for m in at_k if m not in SEARCHES]
        best_other = max(others, key=lambda m: at_k[m])
        fvs_best[str(k)] = {"margin_db": round(at_k["gcache_forecast"] - at_k[best_other], 3), "best_other": best_other}
        gain[str(k)] = round(at_k["gcache_forecast"] - at_k["gcache"], 3)
        inst_gain[str(k)] = round(at_k["instant_auto"] - at_k["instant_1batch"], 3)  # both from one batch
        fit_gain[str(k)] = round(at_k["instant_fitted"] - at_k["instant_linear"], 3)
        runs = out["polish_runs"][k]
        polish[str(k)] = round(statistics.median(r["polish"]["psnr"] - r["nopolish"]["psnr"] for r in runs.values()), 3)
        fitted_on = {"uniform": at_k["fitted_uniform"], "gcache_mask": at_k["gcache_forecast_unchecked"]}
        for rv in RIVALS:
            for where in ("uniform", "gcache_mask"):
                rivals.setdefault(rv, {}).setdefault(where, {})[str(k)] = round(
                    at_k[f"{rv}_{where}"] - fitted_on[where], 3)
    third = str(min(k for k in out["ks"] if k >= n // 3))
    print("polish: forecast search with − without polish, held-out PSNR dB per K (median over GP seeds " +
          ", ".join(map(str, sorted(next(iter(out["polish_runs"].values()))))) + "): " +
          ", ".join(f"K={k}: {v:+.2f}" for k, v in polish.items()))
    for k, runs in out["polish_runs"].items():
        print(f"  K={k}: " + "; ".join(f"seed {g}: {r['polish']['psnr']:.2f} vs {r['nopolish']['psnr']:.2f} "
                                       f"({r['polish']['won']}, {r['polish']['accepted']} moves kept)"
                                       for g, r in runs.items()))
    print("forecast (auto's forecaster, searched) − reuse (searched), held-out PSNR dB per K: " +
          ", ".join(f"K={k}: {v:+.2f}" for k, v in gain.items()))
    print("instant, one batch: auto's forecaster − reuse: "
          + ", ".join(f"K={k}: {v:+.2f}" for k, v in inst_gain.items())
          + "; fitted − linear: " + ", ".join(f"K={k}: {v:+.2f}" for k, v in fit_gain.items())
          + "; auto picked " + ", ".join(f"K={k}: {v}" for k, v in out["auto_forecaster"].items()))
    print("GCache (reuse search) − best other reusing method, held-out PSNR dB per K: " +
          ", ".join(f"K={k}: {v:+.2f}" for k, v in vs_best.items()))
    print("GCache (forecast search) − best row that is no GCache search: " +
          ", ".join(f"K={k}: {v['margin_db']:+.2f} (vs {v['best_other']})" for k, v in fvs_best.items()))
    print("rivals − fitted on the same mask (uniform / gcache_forecast's), dB: " + "; ".join(
        f"{rv} {where}: " + ", ".join(f"K={k} {v:+.2f}" for k, v in per_k.items())
        for rv, d in rivals.items() for where, per_k in d.items()))
    print("forecast search: start masks " + ", ".join(f"K={c['K']}: {c['start_masks']} ({c['other_forecaster_starts']} "
                                                    f"under another forecaster)" for c in cost)
          + "; forecaster check evaluations " + ", ".join(f"K={c['K']}: {c['check_evaluations']}" for c in cost)
          + "; fresh-seed evaluations " + ", ".join(f"K={c['K']}: {c['fresh_evaluations']}"
                                                    f"{' (replaced the pick)' if c['fresh_replaced'] else ''}"
                                                    for c in cost)
          + "; least budget " + ", ".join(f"{fc}: {v['with_other_forecasters']} (own start masks only: "
                                                   f"{v['own_start_masks_only']})"
                                                   for fc, v in out["budget_floor"].items()))
    gp_end = [c["gp_s_per_iter_end"] for c in cost if c["gp_s_per_iter_end"] is not None]
    return {"N": n, "rows": [{"K": r["K"], "method": r["method"], "psnr": round(r["psnr"], 3),
                              "ssim": round(r["ssim"], 4), **({"lpips": round(r["lpips"], 4)} if lpips else {}),
                              "forecaster": r.get("forecaster", "reuse")}
                             for r in rows],
            "gcache_minus_best_baseline_psnr_at_half": round(margin, 3), "margin_paired_se_db": round(se, 3),
            "search_minus_best_other_psnr": vs_best, "forecast_search_minus_best_other_psnr": fvs_best,
            "polish_gain_db": polish,
            "polish_runs": {str(k): {str(g): r for g, r in v.items()} for k, v in out["polish_runs"].items()},
            "rival_minus_fitted_db": rivals,
            "forecast_gain_db_at_third": gain[third], "forecast_min_gain_db": min(gain.values()),
            "forecast_gain_db": gain,
            "instant_forecast_minus_reuse_db": inst_gain, "fitted_minus_linear_db": fit_gain,
            "auto_forecaster": {str(k): v for k, v in out["auto_forecaster"].items()},
            "evaluations": sum(c["evaluations"] for c in cost),
            "gp_seconds_per_iter_at_end": max(gp_end) if gp_end else None, "objective": objective_name,
            "forecast_search_cost": {str(c["K"]): {k: c[k] for k in ("start_masks", "other_forecaster_starts",
                                                                      "check_evaluations", "fresh_evaluations",
                                                                      "fresh_replaced")} for c in cost},
            "budget_floor": out["budget_floor"],
            "evals_to_within_0.3dB": [c["evals_to_0.3dB"] for c in cost]}


def main(argv=None, harness_factory=None) -> dict:
    ap = BenchParser("gcache.bench.quality", __doc__)
    ap.add_argument("--quick", action="store_true", help="N = 30, budget 48, GP seeds 0-2: about 20 min on one core")
    ap.add_argument("--steps", type=whole(6), nargs="+", default=[30])
    ap.add_argument("--budget", type=whole(1), default=None, help="search iterations per K (default 48 quick, 64 full)")
    ap.add_argument("--gp-seeds", type=seed_text, default=None, help="SearchConfig.seed of the polish comparison "
                    "(default 0-2 quick, 0-4 full; --seed is one of them)")
    ap.add_argument("--degree", type=whole(1), default=3)
    ap.add_argument("--seed", type=whole(0), default=0)
    ap.add_argument("--objective", default="auto", choices=("auto", "lpips_ssim", "ssim", "psnr"),
                    help="auto = lpips_ssim if the LPIPS backbone is present, else ssim")
    ap.add_argument("--search-seeds", type=seed_text, default="1000-1015")
    ap.add_argument("--eval-seeds", type=seed_text, default="0-15")
    ap.add_argument("--gp-n", type=whole(0), default=0, help="also time one GP step at this many observations "
                                                             "(e.g. 500)")
    ap.add_argument("--threads", type=whole(1), default=1)
    a = ap.parse_args(argv)
    least = least_useful_budget(a.degree)
    if a.budget is not None and a.budget < least:  # before any work: the searches below would refuse it later
        ap.error(f"--budget {a.budget} is below the minimum useful budget of these searches, {least} (degree "
                 f"{a.degree}: the start masks of every forecaster the bench may search, and the start grid)")
    minutes = 20 * (a.budget or (48 if a.quick else 64)) / 48 * len([30] if a.quick else a.steps)
    a.progress = lambda total, what: Progress(total, what, expected_s=60 * minutes / max(1, len(a.steps)))
    from ..search.infra.cli import set_threads
    from ..search.infra.objectives import load_lpips, lpips_available, make_objective
    set_threads(a.threads)
    if a.quick:
        a.steps = [30]
    a.budget = a.budget or (48 if a.quick else 64)
    a.gp_seeds = a.gp_seeds or ("0-2" if a.quick else "0-4")
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
    sys.exit(run_main(main, "gcache.bench.quality"))
