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
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Optional, Protocol, Sequence, Union

import numpy as np

from ..errors import GCacheError


class Forecaster(Protocol):
    name: str
    keeps: int

    def weights(self, kept: Sequence[int], j: int, times: Sequence[float], params: dict) -> list[float]: ...

    def dp_errors(self, profile) -> tuple[np.ndarray, Optional[np.ndarray]]: ...

    def fit(self, profile, mask: Sequence[int]) -> dict: ...


_REGISTRY: dict[str, Forecaster] = {}
_ORDERS = {0: "reuse", 1: "linear", 2: "quadratic"}  # policy files before forecasters had names held an order
_LOADED = False


def register(forecaster: Forecaster) -> Forecaster:
    _REGISTRY[forecaster.name] = forecaster
    return forecaster


def _load() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for m in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{m.name}")


def names() -> list[str]:
    _load()
    return list(_REGISTRY)


def canonical(name: Union[str, int, None]) -> str:
    """A forecaster's name from a name or an old forecast order (0 reuse, 1 linear, 2 quadratic)."""
    if name is None:
        return "reuse"
    if isinstance(name, bool):
        raise GCacheError(f"A forecaster is a name such as 'linear', got {name!r}.")
    if isinstance(name, int):
        if name not in _ORDERS:
            raise GCacheError(f"The forecast order must be 0, 1 or 2, got {name!r}.")
        return _ORDERS[name]
    _load()
    if name not in _REGISTRY:
        raise GCacheError(f"Unknown forecaster {name!r}: use one of {', '.join(map(repr, _REGISTRY))}.")
    return name


def get(name: Union[str, int, None]) -> Forecaster:
    _load()
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
