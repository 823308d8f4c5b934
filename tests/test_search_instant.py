"""Instant policies (headless): the DP under analytic weights, budgets from a target speed-up, the picture."""
import numpy as np
import pytest
from test_search_bilevel import make_profile

from gcache.core.errors import GCacheError
from gcache.core.policy import k_for_speedup, predicted_speedup
from gcache.core.weights import analytic_w, bernstein_w
from gcache.search.baselines import local_dp_policy, theory_dp_policy
from gcache.search.dp import dp_mask
from gcache.search.infra.plots import plot_policy
from gcache.search.instant import instant_policy, propagation_weights


def test_theory_and_local_are_the_dp_under_their_weights():
    prof = make_profile(n=12)
    for k in (1, 4, 7, 12):
        theory = instant_policy(prof, k, "theory")
        assert theory.mask == dp_mask(prof.E, analytic_w(list(prof.times) + [0.0]), k)[0]
        assert theory.mask == theory_dp_policy(prof, k).mask and theory.method == "theory_dp"
        assert instant_policy(prof, k, "local").mask == local_dp_policy(prof, k).mask == \
            dp_mask(prof.E, np.zeros(12), k)[0]
        s = [3.0, 1.0, 0.0, 2.0]
        assert instant_policy(prof, k, "bernstein", s).mask == dp_mask(prof.E, bernstein_w(prof.times, s), k)[0]
    assert instant_policy(prof, 4, "theory").provenance["instant"] == "theory"


def test_bad_method_or_missing_coefficients_say_what_to_do():
    prof = make_profile(n=6)
    with pytest.raises(GCacheError, match="Unknown instant method"):
        instant_policy(prof, 2, "magic")
    with pytest.raises(GCacheError, match="coefficients"):
        propagation_weights(prof, "bernstein", None)
    with pytest.raises(GCacheError):
        instant_policy(prof, 7, "theory")  # K > N


@pytest.mark.parametrize("n,io", [(30, 0.0), (30, 0.03), (50, 0.2), (8, 0.5)])
def test_k_for_speedup_is_the_best_k_not_above_the_target(n, io):
    for target in (1.0, 1.5, 2.0, 2.5, 3.0, 7.5):
        k = k_for_speedup(n, target, io)
        assert 1 <= k <= n
        if k > 1:  # the largest speed-up not above the target: one step fewer would exceed it
            assert predicted_speedup(n, k, io) <= target + 1e-9 < predicted_speedup(n, k - 1, io)
    assert k_for_speedup(n, 1.0, io) == n
    with pytest.raises(GCacheError):
        k_for_speedup(n, 0.5, io)


def test_policy_picture_has_both_panels():
    prof = make_profile(n=10)
    pol = instant_policy(prof, 4)
    img = plot_policy(pol, propagation_weights(prof))
    arr = np.asarray(img)
    assert img.size[0] == 720 and arr.std() > 10  # not a blank canvas


def test_auto_policy_is_its_forecaster_on_the_reuse_policys_mask():
    """Auto's mask for a forecasting forecaster is the reuse DP's theory mask (AUTO_ERROR_MODEL), with the
    forecaster's parameters fitted to that mask; reuse's own is its DP's."""
    from test_search_polish import _recorded_profile

    from gcache.core.policy import Policy
    from gcache.search.instant import auto_error_model, auto_policy, instant_policy
    prof, _, _ = _recorded_profile(seed=6)
    for k in (2, 3, 4):
        reuse_mask = instant_policy(prof, k, "theory", forecast="reuse").mask
        assert auto_policy(prof, k, "reuse").mask == reuse_mask and auto_error_model("reuse") == "mean_abs"
        for fc in ("linear", "fitted"):
            pol = auto_policy(prof, k, fc)
            assert pol.mask == reuse_mask and pol.forecast == fc and auto_error_model(fc) == "reuse_abs"
            assert pol.forecast_params == Policy.for_mask(prof, reuse_mask, fc).forecast_params
