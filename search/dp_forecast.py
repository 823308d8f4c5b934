"""The exact DP for masks applied with first-order forecasting (forecast order 1).

A skipped step j pays E1[p, i, j]·e^{w_j}, the error of the linear forecast from the last two computed steps
p < i before it; while only one step (0) has been computed it pays the reuse error E[0, j]·e^{w_j} (the forecast
falls back to reuse). The state is the last two computed steps:
    g_2[0, r] = Σ_{0<j<r} E[0, j]·e^{w_j}
    g_k[i, r] = min_{p<i} g_{k−1}[p, i] + Σ_{i<j<r} E1[p, i, j]·e^{w_j}
    cost      = min_{p,i} g_K[p, i] + Σ_{j>i} E1[p, i, j]·e^{w_j}
O(K·N³) time, O(N³) memory (N = 50: 125,000 entries).
"""
from __future__ import annotations

from itertools import combinations
from typing import Sequence

import numpy as np

from ..core.errors import GCacheError
from .dp import dp_mask, mask_cost, validate_problem


def _check_e1(E1, n: int) -> np.ndarray:
    E1 = np.asarray(E1, dtype=np.float64)
    if E1.shape != (n, n, n):
        raise GCacheError(f"The forecast error tensor E1 must be N×N×N for N = {n}, got {E1.shape}: profile with "
                          "forecast recording on.")
    if not np.all(np.isfinite(E1)) or np.any(E1 < 0):
        raise GCacheError("E1 holds NaN/Inf or negative values: the profile is damaged; profile again.")
    return E1


def dp_mask_forecast(E, E1, w, k: int) -> tuple[list[int], float]:
    """The optimal mask under order-1 forecasting and its bound value."""
    E, w = validate_problem(E, w, k)
    n = E.shape[0]
    E1 = _check_e1(E1, n)
    if k == 1 or k == n:
        return dp_mask(E, w, k)  # no step has two computed steps before it, or nothing is skipped
    ew = np.exp(w)
    idx = np.arange(n)
    # seg[p, i, r] = Σ_{i<j<r} E1[p, i, j]·e^{w_j} for r > i, summed from zero over j > i only (a prefix minus
    # the prefix through i would let large entries j ≤ i cancel against the segment's own)
    A = np.where(idx[None, None, :] > idx[None, :, None], E1 * ew[None, None, :], 0.0)
    seg = np.zeros((n, n, n + 1))
    np.cumsum(A, axis=2, out=seg[:, :, 1:])
    r = np.arange(n + 1)
    invalid = (r[None, None, :] <= idx[None, :, None]) | (idx[:, None, None] >= idx[None, :, None])
    seg[invalid] = np.inf                                   # r > i and p < i only
    reuse0 = np.concatenate([[0.0], np.cumsum((E[0] * ew)[1:])])  # Σ_{0<j<r} E[0, j]·e^{w_j}, r = 1..n
    g = np.full((n, n), np.inf)                              # g[p, i]: last two computed p < i
    g[0, 1:] = reuse0[:n - 1]
    parents = []
    for _ in range(3, k + 1):
        cand = g[:, :, None] + seg[:, :, :n]                 # [p, i, r]
        flat = cand.reshape(n, -1)
        par = np.argmin(flat, axis=0).reshape(n, n)          # best p for each (i, r)
        g = np.take_along_axis(cand, par[None], axis=0)[0]   # new g[i, r]
        parents.append(par)
    total = g + seg[:, :, n]
    p, i = np.unravel_index(int(np.argmin(total)), total.shape)
    cost = float(total[p, i])
    steps = [int(i), int(p)]
    for par in reversed(parents):
        steps.append(int(par[steps[-1], steps[-2]]))
    mask = [0] * n
    for s_ in steps:
        mask[s_] = 1
    if mask[0] != 1 or sum(mask) != k:
        raise AssertionError(f"forecast DP produced an invalid mask {mask} for K={k}")
    return mask, cost


def forecast_mask_cost(E, E1, w, mask: Sequence[int]) -> float:
    """The order-1 bound's value for any mask (what dp_mask_forecast minimizes)."""
    E, E1 = np.asarray(E, dtype=np.float64), np.asarray(E1, dtype=np.float64)
    ew = np.exp(np.asarray(w, dtype=np.float64))
    computed, cost = [], 0.0
    for j, m in enumerate(mask):
        if m:
            computed.append(j)
        elif len(computed) == 1:
            cost += E[computed[0], j] * ew[j]
        else:
            cost += E1[computed[-2], computed[-1], j] * ew[j]
    return cost


def brute_force(E, E1, w, k: int) -> tuple[list[int], float]:
    """Every mask (tests only): the reference the DP must match."""
    n = len(w)
    best = None
    for rest in combinations(range(1, n), k - 1):
        mask = [1 if j == 0 or j in rest else 0 for j in range(n)]
        c = forecast_mask_cost(E, E1, w, mask) if E1 is not None else mask_cost(E, w, mask)
        if best is None or c < best[1] - 1e-12:
            best = (mask, c)
    return best
