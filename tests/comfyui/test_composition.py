"""GCache beside ComfyUI's own nodes that share its block slots or call the model again, on whichever tree
COMFYUI_PATH points to (tiny Flux and Wan, 6 steps, the policy 101001 connected to GCache Apply, cfg 3):

- Skip Layer Guidance (SkipLayerGuidanceDiT: an extra cond call per step from a post-CFG function; ...Simple: the
  uncond call with the skip), on the first, a middle and the last block, in both node orders;
- PerpNegGuider and DualCFGGuider (three conds per call), CFGZeroStar and APG (post- and pre-CFG functions);
- another node's dit patch in a slot GCache patches, before GCache, after it, and after it chaining to GCache's own
  patch (as ComfyUI 0.38's core patches do): called on every computed step, exactly as without GCache;
- an object patch of another node after GCache (Lumina2): a replaced first or last block is never an error.

What each shows: no error, and distance(GCache + X, plain + X) ≤ 3 × distance(GCache, plain) (relative L2 of the
final latents, same seed and mask). The factor 3: X itself amplifies the difference GCache's skipped steps make
(Skip Layer Guidance adds scale × (cond − skipped), both of which GCache approximates); measured on both trees,
GCache + X stays well within it (bench/composition.py measures each case: docs/works-with.md). The two node orders
run the same blocks per call, so they give bit-identical latents (asserted with torch.equal), not merely close ones.
The nodes and their settings are composition_cases.py's, which the bench applies too.
"""
import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import tiny_models as tm  # noqa: E402
import torch  # noqa: E402
from composition_cases import (  # noqa: E402
    LAYERS,
    MASK,
    SLOT,
    N,
    cfg_node,
    counting_patch,
    gcache,
    guided,
    ksample,
    object_patched,
    rel,
    slg,
    with_patch,
)

from gcache.core.profile import Profile  # noqa: E402
from gcache.nodes.modes import profile as profile_mode  # noqa: E402
from gcache.nodes.patching import hooks  # noqa: E402

FACTOR = 3.0


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("composition_unets"))
    out = {}
    for fam, (m, pos, neg, lat) in (("flux", tm.flux()), ("wan", tm.wan(d))):
        plain = ksample(m, pos, neg, lat)
        out[fam] = dict(m=m, pos=pos, neg=neg, lat=lat, plain=plain, base=rel(ksample(gcache(m), pos, neg, lat), plain))
    return out


def within(b, with_gcache, with_x, what):
    """The distance rule, with the figures in the message."""
    d = rel(with_gcache, with_x)
    assert torch.isfinite(with_gcache).all()
    assert d <= FACTOR * b["base"], f"{what}: GCache + X is {d:.4g} from plain + X; GCache alone {b['base']:.4g}"
    return d


# ------------------------------------------------------------------------------------------ Skip Layer Guidance
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("node", ["SkipLayerGuidanceDiT", "SkipLayerGuidanceDiTSimple"])
@pytest.mark.parametrize("family", ["flux", "wan"])
def test_skip_layer_guidance_in_both_orders(built, family, node, where, caplog):
    b = built[family]
    m, pos, neg, lat = b["m"], b["pos"], b["neg"], b["lat"]
    x = slg(node, *LAYERS[family][where])
    with_x = ksample(x(m), pos, neg, lat)
    assert rel(with_x, b["plain"]) > 0.005  # the guidance does something on this tiny model
    with caplog.at_level("INFO", logger="gcache"):
        before = ksample(gcache(x(m)), pos, neg, lat)  # SLG's node, then GCache Apply
    assert "computed 3/6 steps, skipped 3" in caplog.text, caplog.text
    after = ksample(x(gcache(m)), pos, neg, lat)       # GCache Apply, then SLG's node
    assert torch.equal(before, after)
    within(b, before, with_x, f"{family} {node} on the {where} block")


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_skip_layer_guidance_on_part_of_the_steps(built, family):
    """The guidance's own call starts mid-run (start/end percent): its branch has no residual on its first step and
    computes there; a later skipped step reuses the branch's own residual."""
    b = built[family]
    m, pos, neg, lat = b["m"], b["pos"], b["neg"], b["lat"]
    x = slg("SkipLayerGuidanceDiT", *LAYERS[family]["middle"], start=0.3, end=0.8)
    with_x = ksample(x(m), pos, neg, lat)
    assert rel(with_x, b["plain"]) > 0.005
    out = ksample(gcache(x(m)), pos, neg, lat)
    assert torch.equal(out, ksample(x(gcache(m)), pos, neg, lat))
    within(b, out, with_x, f"{family} SkipLayerGuidanceDiT on steps 30-80 %")


def test_each_call_keeps_its_own_residual(built):
    """SkipLayerGuidanceDiT's extra call is the cond with a block skipped: on Wan the first block's modules run for
    the batched cond/uncond call and for the guidance call on each computed step, never on a skipped one."""
    b = built["wan"]
    m, pos, neg, lat = b["m"], b["pos"], b["neg"], b["lat"]
    mod = m.get_model_object("diffusion_model").blocks[0].ffn
    runs = []
    hook = mod.register_forward_pre_hook(lambda _m, a: runs.append(a[0].shape[0]))
    try:
        ksample(gcache(slg("SkipLayerGuidanceDiT", "1", "")(m)), pos, neg, lat)
    finally:
        hook.remove()
    assert runs == [2, 1] * sum(MASK)  # cond + uncond batched, then the guidance's cond: 3 computed steps


# ------------------------------------------------------------------------------------------ guiders and CFG functions
@pytest.mark.parametrize("kind", ["PerpNegGuider", "DualCFGGuider"])
@pytest.mark.parametrize("family", ["flux", "wan"])
def test_three_cond_guiders(built, family, kind, caplog):
    b = built[family]
    with_x = guided(family, b["m"], b, kind)
    with caplog.at_level("INFO", logger="gcache"):
        out = guided(family, gcache(b["m"]), b, kind)
    assert "computed 3/6 steps, skipped 3" in caplog.text, caplog.text
    within(b, out, with_x, f"{family} {kind}")


@pytest.mark.parametrize("kind", ["CFGZeroStar", "APG"])
@pytest.mark.parametrize("family", ["flux", "wan"])
def test_cfg_functions(built, family, kind):
    b = built[family]
    m, pos, neg, lat = b["m"], b["pos"], b["neg"], b["lat"]
    x = cfg_node(kind)
    with_x = ksample(x(m), pos, neg, lat)
    before = ksample(gcache(x(m)), pos, neg, lat)
    assert torch.equal(before, ksample(x(gcache(m)), pos, neg, lat))
    within(b, before, with_x, f"{family} {kind}")


# ------------------------------------------------------------------------------------------ another node's dit patch
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("family", ["flux", "wan"])
def test_another_nodes_dit_patch_is_called_in_every_order(built, family, where, caplog):
    b = built[family]
    m, pos, neg, lat = b["m"], b["pos"], b["neg"], b["lat"]
    key = SLOT[family][where]
    plain_n = []
    with_x = ksample(with_patch(m, key, counting_patch(plain_n)), pos, neg, lat)
    assert len(plain_n) % N == 0 and rel(with_x, b["plain"]) > 1e-3
    per_step = len(plain_n) // N
    outs = {}
    for order in ("before", "after", "after, chaining"):
        n = []
        if order == "before":
            with caplog.at_level("INFO", logger="gcache"):
                model = gcache(with_patch(m, key, counting_patch(n)))
            assert "already hold another node's patch" in caplog.text
        else:
            g = gcache(m)
            ours = g.model_options["transformer_options"]["patches_replace"]["dit"][key]
            model = with_patch(g, key, counting_patch(n, ours if order == "after, chaining" else None))
        outs[order] = ksample(model, pos, neg, lat)
        assert len(n) == sum(MASK) * per_step, (order, len(n))  # on every computed step, once per call
    assert torch.equal(outs["before"], outs["after"]) and torch.equal(outs["before"], outs["after, chaining"])
    within(b, outs["before"], with_x, f"{family} another node's patch at the {where} block")


def test_applying_gcache_twice_keeps_the_other_nodes_patch_once(built):
    """A second GCache Apply replaces GCache's own patches (recognised by their marker) and keeps the patch the
    first one wrapped: called once per computed step, not twice, not never."""
    b = built["flux"]
    m, pos, neg, lat = b["m"], b["pos"], b["neg"], b["lat"]
    n = []
    twice = gcache(gcache(with_patch(m, SLOT["flux"]["middle"], counting_patch(n))))
    once_n = []
    once = ksample(gcache(with_patch(m, SLOT["flux"]["middle"], counting_patch(once_n))), pos, neg, lat)
    assert torch.equal(ksample(twice, pos, neg, lat), once) and len(n) == len(once_n) == sum(MASK)


# ------------------------------------------------------------------------------------------ object patches (Lumina2)
@pytest.mark.parametrize("where", ["first", "last"])
def test_a_replaced_object_patched_block_is_never_an_error(where, caplog):
    """Lumina2's blocks are object-patched (no dit hook): a node after GCache that patches the first or last block's
    forward takes GCache's gate off that block for the whole run. No error and no wrong latent: the calls that miss
    GCache's first or last block compute (here every step, as plain + X)."""
    m, pos, neg, lat = tm.lumina2()
    n = []
    plain_x = object_patched(m, where, n)
    with_x = ksample(plain_x, pos, neg, lat)
    after = object_patched(gcache(m), where, n)
    with caplog.at_level("INFO", logger="gcache"):
        out = ksample(after, pos, neg, lat)
    assert "another node replaced GCache's patch" in caplog.text
    assert "Please report" not in caplog.text  # the cause is known and said: nothing to report
    assert torch.equal(out, with_x)
    # before GCache: wrapped, called on the computed steps only
    n.clear()
    before = ksample(gcache(plain_x), pos, neg, lat)
    assert len(n) == sum(MASK) * (len(n) // sum(MASK)) and 0 < len(n) < 2 * N and torch.isfinite(before).all()


# ------------------------------------------------------------------------------------------ Profile
def test_profile_records_the_guidance_branch_when_it_runs_every_step(built, gcache_dir, caplog):
    b = built["wan"]
    m, pos, neg, lat = b["m"], b["pos"], b["neg"], b["lat"]
    every = str(gcache_dir / "every.profile.safetensors")
    ksample(hooks.patch_model(slg("SkipLayerGuidanceDiTSimple", "1", "")(m), profile_mode.profile_config(m, every)),
            pos, neg, lat)
    assert Profile.load(every).count == 2  # the cond, and the uncond (always with the skip: a branch of its own)
    part = str(gcache_dir / "part.profile.safetensors")
    with caplog.at_level("INFO", logger="gcache"):
        ksample(hooks.patch_model(slg("SkipLayerGuidanceDiT", "1", "", start=0.3, end=0.8)(m),
                                  profile_mode.profile_config(m, part)), pos, neg, lat)
    assert Profile.load(part).count == 2  # cond and uncond; the guidance's call ran on some steps only
    assert "ran on some steps only" in caplog.text and "interrupted" not in caplog.text
