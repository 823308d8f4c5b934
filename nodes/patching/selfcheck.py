"""The self-check of the skip path inside a run that computes every step (run 1). No ComfyUI import.

hooks.py's APPLY_MODEL wrapper hands every model call of a run with a RunCheck to `model_call`. At the step checked
(the run's last: a step after the first, and one whose timing the io share leaves out), the first call of each set of
branches runs as usual while the lane's cache holds its block-stack residuals (core/replay.py), and is then called
again with the stack skipped by those residuals, through the very gate, patches and stream code a skipped step runs.
The replay's output is compared with the computed one (core/selfcheck.py) and thrown away: the run goes on with the
computed output, bit for bit. During the replay every GCache block patch counts its calls (each block of each pass
must go through its patch: a block the model's loop runs by itself runs its original) and the cache counts stack
entries and exits (one each per computed pass): a patch the model's loop never calls shows there.

Fail or not checked (`not_checked_why`): a replay that raises is a fail (a skipped step would go through the same
code), except for what says nothing about the skip path: out of memory and a user's interrupt (which then goes on to
stop the prompt). Calls the replay can't make are "not checked" too, with the reason: ComfyUI's MultiGPU CFG split, a
computed output that is not finite, a call where another node's patch sits in a slot of GCache's stack (SLG's
skip, a node applied after GCache) and the replay does not reproduce it (the mismatch may be that node's), and a call
that another node's code inside GCache's model call would see replayed (foreign.unknown_wrappers: a cache pack's
wrapper or forward patch would count the replay or serve it from its own cache). Whatever the
replay did or raised, the lane is left as the computed call left it (LANE_STATE): the rest of the run is the run
without the check. Nothing here fails the prompt but an interrupt.
"""
from __future__ import annotations

import contextlib
import sys
import time
from typing import Optional

import torch

from ...core.errors import GCacheError
from ...core.replay import ReplayBroken
from ...core.selfcheck import Measured, Outcome, conclude, lowest_precision, measure, unit
from .adapters import Adapter, Route, block_slots
from .foreign import unknown_wrappers

UNPAIRED = ("the block stack was entered but never left through GCache's patches (its last block's patch was never "
            "called)")

PATCHES = __name__.rsplit(".", 1)[0]  # the package of GCache's block patches (runtime.py): "ours" in patches_replace
# what a call's lane (runtime._Lane) holds between its block patches: the replay puts it back as the computed call left
# it, also when it raised inside the stack (the lane stayed "entered": end_call took the call for one that never left)
LANE_STATE = ("branches", "compute", "n_img", "patches", "entered", "through", "in_slot")
# CUDA/MPS and the CPU allocator, raised as RuntimeError; cuBLAS/cuDNN failing to allocate their workspace (memory
# pressure, which the replay's held residuals make likelier) says as little about the skip path
OOM_WORDS = ("out of memory", "can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def oom_types(t=torch) -> tuple:
    """What running out of memory raises: torch.OutOfMemoryError exists from torch 2.5 on (ComfyUI pins no torch;
    older ones have only the CUDA one), and Python's MemoryError."""
    return getattr(t, "OutOfMemoryError", t.cuda.OutOfMemoryError), MemoryError


OOM_TYPES = oom_types()


def interrupted(e: BaseException) -> bool:
    """A user's interrupt: KeyboardInterrupt, or ComfyUI's InterruptProcessingException (looked up where ComfyUI
    already imported it: this file imports no ComfyUI)."""
    mm = sys.modules.get("comfy.model_management")
    cls = getattr(mm, "InterruptProcessingException", None)
    return isinstance(e, KeyboardInterrupt) or (isinstance(cls, type) and isinstance(e, cls))


def not_checked_why(e: BaseException) -> Optional[str]:
    """Why an exception the replay raised leaves the call not checked, or None when it is a fail: only running out of
    memory (cuBLAS/cuDNN's allocation failures too) and a user's interrupt say nothing about the skip path; anything
    else a skipped step would raise too."""
    if isinstance(e, OOM_TYPES) or (isinstance(e, RuntimeError) and any(w in str(e) for w in OOM_WORDS)):  # said
        return f"the replay ran out of memory ({type(e).__name__}: {e})"
    if interrupted(e):
        return f"sampling was interrupted during the replay ({type(e).__name__})"
    return None


def parts(t) -> list:
    """A model input/output as tensors: ComfyUI 0.33's NestedTensor (LTX-2's video + audio) is several."""
    return list(t.tensors) if hasattr(t, "tensors") else [t]


class RunCheck:
    """The self-check of one sampling run (module docstring). `step`: the global step checked."""

    def __init__(self, adapter: Adapter, step: Optional[int], why_not: str = ""):
        self.adapter = adapter
        self.step = step            # None: nothing to check in this run (why_not says why)
        self.why_not = why_not
        self.done: set = set()      # the branch sets already checked
        self.errors: list = []      # what each replayed call measured (core.selfcheck.Measured)
        self.problems: list = []    # what went wrong (a fail)
        self.skipped: list = []     # why a call was not checked
        self._timers: list = []     # the replays' (start, end): perf_counter floats or CUDA events
        self.verdict: Optional[dict] = None  # the run's verdict, once it is closed (../modes/verdicts.py)

    # ---------------------------------------------------------------- per model call
    def model_call(self, run, step: int, executor, args: tuple, kwargs: dict, foreign_options: Optional[dict] = None):
        """One model call of run 1 (args: as the model is called, other nodes' patches already inside GCache's gate,
        foreign.py); `foreign_options`: the call's transformer_options as ComfyUI made them, where another node's
        patch in GCache's slots still shows as that node's."""
        if step != self.step or run.disabled is not None:
            return executor(*args, **kwargs)
        ln = run.lane()
        branches = tuple(ln.branches)
        if branches in self.done:
            return executor(*args, **kwargs)
        self.done.add(branches)
        topts = (args[5] if len(args) > 5 else kwargs.get("transformer_options")) or {}
        if topts.get("multigpu_thread_device") is not None:
            self.skipped.append("ComfyUI's MultiGPU CFG split runs this call in a thread of its own device")
            return executor(*args, **kwargs)
        unknown = unknown_wrappers(executor, topts, getattr(getattr(executor, "class_obj", None), "diffusion_model",
                                                            None))
        if unknown:  # a stateful one would count the replay or serve it from its cache: a false fail, or worse
            self.skipped.append(f"another node's code runs inside GCache's model call and would see the replay "
                                f"({', '.join(unknown[:3])})")
            return executor(*args, **kwargs)
        if ln.through:  # an earlier call like it entered the stack and never left it through GCache's last block
            if ln.patches:
                self.skipped.append("calls with another node's block patches left the block stack unpaired")
            else:
                self.problems.append(UNPAIRED)
            return executor(*args, **kwargs)
        cache = ln.cache
        cache.hold()
        try:  # from here on the cache holds this call's residuals: released whatever happens
            out = executor(*args, **kwargs)
            try:
                with run.off_for_call():  # the replay skips blocks a memory compiler recorded (memory_compiler.py)
                    shown = self._replay(ln, executor, args, kwargs, out, topts)
                self._judge(shown,
                            self._foreign(topts if foreign_options is None else foreign_options))
            except Exception as e:  # noqa: BLE001  never the prompt's failure; not a pass either
                if interrupted(e):  # _replay said so already
                    raise
                # what the replay itself raised is judged in _replay (a fail, or not checked); this is the check's
                # own code, whose fault says nothing about the skip path: not a fail, which is kept for good
                self.skipped.append(not_checked_why(e) or f"the self-check's own code raised {type(e).__name__}: "
                                                          f"{e} (please report this at GCache's issues)")
        finally:
            cache.release()
        return out

    def _foreign(self, topts: dict) -> str:
        """Another node's patch in a slot of GCache's stack for this call (SLG's skip, a node applied after GCache
        that wraps or replaces GCache's patch): what the replay then shows may be that node's doing."""
        if self.adapter.route != Route.DIT:
            return ""
        keys = {st.key for st in self.adapter.stacks}
        dit = ((topts.get("patches_replace") or {}).get("dit")) or {}
        for slot, fn in dit.items():
            key = slot[0] if isinstance(slot, tuple) else slot
            if key in keys and not str(getattr(fn, "__module__", "")).startswith(PATCHES):
                return f"another node's block patch sits in GCache's slot on the {key} blocks"
        return ""

    def _judge(self, shown: Optional[tuple], foreign: str) -> None:
        """What one replayed call showed, (problems, Measured or None), into the run's outcome. With another node's
        patch in GCache's slots a mismatch is not the model's: that call is not checked."""
        if shown is None:
            return
        problems, measured = shown
        differs = measured is not None and measured.failed()
        if foreign and (problems or differs):
            self.skipped.append(f"{foreign}, and the replay through it did not reproduce the call")
            return
        self.problems += problems
        if measured is not None:
            self.errors.append(measured)

    def _replay(self, ln, executor, args, kwargs, out, topts) -> Optional[tuple]:
        """Replays the held call through the skip path, then once more with its h + δ nudged by one unit of rounding
        (the floor, core/selfcheck.py): (problems, Measured or None), or None when it could not be made (said in
        self.skipped). Never raises an Exception of the model's."""
        problems: list = []
        count = ln.cache.held_count()  # the computed call's
        if count.held_entries == 0:  # replayed all the same: the blocks' runs are counted, the error measured
            problems.append("GCache's block patches were never called: the model's own loop ran the blocks")
        elif count.held == 0:
            return [UNPAIRED], None
        dm = getattr(getattr(executor, "class_obj", None), "diffusion_model", None)
        slots = block_slots(self.adapter, dm) if dm is not None else []
        calls = [0]
        after = AfterStack(dm, self.adapter, calls, len(slots) * max(count.held, 1))
        try:
            replayed = self._replay_once(ln, executor, args, kwargs, out, topts, dm, slots, calls, after, 0.0)
        except ReplayBroken as e:
            return problems + [str(e)], None
        except GCacheError as e:  # the skip path itself refuses this model's stream: a skipped step would fail
            return problems + [f"the skip path failed: {e}"], None
        except BaseException as e:  # noqa: BLE001  said; only an interrupt goes on to stop the prompt
            if not isinstance(e, Exception) and not interrupted(e):  # SystemExit, GeneratorExit: not the model's
                raise
            why = not_checked_why(e)
            if why is None:  # a skipped step runs the same code: it would raise too
                return problems + [f"the replay through the skip path raised {type(e).__name__}: {e}"], None
            self.skipped.append(why)
            if interrupted(e):
                raise
            return None
        count = ln.cache.held_count()
        if count.entries != count.held or count.exits != count.held:
            problems.append(f"the replay entered the block stack {count.entries} times and left it {count.exits} "
                            f"times; the computed call passed it {count.held} times")
        expected = len(slots) * max(count.held, 1)
        if slots and calls[0] < expected:  # each block of each pass must go through its patch: the others ran
            problems.append(f"the blocks ran anyway: {expected - calls[0]} of {expected} block calls of the replay "
                            "did not go through GCache's patches")
        stream = count.dtype if count.dtype is not None else getattr(dm, "dtype", None)
        dtype = lowest_precision(path_dtypes(stream, after.dtypes, getattr(executor, "class_obj", None)))
        try:  # the floor: the same replay, h + δ nudged by one unit of the path's lowest precision
            nudged = self._replay_once(ln, executor, args, kwargs, out, topts, dm, slots, [0], None, unit(dtype))
        except Exception as e:  # noqa: BLE001  the replay made it once: this one says nothing about the skip path
            if interrupted(e):
                self.skipped.append(f"sampling was interrupted during the replay ({type(e).__name__})")
                raise
            self.skipped.append(not_checked_why(e) or f"the rounding floor's replay raised {type(e).__name__}: {e}")
            return None
        try:
            share = (unit(stream) / unit(dtype)) ** 0.5 if isinstance(stream, torch.dtype) else 1.0
            figures = measure(parts(out), parts(replayed), parts(nudged), parts(_without_model(executor, args, out)),
                              min(share, 1.0))
        except ValueError as e:
            self.skipped.append(str(e))
            return None
        return problems, Measured(figures, str(dtype).replace("torch.", ""))

    def _replay_once(self, ln, executor, args, kwargs, out, topts, dm, slots, calls, after, nudge):
        """One replay of the held call (nudged by `nudge` units when > 0), its block patches counted into calls[0] and
        the dtypes after the stack into `after` (an AfterStack, or None); the lane left as the computed call left it
        whatever happens. Returns the replayed output; raises what the replay raised."""
        rargs, rkwargs, restore = _count_patch_calls(self.adapter, dm, slots, args, kwargs, topts, calls)
        lane = {f: getattr(ln, f) for f in LANE_STATE}  # as the computed call left it
        ln.compute = False  # a middle block reached without the first one must not run its block
        ln.cache.replay(nudge)
        timer = _start(out)
        try:
            with (after if after is not None else contextlib.nullcontext()):
                return executor(*rargs, **rkwargs)
        finally:
            restore()
            for f, v in lane.items():  # nothing of the replay carries over (a raise left the lane "entered")
                setattr(ln, f, v)
            self._timers.append(_stop(timer))

    # ---------------------------------------------------------------- end of the run
    def outcome(self) -> Outcome:
        if self.step is None:
            return Outcome(why=self.why_not)
        if not (self.errors or self.problems or self.skipped):
            return Outcome(why="the run ended before the step checked")
        return conclude(self.errors, self.problems, self.skipped)

    def replay_seconds(self) -> float:
        """Wall time of the replays (the profile's io share leaves it out of the step it ran in)."""
        total = 0.0
        for start, end in self._timers:
            if isinstance(start, float):
                total += end - start
            else:
                end.synchronize()
                total += start.elapsed_time(end) / 1000.0
        return total


def path_dtypes(stream, after_stack, base_model) -> list:
    """The dtypes on the path from the block stack to the output, whose rounding a correct replay may show: the
    stream's (`stream`, the held δ's), what the layers that run after the stack computed in (`after_stack`: the
    dtypes of their inputs, AfterStack; ComfyUI's cast ops compute in their input's dtype, whatever the weights'
    storage), and the dtype ComfyUI computes the model in (the BaseModel's manual_cast_dtype). The input layers run
    before the stack, where the replay can't differ from the computed call: their dtypes don't count."""
    return [stream, *after_stack, getattr(base_model, "manual_cast_dtype", None)]


class AfterStack:
    """While the replay runs: the floating dtypes of the inputs of the model's layers outside the block stacks that
    run after the stack's last block call (`calls` reaches `expected`: the head, and any layer between the stack and
    the output), and of the model's own output (a cast outside any layer). Hooks on those layers, removed on exit."""

    def __init__(self, dm, adapter: Adapter, calls: list, expected: int):
        self.dm, self.calls, self.expected = dm, calls, expected
        self.inside = tuple(f"{st.attr}." for st in adapter.stacks) + tuple(st.attr for st in adapter.stacks)
        self.dtypes: set = set()
        self.handles: list = []

    def _seen(self, module, args, kwargs):
        if self.expected and self.calls[0] >= self.expected:
            self.dtypes.update(a.dtype for a in (*args, *kwargs.values())
                               if torch.is_tensor(a) and a.is_floating_point())

    def _output(self, module, args, out):  # the model's own output: a cast after its last layer (issue 47 case 4)
        outs = out if isinstance(out, (tuple, list)) else parts(out)
        self.dtypes.update(t.dtype for t in outs if torch.is_tensor(t) and t.is_floating_point())

    def __enter__(self):
        if self.dm is not None:
            self.handles = [m.register_forward_pre_hook(self._seen, with_kwargs=True)
                            for name, m in self.dm.named_modules()
                            if name and not name.startswith(self.inside)]
            self.handles.append(self.dm.register_forward_hook(self._output))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        return False


def _without_model(executor, args: tuple, out):
    """The output with the model's contribution taken out: ComfyUI's denoised output is affine in the model's raw
    output (x − σ·v for flow models, c_skip·x + c_out·F for EDM), so this is calculate_denoised with a zero raw
    output; the model input where that can't be had. Against it, the replay's error is relative to what the model
    contributed (no cancellation with c_skip·x late in an EDM schedule)."""
    try:
        ms = executor.class_obj.model_sampling
        return ms.calculate_denoised(args[1], torch.zeros_like(parts(out)[0]), args[0])
    except Exception:  # noqa: BLE001  a model sampling of its own: the input stands in (flow, eps: the same)
        return args[0]


def _count_patch_calls(adapter: Adapter, dm, slots: list, args: tuple, kwargs: dict, topts: dict, calls: list):
    """The replay's (args, kwargs, restore) with every GCache block patch counting its calls into calls[0] (dit
    patches: in a copy of the call's transformer_options; object-patched forwards: wrapped on the blocks until
    `restore()`). A block the model's loop runs without its patch runs its original: the count comes up short."""
    def counting(fn):
        def counted(*a, **kw):
            calls[0] += 1
            return fn(*a, **kw)
        return counted

    if adapter.route == Route.DIT:
        keys = {st.key for st in adapter.stacks}
        replace = dict(topts.get("patches_replace") or {})
        replace["dit"] = {k: counting(fn) if (k[0] if isinstance(k, tuple) else k) in keys else fn
                          for k, fn in (replace.get("dit") or {}).items()}
        counted_opts = dict(topts, patches_replace=replace)
        if len(args) > 5:
            return args[:5] + (counted_opts,) + args[6:], kwargs, lambda: None
        return args, dict(kwargs, transformer_options=counted_opts), lambda: None
    wrapped = []
    for slot in slots:
        block = getattr(getattr(dm, slot.stack.attr), slot.child)
        forward = block.__dict__.get("forward")  # GCache's object patch (ModelPatcher sets it on the block)
        if forward is not None:
            block.forward = counting(forward)
            wrapped.append((block, forward))

    def restore():
        for block, forward in wrapped:
            block.forward = forward
    return args, kwargs, restore


def _start(like):
    first = parts(like)[0]
    if first.device.type == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


def _stop(start):
    if isinstance(start, float):
        return start, time.perf_counter()
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return start, ev
