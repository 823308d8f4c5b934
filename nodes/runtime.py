"""Per-run state and the block-stack gates. No ComfyUI import (hooks.py wires these into a ModelPatcher).

A RunState lives for one sampling run (created in the OUTER_SAMPLE wrapper, closed in its `finally`). It
owns the core ResidualCache and the StepTracker. Each model call: `begin_call` sets the step; the first
block of the stack calls `enter` (compute or skip); middle blocks pass through on a skip; the last block
calls `leave`. Patches know their model clone by a token (the holder's, kept in transformer_options) and
find its live run in a context variable set by the OUTER_SAMPLE wrapper; so block calls that carry no
transformer_options (Wan S2V, object-patched blocks) work too, and no tensor ever sits in model_options,
which ModelPatcher.clone deep-copies.
"""
from __future__ import annotations

import contextvars
from typing import Callable, Optional

import torch

from ..core.engine import ResidualCache
from .adapters import BlockSlot, put_image, take_image
from .steps import StepTracker

_RUNS: contextvars.ContextVar = contextvars.ContextVar("gcache_runs", default={})


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
    def __init__(self, cache: ResidualCache, tracker: StepTracker, owner: str):
        self.cache = cache
        self.tracker = tracker
        self.owner = owner          # token of the model clone this run belongs to
        self.branches: list = ["all"]
        self.names: dict = {}       # cond uuid -> stable branch name for this run
        self.compute = True
        self.n_img = 0
        self.calls = 0

    # ---------------------------------------------------------------- per model call
    def begin_call(self, sigma: float, transformer_options: Optional[dict]) -> int:
        step = self.tracker.step(sigma)
        self.cache.set_step(step)
        self.branches = branch_keys(transformer_options, self.names)
        self.compute = True
        self.calls += 1
        return step

    # ---------------------------------------------------------------- block stack
    def enter(self, h: torch.Tensor) -> bool:
        self.n_img = h.shape[1]
        self.compute = self.cache.enter(h, self.branches)
        return self.compute

    def leave(self, z_img: Optional[torch.Tensor]) -> torch.Tensor:
        return self.cache.exit(z_img)

    def abort(self) -> None:
        self.cache.abort()  # a failed block call must not leave a half-entered stack behind


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
    layout = slot.stack.layout

    def patch(args: dict, extra: dict) -> dict:
        original = extra["original_block"]
        run = current_run(owner)
        if run is None:
            return original(args)
        if slot.first and not run.enter(args["img"]):
            args = dict(args, img=args["img"].clone())  # skipped: pass a copy (callers may add in place)
        if run.compute:
            try:
                out = original(args)
            except BaseException:
                run.abort()
                raise
            if slot.last:
                run.leave(take_image(out["img"], layout, run.n_img))
            return out
        out = {"img": args["img"]}
        if "txt" in args:
            out["txt"] = args["txt"]
        if slot.last:
            out["img"] = put_image(args["img"], layout, run.leave(None))
        return out

    return patch


# ------------------------------------------------------------------------------ object-patched forwards
def make_gated_forward(slot: BlockSlot, original: Callable, owner: str, batch_dim: int = 0) -> Callable:
    """A block `forward` for families without dit replace: same signature, gated by the run."""
    arg, layout = slot.stack.arg, slot.stack.layout

    def get_x(a, kw):
        return kw[arg] if isinstance(arg, str) else a[arg]

    def with_x(a, kw, x):
        if isinstance(arg, str):
            return a, dict(kw, **{arg: x})
        return a[:arg] + (x,) + a[arg + 1:], kw

    def to_engine(t):
        return t.movedim(batch_dim, 0) if batch_dim else t

    def from_engine(t):
        return t.movedim(0, batch_dim) if batch_dim else t

    def forward(*a, **kw):
        run = current_run(owner)
        if run is None:
            return original(*a, **kw)
        x = get_x(a, kw)
        if slot.first and not run.enter(to_engine(x)):
            x = x.clone()
            a, kw = with_x(a, kw, x)
        if run.compute:
            try:
                out = original(*a, **kw)
            except BaseException:
                run.abort()
                raise
            if slot.last:
                y = out[0] if isinstance(out, tuple) else out
                run.leave(take_image(to_engine(y), layout, run.n_img))
            return out
        y = x
        if slot.last:
            y = from_engine(put_image(to_engine(x), layout, run.leave(None)))
        if slot.stack.returns_text:
            return y, kw[slot.stack.returns_text]  # HiDream double-stream blocks return (image, text)
        return y

    return forward
