"""The order-1 forecast DP (headless): exact against brute force, locally optimal at N = 50, its search/instant use."""
import numpy as np
import pytest
from test_search_bilevel import CFG, make_profile

from gcache.core.errors import GCacheError
from gcache.search.dp import dp_mask
from gcache.search.dp_forecast import brute_force, dp_mask_forecast, forecast_mask_cost
from gcache.search.instant import instant_policy


@pytest.mark.parametrize("seed", range(12))
def test_forecast_dp_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    k = int(rng.integers(1, n + 1))
    E = rng.random((n, n))
    np.fill_diagonal(E, 0.0)
    E1, w = rng.random((n, n, n)), rng.normal(size=n)
    mask, cost = dp_mask_forecast(E, E1, w, k)
    want_mask, want = brute_force(E, E1, w, k)
    assert sum(mask) == k and mask[0] == 1
    assert cost == pytest.approx(want, abs=1e-9) and forecast_mask_cost(E, E1, w, mask) == pytest.approx(cost)


def test_forecast_dp_differs_from_reuse_when_forecasting_changes_the_errors():
    n = 10
    rng = np.random.default_rng(3)
    E = np.abs(rng.normal(size=(n, n)))
    np.fill_diagonal(E, 0.0)
    E1 = np.zeros((n, n, n))
    E1[:, :, : n // 2] = 5.0  # forecasting is poor early, perfect late: computing early pays off
    w = np.zeros(n)
    assert dp_mask_forecast(E, E1, w, 4)[0] != dp_mask(E, w, 4)[0]


def test_forecast_dp_at_n_50_beats_every_single_swap():
    """Beyond brute force's reach (N = 50): the DP's mask costs what it reports, and moving any one computed step to
    any skipped one costs at least as much. (Its speed, ~10 ms, is measured in bench/RESULTS.md, not asserted.)"""
    rng = np.random.default_rng(0)
    n = 50
    E, E1, w = rng.random((n, n)), rng.random((n, n, n)), rng.normal(size=n)
    for k in (17, 25, 33):
        mask, cost = dp_mask_forecast(E, E1, w, k)
        assert sum(mask) == k and mask[0] == 1 and forecast_mask_cost(E, E1, w, mask) == pytest.approx(cost)
        for i in (i for i in range(1, n) if mask[i]):
            for j in (j for j in range(1, n) if not mask[j]):
                other = list(mask)
                other[i], other[j] = 0, 1
                assert forecast_mask_cost(E, E1, w, other) >= cost - 1e-9, (k, i, j)


def test_bad_e1_and_profiles_without_it_say_what_to_do():
    with pytest.raises(GCacheError, match="N×N×N"):
        dp_mask_forecast(np.zeros((4, 4)), np.zeros((3, 3, 3)), np.zeros(4), 2)
    with pytest.raises(GCacheError, match="forecast recording"):
        instant_policy(make_profile(n=6), 3, forecast=1)


def test_forecast_search_uses_e1_seeds_the_reuse_mask_and_records_the_forecaster():
    from gcache.search.config import SearchConfig
    from gcache.search.loop import run_search
    prof = make_profile()
    rng = np.random.default_rng(1)
    prof.e1_sum = rng.random((prof.n_steps,) * 3) * prof.count
    res = run_search(prof, SearchConfig(**dict(CFG, forecast=1, budget=18)),
                     lambda m: forecast_mask_cost(prof.E, prof.E1, np.zeros(prof.n_steps), m))
    methods = [h.get("method") for h in res.history[:5]]
    assert methods == ["theory_dp_linear", "local_dp_linear", "theory_dp_linear_reuse_abs",
                       "local_dp_linear_reuse_abs", "teacache"]
    assert res.policy.forecast == "linear" and res.policy.provenance["forecast"]["forecaster"] == "linear"
