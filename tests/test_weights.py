"""Propagation weights: Bernstein form and the analytic exponent of Theorem 3.3."""
import math

import numpy as np
import pytest

from gcache.core.errors import GCacheError
from gcache.core.weights import analytic_w, bernstein_w


def test_bernstein_endpoints_and_constant():
    s = [1.0, -2.0, 3.0, 0.5]
    t = np.array([0.0, 1.0])
    assert np.allclose(bernstein_w(t, s), [s[0], s[-1]])  # w(0) = s_0, w(1) = s_d
    assert np.allclose(bernstein_w(np.linspace(0, 1, 11), [2.5] * 5), 2.5)  # partition of unity


def test_bernstein_matches_formula():
    s = np.array([0.3, 1.7, 4.0])
    t = 0.37
    want = sum(s[v] * math.comb(2, v) * t ** v * (1 - t) ** (2 - v) for v in range(3))
    assert bernstein_w([t], s)[0] == pytest.approx(want)


def test_bernstein_bad_input():
    with pytest.raises(GCacheError):
        bernstein_w([0.5], [])
    with pytest.raises(GCacheError):
        bernstein_w([0.5], [1.0, float("nan")])


def test_analytic_w_by_hand():
    t = [1.0, 0.6, 0.3, 0.0]  # h = 0.4, 0.3, 0.3
    L, Lo = 2.0, 0.5
    w = analytic_w(t, L, Lo)
    assert w[0] == pytest.approx(math.log(0.4 * Lo) + (0.3 + 0.3) * L)
    assert w[1] == pytest.approx(math.log(0.3 * Lo) + 0.3 * L)
    assert w[2] == pytest.approx(math.log(0.3 * Lo))


def test_analytic_w_refuses_bad_schedules():
    with pytest.raises(GCacheError):
        analytic_w([1.0, 1.0, 0.0])
    with pytest.raises(GCacheError):
        analytic_w([0.5])
