"""Today's rival forecasters, as forecasters of the engine's protocol, for bench/quality.py's rows (bench only: they
are registered in the forecaster registry when this module is imported, and never in core/).

spectrum  Spectrum (CVPR'26, github.com/hanjq17/Spectrum, configs/algo/spectrum.yaml and src/utils/basis_utils.py):
          a per-sample ridge fit of Chebyshev coefficients T_0..T_M in time over the last `window` computed
          features, λ = 0.1, M = 4, window 10, time = the step index mapped to [−1, 1] over the run; the paper's
          w = 1 (pure Chebyshev). With a fixed basis and λ the ridge forecast is x(t_j)ᵀ(XᵀX + λI)⁻¹Xᵀ·[δ_k]: a linear
          combination of the kept residuals with weights that depend on the times only, so it is the engine's
          `weights` protocol exactly. We forecast the block stack's residual δ (their feature is the stack's output).
spectrum_mix  the repository's later recommendation w = 0.5: (1 − w)·(linear extrapolation in steps) + w·Chebyshev.
l2p_all   L2P-like (CVPR'26): per-step linear weights over every computed residual before a skipped step (lower
          triangular), least squares on full-compute residual trajectories: for a mask, skipped step j with computed
          steps k < j gets w = argmin Σ‖δ_j − Σ_k w_k δ_k‖², from the Gram matrix G[k, l] = mean δ_k·δ_l of the
          search seeds' full runs (a 1e-6 relative ridge keeps near-collinear residuals solvable). Its weights are
          the forecaster's parameters: {"w": {"<j>": [[k, …], [w_k, …]]}}. GCache's own forecaster 'l2p'
          (core/forecasters/l2p.py) is its variant over the last 4 computed residuals only (each kept residual is a
          full latent stream), fitted to the profile's Gram statistics; bench/quality.py has rows for both.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.observer import EngineObserver

SPECTRUM_M, SPECTRUM_LAMBDA, SPECTRUM_WINDOW = 4, 0.1, 10


def chebyshev_design(tau: np.ndarray, m: int) -> np.ndarray:
    """[len(tau), m + 1]: T_0..T_m at τ ∈ [−1, 1] by the recurrence."""
    tau = np.asarray(tau, dtype=np.float64)
    cols = [np.ones_like(tau), tau]
    for _ in range(2, m + 1):
        cols.append(2 * tau * cols[-1] - cols[-2])
    return np.stack(cols[: m + 1], axis=1)


class SpectrumLike:
    keeps = SPECTRUM_WINDOW

    def __init__(self, name: str, w: float):
        self.name, self.w = name, w

    def weights(self, kept: Sequence[int], j: int, times: Sequence[float], params: dict) -> list[float]:
        n = len(times)
        tau = lambda s: 2.0 * np.asarray(s, dtype=np.float64) / n - 1.0  # noqa: E731 (their t ∈ [0, steps] → [−1, 1])
        X = chebyshev_design(tau(list(kept)), SPECTRUM_M)
        x = chebyshev_design(tau([j]), SPECTRUM_M)[0]
        cheb = x @ np.linalg.solve(X.T @ X + SPECTRUM_LAMBDA * np.eye(X.shape[1]), X.T)
        if self.w >= 1.0 or len(kept) < 2:
            return [float(v) for v in cheb]
        k = (j - kept[-1]) / (kept[-1] - kept[-2])  # Newton forward difference in steps: δ_i + k(δ_i − δ_p)
        lin = np.zeros(len(kept))
        lin[-1], lin[-2] = 1.0 + k, -k
        return [float(v) for v in (1.0 - self.w) * lin + self.w * cheb]

    def dp_errors(self, profile):
        raise GCacheError(f"{self.name} has no exact DP: it is applied on given masks only.")

    def fit(self, profile, mask):
        return {}


class L2PLike:
    name = "l2p_all"
    keeps = 64  # every computed residual before a skipped step (K ≤ 64 here)

    def weights(self, kept: Sequence[int], j: int, times: Sequence[float], params: dict) -> list[float]:
        fit = (params or {}).get("w", {}).get(str(j))
        if fit is None or list(fit[0]) != list(kept):
            return [0.0] * (len(kept) - 1) + [1.0]  # not fitted for these steps: reuse
        return [float(v) for v in fit[1]]

    def dp_errors(self, profile):
        raise GCacheError("l2p_all has no exact DP: it is applied on given masks only (core's l2p has one).")

    def fit(self, profile, mask):
        raise GCacheError("l2p_all is fitted on residual trajectories: use l2p_params.")


def l2p_params(gram: np.ndarray, mask: Sequence[int], ridge: float = 1e-6) -> dict:
    """The least-squares weights of every skipped step (with 2+ computed steps before it) over the computed ones."""
    out, computed = {}, []
    for j, m in enumerate(mask):
        if m:
            computed.append(j)
            continue
        kept = computed[-L2PLike.keeps:]
        if len(kept) < 2:
            continue
        G = gram[np.ix_(kept, kept)]
        G = G + ridge * np.trace(G) / len(kept) * np.eye(len(kept))
        w = np.linalg.solve(G, gram[kept, j])
        out[str(j)] = [list(kept), [float(v) for v in w]]
    return {"w": out}


class GramRecorder(EngineObserver):
    """Records a full-compute run's residuals (every branch, every step) into G[k, l] = mean δ_k·δ_l (float64).
    An engine observer (core/observer.py): on_residual(step, branch, h, δ) on every computed step."""

    reads_h = True

    def __init__(self, n_steps: int):
        self.n = n_steps
        self.deltas: dict = {}

    def on_residual(self, step: int, branch, h: torch.Tensor, delta: torch.Tensor) -> None:
        self.deltas.setdefault(branch, {})[step] = delta.detach().reshape(-1).double().clone()

    def gram(self) -> np.ndarray:
        rows = []
        for per_step in self.deltas.values():
            if sorted(per_step) != list(range(self.n)):
                raise GCacheError("The trajectory run missed steps: every step must be computed.")
            rows.append(torch.stack([per_step[s] for s in range(self.n)]))
        V = torch.cat(rows, dim=1)  # [N, every branch's elements]
        return (V @ V.T / V.shape[1]).numpy()


def trajectory_gram(harness, seeds: Sequence[int]) -> np.ndarray:
    """G of the full-compute residual trajectories of `seeds` on a ReferenceHarness."""
    rec = GramRecorder(harness.n_steps)
    harness.run(seeds, mask=None, recorder=rec)
    return rec.gram()


for _fc in (SpectrumLike("spectrum", 1.0), SpectrumLike("spectrum_mix", 0.5), L2PLike()):
    forecasters.register(_fc)
