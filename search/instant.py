"""Instant policies: the exact DP on a profile under an analytic propagation weight, in milliseconds.

No sampling is needed, so a user gets a speed-up from the first profiled run (GCache Policy, GCache Apply
"auto"); the search (bilevel.py) starts from these masks and only keeps something else where it measures better.

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
    if fc.name != "reuse":
        prov["mask_dp"] = f"{fc.name} forecast DP" + (" (the linear one: no exact DP for it)" if fc.name == "quadratic"
                                                      else "")
    if s is not None and method == "bernstein":
        prov["s"] = [float(v) for v in s]
    return Policy.for_mask(profile, mask, fc.name, method=instant_name(method, fc.name, error_model), provenance=prov,
                           metrics=profile.io.metrics(len(mask), int(sum(mask))))


def instant_name(method: str, forecast: str, error_model: str = error_models.DEFAULT) -> str:
    """theory_dp, local_dp_linear, theory_dp_fitted_rms, …: the instant policy's method name in Policy files and
    search histories (the default error model adds nothing to it)."""
    return f"{method}_dp" + ("" if forecast == "reuse" else f"_{forecast}") + error_models.suffix(error_model)


# ------------------------------------------------------------------------------------------ choosing a forecaster
AUTO_CANDIDATES = ("reuse", "linear", "fitted")  # quadratic has no exact DP and measured worse than linear


def forecaster_scores(profile: Profile, k: int, method: str = "theory") -> dict:
    """Each candidate forecaster's DP bound for its own instant mask, judged on data it was not fitted to: the
    profile's forecast statistics come in two folds (even / odd residual elements); α is fitted on one and every
    forecaster's squared error is measured on the other, both ways round (the RMS form of the DP's objective).
    Without those statistics (older profiles): reuse vs linear by their own mean-|error| bounds (nothing fitted).
    Lower is better."""
    w = propagation_weights(profile, method)
    ew = np.exp(w)
    if not profile.has_fit_stats():
        if profile.e1_sum is None:
            return {"reuse": forecast_dp(profile, w, k, "reuse")[1]}
        return {name: forecast_dp(profile, w, k, name)[1] for name in ("reuse", "linear")}
    st = profile.fit_stats()
    c_of = {"reuse": lambda fold: np.zeros((profile.n_steps,) * 3), "linear": lambda fold: st.linear_c(profile.times),
            "fitted": lambda fold: st.alpha(1 - fold)}
    scores = {}
    for name in AUTO_CANDIDATES:
        mask = forecast_dp(profile, w, k, name)[0]
        scores[name] = float(np.mean([_bound(mask, np.sqrt(st.sq_of(f)), st.rms(c_of[name](f), f), ew)
                                      for f in (0, 1)]))
    return scores


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
        return "reuse", scores
    return min(scores, key=lambda n: (scores[n], AUTO_CANDIDATES.index(n))), scores
