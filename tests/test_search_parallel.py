"""The batch search (headless, thread workers): budget, de-duplication, GP-BUCB spread, crash and resume."""
import json
import threading

import pytest

from gcache.core.errors import GCacheError
from gcache.search.bilevel import SearchConfig, mask_key, run_search
from gcache.search.parallel import ThreadExecutor, run_search_parallel
from test_search_bilevel import CFG, Evaluator, make_profile


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
        res = run_search_parallel(prof, SearchConfig(**CFG), ex, q=q, state_path=str(tmp_path / "s.json"))
    finally:
        ex.close()
    assert len(res.history) == CFG["budget"] and [h["i"] for h in res.history] == list(range(CFG["budget"]))
    assert len(ev.calls) == len(set(ev.calls)) == res.evaluations  # each distinct mask evaluated once
    assert sorted(h.get("method") for h in res.history if h["kind"] == "instant") == ["local_dp", "teacache", "theory_dp"]
    state = json.loads((tmp_path / "s.json").read_text())
    assert state["done"] and state["pending"] == []
    assert res.policy.n_computed == CFG["k"] and res.policy.metrics["loss"] <= min(h["loss"] for h in res.history)


def test_one_in_flight_is_the_sequential_search():
    """q = 1 proposes, measures and chooses exactly what bilevel.run_search does (the benchmark's baseline)."""
    prof = make_profile()
    seq = run_search(prof, SearchConfig(**CFG), Evaluator(prof))
    ex = ThreadExecutor(Counting(prof), workers=1)
    try:
        par = run_search_parallel(prof, SearchConfig(**CFG), ex, q=1)
    finally:
        ex.close()
    strip = ("seconds", "gp_seconds")
    assert [{k: v for k, v in h.items() if k not in strip} for h in par.history] == \
        [{k: v for k, v in h.items() if k not in strip} for h in seq.history]
    assert par.policy.mask == seq.policy.mask and par.state["final"]["mask"] == seq.state["final"]["mask"]


def test_batch_search_is_as_good_as_the_sequential_one():
    prof = make_profile()
    seq = run_search(prof, SearchConfig(**dict(CFG, budget=24)), Evaluator(prof))
    ex = ThreadExecutor(Counting(prof), workers=2)
    try:
        par = run_search_parallel(prof, SearchConfig(**dict(CFG, budget=24)), ex, q=2)
    finally:
        ex.close()
    assert par.policy.metrics["loss"] <= seq.policy.metrics["loss"] * 1.05


def test_killed_coordinator_resumes_losing_at_most_q(tmp_path):
    prof = make_profile()
    path = str(tmp_path / "s.json")
    ex = ThreadExecutor(Counting(prof, crash_after=6), workers=2)
    with pytest.raises(KeyboardInterrupt):
        run_search_parallel(prof, SearchConfig(**CFG), ex, q=2, state_path=path)
    ex.close()
    before = json.loads(open(path).read())
    done, out = len(before["history"]), {p["mask"] for p in before["pending"]}
    assert done >= 6 - 2 and len(out) <= 2
    ev = Counting(prof)
    ex = ThreadExecutor(ev, workers=2)
    try:
        res = run_search_parallel(prof, SearchConfig(**CFG), ex, q=2, state_path=path)
    finally:
        ex.close()
    assert len(res.history) == CFG["budget"] and res.history[:done] == before["history"]
    finished = {h["mask"] for h in before["history"]}
    assert not finished & set(ev.calls)  # nothing that had finished is evaluated again
    assert out <= set(ev.calls) | finished  # what was out is dispatched again


def test_small_q_and_budget_are_refused():
    prof = make_profile()
    with pytest.raises(GCacheError, match="q"):
        run_search_parallel(prof, SearchConfig(**CFG), ThreadExecutor(Counting(prof)), q=0)
    with pytest.raises(GCacheError, match="minimum useful budget"):
        run_search_parallel(prof, SearchConfig(**dict(CFG, budget=11)), ThreadExecutor(Counting(prof)), q=2)
    assert mask_key([1, 0]) == "10"
