"""What the self-check measures and concludes (core/selfcheck.py), by hand-computed cases (headless)."""
import math

import pytest
import torch

from gcache.core.selfcheck import (
    FAIL,
    GROUPS,
    NOT_CHECKED,
    PASS,
    SAFETY,
    Figures,
    Measured,
    allowance,
    conclude,
    measure,
    nudged,
    unit,
)


@pytest.mark.parametrize("dtype, eps", [(torch.float32, 2.0 ** -23), (torch.bfloat16, 2.0 ** -7),
                                        (torch.float16, 2.0 ** -10), (torch.float64, 2.0 ** -52)])
def test_one_unit_is_the_dtypes_epsilon(dtype, eps):
    assert unit(dtype) == eps
    assert unit(torch.int8) == unit(torch.float32)  # not a float: float32's


def test_the_allowance_is_a_fixed_multiple_of_the_measured_floor_plus_the_outputs_rounding():
    assert allowance(1e-3) == pytest.approx(SAFETY * 1e-3) and allowance(1e-3, 1e-6) == pytest.approx(
        SAFETY * (1e-3 + 1e-6))
    assert Figures("element", 0.0).ratio() == 0.0 and Figures("element", 1e-9).ratio() == math.inf


def _measure(y, y2, y3=None, y0=None):
    y3 = y2 if y3 is None else y3
    y0 = torch.zeros_like(y) if y0 is None else y0
    return measure([y], [y2], [y3], [y0])


def test_equal_outputs_have_no_error_and_one_changed_element_is_measured_alone():
    y = torch.ones(2, 3, 10)           # the model contributed y − y0 = 1 everywhere
    figs = _measure(y, y.clone())
    assert figs["element"].error == 0.0 and figs["group"].error == 0.0
    y2 = y.clone()
    y2[1, 2, 9] += 0.5                 # 30 elements per sample: 30 groups of one
    figs = _measure(y, y2)
    assert figs["element"].error == pytest.approx(0.5) and figs["group"].error == pytest.approx(0.5)


def test_one_wrong_element_is_not_diluted_by_the_count():
    """Issue 47: at 4096 tokens a group of 1024 elements diluted one stale token; the element statistic is the same
    at any size, the group one falls with the group's size."""
    for n in (GROUPS * 16, GROUPS * 1024):
        y = torch.ones(1, n)
        y2 = y.clone()
        y2[0, 7] += 0.3
        figs = _measure(y, y2)
        assert figs["element"].error == pytest.approx(0.3)
        assert figs["group"].error == pytest.approx(0.3 / math.sqrt(n // GROUPS))


def test_a_fault_spread_thinly_shows_in_the_group_statistic():
    n = GROUPS * 1024
    y = torch.ones(1, n)
    y2 = y.clone()
    y2[0, -1024:] += 0.2               # a wrong range of one group
    figs = _measure(y, y2)
    assert figs["group"].error == pytest.approx(0.2) and figs["element"].error == pytest.approx(0.2)


def test_the_floor_is_the_nudged_replays_distance_from_the_replay():
    y = torch.ones(1, 64)
    y2 = y + 1e-4
    y3 = y2.clone()
    y3[0, 5] += 3e-3                   # one unit of rounding at the stack's output moved one element by 3e-3
    figs = _measure(y, y2, y3)
    assert figs["element"].floor == pytest.approx(3e-3, rel=1e-4)
    # 64 elements: groups of one; the group's floor is its nudged figure plus one element moved by the worst
    assert figs["group"].floor == pytest.approx(3e-3 + 3e-3, rel=1e-4)
    assert figs["element"].error == pytest.approx(1e-4, rel=1e-3)
    assert figs["element"].rounding == pytest.approx(2.0 ** -23)  # float32 at 1 over a contribution of 1
    assert figs["element"].tolerance == pytest.approx(SAFETY * (3e-3 + 2.0 ** -23), rel=1e-4)


def test_the_outputs_own_rounding_is_its_epsilon_over_what_the_model_contributed():
    """y = 100 with the model contributing 0.5 (late in an EDM schedule): a float32 output rounds at
    eps · 100 / 0.5 of the model's part."""
    y0, y = torch.full((1, 64), 99.5), torch.full((1, 64), 100.0)
    figs = _measure(y, y, y, y0)
    assert figs["element"].error == 0.0 and figs["element"].rounding == pytest.approx(2.0 ** -23 * 100 / 0.5)
    assert figs["group"].rounding == pytest.approx(2.0 ** -23 * 100 / 0.5)


def test_several_parts_of_a_nested_output_and_samples_take_the_worst():
    video, audio = torch.ones(2, 4, 8), torch.ones(2, 2, 3)
    audio2 = audio.clone()
    audio2[1, 0, 0] = 3.0
    figs = measure([video, audio], [video.clone(), audio2], [video.clone(), audio2.clone()],
                   [torch.zeros_like(video), torch.zeros_like(audio)])
    assert figs["element"].error == pytest.approx(2.0)


def test_non_finite_outputs():
    y = torch.ones(1, 8)
    nan = torch.full((1, 8), float("nan"))
    assert _measure(y, nan, y)["element"].error == math.inf
    assert _measure(y, y + 1, y + 1, y.clone())["element"].error == math.inf  # nothing contributed, yet it moved
    with pytest.raises(ValueError, match="NaN"):
        _measure(torch.full((1, 8), float("inf")), y)
    with pytest.raises(ValueError, match="nudged"):
        _measure(y, y, nan)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_nudge_moves_every_element_by_about_one_unit_either_way(dtype):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 64, 32, generator=g).to(dtype)
    z = (h.float() + torch.randn(2, 64, 32, generator=g) * 0.3).to(dtype)
    d = (z.float() - h.float()).to(dtype)
    eps = unit(dtype)
    moved = (h.float() + nudged(h, d, eps).float()).to(dtype).float() - (h.float() + d.float()).to(dtype).float()
    scale = torch.maximum(z.float().abs(), h.float().abs())
    rel = moved.abs() / (eps * scale)
    assert rel.max() <= 3.0 and rel.mean() >= 0.5  # one unit, the rounding of δ' and h + δ' around it
    assert 0.3 < (moved > 0).float().mean() < 0.7  # either way, half and half
    assert torch.equal(nudged(h, d, eps), nudged(h, d, eps))  # the same on every run


def test_a_run_fails_when_any_call_fails_and_is_not_checked_when_no_call_was():
    ok = Measured({"element": Figures("element", 1e-8, 1e-7), "group": Figures("group", 1e-9, 1e-7)}, "float32")
    assert conclude([ok], [], []).result == PASS
    worse = Figures("group", 3 * allowance(1e-7), 1e-7)
    bad = conclude([ok, Measured({"element": Figures("element", 1e-8, 1e-7), "group": worse}, "float32")], [], [])
    assert bad.result == FAIL and bad.statistic == "group" and bad.error == worse.error and "differs" in bad.why
    counted = conclude([ok], ["the blocks ran anyway (4 block module calls in the replay)"], [])
    assert counted.result == FAIL and "blocks ran anyway" in counted.why and counted.error == 1e-8
    none = conclude([], [], ["ComfyUI's MultiGPU CFG split runs this call in a thread of its own device"])
    assert none.result == NOT_CHECKED and "MultiGPU" in none.why and none.error is None
    assert conclude([ok], [], ["another node's block patch replaced GCache's"]).result == PASS  # one call checked
    text = conclude([ok], [], []).describe()
    assert text.startswith("element error 1e-08 ≤ tolerance") and "(group error 1e-09 ≤" in text
    assert ">" in bad.describe() and bad.describe().startswith("group error")


def test_behind_a_head_of_lower_precision_the_group_floor_is_the_nudges_share_plus_one_flipped_element():
    """A float32 stack before a bfloat16 head: the replay differs in float32's last bits, which the head turns into a
    whole bfloat16 unit on rare elements only. The group floor is the nudge's group figure times
    √(ε float32 / ε bfloat16) = 1/256, plus one element moved by the nudge's worst over the group (1024 elements)."""
    n = GROUPS * 1024
    y = torch.ones(1, n)
    y3 = y.clone()
    y3[0, ::2] += 1e-2                 # the nudge moves every other element by 1e-2: every group's RMS is 1e-2 / √2
    share = (unit(torch.float32) / unit(torch.bfloat16)) ** 0.5
    figs = measure([y], [y.clone()], [y3], [torch.zeros_like(y)], share)
    assert share == pytest.approx(1 / 256)
    assert figs["group"].floor == pytest.approx(1e-2 / math.sqrt(2) / 256 + 1e-2 / 32, rel=1e-4)
    assert figs["element"].floor == pytest.approx(1e-2, rel=1e-4)  # one rounding may land anywhere: in full
    thin = y.clone()
    thin += 2e-3                       # a fault spread over every element, a fifth of the head's unit
    assert measure([y], [thin], [y3 + 2e-3], [torch.zeros_like(y)], share)["group"].ratio() > 1
    assert measure([y], [thin], [y3 + 2e-3], [torch.zeros_like(y)], 1.0)["group"].ratio() < 1  # the same precision


def test_a_replay_of_another_shape_or_with_a_part_missing_is_an_infinite_error():
    """A skip path that returns an output of another form is a fault (a skipped step would return it), never the
    check's own error ('not checked'), and a nested output's missing part is never left uncompared."""
    y = torch.ones(1, 4, 8)
    assert _measure(y, torch.ones(1, 4, 7), torch.ones(1, 4, 7))["element"].error == math.inf
    video, audio = torch.ones(1, 4, 8), torch.ones(1, 2, 3)
    figs = measure([video, audio], [video.clone()], [video.clone()], [torch.zeros_like(video), torch.zeros_like(audio)])
    assert figs["element"].error == math.inf
