"""Squared-error statistics of linear-form forecasts on a profile: δ̂_j = δ_i + c·(δ_i − δ_p) for computed p < i < j.

With a[p, i] = δ_i − δ_p and b[i, j] = δ_j − δ_i, the mean squared error of any such forecast is
    mse(c) = sq[i, j] − 2c·cross[p, i, j] + c²·sq[p, i],   sq[i, j] = mean (δ_j − δ_i)²,  cross = mean a·b,
so these two arrays give, exactly and mergeably (sums over samples), the error of reuse (c = 0), of the linear
forecast (c = (t_j − t_i)/(t_i − t_p)) and of the least-squares c, α = cross / sq[p, i] (profile-fitted forecaster).
Each is kept for two folds, the even and the odd elements of the (sampled) residual, so that a forecaster fitted
on one fold is judged on the other (auto mode's choice of forecaster). Differences are formed before squaring:
no cancellation of large sums.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class FitStats:
    sq: np.ndarray      # [N, N, 2]: mean over the fold's elements of (δ_i − δ_j)², mean over samples
    cross: np.ndarray   # [N, N, N, 2]: mean of (δ_i − δ_p)(δ_j − δ_i), for p < i < j

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
