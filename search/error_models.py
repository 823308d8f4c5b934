"""Error models: which error tensors the exact DP minimizes to pick a mask for a forecaster.

The DP's objective is a proxy for the image loss, and the error model behind it moves the result by decibels (on a
held-out benchmark the same profile-fitted forecaster scored 38.7 dB on one DP's mask and 43.2 dB on the mask of a
DP over another error tensor, K = 10 of 30). So GCache Policy offers each model, and the search measures each
model's masks first (search/starts.py) and keeps what the true loss says.

An error model is one function (profile, forecaster) -> (E2, E3), the DP's inputs as a forecaster's dp_errors gives
them (E2[i, j]: a skipped step j whose only computed step before it is i; E3[p, i, j]: one with two, None for the
reuse DP), or None when the profile lacks the statistics it needs. Registered by name in ERROR_MODELS:

    mean_abs  the forecaster's own DP errors: mean |error| (profile-fitted: E1 scaled by the fitted/linear RMS ratio)
    rms       the exact RMS error of the forecaster's two-step linear form δ_i + c·(δ_i − δ_p) (core/fit_stats.py):
              reuse c = 0, linear/quadratic c = (t_j − t_i)/(t_i − t_p), fitted c = α; needs the fit statistics
    ls_rms    the RMS error of the unconstrained least-squares two-step forecast a·δ_i + b·δ_p, (a, b) fitted per
              (p, i, j) (FitStats.two_step_rms, from the Gram statistics): not the forecaster's own error but the
              error of the best forecast from those two residuals, so its masks put computed steps where the
              trajectory is hard to predict at all; for forecasters that use two or more residuals (E2 as rms's)

    reuse_abs the reuse DP's errors E[i, j] = mean |δ_j − δ_i| for a forecaster that forecasts: the reuse-optimal
              mask, applied with the forecaster (which then fits its parameters to it)

Each model's masks are applied with the search's forecaster; which model's mask is best is the true loss's call
(bench/auto_error_models.py measured that auto should not pick by the held-out bound).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..core import forecasters
from ..core.errors import GCacheError

Tensors = tuple[np.ndarray, Optional[np.ndarray]]
DEFAULT = "mean_abs"


def mean_abs(profile, fc) -> Optional[Tensors]:
    return fc.dp_errors(profile)


def rms(profile, fc) -> Optional[Tensors]:
    if not applies("rms", fc) or not profile.has_fit_stats():
        return None
    st = profile.fit_stats()
    e2 = np.sqrt(np.maximum(st.sq_of(), 0.0))  # reuse: δ_j − δ_i, while one step is computed
    if not fc.forecasts:
        return e2, None
    c = fc.two_step_c(profile, st)
    return None if c is None else (e2, st.rms(c))


def ls_rms(profile, fc) -> Optional[Tensors]:
    if not applies("ls_rms", fc) or not profile.has_fit_stats():
        return None
    st = profile.fit_stats()
    if st.gram is None:  # a profile made before the Gram statistics were recorded
        return None
    return np.sqrt(np.maximum(st.sq_of(), 0.0)), st.two_step_rms()


def reuse_abs(profile, fc) -> Optional[Tensors]:
    if not applies("reuse_abs", fc):
        return None
    return forecasters.get(forecasters.canonical(None)).dp_errors(profile)  # reuse's E: the reuse DP


ERROR_MODELS: dict[str, Callable[..., Optional[Tensors]]] = {"mean_abs": mean_abs, "rms": rms, "ls_rms": ls_rms,
                                                             "reuse_abs": reuse_abs}
NEEDS_FIT_STATS = ("rms", "ls_rms")  # the others come from E (and E1), in every profile
# Which forecasters a model is for (every one unless named): the forecaster's own RMS error needs its two-step form
# (reuse needs none); a two-step least-squares error means nothing to a one-residual rule.
_FOR = {"rms": lambda fc: not fc.forecasts or fc.two_step_form, "ls_rms": lambda fc: fc.keeps >= 2,
        "reuse_abs": lambda fc: fc.forecasts}


def applies(name: str, fc) -> bool:
    return _FOR.get(name, lambda _: True)(fc)


def check(name: str) -> str:
    if name not in ERROR_MODELS:
        raise GCacheError(f"Unknown error model {name!r}: use one of {', '.join(map(repr, ERROR_MODELS))}.")
    return name


def errors(profile, fc, name: str = DEFAULT) -> Tensors:
    """The DP's error tensors for forecaster `fc` under error model `name`; says what to do when the profile can't
    give them (or a profile whose E was recorded the wrong way: core/profile.py Profile.defect)."""
    profile.require_clean("The DP (instant policies, search start masks, the forecaster choice)")
    out = ERROR_MODELS[check(name)](profile, fc)
    if out is None:
        raise GCacheError(f"The {name!r} error model needs the forecast fit statistics, which this profile lacks "
                          f"(or the {fc.name} forecaster has no two-step form): profile with forecast recording on, "
                          f"or use the {DEFAULT!r} error model.")
    return out


def available(profile, fc) -> list[str]:
    """The error models this profile gives for forecaster `fc`, in registry order."""
    return [name for name, model in ERROR_MODELS.items() if model(profile, fc) is not None]


def suffix(name: str) -> str:
    """'' for the default model, '_rms' etc. otherwise: method names like theory_dp_fitted_rms."""
    return "" if name == DEFAULT else f"_{name}"
