"""bench/peers.py's arithmetic (no ComfyUI): the peer curve's interpolation, the bootstrap interval, the headline."""
import statistics

from gcache.bench.peers import bootstrap, headline, interpolate


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


def test_headline_is_gcache_minus_the_interpolated_peer_and_none_out_of_range():
    rows = [{"row": "GCache auto 2x", "kind": "gcache", "speedup_passes": 3.0, "psnr": [30.0, 32.0],
             "ssim": [0.9, 0.9]},
            {"row": "E 1", "kind": "EasyCache", "speedup_passes": 2.0, "psnr": [28.0, 30.0], "ssim": [0.9, 0.8]},
            {"row": "E 2", "kind": "EasyCache", "speedup_passes": 4.0, "psnr": [20.0, 22.0], "ssim": [0.7, 0.6]},
            {"row": "L 1", "kind": "LazyCache", "speedup_passes": 1.5, "psnr": [40.0, 40.0], "ssim": [1.0, 1.0]}]
    easy, lazy = headline(rows)
    assert easy["peer"] == "EasyCache" and easy["peer_psnr"] == 25.0 and easy["psnr_diff"] == 6.0  # 30-24, 32-26
    assert easy["interval"] == [6.0, 6.0]
    assert easy["ssim_diff"] == 0.15  # 0.9 - 0.8 and 0.9 - 0.7
    assert lazy["psnr_diff"] is None and "1.50-1.50x only" in lazy["why"]


def test_search_minus_auto_pairs_the_rows_of_the_same_k():
    from gcache.bench.peers import search_vs_auto
    rows = [{"row": "GCache auto 3x", "kind": "gcache", "passes": [2, 2], "psnr": [10.0, 10.0]},
            {"row": "GCache auto 2x", "kind": "gcache", "passes": [4, 4], "psnr": [20.0, 22.0]},
            {"row": "GCache Search K=4", "kind": "gcache search", "k": 4, "passes": [4, 4], "psnr": [21.0, 25.0]}]
    (x,) = search_vs_auto(rows)
    assert x["auto"] == "GCache auto 2x" and x["psnr_diff"] == 2.0  # (1 + 3) / 2
    assert 1.0 <= x["interval"][0] <= 2.0 <= x["interval"][1] <= 3.0
