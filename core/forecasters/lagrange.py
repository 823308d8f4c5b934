"""Lagrange extrapolation in the model's normalized time: linear from the last two computed steps,
δ̂_j = δ_i + (t_j − t_i)(δ_i − δ_p)/(t_i − t_p), quadratic from the last three; the highest order the computed steps
allow (one computed step: reuse). Its DP uses E1, the linear forecast errors a profile records with forecasting
on; there is no exact DP for the quadratic (it would need N⁴ errors): it is applied on the linear DP's mask."""
from __future__ import annotations

from typing import Sequence

from . import register


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


class Lagrange:
    def __init__(self, name: str, order: int, auto_candidate: bool):
        self.name, self.keeps = name, order + 1
        self.needs = ("e1",)  # the linear DP's errors, which every order's mask comes from
        self.label, self.rank = f"{name} ({order})", order
        # the linear DP picks the masks of every order (an exact DP of order ≥ 2 would need N⁴ errors)
        self.dp_of = None if order == 1 else "linear"
        self.auto_candidate = auto_candidate

    def weights(self, kept, j, times, params):
        return lagrange_weights([float(times[i]) for i in kept], float(times[j]))

    def dp_errors(self, profile):
        return profile.E, profile.E1

    def fit(self, profile, mask):
        return {}

    def two_step_c(self, profile, st, fold=None):
        return st.linear_c(profile.times)  # the quadratic's too: it is applied on the linear DP's masks


register(Lagrange("linear", 1, auto_candidate=True))
register(Lagrange("quadratic", 2, auto_candidate=False))  # no exact DP of its own, and measured worse than linear
