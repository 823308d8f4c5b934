"""The Gram statistics G[i, j] = mean δ_i·δ_j per fold of even and odd elements (N²·2 float64 per sample): any
unconstrained least-squares forecast δ̂_j = Σ_k w_k δ_k and its error follow (core/fit_stats.py, the l2p
forecaster). Products of float32 values, summed precisely (fold_means(precise=True): they cancel in the error)."""
from __future__ import annotations

import numpy as np

from . import Tensor, fold_means, register


class GramStatistics:
    name = "gram"
    tensors = {"gram_sum": Tensor(lambda n: (n, n, 2), lambda a: not np.any(np.diagonal(a) < 0))}  # mean δ_i² ≥ 0
    order = 10  # reads c.rows before the recorder's E may reuse their float32 copy
    missing = ("This profile has no Gram statistics (made before they were recorded): profile again with forecast "
               "recording on.")

    def on_step(self, acc, s):
        acc["gram_sum"][s.j, s.j] = fold_means((s.dj * s.dj)[None], precise=True)[0]

    def on_pairs(self, acc, c):  # a float32 temporary, freed before the difference is made
        gram = fold_means(c.rows * c.step.dj, precise=True)
        acc["gram_sum"][c.step.j, c.lo:c.hi] = gram
        acc["gram_sum"][c.lo:c.hi, c.step.j] = gram


register(GramStatistics())
