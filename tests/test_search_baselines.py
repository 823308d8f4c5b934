"""Baselines: exactly K computed steps with step 0 for every K; each one does what it says."""
import numpy as np
import pytest
from test_search_bilevel import make_profile

from gcache.core.errors import GCacheError
from gcache.core.weights import analytic_w
from gcache.search.baselines import (
    _teacache_run,
    all_baselines,
    local_dp_policy,
    teacache_mask,
    teacache_policy,
    theory_dp_policy,
    uniform_mask,
    uniform_policy,
)
from gcache.search.dp import dp_mask


def test_every_baseline_gives_exactly_k_for_every_k():
    prof = make_profile(n=12)
    for k in range(1, 13):
        for name, pol in all_baselines(prof, k).items():
            assert pol.n_computed == k and pol.mask[0] == 1 and pol.n_steps == 12, (name, k, pol.mask)
            assert pol.method == name


def test_uniform_is_evenly_spaced():
    assert uniform_mask(30, 10) == [1, 0, 0] * 10
    assert uniform_mask(10, 4) == [1, 0, 1, 0, 0, 1, 0, 1, 0, 0]
    assert uniform_policy(5, 5).mask == [1] * 5


def test_teacache_computes_where_the_input_changes_most():
    rel = np.array([0, .01, .01, .01, .5, .01, .01, .6, .01, .01])
    mask, thr = teacache_mask(rel, 3)
    assert sum(mask) == 3 and thr > 0
    assert mask == _teacache_run(rel, thr)[0]  # it is TeaCache's own rule at the returned threshold
    assert mask[7] == 1  # the largest change of the input triggers a computation
    # ties (equal indicators) make the count jump; we still get exactly K
    for k in range(1, 11):
        assert sum(teacache_mask(np.r_[0, np.ones(9)], k)[0]) == k


def test_dp_baselines_use_their_weights():
    prof = make_profile(n=12)
    assert local_dp_policy(prof, 4).mask == dp_mask(prof.E, np.zeros(12), 4)[0]
    w = analytic_w(list(prof.times) + [0.0])
    assert theory_dp_policy(prof, 4).mask == dp_mask(prof.E, w, 4)[0] != dp_mask(prof.E, np.zeros(12), 4)[0]
    assert teacache_policy(prof, 4).provenance["indicator"] == "rel_l1_block_input"


@pytest.mark.parametrize("k", [0, 13])
def test_baselines_reject_bad_k(k):
    prof = make_profile(n=12)
    for fn in (lambda: uniform_policy(12, k), lambda: teacache_policy(prof, k), lambda: local_dp_policy(prof, k),
               lambda: theory_dp_policy(prof, k)):
        with pytest.raises(GCacheError):
            fn()
    with pytest.raises(GCacheError):
        uniform_policy(10, 3, profile=prof)
