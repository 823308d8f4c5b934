"""bench/trained_figures.py's rows on one seed, on the trained tiny Flux (8 steps, few steps 4): every figure is there
and consistent with what it is made of, the predicted speed-up is recomputed from its formula, and the few-steps
row's "fewer steps" PSNR is recomputed here from KSampler runs of our own. About half a minute."""
import math

import pytest
import torch
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import nodes as comfy_nodes  # noqa: E402
from gcache.bench import trained_figures  # noqa: E402
from gcache.comfy_models import data  # noqa: E402
from gcache.comfy_models.families import FLUX, comfy_cond, load  # noqa: E402

STEPS, FEW = 8, 4


@pytest.fixture(scope="module")
def result():
    return trained_figures.main(["--seeds", "1", "--steps", str(STEPS), "--few-steps", str(FEW),
                                 "--families", "flux"])["families"]["flux"]


def test_every_figure_is_there(result):
    assert [list(p) for p in result["pairs"]] == [[0, 0]]
    sc = result["selfcheck"]
    assert sc["result"] == "pass" and 0 <= sc["error"] <= sc["tolerance"] and sc["dtype"] == "float32"
    assert sc["margin"] == round(sc["tolerance"] / sc["error"], 2)
    comp = result["composition"]
    assert [r["x"] for r in comp["rows"]] == ["SkipLayerGuidanceDiT", "PerpNegGuider"]
    k = result["speedup"]["k"]
    for r in comp["rows"]:
        assert r["computed"] == [k]  # GCache skipped beside X, with auto's policy
        assert r["ratio"] == pytest.approx(r["gcache_x_vs_plain_x"][0] / comp["gcache_vs_plain"][0], abs=2e-3)
    [few] = result["few_steps"]
    assert few["n"] == FEW and 1 <= few["k"][0] < FEW and len(few["auto_psnr"]) == len(few["fewer_steps_psnr"]) == 1
    assert few["auto_minus_fewer"] == pytest.approx(few["auto_psnr"][0] - few["fewer_steps_psnr"][0], abs=1e-3)


def test_predicted_speedup_by_its_formula(result):
    """N / (K + (N − K)·io_share) by hand, and GCache's own log line said the same figure; auto skipped steps."""
    sp = result["speedup"]
    n, k, io = sp["n"], sp["k"], sp["io_share"]
    assert n == STEPS and 1 <= k < n and sp["computed"] == [k]
    assert sp["predicted"] == pytest.approx(n / (k + (n - k) * io), abs=2e-3)
    assert sp["logged_predicted"] == [pytest.approx(sp["predicted"], abs=0.006)]
    assert sp["measured_wall"] > 0 and sp["measured_logged"] > 0


def test_fewer_steps_psnr_recomputed_by_hand(result):
    """The plain run of FEW steps and of K steps sampled again here; PSNR of the pixels in [0, 1] by its formula."""
    m = load(FLUX).patcher

    def pixels(steps):
        z = comfy_nodes.common_ksampler(m, 0, steps, 3.5, "euler", "simple", comfy_cond(FLUX, 0),
                                        comfy_cond(FLUX, -1), {"samples": torch.zeros(1, *FLUX.latent_shape)})[0]
        return (data.decode(m.model.process_latent_in(z["samples"])).clamp(-1, 1) * 0.5 + 0.5).double()

    [few] = result["few_steps"]
    ref, fewer = pixels(FEW), pixels(few["k"][0])
    want = 10 * math.log10(1.0 / float(((fewer - ref) ** 2).mean()))
    assert few["fewer_steps_psnr"][0] == pytest.approx(want, abs=1e-2)
