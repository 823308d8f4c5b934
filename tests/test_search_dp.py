"""The exact DP (Algorithm 1) against brute force, and its input checks."""
import itertools

import numpy as np
import pytest

from gcache.core.errors import GCacheError
from gcache.search.dp import dp_mask, mask_cost, segment_costs


def brute_force(E, w, k):
    n = E.shape[0]
    best = (np.inf, None)
    for rest in itertools.combinations(range(1, n), k - 1):
        mask = [0] * n
        for s in (0,) + rest:
            mask[s] = 1
        c = mask_cost(E, w, mask)
        if c < best[0] - 1e-12:
            best = (c, mask)
    return best


def test_dp_matches_brute_force_on_random_problems():
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(300):
        n = int(rng.integers(1, 11))
        k = int(rng.integers(1, n + 1))
        E = rng.random((n, n)) ** 2 * rng.choice([1e-3, 1.0, 50.0])
        w = rng.normal(0, 2, n)
        mask, cost = dp_mask(E, w, k)
        bf_cost, _ = brute_force(E, w, k)
        assert mask[0] == 1 and sum(mask) == k and len(mask) == n
        assert cost == pytest.approx(bf_cost, rel=1e-9, abs=1e-12)
        assert mask_cost(E, w, mask) == pytest.approx(cost, rel=1e-9, abs=1e-12)  # the bound's value is returned
        checked += 1
    assert checked == 300


def test_dp_extremes():
    E = np.ones((6, 6))
    assert dp_mask(E, np.zeros(6), 6) == ([1] * 6, 0.0)
    mask, cost = dp_mask(E, np.zeros(6), 1)
    assert mask == [1, 0, 0, 0, 0, 0] and cost == pytest.approx(5.0)


def test_dp_prefers_refreshing_where_weights_are_large():
    n = 10
    E = np.ones((n, n))
    w = np.zeros(n)
    w[7] = 10.0  # reusing at step 7 is very expensive
    mask, _ = dp_mask(E, w, 2)
    assert mask[7] == 1


def test_segment_costs_shape_and_values():
    E = np.arange(16, dtype=float).reshape(4, 4)
    C = segment_costs(E, np.zeros(4))
    assert C.shape == (4, 5)
    assert C[0, 1] == 0 and C[0, 3] == E[0, 1] + E[0, 2] and np.isinf(C[2, 1])


@pytest.mark.parametrize("k", [0, 7, -1])
def test_dp_rejects_budget_outside_range(k):
    with pytest.raises(GCacheError, match="outside"):
        dp_mask(np.ones((6, 6)), np.zeros(6), k)


def test_dp_rejects_bad_inputs():
    with pytest.raises(GCacheError):
        dp_mask(np.ones((3, 4)), np.zeros(3), 2)
    with pytest.raises(GCacheError):
        dp_mask(np.ones((4, 4)), np.zeros(3), 2)
    E = np.ones((4, 4))
    E[1, 2] = np.nan
    with pytest.raises(GCacheError, match="NaN"):
        dp_mask(E, np.zeros(4), 2)
