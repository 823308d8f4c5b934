"""Propagation weights: how much an error made at step j grows by the end of sampling, as an exponent w_j.

Two forms (paper §3.2–3.3):
- Bernstein:   w(t; s) = Σ_{ν=0..d} s_ν · C(d, ν) · t^ν (1 − t)^{d−ν}, learned by the search;
- analytic:    w_j = ln(h_j · L_out) + Σ_{m > j} h_m · L   (Theorem 3.3, the "theory" policy).
Step j goes from σ_j to σ_{j+1}; h_j = t_j − t_{j+1} in normalized time.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .errors import GCacheError

MAX_DEGREE = 8


def bernstein_w(t: Sequence[float] | np.ndarray, s: Sequence[float] | np.ndarray) -> np.ndarray:
    """w(t; s) for every t; the degree is len(s) − 1."""
    s = np.asarray(s, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    if s.ndim != 1 or not 1 <= s.size <= MAX_DEGREE + 1:
        raise GCacheError(f"Bernstein coefficients s must be a vector of 1..{MAX_DEGREE + 1} numbers, got shape "
                          f"{s.shape}.")
    if not np.all(np.isfinite(s)) or not np.all(np.isfinite(t)):
        raise GCacheError("Bernstein weights got a NaN/Inf coefficient or time.")
    d = s.size - 1
    nu = np.arange(d + 1)
    binom = np.array([math.comb(d, k) for k in nu], dtype=np.float64)
    tt = t[..., None]
    basis = binom * tt ** nu * (1.0 - tt) ** (d - nu)
    return basis @ s


def analytic_w(times_with_end: Sequence[float], lipschitz: float = 1.0, lipschitz_out: float = 1.0) -> np.ndarray:
    """Theorem 3.3's exponent for each of the N steps.

    `times_with_end` has N + 1 normalized times (the schedule including its final 0), decreasing.
    """
    t = np.asarray(times_with_end, dtype=np.float64)
    if t.ndim != 1 or t.size < 2:
        raise GCacheError("analytic_w needs the N + 1 times of the schedule (including the final one).")
    if lipschitz < 0 or lipschitz_out <= 0:
        raise GCacheError("Lipschitz constants must be positive.")
    h = t[:-1] - t[1:]
    if np.any(h <= 0):
        raise GCacheError("analytic_w needs strictly decreasing times (1 → 0).")
    later = np.concatenate([np.cumsum((h * lipschitz)[::-1])[::-1][1:], [0.0]])  # Σ_{m>j} h_m L
    return np.log(h * lipschitz_out) + later
