"""bench/auto_seeds.py's arithmetic, on hand-made cases: which candidate the check keeps (the lowest run-1 loss, a
tie to the earlier one, as search/auto_check.choose), the spread over run-1 inputs, and the monotone count."""
from __future__ import annotations

from gcache.bench.auto_seeds import RULES, monotone, pick, summary
from gcache.search import auto_check


class Cand:
    forecast, n_computed = "linear", 4  # what search/auto_check.choose's line names

    def __init__(self, name):
        self.name = name


def test_pick_keeps_the_lowest_run1_loss_and_the_earlier_on_a_tie():
    a, b, c = Cand("a"), Cand("b"), Cand("c")
    rows = {"a": {"run1_loss": 0.3, "psnr": 20.0}, "b": {"run1_loss": 0.1, "psnr": 18.0},
            "c": {"run1_loss": 0.1, "psnr": 30.0}}
    key = lambda x: x.name  # noqa: E731
    assert pick([a, b, c], rows, key) is rows["b"]          # b and c tie: b is listed first
    assert pick([a, c, b], rows, key) is rows["c"]
    assert pick([a], rows, key) is rows["a"]                 # a check of one candidate keeps it
    # the same rule as the check GCache Apply runs
    losses = [rows[x.name]["run1_loss"] for x in (a, c, b)]
    assert auto_check.choose([a, c, b], losses)[0] == 1


def test_summary_is_mean_min_max():
    assert summary([20.0, 23.0, 29.0]) == {"mean": 24.0, "min": 20.0, "max": 29.0}


def test_monotone_counts_each_run_and_step_in_k():
    # two runs, Ks 3 -> 4 -> 5: run 0 falls once for "checked" (31 -> 30), run 1 never; a tie counts as held
    runs = [{3: dict.fromkeys(RULES, 25.0), 4: dict.fromkeys(RULES, 31.0), 5: dict.fromkeys(RULES, 32.0)},
            {3: dict.fromkeys(RULES, 24.0), 4: dict.fromkeys(RULES, 24.0), 5: dict.fromkeys(RULES, 26.0)}]
    runs[0][5]["checked"] = 30.0
    got = monotone(runs, [3, 4, 5])
    assert got["checked"] == [3, 4]
    assert got["instant"] == [4, 4]
