"""The self-check's replay at the model call (nodes/patching/selfcheck.py) on a toy Flux-shaped model whose block
loop asks for GCache's real dit patches (runtime.make_dit_patch): a correct adapter passes with the run's output
untouched; a wrong token range, blocks writing into their input, a loop that never calls a patch each fail; calls
the replay can't make are "not checked", never a failure of the call (headless)."""
from types import SimpleNamespace

import torch

from gcache.core.engine import ResidualCache
from gcache.core.selfcheck import FAIL, NOT_CHECKED, PASS
from gcache.nodes.patching import streams
from gcache.nodes.patching.adapters import Adapter, BlockSlot, Route, Stack
from gcache.nodes.patching.runtime import RunState, activate, deactivate, make_dit_patch
from gcache.nodes.patching.selfcheck import RunCheck
from gcache.nodes.patching.steps import StepTracker
from gcache.nodes.patching.streams import Layout

N_TXT, N_IMG, D = 3, 8, 6
DOUBLE, SINGLE = Stack("double_block", "double_blocks", Layout.IMG), Stack("single_block", "single_blocks",
                                                                           Layout.TXT_FIRST)
ADAPTER = Adapter("toy", (), Route.DIT, (DOUBLE, SINGLE))
SIGMAS = [1.0, 0.75, 0.5, 0.25, 0.0]


class Toy:
    """apply_model(x, t, ..., transformer_options): io part, 2 double blocks on (img, txt), 2 single blocks on
    cat(txt, img), an output head on the image tokens; denoised = x − σ·v. `patches`: the dit patches it asks for
    (None: a loop that never asks); `in_place`: blocks that add into their input."""

    def __init__(self, patches, in_place=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.w = [torch.randn(D, D, generator=g) * 0.4 for _ in range(5)]
        self.txt = torch.randn(1, N_TXT, D, generator=g)
        self.patches, self.in_place = patches, in_place
        self.block_runs = 0
        dm = torch.nn.Module()  # where the replay finds the blocks it counts (block_slots)
        dm.double_blocks = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Identity()])
        dm.single_blocks = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Identity()])
        self.class_obj = SimpleNamespace(diffusion_model=dm)  # ComfyUI's executor.class_obj: the BaseModel

    def block(self, i, x):
        self.block_runs += 1
        upd = torch.tanh(x @ self.w[i])
        if self.in_place:
            x += upd
            return x
        return x + upd

    def __call__(self, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options=None):
        topts = transformer_options or {}
        img, txt = x * 1.5 + 0.1, self.txt.expand(x.shape[0], -1, -1).clone()
        for i in range(2):
            def double(args, i=i):
                return {"img": self.block(i, args["img"]), "txt": args["txt"] + 0.1 * args["img"].mean(1, True)}
            args = {"img": img, "txt": txt, "transformer_options": topts}
            out = self.call(("double_block", i), args, double)
            img, txt = out["img"], out["txt"]
        s = torch.cat((txt, img), 1)
        for i in range(2):
            def single(args, i=i):
                return {"img": self.block(2 + i, args["img"])}
            s = self.call(("single_block", i), {"img": s, "transformer_options": dict(topts)}, single)["img"]
        v = s[:, N_TXT:] @ self.w[4]
        return x - float(t.reshape(-1)[0]) * v

    def call(self, key, args, block):  # as ComfyUI's loops: the patch in transformer_options, else the block
        patch = ((args["transformer_options"].get("patches_replace") or {}).get("dit") or {}).get(key)
        return patch(args, {"original_block": block}) if patch is not None else block(args)


def patches(owner):
    slots = [BlockSlot(DOUBLE, 0, "0", True, False), BlockSlot(DOUBLE, 1, "1", False, False),
             BlockSlot(SINGLE, 0, "0", False, False), BlockSlot(SINGLE, 1, "1", False, True)]
    return {(s.stack.key, s.index): make_dit_patch(s, owner) for s in slots}


def sample(model, check=None, topts=None, owner="toy", batch=2):
    """Euler over SIGMAS with the model called through `check` (as hooks._apply_model does), and the run's stats."""
    run = RunState(lambda: ResidualCache(None), StepTracker(SIGMAS), owner)
    run.selfcheck = check
    token = activate(run)
    try:
        x = torch.randn(batch, N_IMG, D, generator=torch.Generator().manual_seed(7))
        for i in range(len(SIGMAS) - 1):
            t = torch.tensor([SIGMAS[i]])
            dit = {**(model.patches or {}), **((topts or {}).get("patches_replace") or {}).get("dit", {})}
            opts = dict(topts or {}, cond_or_uncond=[0, 1][:batch], patches_replace={"dit": dit})
            step = run.begin_call(SIGMAS[i], opts)
            args = (x, t, None, None, None, opts)
            y = check.model_call(run, step, model, args, {}) if check is not None else model(*args)
            x = y + (x - y) / SIGMAS[i] * SIGMAS[i + 1]
            run.tracker.completed(i)
    finally:
        deactivate(token)
    return x, run.close()


def checked(model_patches=patches, in_place=False, topts=None, owner="toy"):
    model = Toy(model_patches(owner) if model_patches else None, in_place)
    plain, plain_stats = sample(Toy(None, in_place))
    check = RunCheck(ADAPTER, len(SIGMAS) - 2)
    out, stats = sample(model, check, topts, owner)
    return plain, out, check.outcome(), stats, plain_stats


def test_a_correct_adapter_passes_and_the_run_is_bit_identical():
    plain, out, outcome, stats, _ = checked()
    assert torch.equal(out, plain)
    assert outcome.result == PASS and outcome.calls == 1 and outcome.error <= outcome.tolerance / 4
    assert stats.stack_calls == 4 and stats.computed_steps == 4  # the replay's stack pass is not in the stats


def test_image_tokens_from_the_wrong_end_fail(monkeypatch):
    right = streams.image_range

    def wrong(length, layout, n_img, img_slice, where=""):
        a, b = right(length, layout, n_img, img_slice, where)
        return (a, b) if layout not in streams.JOINT else ((length - (b - a), length) if a == 0 else (0, b - a))
    monkeypatch.setattr(streams, "image_range", wrong)
    plain, out, outcome, _, _ = checked()
    assert torch.equal(out, plain)  # the computed steps are what they are: only the replay shows it
    assert outcome.result == FAIL and outcome.error > 10 * outcome.tolerance and "differs" in outcome.why


def test_blocks_that_write_into_their_input_fail_without_the_engines_snapshot(monkeypatch):
    assert checked(in_place=True)[2].result == PASS  # the engine's snapshot keeps h
    monkeypatch.setattr(ResidualCache, "_snapshot", lambda self, key, h, meta: h)
    outcome = checked(in_place=True)[2]
    assert outcome.result == FAIL and outcome.error > 10 * outcome.tolerance


def test_a_loop_that_never_calls_a_patch_fails():
    outcome = checked(model_patches=None)[2]
    assert outcome.result == FAIL and "never called" in outcome.why

    def doubles_only(owner):
        return {k: v for k, v in patches(owner).items() if k[0] == "double_block"}
    outcome = checked(model_patches=doubles_only)[2]
    assert outcome.result == FAIL and "entered but never left" in outcome.why

    def a_middle_block_runs_by_itself(owner):  # the output is still right: only the count shows it
        return {k: v for k, v in patches(owner).items() if k != ("single_block", 0)}
    outcome = checked(model_patches=a_middle_block_runs_by_itself)[2]
    assert outcome.result == FAIL and "1 of 4 block calls" in outcome.why and outcome.error <= outcome.tolerance


def test_calls_the_replay_cant_make_are_not_checked():
    plain, out, outcome, _, _ = checked(topts={"multigpu_thread_device": "cuda:1"})
    assert torch.equal(out, plain) and outcome.result == NOT_CHECKED and "MultiGPU" in outcome.why

    def slg_skip(args, extra):  # another node's patch in GCache's slot (SLG's skip), defined outside GCache
        return {"img": args["img"]}
    topts = {"patches_replace": {"dit": {("single_block", 1): slg_skip}}}
    plain, out, outcome, _, _ = checked(topts=topts)
    assert outcome.result == NOT_CHECKED and "another node's block patch sits in GCache's slot" in outcome.why


def test_a_node_that_wraps_gcaches_patch_is_replayed_through():
    def wrapping(owner):  # a node applied after GCache that wraps its patch (an observer, a ControlNet-like hook)
        ours = patches(owner)
        return {k: (lambda args, extra, fn=fn: fn(args, extra)) for k, fn in ours.items()}
    plain, out, outcome, _, _ = checked(model_patches=wrapping)
    assert torch.equal(out, plain) and outcome.result == PASS


def test_a_replay_that_raises_is_not_checked_and_the_call_keeps_its_output():
    class Flaky(Toy):
        calls = 0

        def __call__(self, *a, **kw):
            Flaky.calls += 1
            if Flaky.calls == len(SIGMAS):  # the replay of the last step's call
                raise RuntimeError("CUDA out of memory")
            return super().__call__(*a, **kw)
    plain, _ = sample(Toy(None))
    check = RunCheck(ADAPTER, len(SIGMAS) - 2)
    out, _ = sample(Flaky(patches("toy")), check)
    assert torch.equal(out, plain)
    assert check.outcome().result == NOT_CHECKED and "out of memory" in check.outcome().why


def test_one_replay_per_set_of_branches_and_none_elsewhere():
    model = Toy(patches("toy"))
    check = RunCheck(ADAPTER, 2)
    sample(model, check)
    runs_with_check = model.block_runs
    model2 = Toy(patches("toy"))
    sample(model2)
    assert runs_with_check == model2.block_runs  # the replay ran no block
    assert check.outcome().calls == 1 and len(check.done) == 1
    none = RunCheck(ADAPTER, None, "a one-step run has no step after the first to check")
    sample(Toy(patches("toy")), none)
    assert none.outcome().result == NOT_CHECKED and "one-step" in none.outcome().why
    late = RunCheck(ADAPTER, 99)
    sample(Toy(patches("toy")), late)
    assert late.outcome().result == NOT_CHECKED and "ended before" in late.outcome().why
