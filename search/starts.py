"""The search's start masks, measured before the start grid: for each error model the profile gives (error_models.py),
the theory-weight and local-weight instant DP masks of the search's forecaster (for a forecasting one, reuse_abs gives
the reuse-optimal masks, applied with it); then the TeaCache-like mask; then the caller's extra masks (e.g. the reuse
search's result).

Each is a history entry of kind "instant" named by its method (theory_dp_fitted, local_dp_fitted_rms, teacache, …).
Two error models may pick the same mask: the second entry reuses the first one's loss (no sampling).

`start_methods` is the one list of them: name -> how it is made, (instant method, forecaster, error model) or None
for the TeaCache-like mask. The search measures them in its order, and `start_count` counts the same list before a
profile exists (budget.py), so a new source of start masks is a new entry there (e.g. another forecaster's instant
masks: the same tuple with that forecaster).
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.profile import Profile
from . import error_models
from .baselines import teacache_mask
from .instant import instant_name, instant_policy

Start = Optional[tuple[str, str, str]]  # (instant method, forecaster, error model), None: the TeaCache-like mask


def start_methods(forecast: str, models: Sequence[str]) -> dict[str, Start]:
    """name -> how it is made, in the order the search measures them."""
    out: dict[str, Start] = {}
    for model in models:
        for method in ("theory", "local"):
            out[instant_name(method, forecast, model)] = (method, forecast, model)
    out["teacache"] = None
    return out


def _models(forecast: str, has_fit_stats: bool) -> list[str]:
    fc = forecasters.get(forecast)
    return [m for m in error_models.ERROR_MODELS if error_models.applies(m, fc)
            and (has_fit_stats or m not in error_models.NEEDS_FIT_STATS)]


def start_count(forecast: str, has_fit_stats: bool, n_extra: int = 0) -> int:
    """How many start masks a search of `forecast` has on a profile with (or without) the forecast fit statistics
    (the RMS error models need them and the Gram statistics recorded with them): for the budget check before any
    profile exists."""
    forecast = forecasters.canonical(forecast)
    return len(start_methods(forecast, _models(forecast, has_fit_stats))) + n_extra


def instant_masks(profile: Profile, k: int, forecast="reuse") -> list[tuple[str, list]]:
    """(method name, mask) of the instant start masks, in the order the search measures them."""
    fc = forecasters.get(forecast)

    def mask(how: Start) -> list:
        return teacache_mask(profile.rel_h, k)[0] if how is None else \
            instant_policy(profile, k, how[0], forecast=how[1], error_model=how[2]).mask
    models = [m for m in error_models.available(profile, fc)]
    return [(name, mask(how)) for name, how in start_methods(fc.name, models).items()]


def start_masks(profile: Profile, k: int, forecast="reuse",
                extra_masks: Sequence[tuple[str, Sequence[int]]] = ()) -> list[tuple[str, list]]:
    """The instant masks, then the caller's extra masks, each checked to be a K-mask over the profile's steps."""
    n = profile.n_steps
    masks = instant_masks(profile, k, forecast) + [(str(nm), [int(v) for v in m]) for nm, m in extra_masks]
    for nm, m in masks:
        if len(m) != n or sum(m) != k or m[0] != 1:
            raise GCacheError(f"The start mask {nm!r} is not a K = {k} mask over {n} steps with step 0 computed.")
    return masks
