"""Auto's true-loss check (search/auto_check.py): its candidates, its budget of one full run, its choice."""
import os

import pytest
import torch

from gcache.core.errors import GCacheError
from gcache.core.profile import Profile
from gcache.search import auto_check
from gcache.search.instant import auto_candidates, auto_policy, choose_forecaster

HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE = os.path.join(HERE, "data", "search_v3.profile.safetensors")  # 10 steps, with the forecast statistics


@pytest.fixture(scope="module")
def profile():
    return Profile.load(PROFILE)


@pytest.mark.parametrize("io_share", [0.0, 0.1, 0.3, 0.6])
def test_the_candidates_cost_at_most_one_full_run_and_start_with_the_instant_policy(profile, io_share):
    n = profile.n_steps
    for k in range(2, n):
        cands = auto_check.candidates(profile, k, io_share=io_share)
        pick = choose_forecaster(profile, k)[0]
        assert cands[0].mask == auto_policy(profile, k, pick).mask and cands[0].forecast == pick
        # by hand: each costs K computed + (N - K) skipped steps at the io share
        spent = sum(c.n_computed + (n - c.n_computed) * io_share for c in cands)
        assert len(cands) == 1 or spent <= n + 1e-9, (k, io_share, spent)
        keys = [(tuple(c.mask), c.forecast) for c in cands]
        assert len(set(keys)) == len(keys)
        assert all(c.n_computed in (k, k - 1) and c.mask[0] == 1 and c.forecast in auto_candidates() for c in cands)
        # two candidates that would sample the same (a mask that never forecasts, under two forecasters) never are
        for c in cands:
            twins = [d for d in cands if d.mask == c.mask]
            never = not any(not m and sum(c.mask[:j]) >= 2 for j, m in enumerate(c.mask))
            assert len(twins) == 1 or not never
        # what one run pays for is taken, in order: one more candidate would pass the budget
        more = auto_check.candidates(profile, k, io_share=io_share, budget_runs=10.0)
        assert [(tuple(c.mask), c.forecast) for c in more[:len(cands)]] == keys
        if len(more) > len(cands):
            nxt = more[len(cands)]
            assert len(cands) == 1 and spent > n or spent + nxt.n_computed + (n - nxt.n_computed) * io_share > n


def test_at_a_low_k_the_check_compares_the_forecasters_on_the_mask_and_on_k_minus_1s(profile):
    cands = auto_check.candidates(profile, 3, io_share=0.0, budget_runs=2.0)
    same = [c for c in cands if c.mask == cands[0].mask]
    assert {c.forecast for c in same} == set(auto_candidates())
    fewer = [c for c in cands if c.n_computed == 2]
    assert fewer and all(c.mask == auto_policy(profile, 2, "reuse").mask for c in fewer)
    assert auto_check.worth_checking(cands) and not auto_check.worth_checking(cands[:1])


def test_the_check_chooses_the_lowest_loss_and_records_what_it_compared(profile):
    cands = auto_check.candidates(profile, 3, io_share=0.0)
    assert len(cands) >= 3
    outputs = {id(c): torch.full((2, 2), float(i)) for i, c in enumerate(cands)}
    ref = torch.full((2, 2), 1.25)
    chosen, rec = auto_check.check(cands, lambda c: outputs[id(c)], ref, auto_check.mse)
    # by hand: candidate i's output is i everywhere, so its loss is (i - 1.25)^2: candidate 1 (0.0625) wins
    assert chosen is cands[1] and rec["chosen"] == 1
    assert [c["loss"] for c in rec["candidates"]] == [(i - 1.25) ** 2 for i in range(len(cands))]
    assert chosen.provenance["check"] is rec


def test_a_tie_goes_to_the_earlier_candidate_and_a_missing_loss_is_refused(profile):
    cands = auto_check.candidates(profile, 3, io_share=0.0)
    assert auto_check.choose(cands[:3], [0.5, 0.2, 0.2])[0] == 1
    with pytest.raises(GCacheError):
        auto_check.choose(cands[:3], [0.5])


def test_mse_is_the_mean_squared_difference():
    a, b = torch.tensor([[0.0, 1.0], [2.0, 3.0]]), torch.tensor([[1.0, 1.0], [0.0, 3.0]])
    assert auto_check.mse(a, b) == pytest.approx((1 + 0 + 4 + 0) / 4)


def test_on_the_reference_model_a_larger_k_is_never_checked_worse_than_the_smaller_ks_instant_policy():
    """Where the budget pays for it, the check at K samples K - 1's instant policy, so its pick is
    never judged worse than what auto's instant policy at K - 1 gives on the same inputs; and the loss it records
    is the mean squared difference of the sampled images, recomputed here by hand."""
    from gcache.reference_model.harness import ReferenceHarness
    h = ReferenceHarness(10)
    seeds = [1000, 1001]
    prof = h.profile(seeds, forecast=True)
    ref = h.full(seeds)

    def sample(p):
        return h.run(seeds, p.mask, forecast=p.forecast, forecast_params=p.forecast_params)[0]

    for k in range(3, 7):
        cands = auto_check.candidates(prof, k, io_share=0.0, budget_runs=10.0)  # every candidate
        chosen, rec = auto_check.check(cands, sample, ref, auto_check.mse)
        smaller = auto_policy(prof, k - 1, choose_forecaster(prof, k - 1)[0])
        hit = [c for c in rec["candidates"] if c["steps"] == smaller.compute_steps()
               and c["forecast"] == smaller.forecast]
        assert hit, (k, rec["what"])
        assert min(c["loss"] for c in rec["candidates"]) <= hit[0]["loss"]
        by_hand = float(((sample(chosen).double() - ref.double()) ** 2).mean())
        assert rec["candidates"][rec["chosen"]]["loss"] == pytest.approx(by_hand, rel=1e-5)


def test_on_the_reference_model_the_checked_picks_quality_on_held_out_seeds_rises_with_k():
    """Issue 49's monotone K, measured where it is cheap: run 1 profiles one batch of seeds, the check judges the
    candidates one full run pays for (at the profile's own io share) on run 1's inputs, as GCache Apply (auto)
    does, and each K's pick is applied to held-out seeds. Its PSNR against their full run must not fall from one K
    to the next (bench/auto_ranking.py: 25.38, 31.22, 31.51, 36.89 dB at K = 3..6 of 20, 16 held-out seeds)."""
    from gcache.reference_model.harness import ReferenceHarness
    from gcache.search.infra.objectives import psnr
    h = ReferenceHarness(20)
    run1, held = list(range(1000, 1008)), list(range(0, 8))
    prof = h.profile(run1, forecast=True)
    ref1, ref = h.full(run1), h.full(held)

    def sample(p, seeds):
        return h.run(seeds, p.mask, forecast=p.forecast, forecast_params=p.forecast_params)[0]

    got = []
    for k in range(3, 7):
        cands = auto_check.candidates(prof, k)
        chosen, _ = auto_check.check(cands, lambda p: sample(p, run1), ref1, auto_check.mse)
        got.append(psnr(sample(chosen, held), ref))
    assert all(b >= a for a, b in zip(got, got[1:])), got
