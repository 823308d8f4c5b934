"""Adapters' token bookkeeping and the block gates, on fake block loops shaped like ComfyUI's (headless)."""
import pytest
import torch

from gcache.core.engine import ResidualCache
from gcache.nodes.patching.adapters import (
    ADAPTERS,
    FALLBACK,
    ObjectCall,
    Stack,
    block_slots,
    choose_adapter,
    estimated_io_share,
    find_adapter,
)
from gcache.nodes.patching.runtime import (
    RunState,
    activate,
    branch_keys,
    deactivate,
    make_dit_patch,
    make_gated_forward,
)
from gcache.nodes.patching.steps import StepTracker
from gcache.nodes.patching.streams import Layout, put_image, take_image

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------- table lookups
# Fakes carry the module of ComfyUI's class: adapters match module and class, never the class name alone.
class Flux(torch.nn.Module):
    __module__ = "comfy.ldm.flux.model"

    def __init__(self, nd=2, ns=2):
        super().__init__()
        self.double_blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(nd))
        self.single_blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(ns))
        self.final = torch.nn.Linear(4, 4)


class Chroma(Flux):
    __module__ = "comfy.ldm.chroma.model"

    def __init__(self):
        super().__init__(3, 3)
        self.skip_mmdit, self.skip_dit = [0], [2]


class WanModel(torch.nn.Module):
    __module__ = "comfy.ldm.wan.model"


class VaceWanModel(WanModel):
    __module__ = "comfy.ldm.wan.model"


class WanLikeName(torch.nn.Module):  # a substring of a known name is not a match
    pass


class SD3MMDiT(torch.nn.Module):
    __module__, __qualname__ = "comfy.ldm.modules.diffusionmodules.mmdit", "MMDiT"

    def __init__(self):
        super().__init__()
        self.joint_blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))


class AuraMMDiT(torch.nn.Module):
    __module__, __qualname__ = "comfy.ldm.aura.mmdit", "MMDiT"

    def __init__(self):
        super().__init__()
        self.double_layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(1))
        self.single_layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))


class ForeignFlux(torch.nn.Module):  # another pack's class that happens to be called Flux
    __qualname__ = "Flux"


def test_find_adapter_by_module_and_class_in_mro():
    assert find_adapter(Flux()).adapter.name == "flux" and find_adapter(Flux()).verified
    assert find_adapter(VaceWanModel()).adapter.name == "wan"
    assert find_adapter(WanLikeName()).adapter is FALLBACK
    assert find_adapter(ForeignFlux()).adapter is FALLBACK
    names = [n for a in ADAPTERS for n in a.classes]
    assert len(names) == len(set(names))


def test_auraflow_is_not_taken_for_sd3():
    """Both classes are called MMDiT; before module matching AuraFlow got SD3's adapter and patched nothing."""
    assert find_adapter(SD3MMDiT()).adapter.name == "sd3"
    aura = AuraMMDiT()
    assert choose_adapter(aura).name == "auraflow"
    slots = block_slots(choose_adapter(aura), aura)
    assert [(s.stack.key, s.index, s.stack.layout) for s in slots] == [
        ("double_block", 0, Layout.IMG), ("single_block", 0, Layout.TXT_FIRST), ("single_block", 1, Layout.TXT_FIRST)]


def test_known_family_without_its_blocks_falls_back_loudly(caplog):
    class Hollow(torch.nn.Module):  # e.g. a custom pack's subclass that renamed the block list
        __module__, __qualname__ = "comfy.ldm.flux.model", "Flux"
    with caplog.at_level("WARNING", logger="gcache"):
        assert choose_adapter(Hollow()) is FALLBACK
    assert "none of its blocks" in caplog.text and "fallback" in caplog.text


def test_block_slots_roles_and_chroma_skips():
    slots = block_slots(find_adapter(Flux()).adapter, Flux())
    assert [(s.stack.key, s.index, s.first, s.last) for s in slots] == [
        ("double_block", 0, True, False), ("double_block", 1, False, False),
        ("single_block", 0, False, False), ("single_block", 1, False, True)]
    slots = block_slots(find_adapter(Chroma()).adapter, Chroma())
    assert [(s.stack.key, s.index) for s in slots] == [("double_block", 1), ("double_block", 2),
                                                       ("single_block", 0), ("single_block", 1)]
    assert slots[0].first and slots[-1].last


def test_estimated_io_share_counts_parameters_outside_the_stack():
    m = Flux()
    assert estimated_io_share(find_adapter(m).adapter, m) == pytest.approx(20 / 100)
    assert estimated_io_share(FALLBACK, m) == 0.0


def test_take_and_put_image_tokens():
    txt, img = torch.zeros(2, 3, 4), torch.ones(2, 5, 4)
    tf, imf = torch.cat((txt, img), 1), torch.cat((img, txt), 1)
    assert torch.equal(take_image(tf, "txt_first", 5), img)
    assert torch.equal(take_image(imf, "img_first", 5), img)
    z = torch.full((2, 5, 4), 7.0)
    assert torch.equal(put_image(tf, "txt_first", z), torch.cat((txt, z), 1))
    assert torch.equal(put_image(imf, "img_first", z), torch.cat((z, txt), 1))
    assert put_image(img, "img", z) is z


def test_branch_keys_from_cond_or_uncond():
    assert branch_keys({"cond_or_uncond": [1, 0]}) == [(1, 0), (0, 0)]
    assert branch_keys({"cond_or_uncond": [0, 0, 1]}) == [(0, 0), (0, 1), (1, 0)]
    assert branch_keys({}) == ["all"] and branch_keys(None) == ["all"]


def test_branch_keys_follow_cond_uuids_across_separate_calls():
    """Two positive conds run in separate calls (e.g. different token lengths) must not share one cache."""
    names: dict = {}
    a = branch_keys({"cond_or_uncond": [0], "uuids": ["A"]}, names)
    b = branch_keys({"cond_or_uncond": [0], "uuids": ["B"]}, names)
    u = branch_keys({"cond_or_uncond": [1], "uuids": ["N"]}, names)
    assert a != b and a == [(0, 0)] and b == [(0, 1)] and u == [(1, 0)]
    assert branch_keys({"cond_or_uncond": [1, 0, 0], "uuids": ["N", "B", "A"]}, names) == [(1, 0), (0, 1), (0, 0)]
    assert branch_keys({"cond_or_uncond": [0, 0], "uuids": ["A", "A"]}, names) == [(0, 0), (0, 0, 1)]
    # the second sampler of a split schedule: new uuids, same order of first appearance -> same names
    names2: dict = {}
    assert branch_keys({"cond_or_uncond": [0], "uuids": ["A2"]}, names2) == [(0, 0)]
    assert branch_keys({"cond_or_uncond": [0], "uuids": ["B2"]}, names2) == [(0, 1)]


# ------------------------------------------------------------------------------------------- fake loops
def make_blocks(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 8, generator=g) * 0.3 for _ in range(n)]


class FakeDiT:
    """A ComfyUI-style loop: double blocks (img, txt), then single blocks on a concatenated stream."""

    def __init__(self, order):  # order: "txt_first" (Flux) or "img_first" (HunyuanVideo)
        self.order, self.wd, self.ws = order, make_blocks(2, 1), make_blocks(2, 2)
        self.calls = 0

    def forward(self, img, txt, patches):
        to = {"cond_or_uncond": [0]}
        for i, w in enumerate(self.wd):
            def wrap(a, w=w):
                self.calls += 1
                return {"img": torch.tanh(a["img"] @ w + a["txt"].mean(1, keepdim=True)), "txt": a["txt"] * 1.01}
            args = {"img": img, "txt": txt, "transformer_options": to}
            out = patches[("double_block", i)](args, {"original_block": wrap}) if patches else wrap(args)
            img, txt = out["img"], out["txt"]
        n_txt = txt.shape[1]
        x = torch.cat((txt, img), 1) if self.order == "txt_first" else torch.cat((img, txt), 1)
        for i, w in enumerate(self.ws):
            def wrap(a, w=w):
                self.calls += 1
                return {"img": torch.tanh(a["img"] @ w)}
            args = {"img": x, "transformer_options": to}
            x = (patches[("single_block", i)](args, {"original_block": wrap}) if patches else wrap(args))["img"]
        return x[:, n_txt:] if self.order == "txt_first" else x[:, :x.shape[1] - n_txt]


def patched(order, owner):
    st = (Stack("double_block", "d", "img"), Stack("single_block", "s", order))
    slots = [(st[0], 0), (st[0], 1), (st[1], 0), (st[1], 1)]
    from gcache.nodes.patching.adapters import BlockSlot
    return {(s.key, i): make_dit_patch(BlockSlot(s, i, str(i), n == 0, n == 3), owner)
            for n, (s, i) in enumerate(slots)}


def sample(net, patches, run, steps=4):
    g = torch.Generator().manual_seed(5)
    img, txt = torch.randn(1, 6, 8, generator=g), torch.randn(1, 3, 8, generator=g)
    sig = [1 - i / steps for i in range(steps + 1)]
    outs, token = [], activate(run) if run else None
    try:
        for i in range(steps):
            if run:
                run.begin_call(sig[i], {"cond_or_uncond": [0]})
            x = img + i * 0.1
            outs.append((x, net.forward(x, txt, patches)))
            if run:
                run.tracker.completed(i)
    finally:
        if token is not None:
            deactivate(token)
    return outs


@pytest.mark.parametrize("order", ["txt_first", "img_first"])
def test_all_ones_is_bit_identical_and_skips_reuse_delta(order):
    net = FakeDiT(order)
    ref = sample(net, None, None)
    full_calls = net.calls
    run = RunState(lambda: ResidualCache([1, 1, 1, 1]), StepTracker([1, .75, .5, .25, 0]), "a")
    got = sample(net, patched(order, "a"), run)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(ref, got))
    net.calls = 0
    run = RunState(lambda: ResidualCache([1, 0, 1, 0]), StepTracker([1, .75, .5, .25, 0]), "a")
    got = sample(net, patched(order, "a"), run)
    assert net.calls == full_calls // 2                     # the stack ran on 2 of 4 steps
    for skip, comp in ((1, 0), (3, 2)):
        h_c, z_c = ref[comp]
        h_s, z_s = got[skip]
        assert torch.allclose(z_s, h_s + (z_c - h_c), atol=1e-6)
    assert run.close().block_runs == {(0, 0): 2}


def test_patch_without_live_run_or_other_owner_passes_through():
    net = FakeDiT("txt_first")
    ref = sample(net, None, None)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(ref, sample(net, patched("txt_first", "a"), None)))
    other = RunState(lambda: ResidualCache([1, 0, 0, 0]), StepTracker([1, .75, .5, .25, 0]), "b")
    got = sample(net, patched("txt_first", "a"), other)  # a run of another model clone: not ours
    assert all(torch.equal(a[1], b[1]) for a, b in zip(ref, got))


def test_gated_forward_keyword_pair_and_batch_dim():
    from gcache.nodes.patching.adapters import BlockSlot
    st = Stack("double_stream", "d", "img", call=ObjectCall("image_tokens", returns_text="text_tokens"))
    blk = lambda image_tokens, text_tokens, **kw: (image_tokens * 2, text_tokens)  # noqa: E731
    fwd = make_gated_forward(BlockSlot(st, 0, "0", True, True), blk, "o")
    run = RunState(lambda: ResidualCache([1, 0]), StepTracker([1, .5, 0]), "o")
    tok = activate(run)
    try:
        x, t = torch.ones(1, 3, 2), torch.zeros(1, 2, 2)
        run.begin_call(1.0, None)
        assert torch.equal(fwd(image_tokens=x, text_tokens=t)[0], 2 * x)
        run.tracker.completed(0)
        run.begin_call(0.5, None)
        y, tt = fwd(image_tokens=3 * x, text_tokens=t)
        assert torch.equal(y, 3 * x + x) and tt is t          # h + δ, δ = 2x − x
    finally:
        deactivate(tok)
    # Cosmos 1 keeps tokens as T H W B D: the branch chunks are along dim 3
    st = Stack("block", "blocks", "all", call=ObjectCall(0, batch_dim=3))
    fwd = make_gated_forward(BlockSlot(st, 0, "block0", True, True), lambda x, *a, **k: x + 1, "c")
    run = RunState(lambda: ResidualCache([1, 0]), StepTracker([1, .5, 0]), "c")
    tok = activate(run)
    try:
        x = torch.randn(2, 2, 2, 2, 4)  # T H W B D with B = 2 (cond, uncond)
        run.begin_call(1.0, {"cond_or_uncond": [1, 0]})
        fwd(x)
        run.tracker.completed(0)
        run.begin_call(0.5, {"cond_or_uncond": [1, 0]})
        assert torch.allclose(fwd(x * 0), torch.ones_like(x))
        assert set(run.cache.stats.block_runs) == {(1, 0), (0, 0)}
    finally:
        deactivate(tok)
