"""The DPs' bounds against the test's own loop over the returned mask, and against every mask (small N)."""
import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gcache.search.dp import dp_mask
from gcache.search.dp_forecast import dp_mask_forecast

CI = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


def bound(mask, E, w, E1=None) -> float:
    """Σ over skipped j of (error of j)·e^{w_j}: reuse E[i, j] from the last computed i; with E1, the linear
    forecast's E1[p, i, j] from the last two (p < i), reuse E[0, j] while step 0 is the only one computed."""
    total, computed = 0.0, []
    for j in range(len(mask)):
        if mask[j] == 1:
            computed.append(j)
        elif E1 is None or len(computed) == 1:
            total += E[computed[-1]][j] * math.exp(w[j])
        else:
            total += E1[computed[-2]][computed[-1]][j] * math.exp(w[j])
    return total


def every_mask(n, k):
    for rest in itertools.combinations(range(1, n), k - 1):
        yield [1 if j == 0 or j in rest else 0 for j in range(n)]


@st.composite
def problems(draw):
    n = draw(st.integers(1, 7))
    k = draw(st.integers(1, n))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(["random", "ties", "sparse", "wide"]))
    E, E1 = rng.random((n, n)), rng.random((n, n, n))
    if kind == "ties":  # many optimal masks
        E, E1 = np.ones((n, n)), np.ones((n, n, n))
    elif kind == "sparse":
        E, E1 = E * (rng.random((n, n)) < 0.3), E1 * (rng.random((n, n, n)) < 0.3)
    elif kind == "wide":
        E, E1 = E * 10.0 ** rng.integers(-6, 6, (n, n)), E1 * 10.0 ** rng.integers(-6, 6, (n, n, n))
    w = rng.normal(0, 2, n)
    return E, E1, w, k


def check(dp, E, w, k, E1=None):
    mask, cost = dp
    n = len(w)
    assert len(mask) == n and mask[0] == 1 and sum(mask) == k and set(mask) <= {0, 1}
    assert math.isclose(bound(mask, E, w, E1), cost, rel_tol=1e-9, abs_tol=1e-300)
    best = min(bound(m, E, w, E1) for m in every_mask(n, k))
    assert math.isclose(cost, best, rel_tol=1e-9, abs_tol=1e-300), (cost, best)


@CI
@given(problems())
def test_reuse_dp_bound_is_its_masks_bound_and_the_minimum(problem):
    E, _, w, k = problem
    check(dp_mask(E, w, k), E, w, k)


@CI
@given(problems())
def test_forecast_dp_bound_is_its_masks_bound_and_the_minimum(problem):
    E, E1, w, k = problem
    check(dp_mask_forecast(E, E1, w, k), E, w, k, E1)
