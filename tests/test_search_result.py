"""What a search returns (search/result.py): every policy of a searched mask carries the profile's io share, so the
speed-up an evaluation predicts (as GCache Apply computes it from the policy it applies) and the speed-up the saved
policy states are one figure."""
import pytest
from test_search_bilevel import CFG, Evaluator, make_profile

from gcache.core.io_share import IoShare
from gcache.core.policy import predicted_speedup
from gcache.search.config import SearchConfig
from gcache.search.loop import run_search
from gcache.search.result import predicted_speedup_text, searched_policy

ESTIMATE = 0.2  # what Apply falls back to for a policy without an io share (the parameter-count estimate)


@pytest.fixture
def prof():
    p = make_profile()
    p.meta["io_runs"] = [{"median": 0.061, "q1": 0.052, "q3": 0.07, "steps": 12}]  # a measured io share
    return p


def test_each_evaluation_predicts_the_speedup_the_returned_policy_states(prof):
    logged = []  # what Apply would log for each evaluation's policy
    ev = Evaluator(prof)

    def evaluate(mask):
        pol = searched_policy(prof, mask, "reuse", "search-candidate")  # as GCache Search's evaluation makes it
        logged.append(IoShare.from_metrics(pol.metrics, ESTIMATE).describe_speedup(pol.n_steps, pol.n_computed))
        return ev(mask)
    res = run_search(prof, SearchConfig(**CFG), evaluate)
    pol = res.policy
    assert set(logged) == {predicted_speedup_text(pol)}
    mid, lo, hi = predicted_speedup(14, 5, 0.061), predicted_speedup(14, 5, 0.07), predicted_speedup(14, 5, 0.052)
    # by hand: N / (K + (N−K)·s), the range at the io share's range (core/io_share.py says what that range is)
    assert predicted_speedup_text(pol).startswith(f"predicted {mid:.2f}× ({lo:.2f}–{hi:.2f} at the io shares of ")
    assert pol.metrics["predicted_speedup"] == pytest.approx(mid, abs=1e-3)
    assert pol.metrics["io_share"] == 0.061 and pol.metrics["io_share_range"] == [0.052, 0.07]
    without = IoShare.from_metrics({}, ESTIMATE).describe_speedup(14, 5)  # what a bare candidate policy made Apply say
    assert without != predicted_speedup_text(pol)


def test_a_searched_policy_keeps_the_callers_metrics_and_adds_the_speedup(prof):
    pol = searched_policy(prof, [1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0], "reuse", "gcache", {"s": [1.0]},
                          {"loss": 0.5})
    assert pol.metrics["loss"] == 0.5 and pol.provenance == {"s": [1.0]} and pol.method == "gcache"
    assert pol.metrics["predicted_speedup"] == pytest.approx(predicted_speedup(14, 5, 0.061), abs=1e-3)
