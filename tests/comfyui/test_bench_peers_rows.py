"""bench/peers.py's rows on one seed, on the trained tiny Flux (8 steps): every row is there with per-pair values, the
pass counts are what the nodes computed, and one row's PSNR is recomputed here by hand. About half a minute."""
import math

import pytest
import torch
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

from comfy_extras.nodes_easycache import LazyCacheNode  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from gcache.bench import peers  # noqa: E402
from gcache.comfy_models import data  # noqa: E402
from gcache.comfy_models.families import FLUX, comfy_cond, load  # noqa: E402

STEPS = 8


@pytest.fixture(scope="module")
def result():
    return peers.main(["--seeds", "1", "--steps", str(STEPS), "--families", "flux", "--targets", "2", "3",
                       "--thresholds", "0.1", "0.5", "--easycache-as-is", "0.1", "--search-budget", "14"]
                      )["families"]["flux"]


def test_every_row_is_there_with_per_pair_values(result):
    assert [list(p) for p in result["pairs"]] == [[0, 0]] and result["plain"]["passes"] == [STEPS]
    kinds = [(r["kind"], r.get("target", r.get("threshold"))) for r in result["rows"]]
    assert kinds == [("gcache", 2.0), ("gcache", 3.0), ("gcache search", None), ("gcache search", None),
                     ("EasyCache", 0.1), ("EasyCache", 0.5), ("LazyCache", 0.1),
                     ("LazyCache", 0.5), ("EasyCache as is", 0.1)]
    for r in result["rows"]:
        assert len(r["psnr"]) == len(r["ssim"]) == len(r["passes"]) == len(r["seconds"]) == 1
        assert r["speedup_passes"] == round(STEPS / r["passes"][0], 3)
    gc = [r for r in result["rows"] if r["kind"] == "gcache"]
    assert all(1 <= r["passes"][0] < STEPS for r in gc)  # auto applied a policy after its run-1 profile
    assert all(len(r["policies"]) == 1 for r in gc)  # the policy auto saved for that target
    searched = [r for r in result["rows"] if r["kind"] == "gcache search"]
    assert [r["passes"][0] for r in searched] == [r["passes"][0] for r in gc] == [r["k"] for r in searched]
    assert all(sum(r["mask"]) == r["k"] for r in searched)  # the searched mask computes K steps
    assert [x["k"] for x in result["search_vs_auto"]] == [r["k"] for r in searched]
    assert len(result["headline"]) == 2 * (len(gc) + len(searched))


def test_a_rows_psnr_recomputed_by_hand(result):
    """LazyCache 0.5 sampled again here; PSNR of the decoded pixels in [0, 1] against plain, by its formula."""
    m = load(FLUX).patcher

    def pixels(model):
        z = comfy_nodes.common_ksampler(model, 0, STEPS, 3.5, "euler", "simple", comfy_cond(FLUX, 0),
                                        comfy_cond(FLUX, -1), {"samples": torch.zeros(1, *FLUX.latent_shape)})[0]
        return (data.decode(m.model.process_latent_in(z["samples"])).clamp(-1, 1) * 0.5 + 0.5).double()

    ref, lazy = pixels(m), pixels(LazyCacheNode.execute(m, 0.5, 0.15, 0.95, False).result[0])
    want = 10 * math.log10(1.0 / float(((lazy - ref) ** 2).mean()))
    row = next(r for r in result["rows"] if r["row"] == "LazyCache 0.5")
    assert row["psnr"][0] == pytest.approx(want, abs=1e-2)
