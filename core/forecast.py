"""Forecasting the cached residual on a skipped step instead of reusing it (DESIGN §3 "Forecast").

Order 0 reuses δ_i of the last computed step i; order 1 extrapolates linearly from the last two computed steps
p < i in the model's normalized time, δ̂_j = δ_i + (t_j − t_i)(δ_i − δ_p)/(t_i − t_p); order 2 quadratically
from the last three. With fewer computed steps than order + 1, the highest order they allow is used. A forecast
is a weighted sum of the kept residuals, δ̂_j = Σ_k L_k(t_j) δ_k, with the Lagrange basis L_k of their times.
"""
from __future__ import annotations

from typing import Sequence


def lagrange_weights(nodes: Sequence[float], t: float) -> list[float]:
    """L_k(t) for the interpolation nodes t_k (distinct): Σ_k L_k(t) f(t_k) is the polynomial through them."""
    out = []
    for k, tk in enumerate(nodes):
        w = 1.0
        for m, tm in enumerate(nodes):
            if m != k:
                w *= (t - tm) / (tk - tm)
        out.append(w)
    return out


def forecast_weights(times: Sequence[float], computed: Sequence[int], j: int, order: int) -> tuple[list[int], list[float]]:
    """The steps (latest last) and weights that forecast δ at step j from the computed steps before it."""
    used = [i for i in computed if i < j][-(order + 1):]
    if not used:
        raise ValueError(f"no computed step before step {j}")
    return used, lagrange_weights([float(times[i]) for i in used], float(times[j]))
