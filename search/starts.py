"""The search's start masks, measured before the start grid: for each error model the profile gives (error_models.py),
the theory-weight and local-weight instant DP masks of the search's forecaster (for a forecasting one, reuse_abs gives
the reuse-optimal masks, applied with it); then, for a search with a profile-fitted forecaster whose evaluation can
apply another forecaster, the same instant masks of every other profile-fitted forecaster the profile can fit, each
applied with its own forecaster; then the TeaCache-like mask; then the caller's extra masks (e.g. the reuse search's
result).

Why the other forecasters' masks: which forecaster suits a mask depends on the mask, and a search that measures
only its own forecaster's masks never meets another's best one, however good its instant policy (bench/quality.py
has each forecaster's instant policy as a row beside the search). The search then goes on (grid, GP, polish) with the
forecaster of the best start mask (loop.py).

Each is a history entry of kind "instant" named by its method (theory_dp_fitted, local_dp_l2p_ls_rms, teacache, …),
whose key is the mask applied with its forecaster (state.py key_of). Two error models may pick the same mask: the
second entry reuses the first one's loss (no sampling).

`start_methods` is the one list of them: name -> how it is made, (instant method, forecaster, error model) or None
for the TeaCache-like mask. The search measures them in its order, and `start_count` counts the same list before a
profile exists (budget.py), so a new source of start masks is a new entry there.
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


def start_methods(forecast: str, models: Sequence[str],
                  others: Sequence[tuple[str, Sequence[str]]] = ()) -> dict[str, Start]:
    """name -> how it is made, in the order the search measures them: the search forecaster's instant masks over
    `models`, then each (other forecaster, its models) of `others`, then the TeaCache-like mask."""
    out: dict[str, Start] = {}
    for fc_name, fc_models in ((forecast, models), *others):
        for model in fc_models:
            for method in ("theory", "local"):
                out[instant_name(method, fc_name, model)] = (method, fc_name, model)
    out["teacache"] = None
    return out


def _models(forecast: str, has_fit_stats: bool) -> list[str]:
    fc = forecasters.get(forecast)
    return [m for m in error_models.ERROR_MODELS if error_models.applies(m, fc)
            and (has_fit_stats or m not in error_models.NEEDS_FIT_STATS)]


def profile_fitted(forecast: str) -> bool:
    """Whether `forecast` fits its parameters to a profile and forecasts (fitted, l2p): a search with one searches
    over all of them (the others: a rule the user chose, which the search keeps)."""
    fc = forecasters.get(forecast)
    return bool(fc.forecasts and fc.needs_profile)


def other_forecasters(forecast: str, can_fit) -> list[str]:
    """The other profile-fitted forecasters whose masks a search of `forecast` measures: none unless `forecast` is
    profile-fitted; `can_fit(name)`: whether the profile has what that forecaster needs."""
    own = forecasters.get(forecast).name
    if not profile_fitted(own):
        return []
    return [n for n in forecasters.names() if n != own and profile_fitted(n) and can_fit(n)]


def start_count(forecast: str, has_fit_stats: bool, n_extra: int = 0, others: bool = True) -> int:
    """How many start masks a search of `forecast` has on a profile with (or without) the forecast fit statistics
    (the RMS error models need them and the Gram statistics recorded with them; a profile recorded with them has
    every statistic a registered forecaster needs): for the budget check before any profile exists. `others`: the
    search's evaluation can apply another forecaster (the other profile-fitted forecasters' masks are measured)."""
    forecast = forecasters.canonical(forecast)
    more = [(n, _models(n, has_fit_stats)) for n in other_forecasters(forecast, lambda n: has_fit_stats)] \
        if others else []
    return len(start_methods(forecast, _models(forecast, has_fit_stats), more)) + n_extra


def can_fit(profile: Profile):
    """can_fit(name): whether `profile` has what forecaster `name` needs (the forecaster's own answer)."""
    return lambda name: forecasters.get(name).can_fit(profile)


def instant_masks(profile: Profile, k: int, forecast="reuse", others: bool = True) -> list[tuple[str, list, str]]:
    """(method name, mask, forecaster) of the instant start masks, in the order the search measures them. `others`:
    with the other profile-fitted forecasters' masks (start_count)."""
    fc = forecasters.get(forecast)

    def mask(how: Start) -> list:
        return teacache_mask(profile.rel_h, k)[0] if how is None else \
            instant_policy(profile, k, how[0], forecast=how[1], error_model=how[2]).mask
    more = [(n, error_models.available(profile, forecasters.get(n)))
            for n in other_forecasters(fc.name, can_fit(profile))] if others else []
    methods = start_methods(fc.name, error_models.available(profile, fc), more)
    return [(name, mask(how), fc.name if how is None else how[1]) for name, how in methods.items()]


def start_masks(profile: Profile, k: int, forecast="reuse", extra_masks: Sequence[tuple[str, Sequence[int]]] = (),
                others: bool = True) -> list[tuple[str, list, str]]:
    """(name, mask, forecaster) of the instant masks, then the caller's extra masks (applied with `forecast`), each
    checked to be a K-mask over the profile's steps."""
    n = profile.n_steps
    own = forecasters.get(forecast).name
    masks = instant_masks(profile, k, forecast, others) + [(str(nm), [int(v) for v in m], own)
                                                           for nm, m in extra_masks]
    for nm, m, _ in masks:
        if len(m) != n or sum(m) != k or m[0] != 1:
            raise GCacheError(f"The start mask {nm!r} is not a K = {k} mask over {n} steps with step 0 computed.")
    return masks
