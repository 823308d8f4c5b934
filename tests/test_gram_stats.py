"""The Gram statistics a forecast profile records and what core/fit_stats.py derives from them (unconstrained
least-squares weights, their mean squared error, the two-step least-squares RMS tensor), against float64
least squares over the stored residuals (stats_oracle.lstsq_fit)."""
import numpy as np
import pytest
import stats_oracle as oracle
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gcache.core.errors import GCacheError
from gcache.core.profile import Profile
from gcache.core.recorder import ProfileRecorder

CI = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


def record(samples, times, dtype):
    """One profile of several samples (branches), each a list of N residual tensors."""
    rec = ProfileRecorder(times, forecast=True)
    for j in range(len(times)):
        for b, ds in enumerate(samples):
            rec.record(j, b, torch.zeros_like(ds[j]), ds[j].to(dtype))
    return rec.finish()


def folded(samples, dtype, fold):
    """Per sample and step, the float64 values of the fold's elements (fold None: the elements of both folds)."""
    out = []
    for ds in samples:
        steps = []
        for d in ds:
            f0, f1 = oracle.folds(oracle.sampled(d.to(dtype), 1))
            steps.append({0: f0, 1: f1, None: None}[fold] if fold is not None else (f0, f1))
        out.append(steps)
    return out


def oracle_mse(samples, dtype, j, ks, fit, judge):
    """Least squares of δ_j on δ_ks fitted on fold `fit`, the mean squared error on fold `judge` (None: the
    two folds pooled as the statistics pool them, each fold weighing half)."""
    parts = folded(samples, dtype, None)

    def data(fold):
        ys, xs = [], []
        for steps in parts:
            for f in ((0, 1) if fold is None else (fold,)):
                ys.append(steps[j][f])
                xs.append([steps[k][f] for k in ks])
        return ys, xs
    w, _ = oracle.lstsq_fit(*data(fit))
    ys, xs = data(judge)
    mse = float(np.mean([np.mean((y - np.stack(x, axis=1) @ w) ** 2) for y, x in zip(ys, xs)]))
    return w, mse


@st.composite
def cases(draw):
    n = draw(st.integers(3, 6))
    n_samples = draw(st.integers(1, 2))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    kind = draw(st.sampled_from(["random", "smooth", "repeat"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    times = [1.0 - k / n for k in range(n)]
    m = draw(st.sampled_from([(2, 8, 4), (1, 5, 7), (3, 16, 8)]))  # odd element counts included
    samples = []
    for _ in range(n_samples):
        base, drift = torch.randn(m, generator=g), torch.randn(m, generator=g)
        ds = []
        for k in range(n):
            if kind == "smooth":  # δ nearly linear in t: two-step forecasts are near-exact
                d = base + times[k] * drift + 0.01 * torch.randn(m, generator=g)
            elif kind == "repeat" and k == 2:
                d = ds[1].clone()  # a repeated residual: a singular Gram block
            else:
                d = torch.randn(m, generator=g)
            ds.append(d)
        samples.append(ds)
    return samples, times, dtype


@CI
@given(cases(), st.sampled_from([None, 0, 1]), st.data())
def test_lstsq_weights_and_mse_equal_float64_least_squares(case, fold, data):
    samples, times, dtype = case
    st_ = record(samples, times, dtype).fit_stats()
    n = len(times)
    j = data.draw(st.integers(1, n - 1))
    ks = data.draw(st.lists(st.integers(0, j - 1), min_size=1, max_size=min(j, 3), unique=True))
    w_want, mse_want = oracle_mse(samples, dtype, j, ks, fold, fold)
    w = st_.lstsq_weights(j, ks, fold)
    g = st_.gram_of(fold)
    scale = g[j, j] + 2 * np.abs(w) @ np.abs(g[ks, j]) + np.abs(w) @ np.abs(g[np.ix_(ks, ks)]) @ np.abs(w)
    assert abs(st_.lstsq_mse(j, ks, fold=fold) - mse_want) <= 1e-5 * mse_want + 64 * oracle.EPS32 * scale
    # the weights themselves where the block is well conditioned (else many w give the same fit)
    if np.linalg.cond(g[np.ix_(ks, ks)]) < 1e3:
        assert np.allclose(w, w_want, rtol=1e-3, atol=1e-3 * (1 + np.abs(w_want).max()))
    # any other w: the same quadratic form, still exact (no fit involved)
    other = w + 0.5
    want_other = float(np.mean([np.mean((y - np.stack(x, 1) @ other) ** 2) for y, x in _pairs(samples, dtype, j, ks,
                                                                                                  fold)]))
    assert abs(st_.lstsq_mse(j, ks, other, fold) - want_other) <= 1e-5 * want_other + 64 * oracle.EPS32 * (
        g[j, j] + 2 * np.abs(other) @ np.abs(g[ks, j]) + np.abs(other) @ np.abs(g[np.ix_(ks, ks)]) @ np.abs(other))


def _pairs(samples, dtype, j, ks, fold):
    for steps in folded(samples, dtype, None):
        for f in ((0, 1) if fold is None else (fold,)):
            yield steps[j][f], [steps[k][f] for k in ks]


@CI
@given(cases(), st.sampled_from([(None, None), (0, 1), (1, 0), (0, 0)]))
def test_two_step_rms_equals_float64_least_squares_per_triple(case, folds):
    samples, times, dtype = case
    fit, judge = folds
    st_ = record(samples, times, dtype).fit_stats()
    got = st_.two_step_rms(fit, judge)
    n = len(times)
    g = st_.gram_of(judge)
    for p in range(n):
        for i in range(n):
            for j in range(n):
                if not p < i < j:
                    assert got[p, i, j] == 0
                    continue
                w, mse = oracle_mse(samples, dtype, j, [i, p], fit, judge)
                scale = g[j, j] + 2 * np.abs(w) @ np.abs(g[[i, p], j]) + \
                    np.abs(w) @ np.abs(g[np.ix_([i, p], [i, p])]) @ np.abs(w)
                assert abs(got[p, i, j] ** 2 - mse) <= 1e-5 * mse + 64 * oracle.EPS32 * scale, (p, i, j)


def test_a_near_exact_forecast_is_resolved_to_the_stated_precision():
    """fit_stats.py's docstring: on float32 residuals of 65536 elements an RMS error of 3e-4·RMS(δ_j) comes out
    within a few percent (one float32 sum over the whole fold lost it entirely)."""
    g = torch.Generator().manual_seed(0)
    m = 65536
    dp = torch.randn(m, generator=g, dtype=torch.float64) * 3 + 1
    di = torch.randn(m, generator=g, dtype=torch.float64) * 2
    exact = 2 * di - dp
    dj = exact + 3e-4 * exact.std() * torch.randn(m, generator=g, dtype=torch.float64)
    ds = [x.float().reshape(1, -1, 64) for x in (dp, di, dj)]
    rms = record([ds], [1.0, 0.7, 0.4], torch.float32).fit_stats().two_step_rms()[0, 1, 2]
    X = np.stack([ds[1].double().reshape(-1).numpy(), ds[0].double().reshape(-1).numpy()], 1)
    y = ds[2].double().reshape(-1).numpy()
    want = np.sqrt(np.mean((y - X @ np.linalg.lstsq(X, y, rcond=None)[0]) ** 2))
    assert want / np.sqrt(np.mean(y ** 2)) == pytest.approx(3e-4, rel=0.1)
    assert rms == pytest.approx(want, rel=0.05)


def test_gram_statistics_merge_survive_the_file_and_are_optional(tmp_path):
    g = torch.Generator().manual_seed(3)
    times = [1.0, 0.6, 0.3]
    a = record([[torch.randn(2, 3, 4, generator=g) for _ in times]], times, torch.float32)
    b = record([[torch.randn(2, 3, 4, generator=g) for _ in times]], times, torch.float32)
    merged = Profile.from_bytes(a.merge(b).to_bytes())
    assert np.allclose(merged.gram_sum, a.gram_sum + b.gram_sum, rtol=1e-15, atol=0)
    assert np.allclose(merged.fit_stats().gram, (a.gram_sum + b.gram_sum) / 2)
    older = Profile.from_bytes(a.to_bytes())
    older.gram_sum = None  # a profile recorded before the Gram statistics
    assert a.merge(older).gram_sum is None and a.merge(older).has_fit_stats()
    assert Profile.from_bytes(older.to_bytes()).gram_sum is None
    with pytest.raises(GCacheError, match="no Gram statistics"):
        older.fit_stats().lstsq_weights(2, [0, 1])
