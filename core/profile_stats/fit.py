"""The fit statistics (core/fit_stats.py): per fold of the residual's even and odd elements, sq[i, j] = mean
(δ_i − δ_j)² (N²·2 float64 per sample) and cross[p, i, j] = mean (δ_i − δ_p)(δ_j − δ_i) for recorded p < i < j
(N³·2), from which the error of every forecast δ_i + c·(δ_i − δ_p) follows, and the profile-fitted α."""
from __future__ import annotations

from . import Tensor, fold_means, nonnegative, register


class FitStatistics:
    name = "fit"
    tensors = {"fit_sq_sum": Tensor(lambda n: (n, n, 2), nonnegative),
               "fit_cross_sum": Tensor(lambda n: (n, n, n, 2))}
    order = 30  # takes c.absdiff after the recorder's E reads it; reads c.block before E1 takes it
    missing = ("This profile has no forecast statistics: profile again with forecast recording on (GCache "
               "Profile's 'record_forecast', GCache Apply (auto) records them itself).")

    def on_pairs(self, acc, c):
        sq = fold_means(c.take_absdiff().square_())  # |x|² = x²: the absolute values serve
        acc["fit_sq_sum"][c.step.j, c.lo:c.hi] = sq
        acc["fit_sq_sum"][c.lo:c.hi, c.step.j] = sq

    def on_triples(self, acc, c):
        step_ij = c.cached("fit.step", lambda: c.step.dj - c.di)  # δ_j − δ_i
        acc["fit_cross_sum"][c.lo:c.hi, c.i, c.step.j] = fold_means((c.di - c.block).mul_(step_ij))


register(FitStatistics())
