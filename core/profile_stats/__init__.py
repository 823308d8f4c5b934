"""Profile statistics: what a profile records for forecasters besides E, each declared by one small object.

A forecaster names the statistics it needs (`needs`, core/forecasters). A run that records forecast statistics
records those every registered forecaster needs (core/recorder.py); the profile file keeps each statistic's tensors
beside E, checks them on load and adds them when profiles merge (core/profile.py). Neither of those files names a
statistic: a new one is one file in this folder (every module here is imported on first use of the registry), or
registered from anywhere else before the run (a forecaster defined outside GCache registers its own).

    name        what forecasters name in `needs`
    tensors     its tensors in the profile file, {file name: Tensor(shape for N steps, check on load)}. Each holds a
                sum over samples (one sample = one branch of one run) of that sample's means over the residual's
                (sampled) elements; profile.mean(file name) divides by the sample count.
    on_step     (acc, s): once per recorded step j
    on_pairs    (acc, c): per chunk of recorded steps i < j
    on_triples  (acc, c): per recorded i < j and chunk of recorded steps p < i
    (each hook is optional; `acc` is {file name: float64 zeros of the tensor's shape on δ's device} for one sample,
    into which the hook writes its entries)

register() fills these in when a statistic doesn't set them:

    order       where its hooks run within a pass (lower first; below)
    merge       (a, b) -> the sum of two samples' or profiles' arrays of one tensor (a + b)
    missing     what a person reads when a profile lacks it: what to do

What a hook is given (core/recorder.py makes these views; every one is read-only, some are the caller's tensors or
the history itself):

    s.j, s.dj        the step and its residual δ_j, flattened and sampled, float32
    s.times          the run's normalized times, float64 numpy; s.device: δ's device
    s.cached(key, f) f() once per step (e.g. coefficients moved to the device once)
    c.step           the step's view (s above) in on_pairs and on_triples
    c.lo, c.hi       the chunk: recorded steps lo ≤ k < hi (a contiguous span, at most chunk rows)
    c.rows           on_pairs: their residuals δ_k (history dtype, or float32), [hi − lo, m]
    c.absdiff        on_pairs: |δ_k − δ_j| in float32
    c.i, c.di        on_triples: the middle step i and δ_i in float32
    c.block          on_triples: the residuals δ_p of the chunk, float32
    c.cached(key, f) on_triples: f() once per middle step i

Shared temporaries: c.absdiff and c.block are computed once per chunk for every statistic of the pass; a hook that
would overwrite one in place (saving a copy) calls c.take_absdiff() / c.take_block() instead, and a later reader
gets a fresh one. Computing c.absdiff may reuse a float32 copy of c.rows in place (bfloat16/float16 history on the
CPU), after which c.rows is loaded again. So readers run before takers: the recorder's own E reads c.absdiff at
ORDER_E, the Gram statistics read c.rows before it, the fit statistics take c.absdiff after it, and in the triple
pass the fit statistics read c.block before E1 takes it. The order moves time, never values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol

import numpy as np
import torch

from ..errors import GCacheError
from ..registry import Registry

# The tensors every profile holds (core/profile.py's own): no statistic may take these names.
BASE_TENSORS = ("e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "times", "sigmas")
ORDER_E = 20  # where the recorder's own E (mean |δ_i − δ_j|) reads c.absdiff in the pair pass
HOOKS = ("on_step", "on_pairs", "on_triples")


@dataclass(frozen=True)
class Tensor:
    """One tensor of a statistic: its shape for N steps, and what else a loaded one must satisfy (beyond the shape
    and finite values), e.g. non-negative means of absolute values."""
    shape: Callable[[int], tuple]
    check: Optional[Callable[[np.ndarray], bool]] = None


class ProfileStatistic(Protocol):
    name: str
    tensors: dict[str, Tensor]
    order: int
    missing: str

    def merge(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...


def nonnegative(a: np.ndarray) -> bool:
    return not np.any(a < 0)


def _defaults(stat) -> dict:
    return {"order": 100, "merge": lambda a, b: a + b,
            "missing": f"This profile has no {stat.name} statistics: profile again with forecast recording on "
                       "(GCache Profile's record_forecast)."}


_REGISTRY = Registry(__name__, __path__, _defaults)


def register(stat: ProfileStatistic) -> ProfileStatistic:
    """Adds a statistic (filling in order, merge and missing); its tensor names must be new to every profile."""
    _REGISTRY.load()  # this folder's statistics first, whoever registers first
    taken = {t: s.name for s in _REGISTRY.values() if s.name != stat.name for t in s.tensors}
    taken.update({t: "the profile itself" for t in BASE_TENSORS})
    for t in stat.tensors:
        if t in taken:
            raise GCacheError(f"The profile statistic {stat.name!r} names tensor {t!r}, which {taken[t]!r} holds "
                              "already: give it another name.")
    return _REGISTRY.add(stat)


def unregister(name: str) -> None:
    """Removes a statistic (tests register toy ones for a while)."""
    _REGISTRY.remove(name)


def registered() -> list[ProfileStatistic]:
    """Every registered statistic, in the order they were registered (this folder's by file name first)."""
    return _REGISTRY.values()


def get(name: str) -> ProfileStatistic:
    if name not in _REGISTRY:
        raise GCacheError(f"Unknown profile statistic {name!r}: the registered ones are "
                          f"{', '.join(map(repr, _REGISTRY))}.")
    return _REGISTRY[name]


def owner(tensor: str) -> Optional[ProfileStatistic]:
    """The registered statistic that holds a tensor of this file name (None: none does)."""
    for stat in registered():
        if tensor in stat.tensors:
            return stat
    return None


# ------------------------------------------------------------------------------------------ helpers for hooks
_BLOCK = 32  # elements per float32 partial sum in fold_means(precise=True), then float64


def fold_means(x: torch.Tensor, precise: bool = False) -> torch.Tensor:
    """Means of rows over their even and over their odd elements: [rows, m] -> [rows, 2] float64 (an odd last
    element is left out). `precise` (the Gram statistics, whose differences cancel: core/fit_stats.py): float32 sums
    over blocks of _BLOCK pairs, added up in float64 (one float32 sum over the fold lost ten times more, and
    mean(dtype=float64) would first copy x to float64: twice its bytes); it costs twice the plain mean on the CPU,
    so the difference-based statistics, which cancel far less, keep the plain float32 mean."""
    rows, half = x.shape[0], x.shape[1] // 2
    pairs = x[:, :2 * half].reshape(rows, half, 2)  # a view: rows are contiguous inside
    if not precise:
        return pairs.mean(dim=1, dtype=torch.float32).double()
    nb = half // _BLOCK
    total = pairs[:, nb * _BLOCK:].sum(dim=1).double()
    if nb:
        total += pairs[:, :nb * _BLOCK].reshape(rows, nb, _BLOCK, 2).sum(dim=2).double().sum(dim=1)
    return total / half
