"""The io share measured while profiling (core/io_share.py): per-step shares, medians over steps and runs, the range,
mergeable profiles, old profiles, and the predicted speed-up's range. Hand-computed cases, no timing asserts."""
import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gcache.core.engine import CacheStats, ResidualCache
from gcache.core.errors import GCacheError
from gcache.core.io_share import MAX_RUNS, IoShare, quartiles, run_summary, step_shares
from gcache.core.policy import predicted_speedup
from gcache.core.profile import Profile
from gcache.core.recorder import ProfileRecorder
from gcache.core.step_clock import StackClock


def profile_with(meta: dict, n: int = 4) -> Profile:
    p = Profile.empty([1.0 - i / n for i in range(n)], meta=meta)
    p.count = 1
    return p


def run(median, q1=None, q3=None, steps=10) -> dict:
    return {"median": median, "q1": median if q1 is None else q1, "q3": median if q3 is None else q3, "steps": steps}


# ------------------------------------------------------------------------------------------------ one run
def test_quartiles_by_hand():
    # sorted 0.1 0.2 0.3 0.4: q1 at position 0.75 → 0.175, median 0.25, q3 at position 2.25 → 0.325
    assert quartiles([0.4, 0.1, 0.3, 0.2]) == pytest.approx((0.175, 0.25, 0.325))
    assert quartiles([0.7]) == (0.7, 0.7, 0.7)
    with pytest.raises(GCacheError):
        quartiles([])


def test_step_shares_leave_out_the_first_and_last_step_and_the_recording():
    step = {0: 2.0, 1: 1.0, 2: 1.2, 3: 1.0, 4: 0.5}
    stack = {0: 1.5, 1: 0.6, 2: 0.9, 3: 0.45, 4: 0.45}
    rec = {1: 0.2, 3: 0.1}
    # step 1: 1 − 0.6 / (1.0 − 0.2) = 0.25; step 2: 1 − 0.9 / 1.2 = 0.25; step 3: 1 − 0.45 / 0.9 = 0.5
    assert step_shares(step, stack, rec) == pytest.approx([0.25, 0.25, 0.5])
    assert run_summary([0.25, 0.25, 0.5]) == {"median": 0.25, "q1": 0.25, "q3": 0.375, "steps": 3}
    # two timed steps: nothing in between, so both count; untimed stacks count for nothing
    assert step_shares({0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.5}, {}) == pytest.approx([0.5, 0.25])
    assert step_shares({0: 1.0}, {}, {}) == []


def test_the_step_clock_counts_the_profile_snapshot_and_recording_as_the_profiles_own_time():
    clock = StackClock()
    clock.marks = [("step", 0, 0.0), ("snap", 0, 0.1), ("in", 0, 0.15), ("out", 0, 0.55), ("rec", 0, 0.65),
                   ("step", 1, 1.0), ("snap", 1, 1.0), ("in", 1, 1.05), ("out", 1, 1.45), ("rec", 1, 1.5),
                   ("end", None, 2.0)]
    total, stack, rec = clock.durations()
    assert total == pytest.approx({0: 1.0, 1: 1.0}) and stack == pytest.approx({0: 0.4, 1: 0.4})
    assert rec == pytest.approx({0: 0.05 + 0.1, 1: 0.05 + 0.05})


def test_a_profiled_reference_run_keeps_one_run_summary_of_its_middle_steps():
    from gcache.reference_model.harness import ReferenceHarness
    h = ReferenceHarness(6)
    prof = h.profile([1000, 1001])
    (r,) = prof.meta["io_runs"]
    assert r["steps"] == 4 and 0 <= r["q1"] <= r["median"] <= r["q3"] <= 1  # steps 1-4 of 0-5
    io = prof.io
    assert io.source == "measured" and io.runs == 1 and prof.io_share == r["median"]
    assert (io.low, io.high) == (r["q1"], r["q3"])  # one run: its steps' interquartile range
    assert "io_time" not in prof.meta


def test_profile_runs_time_the_stack_and_recording_per_step():
    """A run through the engine with a recorder: the per-step shares are those of its own timings."""
    rec = ProfileRecorder([1.0, 0.75, 0.5, 0.25])
    with ResidualCache(None, observers=(rec, StackClock())) as cache:
        for i in range(4):
            cache.set_step(i)
            cache.run(torch.ones(1, 3, 2), ["c"], lambda h: h * 2)
    s = cache.stats
    assert sorted(s.stack_seconds) == sorted(s.record_seconds) == [0, 1, 2, 3]
    assert s.io_step_shares() == pytest.approx(
        [min(max(1 - s.stack_seconds[i] / (s.step_seconds[i] - s.record_seconds[i]), 0), 1) for i in (1, 2)])


# ------------------------------------------------------------------------------------------------ over runs
def test_io_share_over_runs_by_hand():
    runs = [run(0.2, 0.15, 0.3), run(0.25, 0.2, 0.28), run(0.4, 0.35, 0.5)]
    io = IoShare.from_runs(runs)
    # value: median of medians 0.25; range: median q1 0.2, median q3 0.3, widened to the medians' 0.2 … 0.4
    assert (io.value, io.low, io.high, io.runs, io.source) == (0.25, 0.2, 0.4, 3, "measured")
    assert IoShare.from_meta({"io_runs": runs}) == io


def test_merged_profiles_hold_the_statistics_of_their_runs_concatenated():
    a = profile_with({"io_runs": [run(0.2, 0.1, 0.3)], "runs": 1})
    b = profile_with({"io_runs": [run(0.3, 0.25, 0.35), run(0.1, 0.05, 0.2)], "runs": 2})
    m = a.merge(b)
    assert m.meta["io_runs"] == a.meta["io_runs"] + b.meta["io_runs"]
    assert m.io == IoShare.from_runs(a.meta["io_runs"] + b.meta["io_runs"])
    back = Profile.from_bytes(m.to_bytes())
    assert back.io == m.io and back.io_share == pytest.approx(0.2)
    many = profile_with({"io_runs": [run(0.0)]})
    for i in range(1, 40):  # 40 one-run profiles merged: the latest MAX_RUNS runs are kept
        many = many.merge(profile_with({"io_runs": [run(i / 100)]}))
    assert [r["median"] for r in many.meta["io_runs"]] == [i / 100 for i in range(40 - MAX_RUNS, 40)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(*[st.floats(0, 1, allow_subnormal=False)] * 3), min_size=1, max_size=45),
       st.data())
def test_merging_in_any_grouping_equals_the_concatenated_runs(triples, data):
    runs = [run(*sorted(t)[1:2], q1=sorted(t)[0], q3=sorted(t)[2]) for t in triples]
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(runs) - 1)), max_size=4)))
    parts = [runs[i:j] for i, j in zip([0] + cuts, cuts + [len(runs)]) if runs[i:j]]

    def merged_in_order(rs):  # profiles of one run each (as a recorder makes them), merged one after the other
        out = profile_with({"io_runs": rs[:1]})
        for r in rs[1:]:
            out = out.merge(profile_with({"io_runs": [r]}))
        return out
    merged = merged_in_order(parts[0])
    for p in parts[1:]:  # groups merged into groups
        merged = merged.merge(merged_in_order(p))
    kept = runs[-MAX_RUNS:]  # the latest runs, at most MAX_RUNS
    assert merged.meta["io_runs"] == kept and merged.io == IoShare.from_runs(kept)
    meds = sorted(r["median"] for r in kept)
    assert merged.io_share == pytest.approx(float(np.median(meds)))
    assert merged.io.low <= min(meds) and merged.io.high >= max(meds)


# ------------------------------------------------------------------------------------------------ the range
PRINTED = r"predicted ([\d.]+)× \(([\d.]+)–([\d.]+) at the io shares of the profiled steps' middle half(.*)\)"


@pytest.mark.parametrize("n, k", [(30, 10), (12, 4), (50, 25)])
def test_the_printed_range_is_the_prediction_at_the_io_ranges_ends(n, k):
    io = IoShare(0.1, 0.06, 0.17, "measured", 2)
    text = io.describe_speedup(n, k)
    mid, lo, hi = (float(v) for v in re.fullmatch(PRINTED, text).groups()[:3])
    assert mid == round(predicted_speedup(n, k, 0.1), 2)
    assert lo == round(predicted_speedup(n, k, 0.17), 2) and hi == round(predicted_speedup(n, k, 0.06), 2)
    m = io.metrics(n, k)
    assert m["predicted_speedup_range"] == [round(predicted_speedup(n, k, 0.17), 3),
                                            round(predicted_speedup(n, k, 0.06), 3)]
    assert m["io_share_range"] == [0.06, 0.17] and m["io_share_source"] == "measured"
    # what a policy records reads back to the same numbers (GCache Apply's per-run log)
    back = IoShare.from_metrics(json.loads(json.dumps(m)), fallback=0.5).describe_speedup(n, k)
    assert re.fullmatch(PRINTED, back).groups()[:3] == re.fullmatch(PRINTED, text).groups()[:3]


def _quartiles_by_hand(values):
    """First quartile, median, third quartile: linear between the order statistics at (n − 1)·p."""
    v = sorted(values)

    def at(p):
        x = (len(v) - 1) * p
        i = int(x)
        return v[i] if i + 1 == len(v) else v[i] + (x - i) * (v[i + 1] - v[i])
    return at(0.25), at(0.5), at(0.75)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.floats(0.5, 2.0), st.floats(0.05, 0.95), st.floats(0.0, 0.2)),
                         min_size=4, max_size=12), min_size=1, max_size=4), st.integers(1, 29))
def test_the_printed_range_is_what_the_log_says_it_is(runs, k):
    """What the log line says the range is ("at the io shares of the profiled steps' middle half", and of every
    profiled run), computed independently from the raw step timings of each profiled run: every step's share
    1 − stack / (step − recording), the first and last step left out, the steps' quartiles per run, then the median
    over runs of the first and the third quartile, widened to every run's median; the speed-up at the two ends."""
    n = 30
    summaries, meds, q1s, q3s = [], [], [], []
    for steps in runs:  # (step seconds without recording, stack's part of it, recording seconds)
        step = {i: t + r for i, (t, _, r) in enumerate(steps)}
        stack = {i: t * f for i, (t, f, _) in enumerate(steps)}
        rec = {i: r for i, (_, _, r) in enumerate(steps)}
        shares = [1 - stack[i] / (step[i] - rec[i]) for i in range(1, len(steps) - 1)]
        q1, med, q3 = _quartiles_by_hand(shares)
        summaries.append(run_summary(step_shares(step, stack, rec)))
        meds.append(med), q1s.append(q1), q3s.append(q3)
    io = IoShare.from_runs(summaries)
    low = min(_quartiles_by_hand(q1s)[1], min(meds))
    high = max(_quartiles_by_hand(q3s)[1], max(meds))
    assert (io.value, io.low, io.high) == pytest.approx((_quartiles_by_hand(meds)[1], low, high), abs=2e-6)
    text = io.describe_speedup(n, k)
    mid, lo, hi, more = re.fullmatch(PRINTED, text).groups()
    assert more == ("" if len(runs) == 1 else " and of every profiled run")
    by_hand = lambda share: n / (k + (n - k) * share)  # noqa: E731
    assert abs(float(mid) - by_hand(io.value)) <= 0.005 + 1e-9
    assert abs(float(lo) - by_hand(high)) <= 0.0051 and abs(float(hi) - by_hand(low)) <= 0.0051


# ------------------------------------------------------------------------------------------------ old profiles
def test_a_profile_from_before_per_step_timing_gives_its_total_without_a_range(tmp_path):
    old = profile_with({"io_time": {"stack": 0.9, "call": 1.2}, "io_share": 0.5, "runs": 1})
    old.save(str(tmp_path / "old.profile.safetensors"))
    back = Profile.load(str(tmp_path / "old.profile.safetensors"))
    assert back.io_share == pytest.approx(0.25) and not back.io.has_range  # 1 − 0.9 / 1.2, as before
    assert back.io.describe_speedup(12, 4) == \
        f"predicted {predicted_speedup(12, 4, 0.25):.2f}× (no range: a profile from before per-step timing: one " \
        "timed total)"
    assert back.io.metrics(12, 4)["io_share_range"] is None
    # merged with a new one: the old total counts as one run (no spread of its own), the new one's steps as theirs
    new = profile_with({"io_runs": [run(0.3, 0.2, 0.4)], "runs": 1})
    m = back.merge(new)
    assert "io_time" not in m.meta and m.meta["io_runs"] == [run(0.25, steps=0), run(0.3, 0.2, 0.4)]
    assert (m.io.value, m.io.low, m.io.high) == pytest.approx((0.275, 0.225, 0.325))


def test_a_profile_with_only_the_parameter_count_estimate_says_so():
    p = profile_with({"io_share": 0.3})
    assert p.io_share == 0.3 and p.io.source == "parameter count" and not p.io.has_range
    assert "no range: io share estimated from parameter counts, not measured" in p.io.describe_speedup(12, 4)
    none = profile_with({})
    assert none.io_share == 0.0 and "speed-up = N / K" in none.io.describe_speedup(10, 5)
    assert none.io.describe_speedup(10, 5).startswith("predicted 2.00×")


def test_a_policy_from_before_ranges_reads_without_one():
    io = IoShare.from_metrics({"io_share": 0.2}, fallback=0.5)
    assert io.value == 0.2 and not io.has_range and "made before io-share ranges" in io.describe_speedup(10, 5)
    assert IoShare.from_metrics({}, fallback=0.35) == IoShare(0.35, None, None, "parameter count")


@pytest.mark.parametrize("bad", [[{"median": 0.2}], [run(0.5, 0.6, 0.7)], [run(1.5)], "x", [run(float("nan"))]])
def test_damaged_io_timings_are_refused_at_load(bad):
    p = profile_with({"runs": 1})
    p.meta["io_runs"] = bad
    try:
        data = p.to_bytes()
    except ValueError:  # NaN is not JSON: such a file can't even be written
        return
    with pytest.raises(GCacheError, match="damaged io timings"):
        Profile.from_bytes(data)


def test_cache_stats_merge_keeps_per_step_timings_for_the_io_share():
    a, b = CacheStats(), CacheStats()
    a.step_seconds, a.stack_seconds = {0: 1.0, 1: 1.0, 2: 1.0}, {0: 0.5, 1: 0.8, 2: 0.5}
    b.step_seconds, b.stack_seconds = {0: 1.0, 1: 2.0, 2: 1.0}, {0: 0.5, 1: 1.0, 2: 0.5}
    m = CacheStats.merged([a, b])  # two devices side by side: a step took its longest
    assert m.io_step_shares() == pytest.approx([1 - 1.0 / 2.0])
