"""What the engine tells its collaborators about each pass through the block stack: EngineObserver.

ResidualCache (engine.py) is the skip engine only. A profile run records every computed step's residual
(ProfileRecorder, recorder.py) and times its steps and block stack (StepClock, step_clock.py; Apply runs time their
steps too, for the measured speed-up): both are observers the run plugs in, `ResidualCache(mask, observers=(...))`.

Why observers of the one engine, not a separate "profiling stack" with the engine's interface: a profile must
attribute calls exactly as Apply does (one step-attribution function for both: docs/nodes.md, "How the nodes hook
into ComfyUI"), so recording reuses the engine's step attribution, its split of a call into branches, its shape
checks and its statistics instead of a copy of them; and an observed engine may still skip (the engine's oracle tests
record under a mask). For its observers the engine keeps two duties: it calls them at fixed points of its timeline
(below), and when one of them reads h it snapshots h as it entered and forms δ as a tensor of its own on every
computed step (some families' blocks write into their input: LTXV's `x +=`, Chroma's `addcmul_`; engine.py enter).

Timeline of one stack entry at a known step (no hook runs for a call without a step):
    on_enter(step, h)             first thing in enter(), before the engine's decision and its snapshot of h
    on_blocks(step)               the end of enter(): the caller runs the blocks now (on a skipped step too)
    on_blocks_done(step)          exit() of a computed step, before δ is formed
    on_residual(step, key, h, δ)  per branch, to observers that read h: h as it entered, δ = z − h; neither may be
                                  written, and the engine may reuse both after the call (copy what you keep)
    on_exit(step)                 the engine is done with this computed step's residuals
    on_close(stats)               once, at close(): add what was observed to the run's CacheStats
Each point calls the observers in the order given, only those that do something there (`hooks`: the engine
finds them once). The hooks run on the sampling hot path: the clocks' take no host sync (CUDA events, read at
close); the recorder's work is the profile's own, timed as such (between a StackClock's "out" and "rec").
"""
from __future__ import annotations

from typing import Hashable, Sequence

import torch


class EngineObserver:
    """A collaborator of ResidualCache (module docstring). Subclasses override the points they need."""

    reads_h = False  # True: needs h as it entered and δ of every computed step (on_residual)

    def on_enter(self, step: int, h: torch.Tensor) -> None:
        pass

    def on_blocks(self, step: int) -> None:
        pass

    def on_blocks_done(self, step: int) -> None:
        pass

    def on_residual(self, step: int, branch: Hashable, h: torch.Tensor, delta: torch.Tensor) -> None:
        pass

    def on_exit(self, step: int) -> None:
        pass

    def on_close(self, stats) -> None:
        pass


def hooks(observers: Sequence[EngineObserver], point: str) -> tuple:
    """The bound `point` methods (e.g. "on_blocks") of the observers that do something there, in order."""
    return tuple(getattr(o, point) for o in observers
                 if getattr(type(o), point, None) is not getattr(EngineObserver, point))
