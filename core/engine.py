"""Residual-reuse engine: the per-run state that skips the block stack on the policy's reuse steps.

Contract with a model (the reference DiT here, family adapters in ComfyUI):
    h = f_in(x)                                   # block-stack input, image tokens, batch = chunks of branches
    compute = cache.enter(h, branches)            # decides for this call
    z = blocks(h) if compute else <anything>      # the caller runs the stack only when told to
    z = cache.exit(z)                             # stores δ = z − h, or returns h + δ_cached on a skip
or simply `z = cache.run(h, branches, blocks)`.

The caller says which sampler step a call belongs to with `set_step(i)` (one step-attribution function for
Apply and Profile). Caches are per branch (CFG cond/uncond, batch chunk); a changed shape/dtype/device resets
them with a warning. `close()` releases every tensor; use the cache as a context manager so that this also
happens when an exception escapes the blocks.

The engine only skips: what a run records (ProfileRecorder) and times (StepClock, StackClock) are observers it is
given (observer.py says why, and when each is told what). mask=None computes every step and keeps nothing: a profile
run, whose observers do the work. A self-check replays one call of such a run through the skip path (`hold`,
`replay`, `release`; replay.py), unseen by the statistics and the observers.

`alloc_context` (a zero-argument callable returning a context manager; none by default) is where every tensor that
outlives the stack entry is made: δ snapshots and stored residuals, what the observers keep from δ and the δ held
for a self-check's replay. A host whose allocator records each block's allocations and expects them gone by the
block's end (ComfyUI's memory compiler, 0.34+) fills it with its pause; the engine itself never imports the host.
"""
from __future__ import annotations

import contextlib
import logging
import statistics
from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional, Sequence

import torch

from . import forecasters
from .errors import GCacheError
from .io_share import IoShare, step_shares
from .observer import EngineObserver, hooks
from .replay import HeldCall, ReplayCount

log = logging.getLogger("gcache")


@dataclass
class CacheStats:
    computed_steps: int = 0
    skipped_steps: int = 0
    block_runs: dict = field(default_factory=dict)  # branch key -> number of block-stack runs
    stack_calls: int = 0
    resets: int = 0
    bytes_held: int = 0
    peak_bytes: int = 0
    step_seconds: dict = field(default_factory=dict)  # step -> wall seconds (a StepClock's, filled at close)
    stack_seconds: dict = field(default_factory=dict)  # step -> seconds in the block stack (a StackClock)
    record_seconds: dict = field(default_factory=dict)  # step -> seconds of profile recording (not the model's)
    decided: dict = field(default_factory=dict)       # step -> whether it computed the stack
    forced_calls: int = 0  # stack calls of skipped steps that computed: their branch had no residual (engine.enter)

    @classmethod
    def merged(cls, parts: Sequence["CacheStats"]) -> "CacheStats":
        """One run's statistics from the caches of its threads (ComfyUI's MultiGPU CFG split: one per device).
        A step computed anywhere counts as computed; the devices ran side by side, so a step took its longest."""
        parts = list(parts)
        if len(parts) == 1:
            return parts[0]
        out = cls()
        for p in parts:
            for step, computed in p.decided.items():
                out.decided[step] = out.decided.get(step, False) or computed
            for k, v in p.block_runs.items():
                out.block_runs[k] = out.block_runs.get(k, 0) + v
            for name in ("step_seconds", "stack_seconds", "record_seconds"):
                for step, t in getattr(p, name).items():
                    getattr(out, name)[step] = max(getattr(out, name).get(step, 0.0), t)
            out.stack_calls += p.stack_calls
            out.forced_calls += p.forced_calls
            out.resets += p.resets
            out.peak_bytes += p.peak_bytes
        out.computed_steps = sum(out.decided.values())
        out.skipped_steps = len(out.decided) - out.computed_steps
        return out

    def summary(self, io_share: Optional["IoShare | float"] = None) -> str:
        n = self.computed_steps + self.skipped_steps
        parts = [f"computed {self.computed_steps}/{n} steps, skipped {self.skipped_steps}"]
        if io_share is not None and n:
            io = io_share if isinstance(io_share, IoShare) else IoShare(float(io_share), source="given")
            parts.append(io.describe_speedup(n, self.computed_steps))
        parts.append(self.describe_measured())
        parts.append(f"cache peak {format_bytes(self.peak_bytes)}")
        return "GCache: " + ", ".join(p for p in parts if p)

    def io_step_shares(self) -> list[float]:
        """Io share of each timed step of a profile run (core/io_share.py: the first and last left out, the
        profile's own snapshot and recording out of the step); empty when the stack was not timed."""
        return step_shares(self.step_seconds, self.stack_seconds, self.record_seconds)

    def step_medians(self) -> Optional[tuple[float, float, int, int]]:
        """(median computed step, median skipped step, how many of each) in seconds, over the steps between the first
        (warm-up) and the last; None without a computed and a skipped step there. The last step is never one of them:
        it ends with the run, without a next step's model call, so it is shorter than the others, and as the only
        computed step timed (K = 2 computing the first and the last) it made the measured speed-up low."""
        steps = sorted(s for s in self.step_seconds if s is not None)[1:-1]
        comp = [self.step_seconds[s] for s in steps if self.decided.get(s) is True]
        skip = [self.step_seconds[s] for s in steps if self.decided.get(s) is False]
        if comp and skip:
            return statistics.median(comp), statistics.median(skip), len(comp), len(skip)
        return None

    def measured_speedup(self) -> Optional[float]:
        """N / (K + (N − K)·r), r = median skipped step / median computed step of this run's own timings (the steps
        between the first and the last, step_medians): the speed-up over computing every step at this run's step
        costs. 1.0 when every step computed; None when too few steps were timed. One run's figure, from its own few
        computed steps: it strays further than the predicted range (core/io_share.py) does."""
        n, k = self.computed_steps + self.skipped_steps, self.computed_steps
        if n and k == n and self.step_seconds:
            return 1.0
        m = self.step_medians()
        if not n or m is None or m[0] <= 0:
            return None
        return n / (k + (n - k) * m[1] / m[0])

    def describe_measured(self) -> str:
        """'measured 1.80× (this run's steps: medians of 2 computed and 8 skipped, first and last left out)', or why
        not."""
        ms = self.measured_speedup()
        if ms is None:
            return "measured: too few steps timed (a computed and a skipped one between the first and the last)" \
                if self.step_seconds and self.skipped_steps else ""
        m = self.step_medians()
        if m is None:
            return f"measured {ms:.2f}× (every step computed)"
        return f"measured {ms:.2f}× (this run's steps: medians of {m[2]} computed and {m[3]} skipped, first and " \
               "last left out)"


class ResidualCache:
    """Per-run residual reuse state. Create one per sampling run; never share it between runs or models."""

    def __init__(self, mask: Optional[Sequence[int]], cache_device: Optional[str | torch.device] = None,
                 forecast: "str | int | forecasters.Forecaster" = "reuse", times: Optional[Sequence[float]] = None,
                 forecast_params: Optional[dict] = None, observers: Sequence[EngineObserver] = (),
                 alloc_context: Optional[Callable[[], contextlib.AbstractContextManager]] = None):
        if mask is not None:
            mask = [int(v) for v in mask]
            if not mask or mask[0] != 1 or any(v not in (0, 1) for v in mask):
                raise GCacheError("ResidualCache needs a 0/1 mask whose first entry is 1.")
        self.forecaster = forecasters.get(forecast)
        if self.forecaster.keeps > 1 and (mask is None or times is None or len(times) != len(mask)):
            raise GCacheError("Forecasting needs the policy's mask and the normalized time of each of its steps.")
        self.mask = mask
        self.forecast_params = dict(forecast_params or {})
        self.times = [float(t) for t in times] if times is not None else None
        # Steps whose δ a later skipped step uses: the last `keeps` computed steps before each skip.
        self._needed = forecasters.needed_steps(mask, self.forecaster.keeps) if mask is not None else set()
        # per step, the last computed step before it: a skipped step reuses a branch's δ only if the branch was
        # computed there or later (a context window that moved away and back has only an older δ: it computes)
        self._fresh_from = last_computed_before(mask) if mask is not None else []
        self.cache_device = torch.device(cache_device) if cache_device is not None else None
        self.observers = tuple(observers)  # told about each stack entry (observer.py), in this order
        self.alloc_context = alloc_context or contextlib.nullcontext  # where kept tensors are made (module doc)
        # per point of the timeline, the hooks of the observers that do something there: the hot path calls no other
        self._on_enter, self._on_blocks, self._on_blocks_done, self._on_exit = (
            hooks(self.observers, p) for p in ("on_enter", "on_blocks", "on_blocks_done", "on_exit"))
        self._on_residual = tuple(o.on_residual for o in self.observers if o.reads_h)  # given h and δ of computed steps
        self.stats = CacheStats()
        self.step: Optional[int] = None
        # key -> kept (step, δ), latest last
        self._deltas: dict[Hashable, list[tuple[Optional[int], torch.Tensor]]] = {}
        self._meta: dict[Hashable, tuple] = {}
        self._pending: Optional[tuple] = None
        self._held: Optional[HeldCall] = None  # a self-check's held call (replay.py), between hold() and release()
        self.closed = False

    # ------------------------------------------------------------------ step attribution
    def set_step(self, step: int) -> None:
        """Every model call after this belongs to sampler step `step` (until the next set_step)."""
        if self.mask is not None and not 0 <= step < len(self.mask):
            raise GCacheError(
                f"Sampler step {step} is outside the policy's {len(self.mask)} steps: the policy was made for "
                "another step count. Remap it (GCache Apply does this by normalized time) or search again."
            )
        if step != self.step and self._fresh_from:
            self._drop_stale(step)
        self.step = step

    def _drop_stale(self, step: int) -> None:
        """Forget the δ of branches not computed at the last computed step before `step` (nor later): no skipped
        step from here on may use it. Only calls that do not run at every step (ComfyUI's context windows of a
        schedule that moves them) leave such δ; holding them would grow the cache with every window seen."""
        fresh = self._fresh_from[step]
        stale = [k for k, kept in self._deltas.items() if not self._is_fresh(kept, fresh)]
        for k in stale:
            del self._deltas[k]
            self._meta.pop(k, None)
        if stale:
            self.stats.bytes_held = sum(d.numel() * d.element_size() for v in self._deltas.values() for _, d in v)

    @staticmethod
    def _is_fresh(kept: list, fresh: Optional[int]) -> bool:
        return fresh is None or kept[-1][0] is None or kept[-1][0] >= fresh

    def expect_steps(self, n_steps: int) -> None:
        """Refuse a policy made for another step count before sampling starts."""
        if self.mask is not None and len(self.mask) != n_steps:
            raise GCacheError(
                f"The policy has {len(self.mask)} steps but this sampling run has {n_steps}: remap the policy to "
                f"{n_steps} steps (Policy.remap / GCache Apply's remap option) or search again for {n_steps} steps."
            )

    def step_computes(self, step: Optional[int]) -> bool:
        return self.mask is None or step is None or bool(self.mask[step])

    def _fresh(self, step: Optional[int]) -> Optional[int]:
        return self._fresh_from[step] if step is not None and self._fresh_from else None

    def _must_store(self, step: Optional[int], forced: bool) -> bool:
        # δ is only needed if a later step will use it: skip the subtraction on back-to-back computed steps.
        if self.mask is None:
            return False  # no policy (Profile runs): nothing is ever skipped, nothing to keep
        if forced or step is None:
            return True
        return step in self._needed

    # ------------------------------------------------------------------ the hook
    def enter(self, h: torch.Tensor, branches: Sequence[Hashable] = ("all",)) -> bool:
        if self.closed:
            raise RuntimeError("ResidualCache used after close(): create a new one per sampling run.")
        keys, chunks = self._split_keys(h, branches)
        if self._held is not None:
            if self._held.replaying:  # a self-check's replay: skip with the held δ, seen by nothing else
                self._held.enter(h, keys, chunks)
                return False
            self._held.entered()
        step = self.step
        if step is not None:  # a call without a step is neither recorded nor timed
            for hook in self._on_enter:
                hook(step, h)
        compute = self.step_computes(step)
        forced = False
        meta = (h.shape[0] // chunks, tuple(h.shape[1:]), h.dtype, h.device)  # per chunk
        for k in keys:
            old = self._meta.get(k)
            if old is not None and old != meta:
                log.warning("GCache: the block-stack input changed from %s to %s (batch, resolution or dtype) "
                            "during sampling; the residual cache is reset and this step is computed.", old, meta)
                self.reset()
                self.stats.resets += 1
                break
        if not compute and any(k not in self._deltas or not self._is_fresh(self._deltas[k], self._fresh(step))
                               for k in keys):
            compute, forced = True, True  # a branch with no residual of the last computed step (new cond, reset,
            #                               a context window new at this step): compute it
        if step is not None and step not in self.stats.decided:
            self.stats.decided[step] = compute
            if compute:
                self.stats.computed_steps += 1
            else:
                self.stats.skipped_steps += 1
        elif step is not None and compute and not self.stats.decided[step]:
            # a later call of a skipped step computed (a branch with no residual yet: a context window new at this
            # step, a cond that starts late): the step ran the stack, it counts as computed (as in merged())
            self.stats.decided[step] = True
            self.stats.computed_steps += 1
            self.stats.skipped_steps -= 1
        if forced:
            self.stats.forced_calls += 1
        self.stats.stack_calls += 1
        # δ = z − h needs h as it was on entry, and some families' blocks add into their input in place (LTXV
        # `x +=`, Chroma `addcmul_`). Snapshot it (one tensor per branch), but only on steps whose δ is kept or
        # read by an observer; each snapshot then becomes its branch's stored δ (subtracted into in place), and it
        # is written into the δ this step evicts when there is one, so it costs one copy of h and no memory.
        keep = compute and ((self._on_residual and step is not None) or self._must_store(step, forced)
                            or self._held is not None)
        snaps = None
        if keep:
            with self.alloc_context():  # the snapshots outlive the stack entry (they become the stored δ)
                snaps = [self._snapshot(k, c, meta) for k, c in zip(keys, h.chunk(chunks, 0) if chunks > 1 else (h,))]
        self._pending = (h, snaps, keys, chunks, compute, forced, meta)
        if step is not None:
            for hook in self._on_blocks:
                hook(step)
        return compute

    def _snapshot(self, key: Hashable, h: torch.Tensor, meta: tuple) -> torch.Tensor:
        """A copy of h: into the storage of the branch's oldest kept δ when this step's δ evicts it (same
        layout), else a new tensor. Peak memory then stays one δ per kept slot, also while the blocks run."""
        kept = self._deltas.get(key)
        if kept and len(kept) == self.forecaster.keeps and self._meta.get(key) == meta and self._held is None:
            old = kept[0][1]
            if (old.device, old.dtype, old.shape, old.stride()) == (h.device, h.dtype, h.shape, h.stride()):
                if len(kept) > 1:
                    self._deltas[key] = kept[1:]
                else:
                    del self._deltas[key]  # a failure in the blocks now forces this branch's next step
                return old.copy_(h)
        return h.clone()

    def exit(self, z: Optional[torch.Tensor]) -> torch.Tensor:
        if self._held is not None and self._held.replaying:  # the skip path below, on the held call's δ
            h, keys, chunks, step, deltas = self._held.exit()
            held = dict(zip(keys, deltas))
            return self._skip(h, keys, chunks, step, lambda k: [(step, held[k])])
        if self._pending is None:
            raise RuntimeError("ResidualCache.exit() without enter().")
        h, snaps, keys, chunks, compute, forced, meta = self._pending
        self._pending = None
        step = self.step
        if compute:
            if z is None or z.shape != h.shape:
                raise GCacheError(f"The block stack returned shape {None if z is None else tuple(z.shape)} for input "
                                  f"{tuple(h.shape)}: the family adapter marks the wrong tokens as image tokens.")
            for k in keys:
                self.stats.block_runs[k] = self.stats.block_runs.get(k, 0) + 1
            if step is not None:
                for hook in self._on_blocks_done:
                    hook(step)
            if snaps is not None:
                readers = self._on_residual if step is not None else ()
                store = self._must_store(step, forced)
                held = []
                with self.alloc_context():  # what the observers, the store and a held replay keep outlives the entry
                    for k, zp, hp in zip(keys, z.chunk(chunks, 0) if chunks > 1 else (z,), snaps):
                        # an observer also reads h; otherwise δ overwrites the snapshot (it is ours alone)
                        d = zp - hp if readers else torch.sub(zp, hp, out=hp)
                        for hook in readers:
                            hook(step, k, hp, d)
                        if store:
                            self._store(k, step, d, meta)
                        held.append(d)
                    if self._held is not None:  # kept where a stored δ is (cache_device), as a skipped step finds it
                        self._held.keep(keys, chunks, step, [self._to_cache(d) for d in held])
            if step is not None:
                for hook in self._on_exit:
                    hook(step)
            return z
        return self._skip(h, keys, chunks, step, self._deltas.__getitem__)

    # ------------------------------------------------------------------ the skip path (a skipped step, a replay)
    def _skip(self, h: torch.Tensor, keys: list, chunks: int, step: Optional[int], kept_of: Callable) -> torch.Tensor:
        """The stack's output on a skipped step: h + δ̂ per branch chunk, δ̂ from `kept_of(key)`, the branch's kept
        [(step, δ)] (the store; a self-check's replay gives the held call's δ, so it checks this very code)."""
        if chunks == 1:
            return self._skip_out(h, kept_of(keys[0]), step, None)
        out = torch.empty_like(h)  # chunk by chunk into one output: no concatenated δ temporary
        for k, hk, ok in zip(keys, h.chunk(chunks, 0), out.chunk(chunks, 0)):
            self._skip_out(hk, kept_of(k), step, ok)
        return out

    def _skip_out(self, h: torch.Tensor, kept: list, step: Optional[int], out: Optional[torch.Tensor]):
        """h + δ of the branch's last computed step (reuse), or h + the forecaster's δ̂ at this step's time."""
        if self.cache_device is not None:
            kept = [(i, to_device(d, h.device)) for i, d in kept]
        w = self._weights(kept, step)
        out = torch.add(h, kept[-1][1], alpha=w[-1], out=out)
        for wk, (_, dk) in zip(w[:-1], kept[:-1]):
            out.add_(dk, alpha=wk)
        return out

    def _weights(self, kept: list, step: Optional[int]) -> list[float]:
        """Each kept δ's weight in δ̂: the forecaster's (reuse's [1.0] too: a replay at run 1 checks them); the last δ
        alone at an unknown step, or while a forecaster of several δ has one so far (it reuses it)."""
        if step is None or any(i is None for i, _ in kept) or (len(kept) == 1 and self.forecaster.keeps > 1):
            return [1.0]
        return self.forecaster.weights([i for i, _ in kept], step, self.times, self.forecast_params)

    def _to_cache(self, delta: torch.Tensor) -> torch.Tensor:
        """δ where the run keeps it: on cache_device when one is set (a stored δ, a replay's held δ)."""
        if self.cache_device is not None and delta.device != self.cache_device:
            return delta.to(self.cache_device, non_blocking=False)
        return delta

    def run(self, h: torch.Tensor, branches: Sequence[Hashable], blocks: Callable[[torch.Tensor], torch.Tensor]):
        """enter → blocks (only when computing) → exit; a failure in the blocks drops the pending input."""
        try:
            z = blocks(h) if self.enter(h, branches) else None
        except BaseException:
            self.abort()
            raise
        return self.exit(z)

    def abort(self) -> None:
        """Forget a stack entered but never left (its blocks raised): no half-entered state, no snapshot held."""
        self._pending = None
        if self._held is not None:
            self._held.abort()

    # ------------------------------------------------------------------ the self-check's replay (replay.py)
    def hold(self) -> None:
        """Keep the δ of every block-stack pass until release(), whatever the mask: the call about to run is
        replayed through the skip path. What the statistics and the observers see does not change."""
        self._held = HeldCall()  # (a stack entered and never left before stays pending: the next entry replaces it)

    def replay(self, nudge: float = 0.0) -> None:
        """From now on each stack entry skips with the held δ of the computed pass of the same order (no statistics,
        no observer, no stored δ touched) and its exit returns h + δ, until release()."""
        if self._held is None:
            raise RuntimeError("ResidualCache.replay() without hold().")
        if self._held.replaying or nudge:  # once more from the first pass, h + δ nudged (the rounding floor)
            self._held.again(nudge)
        self._held.replaying = True

    def held_count(self) -> ReplayCount:
        """What the held call (and its replay) counted so far."""
        return self._held.count if self._held is not None else ReplayCount()

    def release(self) -> ReplayCount:
        """End a held call (and its replay): its tensors are dropped; returns what it counted."""
        held, self._held = self._held, None
        return held.count if held is not None else ReplayCount()

    # ------------------------------------------------------------------ storage
    def _split_keys(self, h: torch.Tensor, branches: Sequence[Hashable]):
        branches = list(branches) if branches else ["all"]
        if len(branches) > 1 and h.shape[0] % len(branches) == 0:
            return branches, len(branches)
        return [tuple(branches) if len(branches) > 1 else branches[0]], 1

    def _store(self, key: Hashable, step: Optional[int], delta: torch.Tensor, meta: tuple) -> None:
        delta = self._to_cache(delta)
        # δ is the branch's own snapshot of h (clone() kept h's memory layout, e.g. Wan's transposed tokens),
        # so the skip-step add runs on matching strides and no view pins a whole batch. Forecasting keeps the
        # last order + 1 of them; a meta change (reset) or a forced step starts the list again.
        kept = self._deltas.get(key, []) if self._meta.get(key) == meta else []
        if kept and step is not None and step == kept[-1][0]:
            kept = kept[:-1]  # another evaluation of the same step (dpm_2's midpoint): the latest stands for it
        elif kept and (step is None or kept[-1][0] is None or step < kept[-1][0]):
            kept = []
        self._deltas[key] = (kept + [(step, delta)])[-self.forecaster.keeps:]
        self._meta[key] = meta
        self.stats.bytes_held = sum(d.numel() * d.element_size() for v in self._deltas.values() for _, d in v)
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes_held)

    def reset(self) -> None:
        self._deltas.clear()
        self._meta.clear()
        self.stats.bytes_held = 0

    def close(self) -> CacheStats:
        """Release every cached tensor (idempotent). Returns the run's statistics (with what the observers add)."""
        if not self.closed:
            for o in self.observers:
                o.on_close(self.stats)
        self.reset()
        self._pending = None
        self._held = None
        self.closed = True
        return self.stats

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def held_tensors(self) -> int:
        return sum(len(v) for v in self._deltas.values()) + (0 if self._pending is None else 1)

    def summary(self, io_share: Optional["IoShare | float"] = None) -> str:
        return self.stats.summary(io_share)


def last_computed_before(mask: Sequence[int]) -> list[Optional[int]]:
    """For each step of a 0/1 mask, the last step before it that the mask computes (None for the first)."""
    out, last = [], None
    for i, m in enumerate(mask):
        out.append(last)
        last = i if m else last
    return out


def to_device(delta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A kept δ moved to the stack's device for a skipped step (no copy when it is there already)."""
    return delta.to(device, non_blocking=True)


def format_bytes(n: int) -> str:
    """Bytes for a log line, in the unit that keeps them readable (a tiny cache is not "0.0 MiB")."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
