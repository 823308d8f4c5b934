"""ComfyUI's memory compiler, found by feature detection, in each generation GCache knows. Imports ComfyUI only
inside functions.

Newer ComfyUI records the allocations of a model's forward, block by block (comfy.model_prefetch: malloc_graph_begin /
end around the block loops of LTX-2, MiniMax H3 and Qwen-Image 2.1, an iterate per block), and expects the same
pattern every step; anything a patch keeps past the block that made it is what the compiler aborts on, natively
("aimdo memory compile error"). The compiler is on when `malloc_graph_enabled(device)` says so; in every generation
`--disable-comfy-compiler` (args.disable_comfy_compiler) turns it off, and that function reads the flag on every
call. The generations (docs/families.md names which were verified against what):
- none: no comfy.model_prefetch (0.3.64), or one without `malloc_graph_enabled` (0.33: CUDA graphs of text
  encoders only). find() returns None; nothing to do;
- the per-module graph (public ComfyUI after 0.33): `malloc_graph_enabled`, `malloc_graph_begin(module, device)`,
  a graph kept per module, and no `pause_malloc_graph` (its graphs pause through an internal per-thread registry,
  which is no API to rely on): GCache doesn't make what it keeps across steps outside the recording there, so every
  block-patched run turns the compiler off for itself (Compiler.pause is None);
- the per-thread graph with `pause_malloc_graph()` (the newest): see below.

What GCache does with the newest, per sampling run of a block-patched model:
- every tensor GCache keeps across steps (the engine's δ snapshots and stored residuals, the profile's history) is
  made under `pause_malloc_graph()`: the engine's and recorder's allocation context (core/engine.py `alloc_context`),
  and so is the block stack's input GCache packs at the first block and holds to the last (LTX-2's video and audio
  streams as one tensor; runtime.py `gate`);
- a run that may skip the block stack (Apply with a policy that has a 0) turns the compiler off for itself, from the
  OUTER_SAMPLE wrapper, and puts the flag back in `finally`: a skipped step runs none of the blocks the compiler
  recorded (its per-block pattern changes whenever the policy does), which no pause can make equal. Runs that compute
  every step (Profile, Auto's first run, an all-ones policy) keep the compiler on, except for the one model call the
  self-check replays through the skip path (selfcheck.py): the compiler is off for that call alone
  (`run.off_for_call`).
In every generation: the flag is process-wide, so the first of overlapping GCache runs saves it and the last puts it
back; a user's own `--disable-comfy-compiler` is respected (GCache never turns the compiler on); the log says which,
once per run. The whole-model fallback caches outside the diffusion model's forward (the APPLY_MODEL wrapper), where
nothing is recorded: nothing to do. Both compiler generations were tested against stand-in modules with these names
(tests/comfyui/test_memory_compiler.py), not against a real ComfyUI tree that has them.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from .adapters import Route

log = logging.getLogger("gcache")
FLAG = "disable_comfy_compiler"  # comfy.cli_args.args attribute of --disable-comfy-compiler


@dataclass(frozen=True)
class Compiler:
    """The names GCache uses, where they exist."""
    enabled: Callable          # malloc_graph_enabled(device) -> bool
    pause: Optional[Callable]  # pause_malloc_graph() -> context manager; None: the per-module graph, without one
    args: object               # comfy.cli_args.args (holds FLAG)


def find() -> Optional[Compiler]:
    """The memory compiler's API on this ComfyUI (with or without its pause), or None (no compiler, or its switch
    missing or broken)."""
    try:
        prefetch = importlib.import_module("comfy.model_prefetch")
        args = importlib.import_module("comfy.cli_args").args
    except Exception:  # noqa: BLE001  a ComfyUI without it, or one whose module fails to import: nothing to adapt to
        return None
    enabled, pause = getattr(prefetch, "malloc_graph_enabled", None), getattr(prefetch, "pause_malloc_graph", None)
    if not callable(enabled) or not hasattr(args, FLAG):
        return None
    return Compiler(enabled, pause if callable(pause) else None, args)


class _Holds:
    """GCache runs that hold the compiler off (process-wide: the flag is), with the value they found."""

    def __init__(self):
        self.lock = threading.Lock()
        self.count = 0
        self.saved = False

    def user_flag(self, args) -> bool:
        """The flag as the user set it (while GCache holds the compiler off, the value it found)."""
        with self.lock:
            return self.saved if self.count else bool(getattr(args, FLAG))

    def acquire(self, args) -> None:
        with self.lock:
            if self.count == 0:
                self.saved = bool(getattr(args, FLAG))
                setattr(args, FLAG, True)
            self.count += 1

    def release(self, args) -> None:
        with self.lock:
            self.count -= 1
            if self.count == 0:
                setattr(args, FLAG, self.saved)


HOLDS = _Holds()


def _in_play(api: Compiler, device) -> bool:
    """Whether the compiler would record this device's forwards (True while another GCache run holds it off)."""
    with HOLDS.lock:
        if HOLDS.count:
            return True
    try:
        return bool(api.enabled(device))
    except Exception:  # noqa: BLE001  an unexpected signature: assume it records, the safe side
        return True


@contextlib.contextmanager
def _off(api: Compiler):
    """The compiler off for what runs inside (one call), then as it was."""
    HOLDS.acquire(api.args)
    try:
        yield
    finally:
        HOLDS.release(api.args)


@contextlib.contextmanager
def for_run(run, route: Route, device):
    """Around one sampling run (hooks.py's OUTER_SAMPLE wrapper): see the module docstring."""
    api = find() if route != Route.FALLBACK else None
    if api is None:
        yield
        return
    if api.pause is not None:
        run.alloc_context = api.pause  # every lane's cache makes what it keeps outside the recording
    if HOLDS.user_flag(api.args):
        log.info("GCache: ComfyUI's memory compiler is off (--disable-comfy-compiler); GCache leaves it off.")
        yield
        return
    if not _in_play(api, device):
        log.debug("GCache: ComfyUI's memory compiler does not record on %s; nothing to change.", device)
        yield
        return
    if api.pause is None:
        why = ("this ComfyUI's compiler has no pause_malloc_graph, the API GCache makes the tensors it keeps across "
               "steps under, outside the recording")
    elif run.may_skip:
        why = ("the steps GCache skips run none of the blocks it records, so its per-step allocation pattern would "
               "change")
    else:
        log.info("GCache: ComfyUI's memory compiler stays on for this run (every step computes); the tensors GCache "
                 "keeps across steps are made outside its recording (pause_malloc_graph), and the self-check's "
                 "replayed calls (the replay and its nudged twin) run with the compiler off.")
        run.off_for_call = lambda: _off(api)  # the self-check's replay skips the blocks the compiler recorded
        yield
        return
    log.info("GCache: ComfyUI's memory compiler is off for this run: %s; it is back on when sampling ends "
             "(--disable-comfy-compiler keeps it off for good).", why)
    with _off(api):
        yield
