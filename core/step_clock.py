"""Clocks of a sampling run, as observers of the engine (observer.py): StepClock times its sampler steps (Apply runs:
the measured speed-up), StackClock also the block stack inside them (profile runs: the measured io share). No host
syncs while sampling: CUDA events on a GPU, read once at close; perf_counter on the CPU.

Marks: "step" (a step's first stack entry), "snap" (before the engine's snapshot of h, which it takes for the
recorder), "in" / "out" (the block stack), "rec" (after the recording that follows "out"), "end" (close). An
interval counts for the step of the mark it starts at. A StepClock marks only "step" and "end". For a StackClock the
snapshot and the recording are the profile's own work: they count as recording, not as the model's time.
"""
from __future__ import annotations

import time
from typing import Optional

import torch

from .observer import EngineObserver


class StepClock(EngineObserver):
    """Wall time of each sampler step (CacheStats.step_seconds)."""

    def __init__(self):
        self.cuda: Optional[bool] = None  # known at the first stack entry (h's device)
        self.marks: list[tuple[str, Optional[int], object]] = []
        self._last_step: Optional[int] = None

    def mark(self, tag: str, step: Optional[int]) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((tag, step, ev))
        else:
            self.marks.append((tag, step, time.perf_counter()))

    def on_enter(self, step: int, h: torch.Tensor) -> None:
        if self.cuda is None:
            self.cuda = h.device.type == "cuda"
        if step != self._last_step:
            self.mark("step", step)
            self._last_step = step

    def on_close(self, stats) -> None:
        """The run's timings into its statistics (step_seconds; a StackClock's stack_seconds and record_seconds)."""
        if self.cuda is None:
            return  # never entered: nothing timed
        try:
            self.mark("end", None)  # end of the last step
            stats.step_seconds, stats.stack_seconds, stats.record_seconds = self.durations()
        except RuntimeError:  # a CUDA error already in flight: timings are not worth a second failure
            stats.step_seconds = {}

    def durations(self) -> tuple[dict, dict, dict]:
        """Seconds per step: (whole step, block stack, profile recording)."""
        total: dict = {}
        stack: dict = {}
        rec: dict = {}
        if len(self.marks) < 2:
            return total, stack, rec
        if self.cuda:
            self.marks[-1][2].synchronize()
            secs = [a[2].elapsed_time(b[2]) / 1000.0 for a, b in zip(self.marks, self.marks[1:])]
        else:
            secs = [b[2] - a[2] for a, b in zip(self.marks, self.marks[1:])]
        for (tag, step, _), (nxt, _, _), s in zip(self.marks, self.marks[1:], secs):
            total[step] = total.get(step, 0.0) + s
            if tag == "in":
                stack[step] = stack.get(step, 0.0) + s
            elif (tag == "out" and nxt == "rec") or (tag == "snap" and nxt == "in"):
                rec[step] = rec.get(step, 0.0) + s
        return total, stack, rec


class StackClock(StepClock):
    """A StepClock that also times the block stack (stack_seconds) and the profile's own work around it, the
    engine's snapshot of h before and the recording after (record_seconds)."""

    def on_enter(self, step: int, h: torch.Tensor) -> None:
        super().on_enter(step, h)
        self.mark("snap", step)

    def on_blocks(self, step: int) -> None:
        self.mark("in", step)  # the snapshot before it is the profile's own work, not the model's

    def on_blocks_done(self, step: int) -> None:
        self.mark("out", step)

    def on_exit(self, step: int) -> None:
        self.mark("rec", step)
