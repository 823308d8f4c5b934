"""The batch search (headless, thread workers): budget, de-duplication, GP-BUCB spread, crash and resume."""
import json
import threading

import numpy as np
import pytest
from test_search_bilevel import CFG, Evaluator, make_profile

from gcache.core.errors import GCacheError
from gcache.search.config import SearchConfig
from gcache.search.executor import InProcessExecutor
from gcache.search.infra.parallel import ThreadExecutor
from gcache.search.loop import run_batch_search, run_search


class Counting(Evaluator):
    """The synthetic loss, thread-safe call log, optional crash after m calls (the coordinator is killed)."""

    def __init__(self, profile, crash_after=None):
        super().__init__(profile)
        self.lock, self.crash_after = threading.Lock(), crash_after

    def __call__(self, mask):
        with self.lock:
            if self.crash_after is not None and len(self.calls) >= self.crash_after:
                raise KeyboardInterrupt("coordinator killed")
            return super().__call__(mask)


@pytest.mark.parametrize("q", [1, 2, 4])
def test_batch_search_spends_the_budget_once_per_mask(q, tmp_path):
    prof = make_profile()
    ev = Counting(prof)
    ex = ThreadExecutor(ev, workers=q)
    try:
        res = run_batch_search(prof, SearchConfig(**CFG), ex, q=q, state_path=str(tmp_path / "s.json"))
    finally:
        ex.close()
    assert len(res.history) == CFG["budget"] and [h["i"] for h in res.history] == list(range(CFG["budget"]))
    assert len(ev.calls) == len(set(ev.calls)) == res.evaluations  # each distinct mask evaluated once
    assert sorted(h.get("method") for h in res.history if h["kind"] == "instant") == ["local_dp", "teacache",
                                                                                     "theory_dp"]
    state = json.loads((tmp_path / "s.json").read_text())
    assert state["done"] and state["pending"] == []
    assert res.policy.n_computed == CFG["k"] and res.policy.metrics["loss"] <= min(h["loss"] for h in res.history)


def test_one_in_flight_is_the_sequential_search():
    """q = 1 proposes, measures and chooses exactly what loop.run_search does (the benchmark's baseline)."""
    prof = make_profile()
    seq = run_search(prof, SearchConfig(**CFG), Evaluator(prof))
    ex = ThreadExecutor(Counting(prof), workers=1)
    try:
        par = run_batch_search(prof, SearchConfig(**CFG), ex, q=1)
    finally:
        ex.close()
    strip = ("seconds", "gp_seconds")
    assert [{k: v for k, v in h.items() if k not in strip} for h in par.history] == \
        [{k: v for k, v in h.items() if k not in strip} for h in seq.history]
    assert par.policy.mask == seq.policy.mask and par.state.final["mask"] == seq.state.final["mask"]


def test_batch_search_is_as_good_as_the_sequential_one():
    """Two evaluations out at once, results back in the order they went out (InProcessExecutor evaluates the oldest
    first): the same batch search on every machine, whatever the threads' timing would have been."""
    prof = make_profile()
    seq = run_search(prof, SearchConfig(**dict(CFG, budget=24)), Evaluator(prof))
    par = run_batch_search(prof, SearchConfig(**dict(CFG, budget=24)), InProcessExecutor(Evaluator(prof)), q=2)
    assert [h["mask"] for h in par.history] != [h["mask"] for h in seq.history]  # it did search otherwise
    assert par.policy.metrics["loss"] <= seq.policy.metrics["loss"] * 1.05


def test_gp_proposals_made_while_another_is_out_look_elsewhere(monkeypatch):
    """GP-BUCB: with the pending point counted at the posterior mean, a second proposal made while the first is out
    goes elsewhere; without it, the GP would propose (nearly) the same s again."""
    from gcache.search.gp import GPLCB
    prof = make_profile()

    def gp_steps(res):  # results come back in dispatch order: each GP proposal was made while the one before was out
        s = np.array([h["s"] for h in res.history if h["kind"] == "gp"])
        return np.linalg.norm(np.diff(s, axis=0), axis=1)
    spread = gp_steps(run_batch_search(prof, SearchConfig(**dict(CFG, budget=24)),
                                          InProcessExecutor(Evaluator(prof)), q=2))
    monkeypatch.setattr(GPLCB, "add_pending", lambda self, S: None)
    blind = gp_steps(run_batch_search(prof, SearchConfig(**dict(CFG, budget=24)),
                                         InProcessExecutor(Evaluator(prof)), q=2))
    assert spread.min() > 1.0 and blind.min() < 0.5  # in s ∈ [0, 10]^3; the control shows what GP-BUCB prevents


@pytest.mark.parametrize("bad", [float("nan"), None, "x", [0.1, float("nan")]])
def test_a_loss_that_is_no_number_stops_the_batch_search_with_what_to_do(tmp_path, bad):
    prof = make_profile()
    path = tmp_path / "s.json"
    ex = ThreadExecutor(lambda mask: bad, workers=2)
    try:
        with pytest.raises(GCacheError, match="not a finite loss"):
            run_batch_search(prof, SearchConfig(**CFG), ex, q=2, state_path=str(path))
    finally:
        ex.close()
    state = json.loads(path.read_text())
    assert state["history"] == [] and state["masks"] == {} and len(state["pending"]) == 2  # dispatched again later


def test_killed_coordinator_resumes_losing_at_most_q(tmp_path):
    prof = make_profile()
    path = str(tmp_path / "s.json")
    ex = ThreadExecutor(Counting(prof, crash_after=6), workers=2)
    with pytest.raises(KeyboardInterrupt):
        run_batch_search(prof, SearchConfig(**CFG), ex, q=2, state_path=path)
    ex.close()
    before = json.loads(open(path).read())
    done, out = len(before["history"]), {p["mask"] for p in before["pending"]}
    assert done >= 6 - 2 and len(out) <= 2
    ev = Counting(prof)
    ex = ThreadExecutor(ev, workers=2)
    try:
        res = run_batch_search(prof, SearchConfig(**CFG), ex, q=2, state_path=path)
    finally:
        ex.close()
    assert len(res.history) == CFG["budget"] and res.history[:done] == before["history"]
    finished = {h["mask"] for h in before["history"]}
    assert not finished & set(ev.calls)  # nothing that had finished is evaluated again
    assert out <= set(ev.calls) | finished  # what was out is dispatched again


def test_small_q_and_budget_are_refused():
    prof = make_profile()
    with pytest.raises(GCacheError, match="q"):
        run_batch_search(prof, SearchConfig(**CFG), ThreadExecutor(Counting(prof)), q=0)
    with pytest.raises(GCacheError, match="minimum useful budget"):
        run_batch_search(prof, SearchConfig(**dict(CFG, budget=11)), ThreadExecutor(Counting(prof)), q=2)
    with pytest.raises(GCacheError, match="minimum useful budget is 13"):  # the extra start mask counts too
        run_batch_search(prof, SearchConfig(**dict(CFG, budget=12)), ThreadExecutor(Counting(prof)), q=2,
                            extra_masks=[("mine", [1, 1, 1, 1, 1] + [0] * 9)])
