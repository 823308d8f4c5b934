"""The engine's side of the self-check (the skip path replayed on a computed call). Torch only.

A run that computes every step can prove that skipping would be right: it keeps the residual δ = z − h of one model
call's block-stack passes (`ResidualCache.hold()`), then the caller runs the same call again (`replay()`), and on
that second call every stack entry skips with the δ of the computed pass of the same order, so its last block
returns h + δ by the very code a skipped step runs. The replay is invisible to the run: the engine's statistics,
its stored residuals and its observers (the profile recorder, the clocks) see nothing of it. `release()` drops the
held tensors and says what was counted: a replay whose stack entries and exits do not match the computed call's
passes tells that GCache's patches were not where the model's stack is (ReplayBroken, or the counts).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Optional, Sequence

import torch

from .errors import GCacheError
from .selfcheck import nudged


class ReplayBroken(GCacheError):
    """The replay's passes through the block stack do not match the computed call's: the skip path can't be right."""


@dataclass
class ReplayCount:
    """What one held call and its replay did at the block stack."""
    held_entries: int = 0   # stack entries of the computed call
    held: int = 0           # its passes that left the stack (their δ is held)
    entries: int = 0        # stack entries of the replay
    exits: int = 0          # ... and exits
    dtype: Optional[torch.dtype] = None  # the stream's dtype (the held δ's)


class HeldCall:
    """The δ of each computed stack pass of one model call, in order, and its replay."""

    def __init__(self):
        self.passes: list[tuple[list, int, Optional[int], list[torch.Tensor]]] = []  # (keys, chunks, step, δ per chunk)
        self.count = ReplayCount()
        self.replaying = False
        self.nudge = 0.0  # a replay of the rounding floor: h + δ moved by ±nudge·max(|h|, |h + δ|) (selfcheck.nudged)
        self._pending: Optional[tuple] = None  # (h, keys, chunks, step, δ per chunk) of the replayed entry

    # ---------------------------------------------------------------- the computed call
    def entered(self) -> None:
        self.count.held_entries += 1

    def keep(self, keys: Sequence[Hashable], chunks: int, step: Optional[int], deltas: Sequence[torch.Tensor]) -> None:
        """One computed pass's δ per chunk at `step` (tensors the engine no longer writes: its own or an observer's)."""
        self.passes.append((list(keys), chunks, step, list(deltas)))
        self.count.held += 1
        self.count.dtype = deltas[0].dtype

    # ---------------------------------------------------------------- the replay
    def enter(self, h: torch.Tensor, keys: Sequence[Hashable], chunks: int) -> None:
        """A replayed stack entry: it will skip with the δ of the computed pass of the same order."""
        i = self.count.entries
        self.count.entries += 1
        if self._pending is not None:
            raise ReplayBroken("the replay entered the block stack again before leaving it")
        if i >= len(self.passes):
            raise ReplayBroken(f"the replay entered the block stack {i + 1} times, the computed call left it "
                               f"{len(self.passes)} times")
        held_keys, held_chunks, step, deltas = self.passes[i]
        parts = h.chunk(chunks, 0) if chunks > 1 else (h,)
        if list(keys) != held_keys or chunks != held_chunks or \
                any(p.shape != d.shape or p.dtype != d.dtype
                    for p, d in zip(parts, deltas)):  # (δ's device: cache_device)
            raise ReplayBroken(f"the replay's block-stack input {tuple(h.shape)} {h.dtype} does not match the "
                               f"computed call's ({[tuple(d.shape) for d in deltas]})")
        if self.nudge:
            deltas = [nudged(p, d, self.nudge, 64 * i + j) for j, (p, d) in enumerate(zip(parts, deltas))]
        self._pending = (h, list(keys), chunks, step, deltas)

    def exit(self) -> tuple:
        """The pending replayed entry (h, keys, chunks, step, δ per chunk): the engine's skip path makes its h + δ."""
        if self._pending is None:
            raise ReplayBroken("the replay left the block stack without entering it (the first block's patch was "
                               "not called)")
        pending, self._pending = self._pending, None
        self.count.exits += 1
        return pending

    def abort(self) -> None:
        self._pending = None

    def again(self, nudge: float) -> None:
        """Make the replay once more from the first pass, its h + δ nudged by `nudge` units (the floor's replay)."""
        self.count.entries = self.count.exits = 0
        self._pending = None
        self.nudge = float(nudge)
