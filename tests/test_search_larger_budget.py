"""A finished forecasting search continued with a larger budget (issue 48): the mask the first finish measured (argmin
μ, no history entry) stays a candidate, so the continued search neither crashes on it nor returns a worse policy on
its own loss, and its finished file gives the same policy again without sampling."""
import numpy as np
import pytest

from gcache.core.profile import Profile
from gcache.search.config import SearchConfig
from gcache.search.loop import run_search

import search_fixture as fx

SEED = 1  # a search seed whose budget-26 finish measures a new mask (checked below, not assumed)


class FreshEvaluator(fx.Evaluator):
    """The fixture's evaluator, able to sample fresh seeds (the same losses there), with one mask (`star`) at half its
    loss under every forecaster: the case where the earlier finish's argmin-μ mask is the best the search knows."""

    can_sample_fresh = True

    def __init__(self, star=None):
        super().__init__()
        self.star, self.fresh_calls = star, []

    def __call__(self, mask, forecast=None, fresh=False):
        losses = super().__call__(mask, forecast)
        if fresh:
            self.fresh_calls.append(self.calls.pop())
        key = "".join(str(int(m)) for m in mask)
        return [v * 0.5 for v in losses] if key == self.star else losses


@pytest.fixture(scope="module")
def profile():
    return Profile.load(fx.PROFILE)


def search(profile, budget, evaluator, path=None):
    return run_search(profile, SearchConfig(**dict(fx.CONFIG, budget=budget, seed=SEED)), evaluator,
                      state_path=path, provenance=fx.PROVENANCE)


def own_loss(evaluator, policy) -> float:
    """The oracle: the evaluator's mean loss of the policy's mask under its forecaster."""
    fc = None if policy.forecast == fx.CONFIG["forecast"] else policy.forecast
    return float(np.mean(FreshEvaluator(evaluator.star)(policy.mask, fc)))


def test_a_larger_budget_keeps_the_earlier_finish_as_a_candidate(profile, tmp_path):
    dry = search(profile, 26, FreshEvaluator())
    star = dry.state.final["mask"]
    assert not dry.state.final["reused"] and "@" not in star  # the finish measured a mask no proposal had
    path = str(tmp_path / "s.search.json")
    small = search(profile, 26, FreshEvaluator(star), path).policy
    assert "".join(map(str, small.mask)) == star and small.provenance["chosen"] == "argmin_mu"
    ev = FreshEvaluator(star)
    large = search(profile, 40, ev, path).policy  # old code: ValueError (min() of nothing) in the end game
    assert ev.calls and not any(key == star and fc is None for key, fc in ev.calls)  # it was not sampled again
    assert large.metrics["loss"] <= small.metrics["loss"]
    assert large.metrics["loss"] == pytest.approx(own_loss(ev, large))
    assert "".join(map(str, large.mask)) == star and large.forecast == small.forecast  # nothing measured beats it
    again = FreshEvaluator(star)  # the finished file: the same policy, nothing sampled
    assert search(profile, 40, again, path).policy.to_dict() == large.to_dict()
    assert again.calls == [] and again.fresh_calls == []


@pytest.mark.parametrize("seed", [0])
def test_a_larger_budget_is_never_worse_on_the_search_loss(profile, tmp_path, seed):
    """Without a constructed best mask: each budget's policy, from one state file continued 26 → 33 → 40, is never
    worse on the search's own loss than the smaller budget's."""
    global SEED
    path, losses, old = str(tmp_path / "s.search.json"), [], SEED
    try:
        SEED = seed
        for budget in (26, 33, 40):
            ev = FreshEvaluator()
            pol = search(profile, budget, ev, path).policy
            assert pol.metrics["loss"] == pytest.approx(own_loss(ev, pol))
            losses.append(pol.metrics["loss"])
    finally:
        SEED = old
    assert losses == sorted(losses, reverse=True)
