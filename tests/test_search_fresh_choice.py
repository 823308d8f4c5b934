"""The final choice on fresh seeds (search/end_game.py): the seeds, the finalists and the winner by hand, a search
whose own seeds rank the forecasters the other way from its fresh seeds, resuming without sampling again, and the
searches that skip it (an evaluation that can't, a fixed rule, a state file made before it)."""
import json
import logging
from typing import Optional

import pytest
from test_forecaster_l2p import profile_of, trajectories

from gcache.search.config import SearchConfig
from gcache.search.end_game import Candidate, finalists, fresh_seeds, on_fresh_seeds
from gcache.search.loop import run_search
from gcache.search.state import SearchState, load_state, migrated

CFG = dict(k=5, degree=2, budget=26, seed=1, objective="ssim", n_candidates=256, acq_polish=2, forecast="fitted")


@pytest.fixture(scope="module")
def prof():
    samples, times = trajectories()
    return profile_of(samples, times)


def test_fresh_seeds_by_hand():
    assert fresh_seeds(range(1000, 1016)) == list(range(1016, 1032))
    assert fresh_seeds([5]) == [6] and fresh_seeds([3, 7]) == [8, 9]
    assert not set(fresh_seeds([0, 1, 2])) & {0, 1, 2}


def _state(masks: dict, history: list, checks: Optional[dict] = None) -> SearchState:
    """An in-memory version-5 search state of a fitted search (migrated from an empty one of version 4 with the
    fresh-seed entry, as a file is read): `masks` key -> per-seed losses, `history` keys (start masks named "m"),
    `checks` key -> the key whose check measured it."""
    data = {"format": "gcache.search_state", "version": 4, "fingerprint": "t",
            "config": {"seed": 0, "forecast": "fitted"}, "profile": {}, "provenance": {}, "starts": [], "history": [],
            "masks": {}, "gp": {"theta": None}, "polish": {"incumbent": None, "roots": [], "guard": None},
            "final": None, "done": True, "pending": [], "fresh": {"masks": {}}}
    st = SearchState(migrated(data), None)
    for key, per_seed in masks.items():
        st.measure(key, per_seed, 0.0, first=0, how={"kind": "check", "s": None, "method": "m", "of": checks[key]}
                   if key in (checks or {}) else None)
    for key in history:
        st.record({"kind": "instant", "s": None, "mask": key, "method": "m"}, 0.0, False)
    return st


def _candidates(st: SearchState, keys) -> list:
    return [Candidate.of(st.measured(k), "fitted") for k in keys]


def test_the_finalists_and_the_winner_by_hand():
    """A (fitted, the pick) 1.0; C (fitted) 1.5; l2p: B 1.2 in the history, D 1.1 measured only by the check (the
    variant of a fitted history entry's mask). Finalists: A and D (l2p's lowest). On the fresh seeds D is lower: D
    wins, carrying its own measurement and what its check said of it (no history entry of its own)."""
    a, b, c = "1111100000", "1110110000@l2p", "1101110000"
    d = "1011110000@l2p"
    st = _state({a: [1.0, 1.0], b: [1.2, 1.2], c: [1.5, 1.5], d: [1.1, 1.1], "1011110000": [1.3, 1.3]},
                [a, b, c, "1011110000"], checks={d: "1011110000"})
    pick = Candidate.of(st.measured(a), "fitted")
    cands = finalists(st, pick, ["fitted", "l2p"], "fitted")
    keys = [x.key for x in cands]
    assert keys == [a, d]
    assert [x.key for x in finalists(st, pick, ["fitted"], "fitted")] == [a]  # A is fitted's lowest: no compare
    fresh = {a: [2.0, 2.2], d: [1.0, 1.4]}
    calls = []

    def measure(mask, fc):
        key = "".join(map(str, mask)) + (f"@{fc}" if fc else "")
        calls.append(key)
        return fresh[key]
    out = on_fresh_seeds(st, cands, measure, "fitted")
    assert calls == [a, d] and out.winner.key == d and out.seeds == 2 and out.finalists == tuple(cands)
    assert out.winner.forecaster == "l2p" and out.winner.loss == pytest.approx(1.1)
    assert out.winner.measured.of == "1011110000" and out.winner.method == "m"  # what its check said, carried
    assert out.losses == {a: pytest.approx(2.1), d: pytest.approx(1.2)}
    rec = out.provenance()
    assert rec["replaced"] is True and rec["seeds"] == 2 and set(rec["losses"]) == {a, d}
    again = on_fresh_seeds(st, cands, None, "fitted")  # kept in the state: nothing measured again
    assert len(calls) == 2 and again == out


def test_a_lower_fresh_loss_within_one_standard_error_keeps_the_pick():
    """D's fresh mean is lower (0.95 against 1.0) but its paired gain is 0.05 with a standard error of 0.21 (z = 0.24,
    paired.py FRESH_Z = 1): the pick stays. E, with a gain of 0.3 ± 0.0 on every seed, replaces it."""
    a, d, e = "1111100000", "1011110000@l2p", "1101110000@l2p"
    st = _state({a: [1.0] * 4, d: [1.1] * 4, e: [1.2] * 4}, [a, d, e])
    fresh = {a: [1.0, 1.0, 1.0, 1.0], d: [0.5, 1.4, 0.6, 1.3], e: [0.7, 0.7, 0.7, 0.7]}

    def measure(mask, fc):
        return fresh["".join(map(str, mask)) + (f"@{fc}" if fc else "")]
    assert on_fresh_seeds(st, _candidates(st, [a, d]), measure, "fitted").winner.key == a
    assert on_fresh_seeds(st, _candidates(st, [a, d, e]), measure, "fitted").winner.key == e


def test_a_tie_keeps_the_pick_and_no_measure_says_why():
    a, d = "1111100000", "1011110000@l2p"
    st = _state({a: [1.0], d: [1.1]}, [a, d])
    out = on_fresh_seeds(st, _candidates(st, [a, d]), lambda mask, fc: [0.5], "fitted")
    assert out.winner.key == a  # equal fresh losses: the search's pick stays
    st2 = _state({a: [1.0], d: [1.1]}, [a, d])
    skipped = on_fresh_seeds(st2, _candidates(st2, [a, d]), None, "fitted", "no references here")
    assert skipped.winner.key == a and "did not run: no references here; the search's pick stays" in skipped.skipped
    assert st2.fresh == {}


class Evaluator:
    """Per-seed losses of two seeds for (mask, forecaster, which seeds): a fixed function of the mask times the
    forecaster's factor, which differs between the search seeds and the fresh ones; records every call."""

    can_apply_forecaster = True
    can_sample_fresh = True

    def __init__(self, factors: dict, fresh_factors: dict):
        self.factors, self.fresh_factors, self.calls = factors, fresh_factors, []

    @staticmethod
    def base(mask) -> float:
        return (1 + sum(i * m for i, m in enumerate(mask))) / 100.0

    def __call__(self, mask, forecast=None, fresh=False):
        self.calls.append(("".join(map(str, mask)), forecast, fresh))
        v = self.base(mask) * (self.fresh_factors if fresh else self.factors).get(forecast, 1.0)
        return [v, 1.1 * v]


def test_a_search_whose_fresh_seeds_disagree_returns_the_fresh_winner(prof, tmp_path):
    """On the search seeds l2p costs 1.3× fitted's loss on every mask; on the fresh seeds half of it. The search
    picks a fitted candidate; on the fresh seeds l2p's best candidate (by its search-seed loss) wins. Oracle: the
    evaluator's own calls."""
    path = str(tmp_path / "s.json")
    ev = Evaluator({"l2p": 1.3}, {"l2p": 0.5})
    res = run_search(prof, SearchConfig(**CFG), ev, state_path=path, provenance={"seeds": [1, 2]})
    searched = [(m, f) for m, f, fresh in ev.calls if not fresh]
    fresh_calls = [(m, f) for m, f, fresh in ev.calls if fresh]
    l2p_best = min((m for m, f in searched if f == "l2p"), key=lambda m: Evaluator.base([int(c) for c in m]))
    fitted_losses = {m: Evaluator.base([int(c) for c in m]) for m, f in searched if f is None}
    pick = min(fitted_losses, key=fitted_losses.get)  # fitted's lowest loss beats every l2p one by 1.3×
    fixed = [(pick, name) for name in ("reuse", "linear", "quadratic")]  # the fixed rules' only masks: the check's
    assert fresh_calls == [(pick, None)] + fixed + [(l2p_best, "l2p")]
    pol = res.policy
    assert pol.forecast == "l2p" and "".join(map(str, pol.mask)) == l2p_best
    assert pol.provenance["forecast"]["chosen_by"] == "fresh seeds"
    fresh = pol.provenance["fresh_seeds"]
    assert fresh["replaced"] is True and fresh["seeds"] == 2
    assert fresh["losses"][l2p_best + "@l2p"] == pytest.approx(0.5 * 1.05 * Evaluator.base(pol.mask))
    assert pol.metrics["fresh_loss"] == fresh["losses"][l2p_best + "@l2p"]
    assert pol.metrics["loss"] == pytest.approx(1.3 * 1.05 * Evaluator.base(pol.mask))  # its search-seed loss
    assert set(load_state(path)["fresh"]["masks"]) == {pick, l2p_best + "@l2p"} | {f"{m}@{n}" for m, n in fixed}
    again = Evaluator({"l2p": 1.3}, {"l2p": 0.5})  # resumed on the finished state: nothing sampled again
    res2 = run_search(prof, SearchConfig(**CFG), again, state_path=path, provenance={"seeds": [1, 2]})
    assert again.calls == [] and res2.policy.to_dict() == pol.to_dict()


def test_agreeing_fresh_seeds_keep_the_pick(prof):
    ev = Evaluator({"l2p": 1.3}, {"l2p": 1.3})
    pol = run_search(prof, SearchConfig(**CFG), ev, provenance={"seeds": [1, 2]}).policy
    assert pol.forecast == "fitted" and pol.provenance["fresh_seeds"]["replaced"] is False
    assert sum(fresh for _, _, fresh in ev.calls) == 5  # the pick, each fixed rule on its mask, l2p's best


def test_an_evaluation_that_cant_sample_fresh_seeds_says_so(prof, caplog):
    ev = Evaluator({"l2p": 1.3}, {"l2p": 0.5})

    def plain(mask, forecast=None):  # applies forecasters, declares no fresh seeds
        return ev(mask, forecast)
    plain.can_apply_forecaster = True
    with caplog.at_level(logging.INFO, logger="gcache"):
        pol = run_search(prof, SearchConfig(**CFG), plain, provenance={"seeds": [1, 2]}).policy
    assert pol.forecast == "fitted" and not any(fresh for _, _, fresh in ev.calls)
    assert "final choice on fresh seeds (5 finalists) did not run" in caplog.text
    assert "can_sample_fresh" in pol.provenance["fresh_seeds"]["skipped"]


def test_a_fixed_rule_search_samples_no_fresh_seeds(prof):
    ev = Evaluator({"l2p": 0.5, "fitted": 0.5}, {"l2p": 0.1, "fitted": 0.1})
    pol = run_search(prof, SearchConfig(**dict(CFG, forecast="linear")), ev, provenance={"seeds": [1, 2]}).policy
    assert pol.forecast == "linear" and not any(fresh for _, _, fresh in ev.calls)
    assert "fresh_seeds" not in pol.provenance


def test_a_state_file_made_before_the_fresh_choice_resumes_without_it(prof, tmp_path):
    """A finished search whose file has no "fresh" entry (version 4, made by the GCache before that choice) returns
    its check's pick and samples nothing; the file is read as it was."""
    path = str(tmp_path / "s.json")
    first = Evaluator({"l2p": 1.3}, {"l2p": 0.5})
    run_search(prof, SearchConfig(**CFG), first, state_path=path, provenance={"seeds": [1, 2]})
    data = as_version_4(json.load(open(path)))
    del data["fresh"]
    json.dump(data, open(path, "w"))
    again = Evaluator({"l2p": 1.3}, {"l2p": 0.5})
    pol = run_search(prof, SearchConfig(**CFG), again, state_path=path, provenance={"seeds": [1, 2]}).policy
    assert again.calls == [] and pol.forecast == "fitted" and "fresh_seeds" not in pol.provenance


def as_version_4(data: dict) -> dict:
    """A version-5 state file as version 4 wrote it: its measured candidates without how they were measured, the
    forecaster check as a record of the checked candidate and each other forecaster's loss, no "choices"."""
    own = data["config"]["forecast"]
    checks = {k: m for k, m in data["masks"].items() if m["kind"] == "check"}
    data["forecasters"] = {"mask": next(iter(checks.values()))["of"], "results": {
        k.partition("@")[2] or own: {"loss": m["loss"], "per_seed": m["per_seed"]} for k, m in checks.items()}}
    for m in data["masks"].values():
        for field in ("kind", "s", "method", "of"):
            m.pop(field, None)
    del data["choices"]
    data["fresh"] = {"masks": data["fresh"]["masks"]}
    data["version"] = 4
    return data


def test_a_damaged_fresh_entry_is_refused(prof, tmp_path):
    from gcache.core.errors import GCacheError
    path = str(tmp_path / "s.json")
    run_search(prof, SearchConfig(**CFG), Evaluator({"l2p": 1.3}, {"l2p": 0.5}), state_path=path,
               provenance={"seeds": [1, 2]})
    data = json.load(open(path))
    data["fresh"]["masks"]["10"] = {"loss": 1.0}  # not a mask of the profile's steps
    json.dump(data, open(path, "w"))
    with pytest.raises(GCacheError):
        load_state(path)
