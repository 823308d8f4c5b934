"""The forecast statistics a profile records (core/fit_stats.py) against a direct computation, and the
profile-fitted forecaster they give."""
import numpy as np
import pytest
import torch

from gcache.core import forecasters
from gcache.core.profile import Profile
from gcache.core.recorder import ProfileRecorder

N = 7


def _deltas(seed=0, m=(3, 10, 6)):
    """A smooth residual trajectory plus noise, one per step, like a DiT's δ over a run."""
    g = torch.Generator().manual_seed(seed)
    base, drift, curve = (torch.randn(m, generator=g) for _ in range(3))
    t = torch.linspace(1, 0, N)
    return [base + tt * drift + tt ** 2 * curve + 0.05 * torch.randn(m, generator=g) for tt in t], t.tolist()


def _record(deltas, times, chunk_elems=1 << 25):
    rec = ProfileRecorder(times, forecast=True, chunk_elems=chunk_elems)
    for j, d in enumerate(deltas):
        rec.record(j, "all", torch.zeros_like(d), d)
    return rec.finish()


@pytest.mark.parametrize("chunk_elems", [1 << 25, 180])  # every row at once, or a few rows per chunk
def test_recorded_statistics_equal_a_direct_computation(chunk_elems):
    deltas, times = _deltas()
    prof = _record(deltas, times, chunk_elems)
    flat = [d.reshape(-1).double().numpy() for d in deltas]
    half = flat[0].size // 2
    folds = [np.arange(0, 2 * half, 2), np.arange(1, 2 * half, 2)]
    st = prof.fit_stats()
    for f, idx in enumerate(folds):
        for i in range(N):
            for j in range(N):
                assert st.sq[i, j, f] == pytest.approx(np.mean((flat[i][idx] - flat[j][idx]) ** 2), rel=1e-5)
        for p in range(N):
            for i in range(p + 1, N):
                for j in range(i + 1, N):
                    want = np.mean((flat[i][idx] - flat[p][idx]) * (flat[j][idx] - flat[i][idx]))
                    assert st.cross[p, i, j, f] == pytest.approx(want, rel=1e-4, abs=1e-7)
    # RMS of reuse (c = 0) equals the direct RMS of δ_j − δ_i
    assert st.rms(np.zeros((N, N, N)))[0, 2, 5] == pytest.approx(
        np.sqrt(np.mean((flat[5][:2 * half] - flat[2][:2 * half]) ** 2)), rel=1e-5)


def test_fitted_alpha_is_the_least_squares_fit_and_never_worse_on_the_profile():
    deltas, times = _deltas(seed=1)
    st = _record(deltas, times).fit_stats()
    a, c_lin = st.alpha(), st.linear_c(times)
    fit, reuse, lin = st.rms(a), st.rms(np.zeros_like(a)), st.rms(c_lin)
    p, i, j = 1, 3, 6
    x = np.concatenate([(deltas[i] - deltas[p]).reshape(-1).numpy()])[: 2 * (deltas[0].numel() // 2)]
    y = np.concatenate([(deltas[j] - deltas[i]).reshape(-1).numpy()])[: 2 * (deltas[0].numel() // 2)]
    assert a[p, i, j] == pytest.approx(np.dot(x, y) / np.dot(x, x), rel=1e-4)
    tri = [(p, i, j) for p in range(N) for i in range(p + 1, N) for j in range(i + 1, N)]
    assert all(fit[t] <= reuse[t] + 1e-9 and fit[t] <= lin[t] + 1e-9 for t in tri)
    assert np.mean([lin[t] for t in tri]) < np.mean([reuse[t] for t in tri])  # a smooth δ: linear beats reuse


def test_statistics_merge_and_survive_the_file(tmp_path):
    d1, times = _deltas(seed=2)
    d2, _ = _deltas(seed=3)
    a, b = _record(d1, times), _record(d2, times)
    merged = Profile.from_bytes(a.merge(b).to_bytes())
    assert merged.count == 2
    assert np.allclose(merged.fit_stats().cross, (a.fit_cross_sum + b.fit_cross_sum) / 2)
    old = _record(d1, times)
    old.fit_sq_sum = old.fit_cross_sum = None  # a profile recorded before the fit statistics existed
    assert not a.merge(old).has_fit_stats() and a.merge(old).E1 is not None
    with pytest.raises(Exception, match="forecast statistics"):
        old.fit_stats()


def test_fitted_forecaster_weights_follow_the_policys_alpha_or_forecast_linearly():
    fc = forecasters.get("fitted")
    times = [1.0, 0.8, 0.6, 0.4]
    params = {"alpha": {"3": [0, 2, 0.25]}}
    assert fc.weights([0, 2], 3, times, params) == [-0.25, 1.25]
    assert fc.weights([1, 2], 3, times, params) == pytest.approx([-1.0, 2.0])  # other kept steps: linear
    assert fc.weights([2], 3, times, params) == [1.0]                           # one kept step: reuse
    assert forecasters.canonical(1) == "linear" and forecasters.get(0).name == "reuse"
    assert set(forecasters.names()) >= {"reuse", "linear", "quadratic", "fitted"}
