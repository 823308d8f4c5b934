"""Outer proposer (paper Algorithm 2, Appendix D.3): GP-LCB over the Bernstein coefficients s ∈ [s_min, s_max]^{d+1}.

- start: the 2^{d+1} grid at {0.25, 0.75} of the box per dimension;
- κ decays linearly from 2.576 to 1.0 over the GP iterations (budget − grid size);
- surrogate: scikit-learn GaussianProcessRegressor, C·Matérn-5/2 (ARD) + white noise, inputs scaled to the
  unit box, normalize_y;
- next s = argmin μ − κσ: random candidates, then L-BFGS-B polish of the best few.

Cost: a fit with optimizer restarts takes ~8 s at n = 500 on a 2-core CPU. We warm-start: each fit starts
from the previous fit's hyperparameters with no restarts and a capped number of L-BFGS-B steps; a cold fit
(default start + one random restart) runs only every `cold_every` observations, to leave a poor local optimum.
Everything random is seeded by (seed, iteration), so a resumed search proposes exactly what an
uninterrupted one would, given the stored warm-start hyperparameters.
"""
from __future__ import annotations

import itertools
import warnings
from typing import Optional

import numpy as np

KAPPA_START = 2.576
KAPPA_END = 1.0
# The GP's settings (SearchConfig's defaults; GPLCB's arguments)
N_CANDIDATES = 2048  # random candidates of the acquisition per proposal
N_POLISH = 3         # L-BFGS-B runs from the best of them
WARM_MAXITER = 30    # L-BFGS-B steps of a warm-started hyperparameter fit
COLD_EVERY = 50      # a cold fit (default start + a restart) every this many observations


def start_grid(dim: int, s_min: float, s_max: float) -> np.ndarray:
    """The 2^dim structured start points {0.25, 0.75}^dim mapped to the box, in a fixed order."""
    unit = np.array(list(itertools.product((0.25, 0.75), repeat=dim)), dtype=np.float64)
    return s_min + unit * (s_max - s_min)


def kappa_schedule(i: int, n_iters: int) -> float:
    """κ of GP iteration i (0-based) of n_iters: linear from 2.576 (first) to 1.0 (last)."""
    if n_iters <= 1:
        return KAPPA_START
    frac = min(max(i / (n_iters - 1), 0.0), 1.0)
    return KAPPA_START + (KAPPA_END - KAPPA_START) * frac


def _kernel(dim: int):
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel
    return (ConstantKernel(1.0, (1e-3, 1e3))
            * Matern(length_scale=np.ones(dim), length_scale_bounds=(1e-2, 1e2), nu=2.5)
            + WhiteKernel(1e-3, (1e-6, 1.0)))


class GPLCB:
    """Fits the surrogate on (S, y) and proposes the next s; `theta` (log hyperparameters) is the warm start."""

    def __init__(self, dim: int, s_min: float, s_max: float, seed: int = 0, n_candidates: int = N_CANDIDATES,
                 n_polish: int = N_POLISH, warm_maxiter: int = WARM_MAXITER, cold_every: int = COLD_EVERY,
                 cold_restarts: int = 1,
                 hyper_every: int = 5, hyper_always_below: int = 100):
        self.dim, self.s_min, self.s_max, self.seed = dim, float(s_min), float(s_max), int(seed)
        self.n_candidates, self.n_polish = n_candidates, n_polish
        self.warm_maxiter, self.cold_every, self.cold_restarts = warm_maxiter, cold_every, cold_restarts
        self.hyper_every, self.hyper_always_below = hyper_every, hyper_always_below
        self.gp = None
        self.X = self.y = None  # what the surrogate was fitted on (unit box, GP targets)

    # ---------------------------------------------------------------- scaling
    def to_unit(self, s: np.ndarray) -> np.ndarray:
        return (np.asarray(s, dtype=np.float64) - self.s_min) / (self.s_max - self.s_min)

    def from_unit(self, x: np.ndarray) -> np.ndarray:
        return self.s_min + np.clip(x, 0.0, 1.0) * (self.s_max - self.s_min)

    def rng(self, iteration: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, int(iteration)])

    # ---------------------------------------------------------------- fit
    def fit(self, S: np.ndarray, y: np.ndarray, theta: Optional[list] = None) -> list:
        """Fit on observations; returns the fitted log-hyperparameters (the next fit's warm start)."""
        from scipy.optimize import minimize
        from sklearn.gaussian_process import GaussianProcessRegressor
        X = self.to_unit(S)
        n = len(y)
        kernel = _kernel(self.dim)
        cold = theta is None or (self.cold_every and n % self.cold_every == 0)
        if theta is not None:
            kernel = kernel.clone_with_theta(np.asarray(theta, dtype=np.float64))
        maxiter = 200 if cold else self.warm_maxiter

        def lbfgs(obj_func, initial_theta, bounds):
            res = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds,
                           options={"maxiter": maxiter})
            return res.x, res.fun

        # Past `hyper_always_below` points one more observation barely moves the hyperparameters: re-optimize
        # them every `hyper_every` observations and otherwise only refactor the kernel matrix (~10x cheaper).
        frozen = not cold and n >= self.hyper_always_below and self.hyper_every > 1 and n % self.hyper_every != 0
        gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, optimizer=None if frozen else lbfgs,
                                      n_restarts_optimizer=self.cold_restarts if cold else 0,
                                      random_state=int(self.rng(10_000_000 + n).integers(2**31 - 1)))
        with warnings.catch_warnings():  # bound-hitting hyperparameters are expected for flat or exact losses
            warnings.simplefilter("ignore")
            gp.fit(X, np.asarray(y, dtype=np.float64))
        self.gp, self.X, self.y = gp, X, np.asarray(y, dtype=np.float64)
        return [float(v) for v in gp.kernel_.theta]

    def add_pending(self, S_pending: np.ndarray) -> None:
        """GP-BUCB: points still being evaluated count as observed at the posterior mean, with the fitted
        hyperparameters kept. μ does not move and σ shrinks around them, so the next proposal goes elsewhere
        instead of repeating one that is out."""
        from sklearn.gaussian_process import GaussianProcessRegressor
        if self.gp is None:
            raise RuntimeError("fit() first")
        Xp = self.to_unit(S_pending)
        kernel = _kernel(self.dim).clone_with_theta(self.gp.kernel_.theta)
        gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, optimizer=None)
        X, y = np.vstack([self.X, Xp]), np.concatenate([self.y, self.gp.predict(Xp)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gp.fit(X, y)
        self.gp, self.X, self.y = gp, X, y

    # ---------------------------------------------------------------- acquisition
    def _acq(self, X: np.ndarray, kappa: float) -> np.ndarray:
        mu, sd = self.gp.predict(np.atleast_2d(X), return_std=True)
        return mu - kappa * sd

    def minimize_acq(self, kappa: float, iteration: int, extra_starts: Optional[np.ndarray] = None) -> np.ndarray:
        """argmin over the box of μ − κσ (κ = 0: the posterior mean). Returns s (not unit-scaled)."""
        from scipy.optimize import minimize
        if self.gp is None:
            raise RuntimeError("fit() first")
        rng = self.rng(iteration)
        cand = rng.random((self.n_candidates, self.dim))
        if extra_starts is not None and len(extra_starts):
            cand = np.vstack([cand, self.to_unit(extra_starts)])
        vals = self._acq(cand, kappa)
        best_x, best_v = cand[int(np.argmin(vals))], float(np.min(vals))
        bounds = [(0.0, 1.0)] * self.dim
        for i in np.argsort(vals)[: self.n_polish]:
            res = minimize(lambda x: float(self._acq(x, kappa)[0]), cand[i], method="L-BFGS-B", bounds=bounds,
                           options={"maxiter": 30})
            if res.fun < best_v:
                best_x, best_v = np.clip(res.x, 0.0, 1.0), float(res.fun)
        return self.from_unit(best_x)
