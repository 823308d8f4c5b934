"""Image tokens of a block stream: ComfyUI's img_slice over the family table's layout, tuple streams (LTX-2),
a loop that passes something else (headless)."""
import logging
import threading

import pytest
import torch

from gcache.core.engine import ResidualCache
from gcache.core.errors import GCacheError
from gcache.nodes.patching import streams
from gcache.nodes.patching.adapters import BlockSlot, Stack
from gcache.nodes.patching.runtime import RunState, activate, current_run, deactivate, make_dit_patch
from gcache.nodes.patching.steps import StepTracker
from gcache.nodes.patching.streams import Layout, image_range, put_image, take_image


def test_img_slice_wins_over_the_layout_and_says_so_once(caplog):
    txt, img = torch.zeros(1, 6, 4), torch.ones(1, 48, 4)
    stream = torch.cat((txt, img), 1)                     # HunyuanVideo's single stream on ComfyUI 0.33
    with caplog.at_level(logging.INFO, logger="gcache"):
        got = take_image(stream, Layout.IMG_FIRST, 48, [6, 54], where="hv-test")
        take_image(stream, Layout.IMG_FIRST, 48, [6, 54], where="hv-test")
    assert torch.equal(got, img)
    assert caplog.text.count("Using ComfyUI's") == 1 and "[6, 54)" in caplog.text and "[0, 48)" in caplog.text
    assert torch.equal(take_image(stream, Layout.IMG_FIRST, 48), stream[:, :48])  # 0.3.64: no img_slice
    z = torch.full((1, 48, 4), 7.0)
    assert torch.equal(put_image(stream, Layout.IMG_FIRST, z, [6, 54], where="hv-test"), torch.cat((txt, z), 1))
    assert image_range(54, Layout.TXT_FIRST, 48, [6, 54]) == (6, 54)           # agreeing: no log line needed
    assert image_range(54, Layout.IMG, 54, [6, 54]) == (0, 54)                 # an image-only stream is whole
    with pytest.raises(GCacheError, match="image tokens"):
        put_image(stream, Layout.TXT_FIRST, z[:, :40], [6, 54])


def test_tuple_streams_pack_each_stream_and_unpack_to_the_same_shapes():
    v, a = torch.randn(2, 5, 8), torch.randn(2, 3, 4)
    packed = take_image((v, a), Layout.IMG, None)
    assert packed.shape == (2, 5 * 8 + 3 * 4)
    back = put_image((v, a), Layout.IMG, packed * 2)
    assert isinstance(back, tuple) and torch.equal(back[0], 2 * v) and torch.equal(back[1], 2 * a)
    assert streams.is_stream((v, a)) and not streams.is_stream(("x", v)) and not streams.is_stream(None)


def _av_loop(patches, vx, ax, n=2):
    """An LTX-2-shaped loop: every block takes and returns a (video, audio) pair as 'img'."""
    for i in range(n):
        def block(args, i=i):
            v, a = args["img"]
            v += 0.1 * (i + 1) * torch.tanh(v)            # in place, as LTX blocks do
            return {"img": (v, a * 0.9 + v.mean())}
        args = {"img": (vx, ax), "transformer_options": {}}
        out = patches[("double_block", i)](args, {"original_block": block}) if patches else block(args)
        vx, ax = out["img"]
    return vx, ax


def test_a_video_and_audio_pair_keeps_a_residual_per_stream():
    st = Stack("double_block", "transformer_blocks", Layout.IMG)
    patches = {("double_block", i): make_dit_patch(BlockSlot(st, i, str(i), i == 0, i == 1), "av") for i in range(2)}
    g = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(1, 4, 6, generator=g), torch.randn(1, 3, 2, generator=g)) for _ in range(3)]
    ref = [_av_loop(None, v.clone(), a.clone()) for v, a in inputs]
    run = RunState(lambda: ResidualCache([1, 0, 0]), StepTracker([1, .6, .3, 0]), "av")
    tok = activate(run)
    try:
        got = []
        for i, (v, a) in enumerate(inputs):
            run.begin_call([1, .6, .3][i], None)
            got.append(_av_loop(patches, v.clone(), a.clone()))
            run.tracker.completed(i)
    finally:
        deactivate(tok)
    assert torch.equal(got[0][0], ref[0][0]) and torch.equal(got[0][1], ref[0][1])
    dv, da = ref[0][0] - inputs[0][0], ref[0][1] - inputs[0][1]
    for j in (1, 2):  # skipped: each stream is its own h + its own δ of step 0
        assert torch.allclose(got[j][0], inputs[j][0] + dv) and torch.allclose(got[j][1], inputs[j][1] + da)
    assert run.close().computed_steps == 1


def test_a_loop_that_passes_no_tokens_disables_the_run_instead_of_failing(caplog):
    st = Stack("double_block", "blocks", Layout.IMG)
    patch = make_dit_patch(BlockSlot(st, 0, "0", True, True), "odd")
    run = RunState(lambda: ResidualCache([1, 0]), StepTracker([1, .5, 0]), "odd")
    tok = activate(run)
    try:
        with caplog.at_level(logging.ERROR, logger="gcache"):
            for i in range(2):
                run.begin_call([1, .5][i], None)
                assert patch({"img": {"video": 1}}, {"original_block": lambda a: {"img": "ran"}}) == {"img": "ran"}
                run.tracker.completed(i)
    finally:
        deactivate(tok)
    assert run.disabled and "computes every step" in caplog.text and caplog.text.count("GCache:") == 1


def test_a_thread_started_inside_the_run_finds_it_and_gets_its_own_cache():
    """ComfyUI's MultiGPU CFG split calls the model from pool threads, where the run's context variable is not set."""
    st = Stack("double_block", "blocks", Layout.IMG)
    patch = make_dit_patch(BlockSlot(st, 0, "0", True, True), "mg")
    block = lambda a: {"img": a["img"] * 2}  # noqa: E731
    run = RunState(lambda: ResidualCache([1, 0]), StepTracker([1, .5, 0]), "mg")
    seen, outs = {}, {}

    def device_thread(name, x, step):
        seen[name] = current_run("mg")
        run.begin_call([1, .5][step], {"cond_or_uncond": [0 if name == "cond" else 1],
                                       "multigpu_thread_device": f"dev-{name}"})
        outs[(name, step)] = patch({"img": x}, {"original_block": block})["img"]

    tok = activate(run)
    try:
        for step in (0, 1):
            ts = [threading.Thread(target=device_thread, args=(n, torch.full((1, 2, 2), v + step), step))
                  for n, v in (("cond", 1.0), ("uncond", 3.0))]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            run.tracker.completed(step)
    finally:
        deactivate(tok)
    assert seen["cond"] is run and seen["uncond"] is run and current_run("mg") is None
    assert set(run._lanes) == {"dev-cond", "dev-uncond"}           # one cache per device
    assert torch.equal(outs[("cond", 1)], torch.full((1, 2, 2), 2.0 + 1.0))   # h + δ(cond) = 2 + (2 − 1)
    assert torch.equal(outs[("uncond", 1)], torch.full((1, 2, 2), 4.0 + 3.0))
    stats = run.close()
    assert (stats.computed_steps, stats.skipped_steps) == (1, 1) and stats.block_runs == {(0, 0): 1, (1, 0): 1}
