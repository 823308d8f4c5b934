"""bench/peers.py's rows on one seed, on the trained tiny Flux (8 steps): every row is there with per-pair values, the
pass counts are what the nodes computed, auto's fixed-K rows compute that K, the io-inclusive speed-up is the formula's,
and two rows' PSNR (a LazyCache row, and plain sampling with fewer steps) are recomputed here by hand; and how an
EasyCache row's skipped steps add the cached differences on this ComfyUI. About a minute."""
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
                       "--auto-k", "2", "3", "--fewer-k", "3", "--thresholds", "0.1", "0.5", "--wide-thresholds", "2",
                       "--easycache-as-is", "0.1", "--search-budget", "14"])["families"]["flux"]


def test_every_row_is_there_with_per_pair_values(result):
    assert [list(p) for p in result["pairs"]] == [[0, 0]] and result["plain"]["passes"] == [STEPS]
    kinds = [(r["kind"], r["k"] if r["kind"] == "gcache k" else r.get("target", r.get("threshold")))
             for r in result["rows"]]
    assert kinds[:4] == [("gcache", 2.0), ("gcache", 3.0), ("gcache k", 2), ("gcache k", 3)]
    assert kinds[4:] == [("gcache search", None), ("gcache search", None), ("fewer steps", None),
                         ("EasyCache", 0.1), ("EasyCache", 0.5), ("LazyCache", 0.1), ("LazyCache", 0.5),
                         ("EasyCache wide", 2.0), ("LazyCache wide", 2.0), ("EasyCache as is", 0.1)]
    assert [r["window"] for r in result["rows"] if "window" in r] == [[0.15, 0.95]] * 4 + [[0.0, 1.0]] * 2
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
    for axis in ("passes", "io"):
        assert [h["gcache"] for h in result["headline"][axis]] == [
            r["row"] for r in result["rows"] if r["kind"] in ("gcache", "gcache k", "gcache search")]


def test_auto_at_a_fixed_k_computes_it_with_the_policy_auto_saved(result):
    fixed = [r for r in result["rows"] if r["kind"] == "gcache k"]
    assert [(r["k"], r["passes"][0], sum(r["mask"])) for r in fixed] == [(2, 2, 2), (3, 3, 3)]
    assert all(len(r["policies"]) == 1 and r["forecast"] for r in fixed)
    for r in fixed:  # the target given is K's own predicted speed-up at run 1's io share
        assert r["target"] == pytest.approx(STEPS / (r["k"] + (STEPS - r["k"]) * result["io_share"]), rel=1e-4)


def test_io_inclusive_speedup_by_its_formula(result):
    r_io = result["io_share"]
    assert 0 < r_io < 1
    for r in result["rows"]:
        k = r["passes"][0]
        want = STEPS / (k + (STEPS - k) * r_io) if r["kind"].startswith("gcache") else STEPS / k
        assert r["speedup_io"] == pytest.approx(want, abs=2e-3), r["row"]


def test_two_rows_psnr_recomputed_by_hand(result):
    """LazyCache 0.5 and plain sampling with 3 steps sampled again here (KSampler's own function, the same sampler
    and scheduler); PSNR of the decoded pixels in [0, 1] against plain 8 steps, by its formula."""
    m = load(FLUX).patcher

    def pixels(model, steps=STEPS):
        with torch.inference_mode():
            z = comfy_nodes.common_ksampler(model, 0, steps, 3.5, "euler", "simple", comfy_cond(FLUX, 0),
                                            comfy_cond(FLUX, -1), {"samples": torch.zeros(1, *FLUX.latent_shape)})[0]
            return (data.decode(m.model.process_latent_in(z["samples"])).clamp(-1, 1) * 0.5 + 0.5).double()

    ref = pixels(m)
    for label, img in (("LazyCache 0.5", pixels(LazyCacheNode.execute(m, 0.5, 0.15, 0.95, False).result[0])),
                       ("plain 3 steps", pixels(m, 3))):
        want = 10 * math.log10(1.0 / float(((img - ref) ** 2).mean()))
        row = next(r for r in result["rows"] if r["row"] == label)
        assert row["psnr"][0] == pytest.approx(want, abs=1e-2), label
    assert next(r for r in result["rows"] if r["row"] == "plain 3 steps")["passes"] == [3]


def test_easycache_rows_skipped_step_adds_the_cached_differences_as_this_comfyui_does(monkeypatch):
    """Why the EasyCache rows of 0.3.64 are far below 0.33.0's (docs/trained-models.md): the bench's row (its input
    copy, KSampler with CFG, so the cond and the empty prompt go through the model as one batch of two) reaches
    EasyCache's skip with two conds, and 0.3.64's EasyCacheHolder.apply_cache_diff adds every cond's cached
    difference to the whole batch, where 0.33.0 adds each to its own half. Checked on every skipped call against both
    sums computed here, which differ."""
    from comfy_extras import nodes_easycache

    from gcache.comfy_models.families import comfyui_version
    calls, apply = [], nodes_easycache.EasyCacheHolder.apply_cache_diff

    def recorded(holder, x, uuids, *args, **kwargs):
        before, diffs = x.clone(), [holder.uuid_cache_diffs[u].clone() for u in uuids]
        out = apply(holder, x, uuids, *args, **kwargs)
        calls.append((before, diffs, out.clone()))
        return out

    monkeypatch.setattr(nodes_easycache.EasyCacheHolder, "apply_cache_diff", recorded)
    m = load(FLUX).patcher
    model = nodes_easycache.EasyCacheNode.execute(peers.input_copied(m), 0.5, 0.0, 1.0, False).result[0]
    s = peers.SETTINGS["flux"]
    with torch.inference_mode():
        comfy_nodes.common_ksampler(model, 0, STEPS, s["cfg"], s["sampler"], s["scheduler"], comfy_cond(FLUX, 0),
                                    comfy_cond(FLUX, -1), {"samples": torch.zeros(1, *FLUX.latent_shape)})
    assert calls, "EasyCache skipped no step: raise the threshold"
    whole_batch_add = comfyui_version().startswith("0.3.")  # fixed upstream by 0.33.0
    for before, diffs, out in calls:
        assert before.shape[0] == len(diffs) == 2  # the CFG pair in one call
        own_half, every_diff = before.clone(), before.clone()
        for i, d in enumerate(diffs):
            own_half[i:i + 1] += d
            every_diff += d
        assert (own_half - every_diff).abs().max() > 1e-2
        want, other = (every_diff, own_half) if whole_batch_add else (own_half, every_diff)
        assert torch.allclose(out, want, atol=1e-6) and not torch.allclose(out, other, atol=1e-3)
