"""Squared-error statistics of linear-form forecasts on a profile: δ̂_j = δ_i + c·(δ_i − δ_p) for computed p < i < j.

With a[p, i] = δ_i − δ_p and b[i, j] = δ_j − δ_i, the mean squared error of any such forecast is
    mse(c) = sq[i, j] − 2c·cross[p, i, j] + c²·sq[p, i],   sq[i, j] = mean (δ_j − δ_i)²,  cross = mean a·b,
so these two arrays give, exactly and mergeably (sums over samples), the error of reuse (c = 0), of the linear
forecast (c = (t_j − t_i)/(t_i − t_p)) and of the least-squares c, α = cross / sq[p, i] (profile-fitted forecaster).
Each is kept for two folds, the even and the odd elements of the (sampled) residual, so that a forecaster fitted
on one fold is judged on the other (auto mode's choice of forecaster). Differences are formed before squaring:
no cancellation of large sums.

The Gram statistics G[i, j] = mean δ_i·δ_j (per fold; absent in profiles made before them) give any unconstrained
linear forecast δ̂_j = Σ_k w_k δ_k exactly: the pooled least-squares w solves G[K, K]·w = G[K, j] and
    mse(w) = G[j, j] − 2 w·G[K, j] + w·G[K, K]·w.
Precision: that sum is a difference of large numbers when the forecast is good. Each G entry is a mean of float32
products (exact for bfloat16/float16 residuals, rounded to 2^-24 for float32 ones), summed in float32 over blocks
of 32 and in float64 beyond (profile_stats.fold_means; one float32 sum over the whole fold lost ten times more), so
mse(w) is known to roughly 1e-8·(1 + Σ|w_k|)²·G[j, j]. Measured on float32 residuals of 65536 elements (5 seeds,
δ_j = 2δ_i − δ_p + noise, tests/test_gram_stats.py checks the middle case): an RMS error of 1e-2·RMS(δ_j) comes out
within 2e-5, 1e-3 within 0.2 %, 3e-4 within 2 %, 1e-4 within 25 %; anything smaller is noise (mse is clipped at 0).
The difference-based mse(c) above has the same kind of floor (float32 means), but relative to mean (δ_j − δ_i)²,
which on a smooth trajectory is far below mean δ_j².
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .errors import GCacheError

# Singular values of a Gram block below this share of its largest count as zero: its entries are float32 means
# (relative error ~1e-7), so directions they can't resolve get no weight instead of a huge one.
_RCOND = 1e-6


@dataclass
class FitStats:
    sq: np.ndarray      # [N, N, 2]: mean over the fold's elements of (δ_i − δ_j)², mean over samples
    cross: np.ndarray   # [N, N, N, 2]: mean of (δ_i − δ_p)(δ_j − δ_i), for p < i < j
    gram: Optional[np.ndarray] = None  # [N, N, 2]: mean of δ_i·δ_j (None: a profile made before it was recorded)

    def _fold(self, a: np.ndarray, fold: Optional[int]) -> np.ndarray:
        return a.mean(axis=-1) if fold is None else a[..., fold]

    def sq_of(self, fold: Optional[int] = None) -> np.ndarray:
        return self._fold(self.sq, fold)

    def alpha(self, fold: Optional[int] = None) -> np.ndarray:
        """α[p, i, j], the least-squares c (0 where δ_i = δ_p)."""
        sq, cross = self.sq_of(fold), self._fold(self.cross, fold)
        den = sq[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(den > 0, cross / np.where(den > 0, den, 1.0), 0.0)

    def rms(self, c: np.ndarray, fold: Optional[int] = None) -> np.ndarray:
        """RMS error [p, i, j] of δ̂_j = δ_i + c[p, i, j]·(δ_i − δ_p) (c broadcast against [N, N, N])."""
        sq, cross = self.sq_of(fold), self._fold(self.cross, fold)
        mse = sq[None, :, :] - 2.0 * c * cross + c * c * sq[:, :, None]
        return np.sqrt(np.maximum(mse, 0.0))

    def linear_c(self, times) -> np.ndarray:
        """c[p, i, j] = (t_j − t_i)/(t_i − t_p): the linear forecast in normalized time (0 where p ≥ i)."""
        t = np.asarray(times, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            c = (t[None, None, :] - t[None, :, None]) / (t[None, :, None] - t[:, None, None])
        return np.nan_to_num(c, nan=0.0, posinf=0.0, neginf=0.0)

    # ------------------------------------------------------------------ unconstrained least squares (Gram)
    def gram_of(self, fold: Optional[int] = None) -> np.ndarray:
        if self.gram is None:
            raise GCacheError("This profile has no Gram statistics (made before they were recorded): profile again "
                              "with forecast recording on.")
        return self._fold(self.gram, fold)

    def lstsq_weights(self, j: int, ks: Sequence[int], fold: Optional[int] = None) -> np.ndarray:
        """The pooled least-squares w of δ̂_j = Σ_k w_k δ_k over the residuals of steps ks (the minimum-norm one
        when they are linearly dependent, e.g. a repeated residual)."""
        g = self.gram_of(fold)
        ks = list(ks)
        return np.linalg.lstsq(g[np.ix_(ks, ks)], g[ks, j], rcond=_RCOND)[0]

    def lstsq_mse(self, j: int, ks: Sequence[int], w: Optional[np.ndarray] = None,
                  fold: Optional[int] = None) -> float:
        """Mean squared error of δ̂_j = Σ_k w_k δ_k on `fold` (w: the least-squares one on the same fold). Known to
        about 1e-7·(1 + Σ|w_k|)²·G[j, j] (module docstring); clipped at 0."""
        g = self.gram_of(fold)
        ks = list(ks)
        w = self.lstsq_weights(j, ks, fold) if w is None else np.asarray(w, dtype=np.float64)
        return float(max(g[j, j] - 2.0 * w @ g[ks, j] + w @ g[np.ix_(ks, ks)] @ w, 0.0))

    def two_step_rms(self, fit: Optional[int] = None, judge: Optional[int] = None) -> np.ndarray:
        """RMS error [p, i, j] (p < i < j; 0 elsewhere) of δ̂_j = a·δ_i + b·δ_p with (a, b) fitted by least squares
        per (p, i, j) on fold `fit` and judged on fold `judge` (None: both folds pooled)."""
        gf, gj = self.gram_of(fit), self.gram_of(judge)
        n = gf.shape[0]
        idx = np.arange(n)
        # M[p, i] = Gram of (δ_i, δ_p); rhs[p, i, j] = (G[i, j], G[p, j])
        M = np.empty((n, n, 2, 2))
        M[..., 0, 0] = np.diag(gf)[None, :]
        M[..., 1, 1] = np.diag(gf)[:, None]
        M[..., 0, 1] = M[..., 1, 0] = gf
        rhs = np.stack([np.broadcast_to(gf[None, :, :], (n, n, n)), np.broadcast_to(gf[:, None, :], (n, n, n))], -1)
        # the minimum-norm solution where δ_i and δ_p are (numerically) parallel, as lstsq gives
        ab = np.einsum("piab,pijb->pija", np.linalg.pinv(M, rcond=_RCOND, hermitian=True), rhs)
        a, b = ab[..., 0], ab[..., 1]
        Mj = np.empty((n, n, 2, 2))
        Mj[..., 0, 0] = np.diag(gj)[None, :]
        Mj[..., 1, 1] = np.diag(gj)[:, None]
        Mj[..., 0, 1] = Mj[..., 1, 0] = gj
        mse = (np.diag(gj)[None, None, :] - 2.0 * (a * gj[None, :, :] + b * gj[:, None, :])
               + a * a * Mj[..., 0, 0][..., None] + 2.0 * a * b * Mj[..., 0, 1][..., None]
               + b * b * Mj[..., 1, 1][..., None])
        valid = (idx[:, None, None] < idx[None, :, None]) & (idx[None, :, None] < idx[None, None, :])
        return np.where(valid, np.sqrt(np.maximum(mse, 0.0)), 0.0)
