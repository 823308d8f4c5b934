"""bench/peers.py's arithmetic (no ComfyUI): a curve's interpolation, the bootstrap interval, the speed-up on both
axes, the target auto turns into K, and the headline against the best alternative (checked against a brute-force
pick over a hand-built table)."""
import itertools
import statistics

import pytest

from gcache.bench.peers import auto_target, bootstrap, headline, interpolate, search_vs_auto, speedups
from gcache.bench.peers_compare import ALTERNATIVES, io_cost
from gcache.core.policy import k_for_speedup


def test_interpolation_between_the_bracketing_rows_by_hand():
    curve = [(1.0, [40.0, 50.0]), (2.0, [30.0, 40.0]), (4.0, [10.0, 30.0])]
    assert interpolate(curve, 1.5) == [35.0, 45.0]
    assert interpolate(curve, 3.0) == [20.0, 35.0]  # halfway from 2x to 4x
    assert interpolate(curve, 4.0) == [10.0, 30.0]
    assert interpolate(curve, 4.5) is None and interpolate(curve, 0.9) is None


def test_rows_of_equal_speedup_are_averaged():
    assert interpolate([(2.0, [10.0]), (2.0, [20.0]), (3.0, [0.0])], 2.0) == [15.0]


def test_bootstrap_interval_holds_the_mean_and_is_a_point_for_equal_values():
    diffs = [1.0, 2.0, 3.0, 4.0, 10.0]
    lo, hi = bootstrap(diffs)
    assert lo <= statistics.mean(diffs) <= hi and lo >= 1.0 and hi <= 10.0
    assert bootstrap([2.0] * 6) == [2.0, 2.0]


def test_io_inclusive_cost_by_hand():
    """GCache at K = 5 of 20 with io share 0.1: 5 + 15 * 0.1 = 6.5 full steps, 20 / 6.5 = 3.077x; in passes 4x.
    A peer or fewer steps at 5 passes: 4x on both axes (they skip the whole model call)."""
    assert io_cost(20, 5, 0.1) == pytest.approx(6.5)
    g = speedups({"kind": "gcache k", "passes": [5, 5]}, 20, 20.0, 0.1)
    assert g == {"speedup_passes": 4.0, "speedup_io": 3.077}
    for kind in ("EasyCache wide", "fewer steps", "gcache search", "gcache"):
        r = speedups({"kind": kind, "passes": [4, 6]}, 20, 20.0, 0.1)
        assert r["speedup_passes"] == 4.0
        assert r["speedup_io"] == (3.077 if kind.startswith("gcache") else 4.0)
    assert speedups({"kind": "gcache", "passes": [20]}, 20, 20.0, 0.3)["speedup_io"] == 1.0  # every step: no gain


@pytest.mark.parametrize("io_share", [0.0, 0.013, 0.15, 0.2471, 0.6])
def test_auto_target_is_the_target_auto_turns_into_that_k(io_share):
    for n in (8, 20, 50):
        assert [k_for_speedup(n, auto_target(n, k, io_share), io_share) for k in range(1, n)] == list(range(1, n))


def _row(name, kind, speedup, psnr, ssim=None):
    r = {"row": name, "kind": kind, "passes": [round(20 / speedup)] * len(psnr), "speedup_passes": speedup,
         "speedup_io": speedup, "psnr": psnr}
    if ssim is not None:
        r["ssim"] = ssim
    return r


TABLE = [  # a GCache row and every alternative, 3 pairs; the best alternative differs with the speed-up
    _row("G", "gcache k", 4.0, [30.0, 31.0, 35.0], [0.9, 0.9, 0.9]),
    _row("G2", "gcache", 8.0, [20.0, 20.0, 20.0], [0.5, 0.5, 0.5]),
    _row("E1", "EasyCache", 2.0, [40.0, 40.0, 40.0], [1.0, 1.0, 1.0]),
    _row("E2", "EasyCache", 3.0, [30.0, 30.0, 30.0], [1.0, 1.0, 1.0]),  # stops short of 4x
    _row("EW1", "EasyCache wide", 2.0, [36.0, 36.0, 36.0], [0.8, 0.8, 0.8]),
    _row("EW2", "EasyCache wide", 6.0, [20.0, 22.0, 30.0], [0.6, 0.6, 0.6]),  # at 4x: 28, 29, 33 (mean 30)
    _row("L1", "LazyCache", 1.5, [50.0, 50.0, 50.0], [1.0, 1.0, 1.0]),
    _row("LW1", "LazyCache wide", 3.0, [30.0, 30.0, 30.0], [0.7, 0.7, 0.7]),
    _row("LW2", "LazyCache wide", 10.0, [16.0, 16.0, 16.0], [0.3, 0.3, 0.3]),  # at 4x: 28; at 8x: 20
    _row("F4", "fewer steps", 4.0, [29.0, 30.0, 29.0], [0.8, 0.7, 0.8]),  # at 4x: 29.33
    _row("F10", "fewer steps", 10.0, [10.0, 10.0, 10.0], [0.2, 0.2, 0.2]),  # at 8x: 29.33 - 2/3 * 19.33 = 16.44
]


def brute_force_best(table, x):
    """Every alternative's rows, every pair of them around x, by hand: the mean of the linear interpolation."""
    best = {}
    for alt in ALTERNATIVES:
        rows = [r for r in table if r["kind"] == alt]
        for lo, hi in itertools.product(rows, rows):
            if lo["speedup_passes"] <= x <= hi["speedup_passes"]:
                w = 0.0 if hi is lo else (x - lo["speedup_passes"]) / (hi["speedup_passes"] - lo["speedup_passes"])
                best[alt] = statistics.mean((1 - w) * a + w * b for a, b in zip(lo["psnr"], hi["psnr"]))
                break
    return max(best, key=best.get), best


def test_best_alternative_headline_against_a_brute_force_pick():
    g, g2 = headline(TABLE, "passes")
    for item, x in ((g, 4.0), (g2, 8.0)):
        want, means = brute_force_best(TABLE, x)
        assert item["best"] == want
        assert item["alternatives"]["EasyCache"] is None and item["alternatives"]["LazyCache"] is None  # short
        assert {a: v for a, v in item["alternatives"].items() if v is not None} == pytest.approx(means, abs=1e-3)
    assert g["best"] == "EasyCache wide" and g["best_psnr"] == 30.0
    assert g["psnr_diff"] == pytest.approx(statistics.mean([30 - 28, 31 - 29, 35 - 33]))  # 2.0 each
    assert g["interval"] == [2.0, 2.0] and g["ssim_diff"] == pytest.approx(0.9 - 0.7, abs=1e-4)
    assert g2["best"] == "LazyCache wide" and g2["best_psnr"] == pytest.approx(20.0)  # 30 - 5/7 * 14 at 8x
    assert g2["psnr_diff"] == pytest.approx(20.0 - g2["best_psnr"])


def test_headline_is_none_where_no_alternative_reaches_and_uses_the_axis_asked():
    rows = [dict(_row("G", "gcache", 4.0, [30.0], [0.9]), speedup_io=1.2), _row("F", "fewer steps", 2.0, [25.0], [0.8]),
            _row("F2", "fewer steps", 5.0, [20.0], [0.5])]
    (p,), (io,) = headline(rows, "passes"), headline(rows, "io")
    assert p["best"] == "fewer steps" and p["psnr_diff"] == pytest.approx(30.0 - (25.0 - 2 / 3 * 5.0), abs=1e-3)
    assert io["best"] is None and io["psnr_diff"] is None and io["speedup_io"] == 1.2


def test_search_minus_auto_pairs_the_rows_of_the_same_k():
    rows = [{"row": "GCache auto 3x", "kind": "gcache", "passes": [2, 2], "psnr": [10.0, 10.0]},
            {"row": "GCache auto 2x", "kind": "gcache", "passes": [4, 4], "psnr": [20.0, 22.0]},
            {"row": "GCache Search K=4", "kind": "gcache search", "k": 4, "passes": [4, 4], "psnr": [21.0, 25.0]}]
    (x,) = search_vs_auto(rows)
    assert x["auto"] == "GCache auto 2x" and x["psnr_diff"] == 2.0  # (1 + 3) / 2
    assert 1.0 <= x["interval"][0] <= 2.0 <= x["interval"][1] <= 3.0
