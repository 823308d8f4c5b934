"""The rival forecasters of bench/rivals.py against direct computations: Spectrum's ridge fit of Chebyshev
coefficients, L2P's least squares, the Gram matrix of a full run, and the engine applying their weights."""
import numpy as np
import pytest
import torch

from gcache.bench.rivals import GramRecorder, SpectrumLike, chebyshev_design, l2p_params
from gcache.core import forecasters
from gcache.core.engine import ResidualCache


def test_chebyshev_columns_are_cos_of_multiples():
    tau = np.linspace(-1, 1, 7)
    X = chebyshev_design(tau, 4)
    assert np.allclose(X, np.cos(np.outer(np.arccos(tau), np.arange(5))))  # T_m(cos θ) = cos(mθ)


@pytest.mark.parametrize("w", [1.0, 0.5])
def test_spectrum_weights_equal_a_per_sample_ridge_fit(w):
    """Fit the coefficients c = argmin ‖Xc − H‖² + λ‖c‖² on the kept residuals (a stacked least-squares problem), then
    evaluate at the skipped step: the same as Σ_k w_k δ_k with the forecaster's weights."""
    rng = np.random.default_rng(0)
    n, kept, j = 20, [0, 2, 3, 6, 7, 9], 11
    H = rng.standard_normal((len(kept), 5))  # 5 feature elements, one row per kept step
    tau = lambda s: 2 * np.asarray(s, dtype=float) / n - 1  # noqa: E731
    X = chebyshev_design(tau(kept), 4)
    lam = 0.1
    c = np.linalg.lstsq(np.vstack([X, np.sqrt(lam) * np.eye(5)]), np.vstack([H, np.zeros((5, 5))]), rcond=None)[0]
    cheb = chebyshev_design(tau([j]), 4)[0] @ c
    k = (j - kept[-1]) / (kept[-1] - kept[-2])
    want = w * cheb + (1 - w) * (H[-1] + k * (H[-1] - H[-2]))
    weights = SpectrumLike("x", w).weights(kept, j, list(np.linspace(1, 0, n)), {})
    assert np.allclose(np.asarray(weights) @ H, want)


def test_l2p_weights_are_the_least_squares_fit_of_the_trajectories():
    rng = np.random.default_rng(1)
    n, m = 9, 400
    base = rng.standard_normal((3, m))
    traj = np.stack([base[0] + t * base[1] + t * t * base[2] + 0.1 * rng.standard_normal(m)
                     for t in np.linspace(1, 0, n)])
    gram = traj @ traj.T / m
    mask = [1, 1, 0, 1, 0, 0, 1, 0, 0]
    params = l2p_params(gram, mask, ridge=0.0)
    for j in (4, 5, 7, 8):
        kept, w = params["w"][str(j)]
        assert kept == [i for i in range(j) if mask[i]]
        direct = np.linalg.lstsq(traj[kept].T, traj[j], rcond=None)[0]
        assert np.allclose(w, direct, atol=1e-8)
    assert "2" in params["w"] and params["w"]["2"][0] == [0, 1]


def test_gram_recorder_is_the_mean_product_of_every_branch_residual():
    n = 4
    rec = GramRecorder(n)
    g = torch.Generator().manual_seed(2)
    deltas = {b: [torch.randn(2, 3, generator=g) for _ in range(n)] for b in ("cond", "uncond")}
    for s in range(n):
        for b in deltas:
            rec.on_residual(s, b, torch.zeros(2, 3), deltas[b][s])
    V = np.stack([np.concatenate([deltas[b][s].reshape(-1).numpy() for b in deltas]) for s in range(n)]).astype(float)
    assert np.allclose(rec.gram(), V @ V.T / V.shape[1])


def test_the_engine_applies_the_rivals_weights():
    """A skipped step adds Σ_k w_k δ_k over the kept residuals (the forecaster's weights) to its block input."""
    n = 8
    times = list(np.linspace(1, 0, n + 1)[:-1])
    mask = [1, 1, 1, 0, 1, 0, 0, 1]
    deltas = [torch.full((1, 2), float(s) ** 1.5) for s in range(n)]
    for name, params in (("spectrum", {}), ("l2p_all", {"w": {"5": [[0, 1, 2, 4], [0.1, -0.2, 0.3, 0.8]]}})):
        cache = ResidualCache(mask, forecast=name, times=times, forecast_params=params)
        for s in range(n):
            cache.set_step(s)
            h = torch.zeros(1, 2)
            out = cache.run(h, ["all"], lambda x, s=s: x + deltas[s])
            if s == 5:
                kept = [0, 1, 2, 4][-forecasters.get(name).keeps:]
                w = forecasters.get(name).weights(kept, 5, times, params)
                assert torch.allclose(out, sum(wk * deltas[k] for wk, k in zip(w, kept)))
        if name == "l2p_all":
            assert w == [0.1, -0.2, 0.3, 0.8]
