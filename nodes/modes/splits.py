"""The one owner of half-recorded split profiles (Wan 2.2's two experts: two samplers, two model clones, one profile
file). No ComfyUI import at module level.

Module-level because the two halves belong to different clones; keyed by profile file. Lifetime: the prompt that
started them. Every sampling run of any GCache clone first calls `SPLITS.expire()` (once, in ModeConfig.start_run,
base.py): a new prompt drops what an earlier one left (an abandoned half keeps its residual history, possibly on the
GPU) as soon as any GCache node samples, and a new first half replaces an older one of the same file. Profile runs
(profile.py) are the only ones that put and take halves.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

from ...core.recorder import ProfileRecorder
from ..patching.steps import Schedule

log = logging.getLogger("gcache")


@dataclass
class Half:
    """The first part of a split schedule, recorded, waiting for the sampler of the remaining steps."""
    recorder: Optional[ProfileRecorder]  # None: a duplicate run, recorded by nobody
    key: str                             # the sample key of the whole run (taken in its first part)
    end: int                             # the global step the next part must start at
    sigmas: list[float]                  # the full schedule
    prompt: Optional[str]


class PendingSplits:
    """Half-recorded split profiles by profile file (module docstring)."""

    def __init__(self, prompt_id: Callable[[], Optional[str]]):
        self.prompt_id = prompt_id
        self._halves: dict[str, Half] = {}

    def expire(self) -> None:
        now = self.prompt_id()
        for path in [p for p, h in self._halves.items() if now is not None and h.prompt != now]:
            log.info("GCache Profile: dropping the unfinished split recording of %s from an earlier prompt.",
                     os.path.basename(path))
            del self._halves[path]

    def continues(self, path: str, sched: Schedule) -> bool:
        h = self._halves.get(path)
        return h is not None and h.end == sched.offset and h.sigmas == sched.sigmas

    def take(self, path: str, sched: Schedule) -> Optional[Half]:
        return self._halves.pop(path) if self.continues(path, sched) else None

    def put(self, path: str, half: Half) -> None:
        self._halves[path] = half  # one per profile file; halves of earlier prompts are dropped by expire()

    def __len__(self) -> int:
        return len(self._halves)


def current_prompt() -> Optional[str]:
    """The id of the prompt ComfyUI is running (None outside one, or where ComfyUI does not say)."""
    try:
        from comfy_execution.utils import get_executing_context
    except ImportError:  # an older ComfyUI: halves then live until consumed or replaced
        return None
    ctx = get_executing_context()
    return getattr(ctx, "prompt_id", None) if ctx is not None else None


SPLITS = PendingSplits(current_prompt)
