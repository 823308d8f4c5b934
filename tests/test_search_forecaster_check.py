"""The search's forecaster check (search/end_game.py check): the chosen candidate under the other profile-fitted
forecasters, who is a candidate, the rule (hand-computed cases), the policy it gives, the state file it keeps and a
resumed search that does not measure again."""
import json
import logging

import pytest
from test_forecaster_l2p import profile_of, trajectories

from gcache.core.errors import GCacheError
from gcache.core.policy import Policy
from gcache.search import end_game, paired
from gcache.search.config import SearchConfig
from gcache.search.end_game import Candidate, among, chooses_among, pick
from gcache.search.loop import mask_key, run_search
from gcache.search.state import load_state

CFG = dict(k=5, degree=2, budget=26, seed=1, objective="ssim", n_candidates=256, acq_polish=2, forecast="fitted")


@pytest.fixture(scope="module")
def prof():
    samples, times = trajectories()
    return profile_of(samples, times)


class Evaluator:
    """Per-seed losses of two seeds for (mask, forecaster): a fixed function of the mask times the forecaster's factor
    (the second seed 1.1 times the first, so both halves move together); records every call."""

    can_apply_forecaster = True  # it says so (search/executor.py): evaluate(mask, forecast=name)

    def __init__(self, factors):
        self.factors, self.calls = factors, []

    def __call__(self, mask, forecast=None):
        self.calls.append((mask_key(mask), forecast))
        v = (1 + sum(i * m for i, m in enumerate(mask))) / 100.0 * self.factors.get(forecast, 1.0)
        return [v, 1.1 * v]


# ------------------------------------------------------------------------------------------------ the rule
def test_pick_by_hand():
    base = {"loss": 1.0, "per_seed": [1.0, 1.0, 1.0, 1.0]}
    both = {"loss": 0.9, "per_seed": [0.9, 0.9, 0.9, 0.9]}
    lopsided = {"loss": 0.8, "per_seed": [0.2, 1.0, 1.0, 1.0]}  # the mean falls, at most one half improves
    noisy = {"loss": 0.95, "per_seed": [0.7, 1.2, 0.7, 1.2]}     # mean gain 0.05, s.e. 0.144
    worse = {"loss": 1.1, "per_seed": [1.1] * 4}
    for seed in range(4):  # whatever the split of the seeds into halves
        assert pick(base, {"a": both}, seed) == "a"
        assert pick(base, {"a": worse}, seed) is None
        assert pick(base, {"a": lopsided}, seed) is None  # one seed carries the mean: one half doesn't improve
        assert pick(base, {"a": lopsided}, seed, paired.MEAN) == "a"
        assert pick(base, {"a": both, "b": {"loss": 0.85, "per_seed": [0.85] * 4}}, seed) == "b"  # the lowest loss
    noise = paired.beyond_z(2.0)  # the bench's alternative: a gain beyond 2 paired standard errors
    assert pick(base, {"a": both}, 0, noise) == "a"  # gain 0.1, s.e. 0: beyond the noise
    assert pick(base, {"a": noisy}, 0, noise) is None and pick(base, {"a": noisy}, 0, paired.MEAN) == "a"
    assert pick(base, {"a": both}, 0, None) is None  # never
    assert pick({"loss": 1.0}, {"a": {"loss": 0.99}}, 0) == "a"  # no per-seed losses: the mean decides


def test_a_search_chooses_among_every_forecaster_and_a_fixed_rule_is_kept(prof):
    """A profile-fitted search's end game chooses among every registered forecaster (fixed rules included), its own
    first; a fixed-rule search keeps its rule; one whose profile can't fit l2p leaves it out."""
    from gcache.core import forecasters
    assert chooses_among("fitted") == ["fitted", "reuse", "linear", "quadratic", "l2p"]
    assert chooses_among("l2p") == ["l2p", "reuse", "linear", "quadratic", "fitted"]
    rivals = set(forecasters.names()) - set(chooses_among("fitted"))  # a bench's rivals or a test's toys, if any
    assert all(not type(forecasters.get(n)).__module__.startswith("gcache.core.forecasters.") for n in rivals)
    assert chooses_among("linear") == [] and chooses_among("reuse") == []  # a fixed rule
    st = _state({}, [])
    st._data.update(choices=chooses_among("fitted"))
    samples, times = trajectories()
    assert among(st, prof, "fitted") == chooses_among("fitted")
    assert among(st, profile_of(samples, times, forecast=False), "fitted") == ["fitted", "reuse", "linear",
                                                                             "quadratic"]  # l2p can't fit


# ------------------------------------------------------------------------------------------------ in the search
def test_a_forecaster_better_on_every_mask_wins_the_start_masks_and_the_search(prof, tmp_path):
    """l2p halves every loss: its start masks win, the search goes on under l2p, and the check measures the best
    masks under fitted (the search's own), which stays behind."""
    path = str(tmp_path / "s.json")
    ev = Evaluator({"l2p": 0.5})
    res = run_search(prof, SearchConfig(**CFG), ev, state_path=path, provenance={"seeds": [1, 2]})
    pol = res.policy
    key = mask_key(pol.mask) + "@l2p"
    assert pol.forecast == "l2p" and pol.forecast_params == Policy.for_mask(prof, pol.mask, "l2p").forecast_params
    assert pol.metrics["loss"] == res.state.masks[key]["loss"]
    fitted = res.state.masks[mask_key(pol.mask)]  # the chosen mask under fitted, measured by the check
    assert fitted["loss"] == pytest.approx(2 * pol.metrics["loss"])
    check = pol.provenance["forecast"]
    assert check["chosen_by"] == "search" and check["check"]["searched_with"] == "l2p"
    assert check["check"]["fitted"]["minus_searched"]["mean"] == pytest.approx(fitted["loss"] - pol.metrics["loss"])
    on_disk = load_state(path)
    checks = [m for m in on_disk["masks"].values() if m["kind"] == "check"]  # the check, kept once: among the masks
    assert on_disk["version"] == 5 and "forecasters" not in on_disk and checks and all(m["of"] == key for m in checks)
    assert on_disk["masks"][mask_key(pol.mask)]["per_seed"] == pytest.approx(fitted["per_seed"])
    # a search run again on its finished state measures nothing and gives the same policy
    again = Evaluator({"l2p": 0.5})
    res2 = run_search(prof, SearchConfig(**CFG), again, state_path=path, provenance={"seeds": [1, 2]})
    assert again.calls == [] and res2.policy.to_dict() == pol.to_dict()


def _state(masks: dict, history: list):
    """An in-memory search state of a fitted search holding `masks` (key -> per-seed losses) and `history` (kind,
    key): an empty one of version 4 migrated as a file is read (its end game chooses among the profile-fitted
    forecasters), then filled."""
    from gcache.search.state import SearchState, migrated
    data = {"format": "gcache.search_state", "version": 4, "fingerprint": "t",
            "config": {"seed": 0, "forecast": "fitted"}, "profile": {}, "provenance": {}, "starts": [], "history": [],
            "masks": {}, "gp": {"theta": None}, "polish": {"incumbent": None, "roots": [], "guard": None},
            "final": None, "done": True, "pending": []}
    st = SearchState(migrated(data), None)
    for key, per_seed in masks.items():
        st.measure(key, per_seed, 0.0, first=0)
    for kind, key in history:
        st.record({"kind": kind, "s": None if kind == "instant" else [0.0], "mask": key,
                   **({"method": "m"} if kind == "instant" else {})}, 0.0, False)
    return st


def test_the_check_of_the_chosen_candidate_by_hand(prof):
    """A (chosen, fitted) and B within the seeds' noise of it: the check measures A alone under l2p (the window of
    candidates within 2 standard errors is gone). l2p worse on A: A stays; l2p better on both halves of A: A under
    l2p is the pick, and its entry is A's. What it measured is kept: nothing is measured twice."""
    from gcache.search.choice import choose
    a, b, start = "1111100000", "1110110000", "1011110000"
    for l2p, wins in (([1.5, 1.5, 1.5, 1.5], False), ([0.8, 0.9, 0.7, 0.8], True)):
        st = _state({a: [1.0, 1.2, 0.9, 1.1], b: [1.05, 1.1, 1.0, 1.1], start: [3.0, 3.0, 3.0, 3.0]},
                    [("instant", start), ("gp", b), ("gp", a)])
        choice = choose(st)
        assert choice.entry["mask"] == a
        calls = []

        def measure(mask, name):
            calls.append(("".join(map(str, mask)), name))
            return l2p
        candidate = Candidate.of(choice.measured, "fitted")
        out = end_game.check(st, prof, "fitted", candidate, measure)
        assert calls == [(a, "l2p")] and out.checked == candidate and out.skipped is None
        assert out.results["l2p"].loss == pytest.approx(sum(l2p) / 4) and out.results["l2p"].of == a
        assert out.pick == (Candidate(st.measured(a + "@l2p"), "l2p", candidate.s, candidate.method) if wins else
                            candidate)
        again = end_game.check(st, prof, "fitted", candidate, measure)
        assert again == out and len(calls) == 1  # kept in the state


def test_a_worse_forecaster_leaves_the_policy_as_searched(prof):
    ev = Evaluator({"l2p": 2.0})
    res = run_search(prof, SearchConfig(**CFG), ev, provenance={"seeds": [1, 2]})
    pol = res.policy
    assert pol.forecast == "fitted" and pol.provenance["forecast"]["chosen_by"] == "search config"
    assert pol.metrics["loss"] == res.state.masks[mask_key(pol.mask)]["loss"]
    assert pol.provenance["forecast"]["check"]["l2p"]["loss"] == pytest.approx(2 * pol.metrics["loss"])
    assert pol.metrics["loss"] == min(m["loss"] for m in res.state.masks.values())  # l2p's start masks lost


def test_an_evaluation_that_cant_change_forecaster_says_so(prof, caplog):
    ev = Evaluator({"l2p": 0.5})
    with caplog.at_level(logging.INFO, logger="gcache"):
        res = run_search(prof, SearchConfig(**CFG), lambda mask: ev(mask), provenance={"seeds": [1, 2]})
    assert res.policy.forecast == "fitted" and all(f is None for _, f in ev.calls)
    assert "and this one can't; the policy keeps fitted" in res.policy.provenance["forecast"]["check"]["skipped"]
    assert "forecaster check (l2p, linear, quadratic, reuse on the chosen mask)" in caplog.text


def test_a_search_told_to_skip_the_check_says_why(prof):
    ev = Evaluator({"l2p": 0.5})
    res = run_search(prof, SearchConfig(**CFG), ev, provenance={"seeds": [1, 2]}, skip_check="no references here")
    assert res.policy.forecast == "fitted" and all(f is None for _, f in ev.calls)
    assert "did not run: no references here; the policy keeps fitted" in \
        res.policy.provenance["forecast"]["check"]["skipped"]


def test_a_fixed_rule_search_has_no_check(prof):
    ev = Evaluator({"l2p": 0.5, "fitted": 0.5})
    res = run_search(prof, SearchConfig(**dict(CFG, forecast="linear")), ev, provenance={"seeds": [1, 2]})
    assert res.policy.forecast == "linear" and all(f is None for _, f in ev.calls)
    assert "check" not in res.policy.provenance["forecast"]


def test_a_damaged_check_entry_is_refused(prof, tmp_path):
    path = tmp_path / "s.json"
    run_search(prof, SearchConfig(**CFG), Evaluator({}), state_path=str(path), provenance={"seeds": [1, 2]})
    data = json.loads(path.read_text())
    key = next(k for k, m in data["masks"].items() if m["kind"] == "check")
    for bad in ({"of": "2" * 10}, {"of": None}, {"kind": "magic"}, {"method": 3}, {"s": [1.0]}):
        masks = dict(data["masks"], **{key: dict(data["masks"][key], **bad)})
        path.write_text(json.dumps(dict(data, masks=masks)))
        with pytest.raises(GCacheError, match="damaged"):
            load_state(str(path))


def test_the_search_s_rule_is_one_the_bench_compares():
    from gcache.bench.forecaster_check import rules
    assert rules()["halves"] is paired.CHECK


def test_a_search_made_without_the_other_forecasters_resumes_as_it_was_searched(prof, tmp_path):
    """A state file of a search whose evaluation could not apply another forecaster (its own start masks only), run
    again with a larger budget by one that can: it continues with its own start masks (its id is theirs, and its
    file names them), and its forecaster check runs now."""
    path = str(tmp_path / "s.json")
    ev = Evaluator({"l2p": 0.5})
    run_search(prof, SearchConfig(**CFG), lambda mask: ev(mask), state_path=path, provenance={"seeds": [1, 2]})
    starts = load_state(path)["starts"]
    assert not any("l2p" in name for name in starts)
    again = Evaluator({"l2p": 0.5})
    res = run_search(prof, SearchConfig(**dict(CFG, budget=CFG["budget"] + 4)), again, state_path=path,
                     provenance={"seeds": [1, 2]})
    on_disk = load_state(path)
    assert on_disk["starts"] == starts and len(on_disk["history"]) == CFG["budget"] + 4
    assert not any(h["kind"] == "instant" and "@" in h["mask"] for h in on_disk["history"])
    assert any(f == "l2p" for _, f in again.calls) and res.policy.provenance["forecast"]["check"]["l2p"]


class RuleEvaluator:
    """tests/search_fixture.py's evaluator (4 seeds, able to sample fresh seeds: the same losses there) with one fixed
    rule `better` at `factor` times the loss on every mask."""

    can_apply_forecaster = can_sample_fresh = True

    def __init__(self, better, factor=0.7):
        import search_fixture as fx
        self.inner, self.better, self.factor = fx.Evaluator(), better, factor

    def __call__(self, mask, forecast=None, fresh=False):
        losses = self.inner(mask, forecast)
        return [v * self.factor for v in losses] if forecast == self.better else losses


@pytest.mark.parametrize("better", ["reuse", "linear"])
def test_a_fixed_rule_better_on_the_chosen_mask_becomes_the_policy(better):
    """The search on the fixture (fitted, its start masks those of fitted and l2p) never measures a fixed rule until
    its end game; with `better` at 0.7 times the loss on every mask, the check measures the chosen mask under it, it
    wins on both halves of the seeds and on the fresh seeds, and the policy applies it. Oracle: the evaluator."""
    import search_fixture as fx

    from gcache.core.profile import Profile
    prof = Profile.load(fx.PROFILE)
    ev = RuleEvaluator(better)
    res = run_search(prof, SearchConfig(**dict(fx.CONFIG, budget=26)), ev, provenance=fx.PROVENANCE)
    pol = res.policy
    assert not any(h["mask"].endswith("@" + better) for h in res.history)  # the search itself never applied it
    searched = res.end.check.checked
    assert pol.forecast == better and pol.mask == [int(c) for c in searched.key.split("@")[0]]
    assert pol.provenance["forecast"]["chosen_by"] == "forecaster check"
    base = fx.Evaluator()(pol.mask, None if searched.forecaster == "fitted" else searched.forecaster)
    assert pol.metrics["loss"] == pytest.approx(0.7 * sum(base) / 4)
    assert res.end.fresh is not None and res.end.final.key == res.end.check.pick.key  # the fresh seeds agree
