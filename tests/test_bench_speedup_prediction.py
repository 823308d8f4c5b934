"""bench/speedup_prediction.py at tiny sizes: its summaries are the statistics of its own per-rerun rows, its figures
from before 2026-11-27 are those formulas on hand-made timings, and its predictions are the profile's. No timing
asserts."""
import json

import numpy as np
import pytest

from gcache.bench import speedup_prediction as bench
from gcache.core.engine import CacheStats
from gcache.core.policy import predicted_speedup


def test_spread_by_hand():
    s = bench.spread([2.0, 2.2, 1.9, 2.1, 2.0])
    assert (s["median"], s["min"], s["max"]) == (2.0, 1.9, 2.2) and s["spread"] == pytest.approx(0.15)


def test_the_figures_from_before_by_hand():
    st = CacheStats()
    st.step_seconds = {0: 3.0, 1: 1.0, 2: 1.0, 3: 0.5}
    st.stack_seconds = {0: 2.0, 1: 0.8, 2: 0.7, 3: 0.5}
    st.record_seconds = {1: 0.2}
    # every step: 1 − (2 + 0.8 + 0.7 + 0.5) / (3 + 0.8 + 1 + 0.5) = 1 − 4 / 5.3
    assert bench.io_share_before(st) == pytest.approx(1 - 4 / 5.3)
    # N · mean computed step / total: 4 · (3 + 1) / 2 / 5.5
    assert bench.measured_before(st, [1, 0, 1, 0]) == pytest.approx(4 * 2.0 / 5.5)


def test_reruns_on_a_tiny_reference_model(capsys):
    from gcache.reference_model.harness import ReferenceHarness
    h = ReferenceHarness(8)
    seeds = [1000, 1001]
    out = bench.rerun_rows(8, (3, 5), lambda: h.profile(seeds),
                           lambda pol: (lambda: h.run(seeds, [1] * 8), lambda: h.run(seeds, pol.mask)),
                           lambda: h.run(seeds, [1] * 8), reruns=3, repeats=2)
    rows = out["reruns"]
    assert len(rows) == 3 and set(out["by_k"]) == {3, 5}
    io = [r["io_share"] for r in rows]
    assert out["io_share"]["median"] == pytest.approx(float(np.median(io)), abs=1e-4)
    for k, fig in out["by_k"].items():
        pred = [r["by_k"][k]["predicted"] for r in rows]
        # each rerun's prediction is the formula at that rerun's io share, its range at the io range's ends
        for r in rows:
            c = r["by_k"][k]
            assert c["predicted"] == pytest.approx(predicted_speedup(8, k, r["io_share"]))
            t, f = r["step_costs"]["profile_step_ms"], r["step_costs"]["run_outside_steps_ms"]
            assert c["predicted_whole_run"] == pytest.approx((8 * t + f) / ((k + (8 - k) * r["io_share"]) * t + f))
            assert c["predicted_range"] == pytest.approx([predicted_speedup(8, k, r["io_range"][1]),
                                                          predicted_speedup(8, k, r["io_range"][0])])
        assert fig["predicted"]["median"] == pytest.approx(float(np.median(pred)), abs=1e-4)
        assert fig["predicted"]["spread"] == pytest.approx((max(pred) - min(pred)) / np.median(pred), abs=1e-3)
        meas = [r["by_k"][k]["measured"] for r in rows]
        assert fig["predicted_over_measured"] == pytest.approx(np.median(pred) / np.median(meas), rel=1e-3)
        assert fig["predicted_within_measured"] == (min(meas) <= round(float(np.median(pred)), 4) <= max(meas))
    for r in rows:  # the step costs are medians of the runs' own step times: positive, the stack inside the step
        c = r["step_costs"]
        assert all(v > 0 for name, v in c.items() if name != "run_outside_steps_ms")
        assert c["profile_stack_ms"] + c["profile_outside_stack_ms"] == pytest.approx(c["profile_step_ms"], rel=0.5)
    json.dumps(out)  # the JSON line can be written


def test_step_costs_by_hand():
    prof, ones, masked = CacheStats(), CacheStats(), CacheStats()
    prof.step_seconds = {0: 9.0, 1: 1.0, 2: 1.2, 3: 1.1, 4: 0.5}
    prof.record_seconds = {1: 0.2, 2: 0.2, 3: 0.2}
    prof.stack_seconds = {0: 5.0, 1: 0.6, 2: 0.7, 3: 0.8, 4: 0.4}
    ones.step_seconds = {0: 5.0, 1: 0.9, 2: 1.0, 3: 0.8, 4: 0.1}
    masked.step_seconds = {0: 5.0, 1: 0.3, 2: 1.0, 3: 0.2, 4: 0.9, 5: 0.1}
    c = bench.step_costs(prof, ones, [(masked, [1, 0, 1, 0, 1, 1])])
    # steps 1-3: calls 0.8, 1.0, 0.9 (median 0.9); stacks 0.6, 0.7, 0.8; outside 0.2, 0.3, 0.1 (median 0.2)
    assert c["profile_step_ms"] == pytest.approx(900) and c["profile_stack_ms"] == pytest.approx(700)
    assert c["profile_outside_stack_ms"] == pytest.approx(200) and c["all_ones_step_ms"] == pytest.approx(900)
    assert c["computed_step_ms"] == pytest.approx(950) and c["skipped_step_ms"] == pytest.approx(250)
