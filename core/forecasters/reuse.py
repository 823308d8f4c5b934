"""Reuse: a skipped step adds the residual of the last computed step (the paper's cache, order 0)."""
from __future__ import annotations

import numpy as np

from . import register


class Reuse:
    name = "reuse"
    keeps = 1
    label, rank = "reuse (0)", 0
    forecasts = False
    auto_candidate = True

    def weights(self, kept, j, times, params):
        return [0.0] * (len(kept) - 1) + [1.0]

    def dp_errors(self, profile):
        return profile.E, None

    def fit(self, profile, mask):
        return {}

    def two_step_c(self, profile, st, fold=None):
        n = profile.n_steps
        return np.zeros((n, n, n))


register(Reuse())
