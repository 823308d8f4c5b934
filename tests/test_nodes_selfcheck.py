"""The self-check's replay at the model call (nodes/patching/selfcheck.py) on a toy Flux-shaped model whose block
loop asks for GCache's real dit patches (runtime.make_dit_patch): a correct adapter passes with the run's output
untouched; a wrong token range, blocks writing into their input, a loop that never calls a patch each fail; calls
the replay can't make are "not checked", never a failure of the call (headless)."""
import logging
from types import SimpleNamespace

import pytest
import torch

from gcache.core.engine import ResidualCache
from gcache.core.recorder import ProfileRecorder
from gcache.core.selfcheck import FAIL, NOT_CHECKED, PASS
from gcache.nodes.patching import streams
from gcache.nodes.patching.adapters import Adapter, BlockSlot, Route, Stack
from gcache.nodes.patching.runtime import RunState, activate, current_run, deactivate, make_dit_patch
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
            self.op("first") if i == 0 else None
        self.op("middle")
        s = torch.cat((txt, img), 1)
        for i in range(2):
            def single(args, i=i):
                return {"img": self.block(2 + i, args["img"])}
            s = self.call(("single_block", i), {"img": s, "transformer_options": dict(topts)}, single)["img"]
        self.op("last")
        v = s[:, N_TXT:] @ self.w[4]
        return x - float(t.reshape(-1)[0]) * v

    def op(self, where):  # an op of the model's own code between its blocks (RaisesInReplay makes one raise)
        pass

    def call(self, key, args, block):  # as ComfyUI's loops: the patch in transformer_options, else the block
        patch = ((args["transformer_options"].get("patches_replace") or {}).get("dit") or {}).get(key)
        return patch(args, {"original_block": block}) if patch is not None else block(args)


def patches(owner):
    slots = [BlockSlot(DOUBLE, 0, "0", True, False), BlockSlot(DOUBLE, 1, "1", False, False),
             BlockSlot(SINGLE, 0, "0", False, False), BlockSlot(SINGLE, 1, "1", False, True)]
    return {(s.stack.key, s.index): make_dit_patch(s, owner) for s in slots}


def sample(model, check=None, topts=None, owner="toy", batch=2, separate=False, observers=(), lanes=None,
           cache_device=None):
    """Euler over SIGMAS with the model called through `check` (as hooks._apply_model does: begin_call, the call and,
    with `lanes`, end_call), and the run's stats. `separate`: cond and uncond in calls of their own (ComfyUI does so
    when their shapes or hooks differ), else batched in one; `lanes`: a list that gets the lane's state after every
    call."""
    run = RunState(lambda: ResidualCache(None, cache_device=cache_device, observers=observers), StepTracker(SIGMAS),
                   owner)
    run.selfcheck = check
    token = activate(run)
    try:
        x = torch.randn(batch, N_IMG, D, generator=torch.Generator().manual_seed(7))
        for i in range(len(SIGMAS) - 1):
            t = torch.tensor([SIGMAS[i]])
            dit = {**(model.patches or {}), **((topts or {}).get("patches_replace") or {}).get("dit", {})}
            ys = []
            for rows in ([[r] for r in range(batch)] if separate else [list(range(batch))]):
                opts = dict(topts or {}, cond_or_uncond=[[0, 1][r] for r in rows], patches_replace={"dit": dit})
                step = run.begin_call(SIGMAS[i], opts)
                args = (x[rows], t, None, None, None, opts)
                ys.append(check.model_call(run, step, model, args, {}) if check is not None else model(*args))
                if lanes is not None:
                    run.end_call()
                    ln = run.lane()
                    lanes.append((ln.compute, ln.entered, ln.through, ln.in_slot, ln.patches, ln.n_img))
            y = torch.cat(ys)
            x = y + (x - y) / SIGMAS[i] * SIGMAS[i + 1]
            run.tracker.completed(i)
    finally:
        deactivate(token)
    return x, run.close(), run


def checked(model_patches=patches, in_place=False, topts=None, owner="toy"):
    model = Toy(model_patches(owner) if model_patches else None, in_place)
    plain, plain_stats, _ = sample(Toy(None, in_place))
    check = RunCheck(ADAPTER, len(SIGMAS) - 2)
    out, stats, _ = sample(model, check, topts, owner)
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


def test_a_replay_that_runs_out_of_memory_is_not_checked_and_the_call_keeps_its_output():
    class Flaky(Toy):
        calls = 0

        def __call__(self, *a, **kw):
            Flaky.calls += 1
            if Flaky.calls == len(SIGMAS):  # the replay of the last step's call
                raise RuntimeError("CUDA out of memory")
            return super().__call__(*a, **kw)
    plain, _, _ = sample(Toy(None))
    check = RunCheck(ADAPTER, len(SIGMAS) - 2)
    out, _, _ = sample(Flaky(patches("toy")), check)
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


class RaisesInReplay(Toy):
    """A Toy whose op at `where` raises `error` only during the self-check's replay: after the first block (the lane
    has entered the stack), between the double and the single blocks (Flux's torch.cat), after the last block (the
    stack was left: the head)."""

    def __init__(self, patches, where, error):
        super().__init__(patches)
        self.where, self.error, self.raised = where, error, 0

    def op(self, where):
        held = current_run("toy").lane().cache._held
        if where == self.where and held is not None and held.replaying:
            self.raised += 1
            raise self.error


def recorded(separate, model=None, check=None, lanes=None):
    """A profile run of 4 steps (recorder as Profile's observer): its output, stats, run and profile."""
    rec = ProfileRecorder(SIGMAS[:-1], forecast=True)
    out, stats, run = sample(model or Toy(patches("toy")), check, separate=separate, observers=(rec,), lanes=lanes)
    return out, stats, run, rec.finish()


@pytest.mark.parametrize("separate", [False, True], ids=["cond+uncond in one call", "separate calls"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_replay_that_raises_inside_the_stack_leaves_the_run_as_without_the_check(where, separate, caplog):
    """Issue 43: the replay raised between the double and the single blocks, the lane stayed entered, end_call took
    the call for one that never left the stack: the plain calls went uncached for the rest of the run with "Please
    report this model", and a separate uncond call was then recorded as a fail."""
    plain_lanes, lanes = [], []
    plain, plain_stats, plain_run, plain_prof = recorded(separate, lanes=plain_lanes)
    check = RunCheck(ADAPTER, len(SIGMAS) - 2)
    model = RaisesInReplay(patches("toy"), where, torch.OutOfMemoryError("CUDA out of memory (injected)"))
    with caplog.at_level("INFO", logger="gcache"):
        out, stats, run, prof = recorded(separate, model, check, lanes)
    assert model.raised == (2 if separate else 1)  # each set of branches was replayed, and raised
    assert torch.equal(out, plain)
    assert lanes == plain_lanes and run.uncached == plain_run.uncached == set() and run.disabled is None
    for f in ("computed_steps", "skipped_steps", "block_runs", "stack_calls", "decided", "resets"):
        assert getattr(stats, f) == getattr(plain_stats, f), f
    assert prof.count == plain_prof.count and (prof.e_sum == plain_prof.e_sum).all()  # the recorder saw it all
    assert "Please report" not in caplog.text and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    outcome = check.outcome()
    assert outcome.result == NOT_CHECKED and "out of memory" in outcome.why, outcome


class InterruptProcessingException(Exception):
    """Stands for ComfyUI's (comfy.model_management), found by the check where ComfyUI imported it."""


def test_what_a_raising_replay_means_fail_or_not_checked(monkeypatch):
    """Only out of memory (cuBLAS/cuDNN's allocation failures too) and a user's interrupt are "not checked" (the
    interrupt then stops the prompt); an exception
    of the skip path itself, or of the model's code on the skipped stream, is a fail: a skipped step would raise it."""
    def outcome_of(error, where="middle"):
        check = RunCheck(ADAPTER, len(SIGMAS) - 2)
        out, _, run = sample(RaisesInReplay(patches("toy"), where, error), check)
        return check.outcome(), out, run

    plain, _, _ = sample(Toy(None))
    for oom in (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4 GB"),
                # issue 47: memory pressure in cuBLAS/cuDNN's workspaces was a fail, kept for good
                RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
                RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")):
        outcome, out, _ = outcome_of(oom)
        assert torch.equal(out, plain) and outcome.result == NOT_CHECKED and "out of memory" in outcome.why, outcome
    outcome, out, run = outcome_of(RuntimeError("Tensors must have same number of dimensions"))
    assert torch.equal(out, plain) and outcome.result == FAIL, outcome
    assert "the replay through the skip path raised RuntimeError: Tensors must have" in outcome.why
    import types
    monkeypatch.setitem(__import__("sys").modules, "comfy.model_management",
                        types.SimpleNamespace(InterruptProcessingException=InterruptProcessingException))
    for stop in (KeyboardInterrupt(), InterruptProcessingException()):
        check = RunCheck(ADAPTER, len(SIGMAS) - 2)
        with pytest.raises(type(stop)):  # the user asked the prompt to stop: it stops
            sample(RaisesInReplay(patches("toy"), "middle", stop), check)
        assert check.outcome().result == NOT_CHECKED and "interrupted" in check.outcome().why


def test_out_of_memory_is_told_on_a_torch_before_2_5_and_an_exit_is_not_swallowed(monkeypatch):
    """torch.OutOfMemoryError came with torch 2.5 (ComfyUI pins no torch): without it the check still tells out of
    memory (the CUDA one, Python's MemoryError) and nothing else raises in its place. SystemExit or GeneratorExit
    in the replay are not the model's: they go on, unrecorded."""
    from gcache.nodes.patching import selfcheck as sc
    before_2_5 = SimpleNamespace(cuda=torch.cuda)  # a torch module without OutOfMemoryError
    assert sc.oom_types(before_2_5) == (torch.cuda.OutOfMemoryError, MemoryError)
    monkeypatch.setattr(sc, "OOM_TYPES", sc.oom_types(before_2_5))
    for oom in (torch.cuda.OutOfMemoryError("CUDA out of memory"), MemoryError()):
        assert "out of memory" in sc.not_checked_why(oom)
    assert sc.not_checked_why(RuntimeError("Tensors must have same number of dimensions")) is None
    check = RunCheck(ADAPTER, len(SIGMAS) - 2)
    with pytest.raises(SystemExit):
        sample(RaisesInReplay(patches("toy"), "middle", SystemExit(3)), check)
    assert check.problems == [] and check.skipped == []


def test_a_fault_of_the_checks_own_code_is_not_a_fail(monkeypatch):
    """A fail is kept for good (verdicts never forget one): a bug in the check's own code outside the replay says
    nothing about the skip path, so it leaves the call not checked and asks for a report."""
    from gcache.nodes.patching import selfcheck as sc

    def broken(*a, **kw):
        raise KeyError("a bug of the check")
    monkeypatch.setattr(sc, "measure", broken)
    plain, out, outcome, _, _ = checked()
    assert torch.equal(out, plain) and outcome.result == NOT_CHECKED, outcome
    assert "the self-check's own code raised KeyError" in outcome.why and "please report" in outcome.why


def test_an_exception_of_the_engines_skip_path_is_a_fail(monkeypatch):
    def broken(self, *a, **kw):
        raise RuntimeError("Expected all tensors to be on the same device")
    monkeypatch.setattr(ResidualCache, "_skip_out", broken)
    plain, out, outcome, _, _ = checked()
    assert torch.equal(out, plain) and outcome.result == FAIL and "same device" in outcome.why, outcome


def test_a_fault_in_the_engines_skip_path_is_caught(monkeypatch):
    """The replay runs the engine's own skip path (ResidualCache._skip_out, with the run's cache_device and the
    forecaster's weights), not a copy of it: a fault there is a fail at run 1."""
    from gcache.core import engine
    plain, _, _ = sample(Toy(None))

    def outcome(cache_device=None):
        check = RunCheck(ADAPTER, len(SIGMAS) - 2)
        out, _, _ = sample(Toy(patches("toy")), check, cache_device=cache_device)
        assert torch.equal(out, plain)
        return check.outcome()
    assert outcome("cpu").result == PASS
    with monkeypatch.context() as mp:  # a move back from cache_device read before its copy landed (zeros)
        mp.setattr(engine, "to_device", lambda d, device: torch.zeros_like(d, device=device))
        assert outcome().result == PASS  # no cache_device: no move
        bad = outcome("cpu")
        assert bad.result == FAIL and bad.error > 10 * bad.tolerance, bad
    with monkeypatch.context() as mp:  # the forecaster's weight of the kept δ wrong
        from gcache.core import forecasters
        reuse = forecasters.get("reuse")
        mp.setattr(reuse, "weights", lambda kept, j, times, params: [0.99])
        bad = outcome()
        assert bad.result == FAIL and bad.error > 10 * bad.tolerance, bad
    with monkeypatch.context() as mp:  # the engine's use of the weights wrong
        weights = ResidualCache._weights
        mp.setattr(ResidualCache, "_weights", lambda self, kept, step: [w * 0.99 for w in weights(self, kept, step)])
        bad = outcome()
        assert bad.result == FAIL and bad.error > 10 * bad.tolerance, bad
