"""What the self-check measures and concludes (core/selfcheck.py), by hand-computed cases (headless)."""
import math

import pytest
import torch

from gcache.core.selfcheck import FAIL, GROUPS, NOT_CHECKED, PASS, TOLERANCE_EPS, conclude, replay_error, tolerance


@pytest.mark.parametrize("dtype, eps", [(torch.float32, 2.0 ** -23), (torch.bfloat16, 2.0 ** -7),
                                        (torch.float16, 2.0 ** -10), (torch.float64, 2.0 ** -52)])
def test_the_tolerance_is_a_multiple_of_the_dtypes_epsilon_plus_the_outputs_rounding(dtype, eps):
    assert tolerance(dtype) == pytest.approx(TOLERANCE_EPS * eps, rel=1e-12)
    assert tolerance(dtype, 1e-6) == pytest.approx(TOLERANCE_EPS * (eps + 1e-6), rel=1e-12)
    assert tolerance(torch.int8) == tolerance(torch.float32)  # not a float: float32's


def test_bfloat16_is_looser_than_float16_and_float32_is_tightest():
    assert tolerance(torch.bfloat16) == 8 * tolerance(torch.float16) == 2 ** 16 * tolerance(torch.float32)


def test_equal_outputs_have_no_error_and_one_changed_element_is_measured_in_its_group():
    y0 = torch.zeros(2, 3, 10)         # the output without the model: the model contributed y − y0 = 1 everywhere
    y = torch.ones(2, 3, 10)
    assert replay_error([y], [y.clone()], [y0])[0] == 0.0
    y2 = y.clone()
    y2[1, 2, 9] += 0.5                 # 30 elements per sample: 30 groups of one; that group's RMS is 0.5
    err, _ = replay_error([y], [y2], [y0])
    assert err == pytest.approx(0.5)


def test_a_wrong_range_of_a_few_tokens_is_not_diluted_by_the_rest():
    """1024 elements per group: a wrong group of RMS 0.2 is 0.2, where a relative norm of the whole output would
    give 0.2 / sqrt(256) = 0.0125 (below bfloat16's tolerance)."""
    n = GROUPS * 1024
    y0, y = torch.zeros(1, n), torch.ones(1, n)
    y2 = y.clone()
    y2[0, -1024:] += 0.2
    err, _ = replay_error([y], [y2], [y0])
    assert err == pytest.approx(0.2)
    assert ((y2 - y).norm() / (y - y0).norm()).item() == pytest.approx(0.2 / 16)


def test_groups_of_unequal_size_and_several_parts_of_a_nested_output():
    n = GROUPS + 1                     # 2 elements per group: 128 full groups, one of 1 element, the rest empty
    y0, y = torch.zeros(1, n), torch.ones(1, n)
    y2 = y.clone()
    y2[0, -1] = 1.3                    # the last group holds this one element alone
    assert replay_error([y], [y2], [y0])[0] == pytest.approx(0.3)
    video, audio = torch.ones(1, 4, 8), torch.ones(1, 2, 3)
    audio2 = audio.clone()
    audio2[0, 0, 0] = 3.0              # 6 groups of one in the audio part: one moved by 2
    err, _ = replay_error([video, audio], [video.clone(), audio2], [torch.zeros_like(video), torch.zeros_like(audio)])
    assert err == pytest.approx(2.0)


def test_the_outputs_own_rounding_is_its_epsilon_over_what_the_model_contributed():
    """y = 100 with the model contributing 0.5 (late in an EDM schedule): a float32 output rounds at
    eps · 100 / 0.5 of the model's part."""
    y0, y = torch.full((1, 64), 99.5), torch.full((1, 64), 100.0)
    err, rounding = replay_error([y], [y], [y0])
    assert err == 0.0 and rounding == pytest.approx(2.0 ** -23 * 100 / 0.5)


def test_non_finite_outputs():
    y, y0 = torch.ones(1, 8), torch.zeros(1, 8)
    assert replay_error([y], [torch.full((1, 8), float("nan"))], [y0])[0] == math.inf
    assert replay_error([y], [y + 1], [y.clone()])[0] == math.inf  # the model contributed nothing, yet it moved
    with pytest.raises(ValueError, match="NaN"):
        replay_error([torch.full((1, 8), float("inf"))], [y], [y0])


def test_a_run_fails_when_any_call_fails_and_is_not_checked_when_no_call_was():
    tol = tolerance(torch.float32)
    ok = (tol / 10, tol, "float32")
    assert conclude([ok], [], []).result == PASS
    bad = conclude([ok, (tol * 3, tol, "float32")], [], [])
    assert bad.result == FAIL and bad.error == tol * 3 and "differs" in bad.why
    counted = conclude([ok], ["the blocks ran anyway (4 block module calls in the replay)"], [])
    assert counted.result == FAIL and "blocks ran anyway" in counted.why and counted.error == tol / 10
    none = conclude([], [], ["ComfyUI's MultiGPU CFG split runs this call in a thread of its own device"])
    assert none.result == NOT_CHECKED and "MultiGPU" in none.why and none.error is None
    assert conclude([ok], [], ["another node's block patch replaced GCache's"]).result == PASS  # one call checked
    assert "≤" in conclude([ok], [], []).describe() and ">" in bad.describe()
