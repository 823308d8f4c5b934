"""Inner problem (paper Algorithm 1): the exact best mask with K computed steps for (E, w).

Cost of a mask: every reuse step j pays E[i, j] · e^{w_j}, where i is the last computed step before j.
Step 0 is always computed (nothing to reuse before it). With C[i, r] = Σ_{i<j<r} E[i, j]·e^{w_j}:
    f_1[0] = 0,   f_k[r] = min_{i<r} f_{k−1}[i] + C[i, r],   cost = min_i f_K[i] + C[i, N].
O(K·N²), vectorized over the inner min.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.errors import GCacheError
from ..core.policy import check_budget


def segment_costs(E: np.ndarray, w: np.ndarray) -> np.ndarray:
    """C[i, r] for 0 ≤ i < r ≤ N (inf elsewhere): the cost of computing at i and reusing until r − 1."""
    n = E.shape[0]
    idx = np.arange(n)
    # only j > i enters row i: summing from zero (not a prefix minus the prefix through i) keeps large entries
    # j ≤ i (E is symmetric) from cancelling against the segment's own
    weighted = np.where(idx[None, :] > idx[:, None], E * np.exp(w)[None, :], 0.0)
    C = np.zeros((n, n + 1))
    np.cumsum(weighted, axis=1, out=C[:, 1:])
    C[np.arange(n + 1)[None, :] <= idx[:, None]] = np.inf
    return C


def validate_problem(E, w, k: int) -> tuple[np.ndarray, np.ndarray]:
    E = np.asarray(E, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if E.ndim != 2 or E.shape[0] != E.shape[1] or E.shape[0] < 1:
        raise GCacheError(f"The error matrix E must be square N×N, got shape {E.shape}.")
    if w.shape != (E.shape[0],):
        raise GCacheError(f"The propagation weights have {w.size} entries for {E.shape[0]} steps.")
    if not np.all(np.isfinite(E)) or not np.all(np.isfinite(w)):
        raise GCacheError("E or w contains NaN/Inf: the profile is damaged; profile again.")
    if np.any(E < 0):
        raise GCacheError("E has negative entries; it must hold mean absolute residual differences.")
    check_budget(k, E.shape[0])
    return E, w


def dp_mask(E, w, k: int) -> tuple[list[int], float]:
    """The optimal mask (list of 0/1, mask[0] = 1, sum = k) and its bound value Σ E[i, j]·e^{w_j}."""
    E, w = validate_problem(E, w, k)
    n = E.shape[0]
    C = segment_costs(E, w)
    f = np.full(n, np.inf)
    f[0] = 0.0
    parents = []
    for _ in range(2, k + 1):
        cand = f[:, None] + C[:, :n]          # [i, r]: last refresh i, next refresh r
        par = np.argmin(cand, axis=0)
        f = cand[par, np.arange(n)]
        parents.append(par)
    total = f + C[:, n]
    last = int(np.argmin(total))
    cost = float(total[last])
    steps = [last]
    for par in reversed(parents):
        steps.append(int(par[steps[-1]]))
    mask = [0] * n
    for s in steps:
        mask[s] = 1
    if mask[0] != 1 or sum(mask) != k:  # cannot happen for a valid problem; guard the invariant anyway
        raise AssertionError(f"DP produced an invalid mask {mask} for K={k}")
    return mask, cost


def mask_cost(E, w, mask: Sequence[int]) -> float:
    """The bound's value for any mask (the DP's objective), used by tests and reports."""
    E = np.asarray(E, dtype=np.float64)
    ew = np.exp(np.asarray(w, dtype=np.float64))
    cost, last = 0.0, 0
    for j, m in enumerate(mask):
        if m:
            last = j
        else:
            cost += E[last, j] * ew[j]
    return cost
