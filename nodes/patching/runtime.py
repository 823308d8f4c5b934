"""Per-run state and the block-stack gate. No ComfyUI import (hooks.py wires these into a ModelPatcher).

A RunState lives for one sampling run (created in the OUTER_SAMPLE wrapper, closed in its `finally`). It owns
the StepTracker and one lane per device that runs the model: ComfyUI's MultiGPU CFG split (0.33) runs each
device's conds in a thread of its own, so every device gets its own ResidualCache (residuals stay on the device
that made them) and every thread its own call state. Each model call: `begin_call` sets the step; every block of
the stack (dit patch, object-patched forward) and the whole-model fallback go through one gate, `gate`.

Patches know their model clone by an owner token (its config's, kept in transformer_options) and find its live
run in a context variable set by the OUTER_SAMPLE wrapper, or, from a thread ComfyUI started inside the run
(where the context variable is not visible), in the process-wide table of live runs. No tensor ever sits in
model_options, which ModelPatcher.clone copies (0.3.64) or shares between clones (0.33).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

from ...core.engine import CacheStats, ResidualCache
from ...core.errors import GCacheError
from . import streams
from .adapters import BlockSlot
from .steps import StepTracker
from .streams import Layout

log = logging.getLogger("gcache")
_RUNS: contextvars.ContextVar = contextvars.ContextVar("gcache_runs", default={})
_LIVE: dict = {}                # owner -> live runs, for threads started inside a run (MultiGPU CFG split)
_LIVE_LOCK = threading.Lock()


def _same(t):
    return t


def branch_keys(transformer_options: Optional[dict], names: Optional[dict] = None) -> list:
    """One key per batch chunk, naming the *cond* it belongs to, stable across the steps of a run.

    ComfyUI gives every cond a uuid (new each sampling run) and may run conds in separate calls (different
    shapes, hooks, low memory), so a key per position in the call would mix two prompts' residuals. Each uuid
    gets the name (cond_or_uncond, n) in order of first appearance, kept in `names` for the run: the same conds
    get the same names in the second sampler of a split schedule too. Without uuids: (cond_or_uncond, position).
    """
    topts = transformer_options or {}
    cou = topts.get("cond_or_uncond")
    if not cou:
        return ["all"]
    uuids = topts.get("uuids")
    if names is None or not uuids or len(uuids) != len(cou):
        seen: dict = {}
        keys = []
        for c in cou:
            keys.append((int(c), seen.get(c, 0)))
            seen[c] = seen.get(c, 0) + 1
        return keys
    counts = names.setdefault("_count", {})
    keys, in_call = [], {}
    for c, u in zip(cou, uuids):
        if u not in names:
            names[u] = (int(c), counts.get(int(c), 0))
            counts[int(c)] = counts.get(int(c), 0) + 1
        occ = in_call.get(u, 0)  # the same cond twice in one call (batched areas): keep the chunks apart
        in_call[u] = occ + 1
        keys.append(names[u] if occ == 0 else names[u] + (occ,))
    return keys


class Variant(NamedTuple):
    """The branch of a call whose block patches differ from the run's plain calls (another node's patch in a slot,
    e.g. Skip Layer Guidance's extra call): it caches on its own and never reads or overwrites the plain branch."""
    base: Any         # the branch key the call would have without its own patches
    patches: str      # a stable signature of those patches (foreign.py)


class Windowed(NamedTuple):
    """The branch of a call ComfyUI's context windows make for one window (comfy/context_windows.py: it calls the
    model once per window with the same conds, and names the window in transformer_options["context_window"]). Each
    window sees other frames, so each caches on its own: its δ, its shape (the causal fix's anchor frame makes the
    windows after the first one frame longer), its self-check replay and its profile history."""
    base: Any         # the branch key the call would have without windows
    frames: tuple     # the latent frames of the window, in order
    anchor: Optional[int] = None  # the causal fix's extra frame fed before them (stripped from the output)


def window_of(transformer_options: Optional[dict]) -> Optional[tuple]:
    """(frames, anchor) of the context window this call runs, None for a call without context windows. Raises
    GCacheError for a window that does not say its frames: its δ could not be told from another window's."""
    window = (transformer_options or {}).get("context_window")
    if window is None:
        return None
    frames = getattr(window, "index_list", None)
    try:
        frames = tuple(int(i) for i in frames)
    except (TypeError, ValueError):
        frames = ()
    if not frames:
        raise GCacheError(f"this run's context windows ({type(window).__name__}) do not say which frames each model "
                          "call covers (no index_list), so GCache cannot keep each window's residual apart")
    anchor = getattr(window, "causal_anchor_index", None)
    return frames, int(anchor) if isinstance(anchor, int) and anchor >= 0 else None


@dataclass
class _Lane:
    """One device's model calls within a run: its cache and the call it is in."""
    cache: ResidualCache
    branches: list = field(default_factory=lambda: ["all"])
    compute: bool = True
    n_img: int = 0
    patches: str = ""        # the current call's patch signature ("" for the plain calls)
    entered: bool = False    # this call entered the stack through GCache's first block and has not left it yet
    through: bool = False    # this call runs every block without the cache (see RunState.end_call)
    in_slot: Optional[tuple] = None  # the slot whose gate is running (a patch that chains back to ours: no 2nd gate)


class RunState:
    """One sampling run of one patched model clone: the step tracker, one lane (cache + call) per device."""

    def __init__(self, make_cache: Callable[[], ResidualCache], tracker: StepTracker, owner: str,
                 on_close: Optional[Callable[["RunState", CacheStats, bool], None]] = None, may_skip: bool = True):
        self.make_cache = make_cache
        self.on_close = [on_close] if on_close else []  # the mode's end of the run: logs, files (in order)
        self.tracker = tracker
        self.owner = owner          # the config's owner token of the model clone this run belongs to
        self.names: dict = {}       # cond uuid -> stable branch name for this run (shared by the lanes)
        self.calls = 0              # model calls (a run whose stack was never entered is reported)
        self.disabled: Optional[str] = None  # why this run stopped caching (it then computes every step)
        self.may_skip = may_skip    # whether the mode may skip the stack at all (ComfyUI's memory compiler asks)
        self.slots: list = []       # the dit slots GCache patched (hooks.py sets them; foreign.py checks each call)
        self.replaced: list = []    # GCache's block forwards another node's object patch replaced (said at the start)
        self.alloc_context: Optional[Callable] = None  # where the caches make what they keep (memory_compiler.py)
        self.uncached: set = set()  # patch signatures of calls that left the stack unpaired: they compute
        self.windows: set = set()   # the (frames, anchor) of the context windows the run's calls ran (Windowed)
        self.context_handler = False  # the sampler's model_options carry ComfyUI's context windows (hooks.py sets it)
        self._unnamed: set = set()  # (callbacks, sigma, branches) of calls under a context handler naming no window
        self.selfcheck = None       # a run that computes every step: its self-check of the skip path (selfcheck.py)
        self.off_for_call: Callable = contextlib.nullcontext  # around a call that skips in a run that may not
        #                                                       (the self-check's replay; memory_compiler.py)
        # after a run that finished: fn(resample, output), resample(run) samples the same inputs again under another
        # RunState and returns its output (hooks.py; auto's true-loss check of candidate policies, modes/auto.py)
        self.after: list = []
        self._lanes: dict = {}        # "main", or the device of ComfyUI's MultiGPU CFG split -> lane
        self._by_thread: dict = {}    # thread id -> the lane of its current call
        self._lock = threading.Lock()

    def lane(self) -> _Lane:
        """The lane of the calling thread (set by its begin_call)."""
        ln = self._by_thread.get(threading.get_ident())
        return ln if ln is not None else self._lane_for("main")

    def _lane_for(self, key) -> _Lane:
        with self._lock:
            ln = self._lanes.get(key)
            if ln is None:
                ln = self._lanes[key] = _Lane(self.make_cache())
                if self.alloc_context is not None:
                    ln.cache.alloc_context = self.alloc_context
            self._by_thread[threading.get_ident()] = ln
        return ln

    @property
    def cache(self) -> ResidualCache:
        """This thread's cache (the only one unless ComfyUI calls the model on several devices)."""
        return self.lane().cache

    # ---------------------------------------------------------------- per model call
    def begin_call(self, sigma: float, transformer_options: Optional[dict], patches: str = "") -> int:
        """A model call starts. `patches`: the signature of the block patches this call has that the run's plain
        calls don't (foreign.py); such a call is a Variant branch of its conds."""
        # a lane per device: the MultiGPU CFG split names the device of each call (its pool threads live as long
        # as the run, but the device is what a cache must follow)
        ln = self._lane_for((transformer_options or {}).get("multigpu_thread_device", "main"))
        if ln.entered:  # the last call raised between entering and leaving the stack: nothing half-entered carries over
            ln.cache.abort()
            ln.entered = False
        step = self.tracker.step(sigma)
        ln.cache.set_step(step)
        try:
            window = window_of(transformer_options)
        except GCacheError as e:
            window = None
            self.disable(str(e))
        with self._lock:  # the lanes share the cond names
            keys = branch_keys(transformer_options, self.names)
            if window is not None:  # ComfyUI's context windows: one call per window, each a branch of its own
                keys = [Windowed(k, *window) for k in keys]
                self.windows.add(window)
            ln.branches = [Variant(k, patches) for k in keys] if patches else keys
            if window is None and self.context_handler and self.disabled is None:
                self._check_unnamed(sigma, ln.branches)  # (another node's patched call, SLG's: a branch of its own)
            self.calls += 1
        ln.compute, ln.patches, ln.in_slot = True, patches, None
        ln.through = patches in self.uncached
        return step

    def _check_unnamed(self, sigma: float, keys: list) -> None:
        """Context windows that do not name their window (a ComfyUI that stopped putting it in transformer_options)
        call the model for the same conds more than once at one sigma: their windows would share one residual, and a
        skipped step would hand every window the last one's. Caching stops at the second such call, on the first
        step, before anything skips. Calls are told apart by the sampler's callbacks so far: Heun's correction at
        σ_{i+1} comes before step i's callback, step i + 1's own call at that σ after it."""
        call = (self.tracker.done, sigma, tuple(keys))
        if call in self._unnamed:
            self.disable("ComfyUI's context windows called the model twice for the same conds at one step without "
                         "naming the window (transformer_options['context_window']), so GCache cannot keep each "
                         "window's residual apart")
        self._unnamed.add(call)

    def end_call(self) -> bool:
        """The model call of this thread returned. True when it must run again: it entered the stack through
        GCache's first block, skipped it, and never reached GCache's last block (another node replaced it for the
        call), so h + δ was never put back. The repeat computes every block; calls with the same patches compute
        for the rest of the run. Never an error, and nothing half-entered is left for the next call."""
        ln = self.lane()
        if not ln.entered:
            return False
        redo = not ln.compute
        self._unpaired(ln)
        ln.through = redo
        return redo

    def _mismatch(self, ln: _Lane, error: Exception) -> None:
        """A computed call whose stack output does not match its input's image tokens: never a failed prompt. A call
        with other nodes' patches (they changed the tokens) computes from now on; a plain call stops the caching."""
        ln.cache.abort()
        if not ln.patches:
            self.disable(f"the block stack's output does not match its input ({error})")
            return
        with self._lock:
            new = ln.patches not in self.uncached
            self.uncached.add(ln.patches)
        if new:
            log.warning("GCache: a model call with other block patches (%s) changed the block stack's image tokens "
                        "(%s); calls like it compute every step for the rest of this run.", ln.patches, error)

    def _unpaired(self, ln: _Lane) -> None:
        ln.cache.abort()
        ln.entered = False
        with self._lock:
            new = ln.patches not in self.uncached
            self.uncached.add(ln.patches)
        if new and ln.patches:
            log.warning("GCache: a model call with other block patches (%s) entered the block stack through GCache's "
                        "first block but did not leave it through GCache's last block (another node replaced that "
                        "block's patch for the call); calls like it compute every step for the rest of this run.",
                        ln.patches)
        elif new and self.replaced:  # another node's object patch replaced a GCache block: said at the run's start
            log.info("GCache: a model call left the block stack without GCache's last block (another node replaced "
                     "its forward: %s); calls like it compute every step for the rest of this run.",
                     ", ".join(self.replaced[:4]))
        elif new:  # a plain call: the model's own loop skipped GCache's last patch (a changed ComfyUI)
            log.warning("GCache: a model call entered the block stack through GCache's first block but did not leave "
                        "it through GCache's last block: this model's block loop did not call the patch GCache set on "
                        "its last block; every call computes for the rest of this run. Please report this model and "
                        "ComfyUI version.")

    def disable(self, reason: str) -> None:
        """Stop caching for the rest of this run (every step computes), loudly, instead of failing the prompt."""
        if self.disabled is None:
            self.disabled = reason
            log.error("GCache: %s; this run computes every step. Please report this model and ComfyUI version.",
                      reason)

    # ---------------------------------------------------------------- the one block-stack gate
    def gate(self, x, run_block: Callable[[Any], Any], first: bool, last: bool, layout: Layout = Layout.ALL,
             tokens: Callable[[Any], Any] = _same, passed: Callable[[Any], Any] = _same,
             img_slice=None, where: str = "") -> Any:
        """One block of the stack (or the whole model, for the fallback) under the policy.

        x: the block's stream (tokens batch first, or a tuple of such streams); run_block(x) calls the original
        block with it; tokens(out) is the output's stream; passed(y) is what the block returns when it is skipped
        and the stream is y; img_slice: where ComfyUI says the image tokens are (None: the layout says). The first
        block decides (compute or skip), the last one leaves the cache: on a computed step it stores δ from the
        real output, on a skipped step it returns h + δ. Middle blocks pass through.
        """
        if self.disabled is not None:
            return run_block(x)
        ln = self.lane()
        if ln.through:
            return run_block(x)
        if first:
            if ln.entered:  # entered twice without leaving (a model that runs its stack twice per call)
                self._unpaired(ln)
                return run_block(x)
            with (self.alloc_context or contextlib.nullcontext)():  # held to the last block (LTX-2 packs a copy)
                h = streams.take_image(x, layout, None, img_slice, where)
            ln.n_img = h.shape[1]
            ln.compute = ln.cache.enter(h, ln.branches)
            ln.entered = True
            if not ln.compute:
                x = streams.clone(x)  # skipped: callers may add into what the blocks pass on (Wan VACE hints)
        elif not ln.entered:
            # this call did not enter the stack through GCache's first block (another node replaced it for the
            # call): GCache does not cache the call, every block computes and nothing is stored
            return run_block(x)
        if ln.compute:
            try:
                out = run_block(x)
            except BaseException:
                ln.cache.abort()  # a failed block call must not leave a half-entered stack behind
                ln.entered = False
                raise
            if last:
                ln.entered = False
                try:
                    ln.cache.exit(streams.take_image(tokens(out), layout, ln.n_img, img_slice, where))
                except (GCacheError, ValueError) as e:  # the stack changed its image tokens: its output stands as is
                    self._mismatch(ln, e)
            return out
        if not last:
            return passed(x)
        ln.entered = False
        return passed(streams.put_image(x, layout, ln.cache.exit(None), img_slice, where))

    # ---------------------------------------------------------------- end of the run
    def close(self, ok: bool = True) -> CacheStats:
        """Release every lane's tensors, then let the mode finish the run (ok: sampling finished). Returns the
        run's statistics, merged over the lanes."""
        stats = CacheStats.merged([ln.cache.close() for ln in self._lanes.values()]) if self._lanes else CacheStats()
        for fn in self.on_close:
            fn(self, stats, ok)
        return stats


def activate(run: RunState):
    """Make `run` the live run of its owner for the duration of a sampling run (returns a reset token)."""
    with _LIVE_LOCK:
        _LIVE.setdefault(run.owner, []).append(run)
    return _RUNS.set({**_RUNS.get(), run.owner: run}), run


def deactivate(token) -> None:
    var_token, run = token
    _RUNS.reset(var_token)
    with _LIVE_LOCK:
        live = _LIVE.get(run.owner, [])
        if run in live:
            live.remove(run)
        if not live:
            _LIVE.pop(run.owner, None)


def current_run(owner: str) -> Optional[RunState]:
    """The live run of the model clone `owner` (a token string), or None when it is sampled without our
    OUTER_SAMPLE wrapper, e.g. by a node that calls the model directly."""
    run = _RUNS.get().get(owner)
    if run is not None:
        return run
    live = _LIVE.get(owner)  # a thread ComfyUI started inside the run (MultiGPU CFG split)
    if not live:
        return None
    if len(live) > 1:
        raise GCacheError("Two sampling runs of one GCache-patched model are live at once and a model call came from "
                          "a thread that belongs to neither, so GCache cannot tell which run it is. Sample the model "
                          "in one run at a time, or give each run its own GCache Apply.")
    return live[0]


# ------------------------------------------------------------------------------ dit replace patches
def make_dit_patch(slot: BlockSlot, owner: str, inner: Optional[Callable] = None) -> Callable:
    """patches_replace["dit"] patch: patch(args, {"original_block": fn}) -> dict of the block's outputs.

    `inner`: another node's patch that held the slot (foreign.py): GCache's gate calls it as the block,
    inner(args, extra), instead of the original block. The patch carries its slot, owner and inner (foreign.py
    tells GCache's patches from others' by them)."""
    stack = slot.stack
    key = (stack.key, slot.index)
    joint = stack.layout in streams.JOINT
    where = f"{stack.key} ({stack.attr})"
    # a loop that runs one cond per call may pass [tokens, dim]: the engine sees it as a batch of one
    lift, drop = (_same, _same) if stack.batched else ((lambda t: t[None]), (lambda t: t[0]))

    def patch(args: dict, extra: dict) -> dict:
        original = extra["original_block"] if inner is None else (lambda a: inner(a, extra))
        run = current_run(owner)
        if run is None or run.disabled is not None:
            return original(args)
        ln = run.lane()
        if ln.in_slot == key:  # called by the patch GCache's gate runs in this slot (it chains to ours): one gate
            return original(args)
        x = args.get("img")
        if not streams.is_stream(x):
            run.disable(f"the {where} blocks of this model pass {type(x).__name__} as 'img', not token tensors")
            return original(args)
        if not stack.batched and len(run.lane().branches) > 1:
            run.disable(f"the {where} blocks of this model take one cond per call, but this call batches "
                        f"{len(run.lane().branches)}")
            return original(args)
        xs = lift(x)

        def passed(y):  # a skipped block hands its stream on (and the text stream, where it has one)
            return {"img": drop(y), "txt": args["txt"]} if "txt" in args else {"img": drop(y)}

        def run_block(y):  # y is the stream unless the first block of a skipped step cloned it
            return original(args if y is xs else dict(args, img=drop(y)))

        topts = args.get("transformer_options") or {}
        ln.in_slot = key
        try:
            return run.gate(xs, run_block, slot.first, slot.last, stack.layout, tokens=lambda out: lift(out["img"]),
                            passed=passed, img_slice=topts.get("img_slice") if joint else None, where=where)
        finally:
            ln.in_slot = None

    patch.gcache_slot, patch.gcache_owner, patch.gcache_inner = key, owner, inner
    return patch


# ------------------------------------------------------------------------------ object-patched forwards
def make_gated_forward(slot: BlockSlot, original: Callable, owner: str, chained: bool = False) -> Callable:
    """A block `forward` for families without dit replace: same signature, gated by the run. `chained`: `original`
    is another node's object patch of this forward (GCache wraps it), not the block's own forward."""
    call = slot.stack.call
    arg, bd = call.arg, call.batch_dim
    where = f"{slot.stack.key} ({slot.stack.attr})"

    def with_x(a, kw, x):
        if isinstance(arg, str):
            return a, dict(kw, **{arg: x})
        return a[:arg] + (x,) + a[arg + 1:], kw

    def to_engine(t):  # the engine keeps the batch first (Cosmos 1 passes T H W B D)
        return t.movedim(bd, 0) if bd else t

    def from_engine(t):
        return t.movedim(0, bd) if bd else t

    def forward(*a, **kw):
        run = current_run(owner)
        if run is None or run.disabled is not None:
            return original(*a, **kw)
        x = kw.get(arg) if isinstance(arg, str) else (a[arg] if len(a) > arg else None)
        if not streams.is_stream(x):
            run.disable(f"the {where} blocks of this model were called without token tensors as {arg!r}")
            return original(*a, **kw)

        def run_block(y):
            a2, kw2 = with_x(a, kw, from_engine(y))
            return original(*a2, **kw2)

        def passed(y):  # HiDream's double-stream blocks return (image, text)
            return (from_engine(y), kw[call.returns_text]) if call.returns_text else from_engine(y)

        topts = kw.get("transformer_options") or {}
        return run.gate(to_engine(x), run_block, slot.first, slot.last, slot.stack.layout,
                        tokens=lambda out: to_engine(out[0] if isinstance(out, tuple) else out), passed=passed,
                        img_slice=topts.get("img_slice") if slot.stack.layout in streams.JOINT else None,
                        where=where)

    forward.gcache_slot, forward.gcache_owner, forward.gcache_inner = slot.child, owner, original if chained else None
    return forward
