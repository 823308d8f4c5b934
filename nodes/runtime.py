"""Per-run state and the block-stack gate. No ComfyUI import (hooks.py wires these into a ModelPatcher).

A RunState lives for one sampling run (created in the OUTER_SAMPLE wrapper, closed in its `finally`). It
owns the core ResidualCache and the StepTracker. Each model call: `begin_call` sets the step; every block of
the stack (dit patch, object-patched forward) and the whole-model fallback go through one gate, `gate`.
Patches know their model clone by an owner token (its config's, kept in transformer_options) and find its live
run in a context variable set by the OUTER_SAMPLE wrapper; so block calls that carry no transformer_options
(Wan S2V, object-patched blocks) work too, and no tensor ever sits in model_options, which ModelPatcher.clone
deep-copies.
"""
from __future__ import annotations

import contextvars
from typing import Any, Callable, Optional

import torch

from ..core.engine import ResidualCache
from .adapters import BlockSlot, Layout, put_image, take_image
from .steps import StepTracker

_RUNS: contextvars.ContextVar = contextvars.ContextVar("gcache_runs", default={})


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


class RunState:
    """One sampling run of one patched model clone: the engine's cache, the step tracker, the current call."""

    def __init__(self, cache: ResidualCache, tracker: StepTracker, owner: str):
        self.cache = cache
        self.tracker = tracker
        self.owner = owner          # the config's owner token of the model clone this run belongs to
        self.branches: list = ["all"]
        self.names: dict = {}       # cond uuid -> stable branch name for this run
        self.compute = True
        self.n_img = 0
        self.calls = 0              # model calls (a run whose stack was never entered is reported)

    # ---------------------------------------------------------------- per model call
    def begin_call(self, sigma: float, transformer_options: Optional[dict]) -> int:
        step = self.tracker.step(sigma)
        self.cache.set_step(step)
        self.branches = branch_keys(transformer_options, self.names)
        self.compute = True
        self.calls += 1
        return step

    # ---------------------------------------------------------------- the one block-stack gate
    def gate(self, x: torch.Tensor, run_block: Callable[[torch.Tensor], Any], first: bool, last: bool,
             layout: Layout = Layout.ALL, tokens: Callable[[Any], torch.Tensor] = _same,
             passed: Callable[[torch.Tensor], Any] = _same) -> Any:
        """One block of the stack (or the whole model, for the fallback) under the policy.

        x: the block's token input, batch first; run_block(x) calls the original block with it; tokens(out) is
        the output's token tensor (batch first); passed(y) is what the block returns when it is skipped and the
        stream is y. The first block decides (compute or skip), the last one leaves the cache: on a computed step
        it stores δ from the real output, on a skipped step it returns h + δ. Middle blocks pass through.
        """
        if first:
            self.n_img = x.shape[1]
            self.compute = self.cache.enter(x, self.branches)
            if not self.compute:
                x = x.clone()  # skipped: callers may add into what the blocks pass on (Wan VACE hints)
        if self.compute:
            try:
                out = run_block(x)
            except BaseException:
                self.cache.abort()  # a failed block call must not leave a half-entered stack behind
                raise
            if last:
                self.cache.exit(take_image(tokens(out), layout, self.n_img))
            return out
        return passed(put_image(x, layout, self.cache.exit(None)) if last else x)


def activate(run: RunState):
    """Make `run` the live run of its owner for the duration of a sampling run (returns a reset token)."""
    return _RUNS.set({**_RUNS.get(), run.owner: run})


def deactivate(token) -> None:
    _RUNS.reset(token)


def current_run(owner: str) -> Optional[RunState]:
    """The live run of the model clone `owner` (a token string), or None when it is sampled without our
    OUTER_SAMPLE wrapper, e.g. by a node that calls the model directly."""
    return _RUNS.get().get(owner)


# ------------------------------------------------------------------------------ dit replace patches
def make_dit_patch(slot: BlockSlot, owner: str) -> Callable:
    """patches_replace["dit"] patch: patch(args, {"original_block": fn}) -> dict of the block's outputs."""
    def patch(args: dict, extra: dict) -> dict:
        original = extra["original_block"]
        run = current_run(owner)
        if run is None:
            return original(args)

        def passed(y):  # a skipped block hands its stream on (and the text stream, where it has one)
            return {"img": y, "txt": args["txt"]} if "txt" in args else {"img": y}

        def run_block(x):  # x is args["img"] unless the first block of a skipped step cloned it
            return original(args if x is args["img"] else dict(args, img=x))

        return run.gate(args["img"], run_block, slot.first, slot.last,
                        slot.stack.layout, tokens=lambda out: out["img"], passed=passed)

    return patch


# ------------------------------------------------------------------------------ object-patched forwards
def make_gated_forward(slot: BlockSlot, original: Callable, owner: str) -> Callable:
    """A block `forward` for families without dit replace: same signature, gated by the run."""
    call = slot.stack.call
    arg, bd = call.arg, call.batch_dim

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
        if run is None:
            return original(*a, **kw)

        def run_block(x):
            a2, kw2 = with_x(a, kw, from_engine(x))
            return original(*a2, **kw2)

        def passed(y):  # HiDream's double-stream blocks return (image, text)
            return (from_engine(y), kw[call.returns_text]) if call.returns_text else from_engine(y)

        x = kw[arg] if isinstance(arg, str) else a[arg]
        return run.gate(to_engine(x), run_block, slot.first, slot.last, slot.stack.layout,
                        tokens=lambda out: to_engine(out[0] if isinstance(out, tuple) else out), passed=passed)

    return forward
