"""The l2p forecaster (core/forecasters/l2p.py) against numpy's least squares on the residual trajectories themselves:
its weights, what the engine adds with them, its DP errors as an upper bound of its own in-sample error, its Policy
parameters (round trip and checks), and what it says on a profile without Gram statistics."""
import numpy as np
import pytest
import torch

from gcache.core import forecasters
from gcache.core.engine import ResidualCache
from gcache.core.errors import GCacheError
from gcache.core.policy import Policy
from gcache.core.recorder import ProfileRecorder
from gcache.search.instant import instant_policy

N = 10
MASK = [1, 1, 0, 1, 1, 0, 1, 1, 0, 0]  # step 9 keeps 4 of 6 computed steps; step 2 keeps 2


def trajectories(n_samples=2, m=300, seed=0):
    """Per sample (a branch), N smooth residuals plus noise, float32."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(1, 0, N + 1)[:-1]  # the last step ends at 0
    out = []
    for _ in range(n_samples):
        a, b, c = (torch.randn(m, generator=g) for _ in range(3))
        out.append([a + tt * b + tt ** 2 * c + torch.sin(5 * tt) * a * 0.3 + 0.05 * torch.randn(m, generator=g)
                    for tt in t])
    return out, t.tolist()


def profile_of(samples, times, forecast=True):
    rec = ProfileRecorder(times, forecast=forecast)
    for j in range(N):
        for b, ds in enumerate(samples):
            rec.record(j, b, torch.zeros_like(ds[j]), ds[j])
    return rec.finish()


def oracle_weights(samples, j, ks):
    """np.linalg.lstsq of δ_j on δ_ks over every sample's elements (the samples are the same size, so pooling their
    means is pooling their elements)."""
    A = np.concatenate([np.stack([ds[k].double().numpy() for k in ks], 1) for ds in samples])
    y = np.concatenate([ds[j].double().numpy() for ds in samples])
    w = np.linalg.lstsq(A, y, rcond=None)[0]
    return w, float(np.sqrt(np.mean((A @ w - y) ** 2)))


def test_weights_are_the_least_squares_fit_of_the_last_four_computed_residuals():
    samples, times = trajectories()
    pol = Policy.for_mask(profile_of(samples, times), MASK, "l2p")
    w = pol.forecast_params["w"]
    assert sorted(w, key=int) == ["2", "5", "8", "9"]
    for j, ks in ((2, [0, 1]), (5, [0, 1, 3, 4]), (8, [1, 3, 4, 6, 7][-4:]), (9, [3, 4, 6, 7])):
        assert w[str(j)][0] == ks
        assert np.allclose(w[str(j)][1], oracle_weights(samples, j, ks)[0], atol=1e-4), j  # measured ≤ 1.2e-5


def test_the_engine_adds_the_weighted_residuals():
    samples, times = trajectories(n_samples=1)
    deltas = samples[0]
    pol = Policy.for_mask(profile_of(samples, times), MASK, "l2p")
    cache = ResidualCache(pol.mask, forecast="l2p", times=pol.times, forecast_params=pol.forecast_params)
    computed = []
    for j in range(N):
        cache.set_step(j)
        h = torch.full_like(deltas[0], 0.25 * j)
        out = cache.run(h, ["all"], lambda x, j=j: x + deltas[j])
        if MASK[j]:
            computed.append(j)
            continue
        ks = computed[-4:]
        w = oracle_weights(samples, j, ks)[0]
        want = h.double() + sum(wk * deltas[k].double() for wk, k in zip(w, ks))
        assert torch.allclose(out.double(), want, atol=5e-3), j
    # a forced computation (kept steps other than the policy's): linear from the last two, as the fitted one does
    fc = forecasters.get("l2p")
    lin = forecasters.get("linear").weights([4, 6], 8, times, {})
    assert fc.weights([3, 4, 6], 8, times, pol.forecast_params) == [0.0] + lin


def test_dp_errors_bound_its_in_sample_error_from_above():
    samples, times = trajectories()
    e2, e3 = forecasters.get("l2p").dp_errors(profile_of(samples, times))
    for i, j in ((0, 1), (0, 5), (3, 9)):
        reuse = np.sqrt(np.mean(np.concatenate([(ds[j] - ds[i]).double().numpy() ** 2 for ds in samples])))
        assert e2[i, j] == pytest.approx(reuse, rel=1e-4)
    for ks, j in (([0, 1], 2), ([0, 1, 3, 4], 5), ([3, 4, 6, 7], 9), ([1, 4, 6, 7], 8)):
        p, i = ks[-2:]
        two = oracle_weights(samples, j, [p, i])[1]
        assert e3[p, i, j] == pytest.approx(two, rel=1e-3)  # the two-step least-squares RMS …
        assert oracle_weights(samples, j, ks)[1] <= e3[p, i, j] * (1 + 1e-3)  # … bounds the one over more


def test_instant_policy_and_file_round_trip(tmp_path):
    samples, times = trajectories()
    pol = instant_policy(profile_of(samples, times), 5, "theory", forecast="l2p")
    assert pol.forecast == "l2p" and pol.method == "theory_dp_l2p" and pol.n_computed == 5
    path = str(tmp_path / "l2p.json")
    pol.save(path)
    back = Policy.load(path)
    assert back.forecast == "l2p" and back.forecast_params == pol.forecast_params and back.mask == pol.mask


def test_the_policy_checks_its_weights():
    samples, times = trajectories()
    good = Policy.for_mask(profile_of(samples, times), MASK, "l2p").forecast_params["w"]
    bad = [{"w": dict(good, **{"9": [[4, 6, 7], good["9"][1][:3]]})},  # not the last four computed steps
           {"w": dict(good, **{"9": [good["9"][0], good["9"][1][:3]]})},  # a weight short
           {"w": dict(good, **{"9": [good["9"][0], [1.0, float("nan"), 0.0, 0.0]]})},
           {"w": dict(good, **{"7": [[1, 3, 4, 6], [0.0, 0.0, 0.0, 1.0]]})},  # a computed step
           {"w": good, "alpha": {}}, {"w": [1, 2]}]
    for params in bad:
        with pytest.raises(GCacheError, match="l2p forecast weights are inconsistent"):
            Policy(MASK, forecast="l2p", forecast_params=params)
    assert Policy(MASK, forecast="l2p", forecast_params={}).forecast_params == {}  # unfitted: linear on every skip


def test_a_profile_without_gram_statistics_says_to_record_forecasts():
    samples, times = trajectories()
    for prof in (profile_of(samples, times, forecast=False), profile_of(samples, times)):
        if prof.has_fit_stats():
            prof.gram_sum = None  # a profile made before the Gram statistics were recorded
        with pytest.raises(GCacheError, match="Gram statistics.*record_forecast"):
            Policy.for_mask(prof, MASK, "l2p")
        with pytest.raises(GCacheError, match="Gram statistics"):
            instant_policy(prof, 5, "theory", forecast="l2p")


def test_l2p_traits():
    fc = forecasters.get("l2p")
    assert fc.label == "l2p (profile)" and fc.keeps == 4 and fc.needs_profile and fc.forecasts
    assert not fc.auto_candidate and forecasters.names().index("l2p") == forecasters.names().index("fitted") + 1
    assert "l2p" not in forecasters.profile_free()
