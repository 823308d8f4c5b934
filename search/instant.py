"""Instant policies: the exact DP on a profile under an analytic propagation weight, in milliseconds.

No sampling is needed, so a user gets a speed-up from the first profiled run (GCache Policy, GCache Apply
"auto"); the search (loop.py) starts from these masks and only keeps something else where it measures better.

    theory     w from Theorem 3.3 (w_j = ln(h_j L_out) + Σ_{m>j} h_m L): the default
    local      w = 0: every reuse error counts the same wherever it happens
    bernstein  w(t; s) with given coefficients s (e.g. an s a search found for a similar model)

With a forecaster (core/forecasters: linear, quadratic, profile-fitted) the mask is the one that is best when
skipped steps forecast their residual (dp_forecast.py over the forecaster's error tensors), which differs from the
best mask for reuse. The error tensors come from an error model (error_models.py: the forecaster's mean |error| by
default, or its exact RMS error). choose_forecaster picks the forecaster for a profile and K by a held-out bound.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.policy import Policy
from ..core.profile import Profile
from ..core.weights import analytic_w, bernstein_w
from . import error_models
from .dp import dp_mask, mask_cost
from .dp_forecast import dp_mask_forecast, forecast_mask_cost

METHODS = ("theory", "local", "bernstein")


def propagation_weights(profile: Profile, method: str = "theory", s: Optional[Sequence[float]] = None) -> np.ndarray:
    """w_j for each of the profile's N steps under `method`."""
    times = [float(t) for t in profile.times]
    if method == "theory":
        return analytic_w(times + [0.0])
    if method == "local":
        return np.zeros(profile.n_steps)
    if method == "bernstein":
        if s is None or len(s) == 0:
            raise GCacheError("The Bernstein method needs its coefficients s (e.g. '2, 1, 0.5, 0').")
        return bernstein_w(times, s)
    raise GCacheError(f"Unknown instant method {method!r}: use one of {', '.join(METHODS)}.")


def dp_on(errors: tuple, w: np.ndarray, k: int) -> tuple[list, float]:
    """The exact DP's K-mask and bound over error tensors (E2, E3) as a forecaster's dp_errors gives them."""
    e2, e3 = errors
    return dp_mask_forecast(e2, e3, w, k) if e3 is not None else dp_mask(e2, w, k)


def bound_on(errors: tuple, w: np.ndarray, mask) -> float:
    """The DP's objective for any mask over error tensors (E2, E3): what dp_on minimizes."""
    e2, e3 = errors
    return forecast_mask_cost(e2, e3, w, mask) if e3 is not None else mask_cost(e2, w, mask)


def forecast_dp(profile: Profile, w: np.ndarray, k: int, forecast="reuse",
                error_model: str = error_models.DEFAULT) -> tuple[list, float]:
    """The exact DP's K-mask and bound for masks applied with `forecast`, over its error tensors under
    `error_model` (error_models.py)."""
    return dp_on(error_models.errors(profile, forecasters.get(forecast), error_model), w, k)


def instant_policy(profile: Profile, k: int, method: str = "theory", s: Optional[Sequence[float]] = None,
                   forecast="reuse", error_model: str = error_models.DEFAULT) -> Policy:
    """The K-step mask the DP picks for this profile under `method`'s weights and the forecaster `forecast`'s
    errors (under `error_model`), as a Policy applied with that forecaster (and its parameters fitted to the mask)."""
    fc = forecasters.get(forecast)
    w = propagation_weights(profile, method, s)
    mask, bound = forecast_dp(profile, w, k, fc.name, error_model)
    prov = {"k": k, "instant": method, "bound": bound, "profile_samples": int(profile.count),
            "error_model": error_model}
    if fc.forecasts:
        prov["mask_dp"] = f"{fc.name} forecast DP" + (f" (the {fc.dp_of} one: no exact DP for it)" if fc.dp_of
                                                      else "")
    if s is not None and method == "bernstein":
        prov["s"] = [float(v) for v in s]
    return Policy.for_mask(profile, mask, fc.name, method=instant_name(method, fc.name, error_model), provenance=prov,
                           metrics=profile.io.metrics(len(mask), int(sum(mask))))


def instant_name(method: str, forecast: str, error_model: str = error_models.DEFAULT) -> str:
    """theory_dp, local_dp_linear, theory_dp_fitted_rms, …: the instant policy's method name in Policy files and
    search histories (the default error model adds nothing to it)."""
    fc = forecasters.get(forecast)
    return f"{method}_dp" + (f"_{fc.name}" if fc.forecasts else "") + error_models.suffix(error_model)


# ------------------------------------------------------------------------------------------ choosing a forecaster
def auto_candidates() -> list[str]:
    """The forecasters auto mode chooses between (those that say auto_candidate), simplest first."""
    return [n for n in forecasters.names() if forecasters.get(n).auto_candidate]


def forecaster_scores(profile: Profile, k: int, method: str = "theory") -> dict:
    """Each candidate forecaster's DP bound for its own instant mask, judged on data it was not fitted to: the
    profile's forecast statistics come in two folds (even / odd residual elements); α is fitted on one and every
    forecaster's squared error is measured on the other, both ways round (the RMS form of the DP's objective).
    Without those statistics (older profiles): reuse vs linear by their own mean-|error| bounds (nothing fitted).
    Lower is better."""
    w = propagation_weights(profile, method)
    ew = np.exp(w)
    candidates = [forecasters.get(n) for n in auto_candidates()]
    if not profile.has_fit_stats():  # the fixed rules whose DP errors the profile has (the statistics they need)
        return {fc.name: forecast_dp(profile, w, k, fc.name)[1] for fc in candidates
                if not fc.needs_profile and all(profile.has(s) for s in fc.needs)}
    st = profile.fit_stats()
    scores = {}
    for fc in candidates:
        mask = forecast_dp(profile, w, k, fc.name)[0]
        scores[fc.name] = float(np.mean([_bound(mask, np.sqrt(st.sq_of(f)), st.rms(_held_out_c(fc, profile, st, f), f),
                                                ew) for f in (0, 1)]))
    return scores


def _held_out_c(fc, profile: Profile, st, fold: int) -> np.ndarray:
    """The candidate's two-step c with its parameters fitted on the other fold than the one it is judged on."""
    c = fc.two_step_c(profile, st, 1 - fold)
    if c is None:
        raise GCacheError(f"The {fc.name} forecaster is an auto candidate but has no two-step form (two_step_c) to "
                          "score it by.")
    return c


def _bound(mask: Sequence[int], reuse_err: np.ndarray, fore_err: np.ndarray, ew: np.ndarray) -> float:
    """Σ_j e^{w_j}·error of skipped step j: reuse error while one step is computed, the forecast's after."""
    total, computed = 0.0, []
    for j, m in enumerate(mask):
        if m:
            computed.append(j)
        elif len(computed) == 1:
            total += ew[j] * reuse_err[computed[0], j]
        else:
            total += ew[j] * fore_err[computed[-2], computed[-1], j]
    return total


# At 8 steps or fewer the held-out bound ranks forecasters wrongly: it judges each forecast from the true residuals,
# and over so few, so long steps the error a forecast feeds into the next steps dominates. Measured (bench/few_steps.py,
# reference model, 2x, instant policies, PSNR vs the full run): N = 6 reuse 31.59 / linear 26.09 / fitted 26.66 dB;
# N = 8 reuse 35.35 / 32.63 / 32.73; from N = 10 on the bound's pick (fitted) was the best (32.0, 39.18, 43.98, 47.78 dB
# at N = 10, 12, 16, 20).
FEW_STEPS = 8


def choose_forecaster(profile: Profile, k: int, method: str = "theory") -> tuple[str, dict]:
    """The forecaster with the lowest held-out bound (forecaster_scores), and every score; reuse at FEW_STEPS or
    fewer steps."""
    scores = forecaster_scores(profile, k, method)
    if profile.n_steps <= FEW_STEPS:
        return forecasters.canonical(None), scores  # reuse
    return min(scores, key=lambda n: (scores[n], forecasters.get(n).rank)), scores


# ------------------------------------------------------------------------------------------ auto's mask
# The mask auto applies its forecaster on: the reuse DP's (error model reuse_abs), not the forecaster's own DP's.
# Measured (bench/auto_error_models.py, reference model, N = 20 / 30 / 50 at 1.5-5x, 16 held-out seeds, PSNR against
# full compute, auto's forecaster on each model's theory mask): reuse_abs beat mean_abs at 14 of 15 (N, K), median
# +2.58 dB (e.g. +8.10 at N = 30, K = 10), and lost once, -6.07 dB at N = 50, K = 16. The forecaster's own DP judges
# each forecast from true residuals; the reuse DP computes where the trajectory changes fast, which is where a forecast
# fed by cached steps goes wrong. Picking the model by the held-out bound instead lost (median -0.10 dB for rms).
AUTO_ERROR_MODEL = "reuse_abs"


def auto_error_model(forecast) -> str:
    """The error model auto's mask for `forecast` comes from (AUTO_ERROR_MODEL where it applies: not to reuse)."""
    fc = forecasters.get(forecast)
    return AUTO_ERROR_MODEL if error_models.applies(AUTO_ERROR_MODEL, fc) else error_models.DEFAULT


def auto_policy(profile: Profile, k: int, forecast) -> Policy:
    """GCache Apply (auto)'s instant policy: the theory-weight DP mask of auto_error_model, applied with `forecast`
    (its parameters fitted to that mask)."""
    fc = forecasters.get(forecast)
    return instant_policy(profile, k, "theory", forecast=fc.name, error_model=auto_error_model(fc))
