"""Forecasters: what a skipped step adds to its block input h instead of running the blocks.

A forecaster is one small object behind one protocol, registered by name. The engine, the Policy file, the DP and
the nodes ask this registry (`get(name)`), never a hard-coded order. Adding one (e.g. Hermite, as in HiCache) is one
file in this folder that calls `register(...)`: every module here is imported on first use of the registry.

    name       its name in Policy files and node combos
    keeps      how many computed residuals it keeps per branch (the latest last)
    weights    δ̂_j = Σ_k w_k δ_k over the kept residuals, for a skipped step j at normalized time t_j
    dp_errors  the error tensors its exact DP needs from a profile: E2[i, j] for a skipped step j whose only
               computed step before it is i (step 0), E3[p, i, j] for one with two (None: the reuse DP)
    fit        its parameters for one mask, from a profile (stored in the Policy; {} for a fixed rule)

What the rest of GCache decides by a forecaster, it asks the forecaster (never its name); register() gives each of
these its default (DEFAULTS) when a forecaster doesn't set it:

    label          its label in the GCache Policy / Search combos (saved workflows hold it: never change one)
    rank           its place in those combos, and auto's tie-break between equal scores (the simpler first)
    needs          the profile statistics (core/profile_stats, by name) its dp_errors and fit read besides E: a run
                   that records forecast statistics records those every registered forecaster needs (default ())
    forecasts      False for reuse: a forecasting search also measures the reuse-optimal start mask, and its
                   reference runs record the forecast statistics
    needs_profile  its parameters are fitted to each mask from a profile (fit): whoever applies it must hold the
                   profile (a ComfyUI worker doesn't)
    can_fit        (profile) -> whether its fit and its DP can run on that profile (by default: the profile holds
                   every statistic in `needs`); the search asks it before it measures a forecaster's start masks
    dp_of          the forecaster whose exact DP its dp_errors are when it has none of its own (quadratic: linear)
    auto_candidate auto mode's choose_forecaster considers it (search/instant.py); it then needs two_step_c
    check_params   (params, mask) -> None, or a GCacheError saying what is wrong (Policy.validate)
    two_step_c     (profile, fit_stats, fold) -> c[p, i, j] of its two-step form δ_i + c·(δ_i − δ_p), with any
                   parameters fitted on `fold` (None: both), or None when it has no such form (the RMS error model and
                   auto's held-out scores use it)
    two_step_form  whether it defines two_step_c (set by register(): an error model can tell without a profile)
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence, Union

import numpy as np

from ..errors import GCacheError
from ..registry import Registry
from ..user_text import quoted


class Forecaster(Protocol):
    name: str
    keeps: int

    def weights(self, kept: Sequence[int], j: int, times: Sequence[float], params: dict) -> list[float]: ...

    def dp_errors(self, profile) -> tuple[np.ndarray, Optional[np.ndarray]]: ...

    def fit(self, profile, mask: Sequence[int]) -> dict: ...

    label: str
    rank: int
    needs: tuple
    forecasts: bool
    needs_profile: bool
    dp_of: Optional[str]
    auto_candidate: bool
    two_step_form: bool

    def can_fit(self, profile) -> bool: ...

    def check_params(self, params: dict, mask: Sequence[int]) -> None: ...

    def two_step_c(self, profile, st, fold: Optional[int] = None) -> Optional[np.ndarray]: ...


def no_params(params: dict, mask: Sequence[int], name: str = "this") -> None:
    """A fixed rule's parameters: none (a hand-edited file that gives some is told so, not silently ignored)."""
    if params:
        raise GCacheError(f"The {name} forecaster takes no parameters, but the policy's forecast_params hold "
                          f"{sorted(params)[:3]}: remove them, or set the forecaster they were made for.")


def _defaults(fc) -> dict:
    return {"label": fc.name, "rank": 100, "needs": (), "forecasts": True, "needs_profile": False, "dp_of": None,
            "auto_candidate": False,
            "can_fit": lambda profile: all(profile.has(stat) for stat in fc.needs),
            "check_params": lambda params, mask: no_params(params, mask, fc.name),
            "two_step_c": lambda profile, st, fold=None: None}


_ORDERS = {0: "reuse", 1: "linear", 2: "quadratic"}  # policy files before forecasters had names held an order


_REGISTRY = Registry(__name__, __path__, _defaults)


def register(forecaster: Forecaster) -> Forecaster:
    if not hasattr(forecaster, "two_step_form"):
        forecaster.two_step_form = hasattr(forecaster, "two_step_c")
    return _REGISTRY.add(forecaster)


def unregister(name: str) -> None:
    """Removes a forecaster (tests register toy ones for a while)."""
    _REGISTRY.remove(name)


def names() -> list[str]:
    """Every registered forecaster's name, by rank (the combos' order)."""
    return sorted(_REGISTRY, key=lambda n: _REGISTRY[n].rank)


def profile_free() -> list[str]:
    """The forecasters whose parameters don't come from a profile (what a ComfyUI worker, holding none, applies)."""
    return [n for n in names() if not _REGISTRY[n].needs_profile]


def canonical(name: Union[str, int, None]) -> str:
    """A forecaster's name from a name or an old forecast order (0 reuse, 1 linear, 2 quadratic)."""
    if name is None:
        return "reuse"
    if isinstance(name, bool):
        raise GCacheError(f"A forecaster is a name such as 'linear', got {quoted(name)}.")
    if isinstance(name, int):
        if name not in _ORDERS:
            raise GCacheError(f"The forecast order must be 0, 1 or 2, got {quoted(name)}.")
        return _ORDERS[name]
    if name not in _REGISTRY:
        raise GCacheError(f"Unknown forecaster {quoted(name)}: use one of {', '.join(map(repr, _REGISTRY))}.")
    return name


def get(name: Union[str, int, None, Forecaster]) -> Forecaster:
    """The forecaster of a name (or an old forecast order); a forecaster object passes through, so that the one a
    node resolved travels to the engine as it is."""
    if hasattr(name, "weights") and hasattr(name, "keeps"):
        return name
    return _REGISTRY[canonical(name)]


def needed_steps(mask: Sequence[int], keeps: int) -> set[int]:
    """Computed steps whose δ some skipped step uses: the last `keeps` computed ones before each skip."""
    need, computed = set(), []
    for j, m in enumerate(mask):
        if m:
            computed.append(j)
        else:
            need.update(computed[-keeps:])
    return need
