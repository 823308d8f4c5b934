"""ProfileRecorder: one sampling run's residuals as a Profile sample (core/profile.py), an observer of the engine.

Memory model (per branch of a run, measured by bench/engine.py and bench/speed.py):
- the residual history, N × m in δ's dtype, on `history_device` (default: δ's own device; "cpu" offloads it,
  pinned, and streams it back in chunks for each new row). m = numel(δ) up to `max_elems` (default 2^25); beyond
  that every s-th element is kept (s = ⌈numel / max_elems⌉, coprime with the channel count), and E, still a mean,
  is estimated on that sample,
- one copy of the previous block input h (for the rel-L1 change of h),
- a float32 temporary of at most `chunk_elems` elements while a row of E is computed (differences are formed in
  float32 whatever δ's dtype: for a bfloat16/float16 δ that is twice the bytes of a difference in its own dtype,
  which rounded every element), plus a float32 copy of δ and of h when they are not float32 (and flattened copies
  when the model hands over non-contiguous token views, e.g. Wan's transposed patch embedding).
E is built row by row as each step arrives (O(N²·m) work spread over the run), so nothing is recomputed at the end.

With `forecast=True` the recorder also records the statistics every registered forecaster needs (core/profile_stats:
E1, the fit and the Gram statistics), from the same history and in the same passes: per new step j, one pass over
the recorded steps i < j in chunks (E and the pair statistics), and, when a statistic needs it, one over the
recorded p < i < j (O(N³·m) work over the run), with float32 temporaries of at most chunk rows + 2 rows of m
elements. Their tensors are float64 on δ's device (E1: N³, 216 KB at N = 30, 1 MB at N = 50; the Gram product's
temporary is freed before the difference is made; its fold means add partial sums of m/32 elements).
Values are means (not sums) so profiles at different resolutions can be merged.
"""
from __future__ import annotations

import logging
import math
import threading
from typing import Hashable, Optional, Sequence

import numpy as np
import torch

from . import forecasters, profile_stats
from .errors import GCacheError
from .observer import EngineObserver
from .profile import Profile

log = logging.getLogger("gcache")

# Residual elements kept per step and branch (2^25 = 64 MiB in bf16). Flux at 1024² (12.6 M) is recorded
# exactly; larger residuals (video: Wan 1.3B 81 frames 480p has 50 M, Wan 14B 720p ~384 M) are sampled.
MAX_ELEMS = 1 << 25
# Devices whose kernels on mixed dtypes (bfloat16 − float32) are slow: on the CPU (not vectorized) one took 2x
# converting to float32 first and 4x a bfloat16 − bfloat16 subtraction (bench/recorder.py --kernels, 8 × 2^20
# elements). There lower-precision history rows are converted first; elsewhere the kernel promotes them.
CONVERT_FIRST = {"cpu"}


def forecast_statistics() -> list:
    """What a run with forecast recording on records: the statistics every registered forecaster needs, in the
    statistics' registry order."""
    known = {s.name: s for s in profile_stats.registered()}
    need = set()
    for name in forecasters.names():
        for stat in forecasters.get(name).needs:
            if stat not in known:
                raise GCacheError(f"The {name} forecaster needs the profile statistic {stat!r}, which is not "
                                  "registered (core/profile_stats).")
            need.add(stat)
    return [s for s in known.values() if s.name in need]


def sample_stride(numel: int, last_dim: int, max_elems: Optional[int]) -> int:
    """Every stride-th element of a flattened residual, so that at most max_elems are kept per step.

    The stride is coprime with the channel dimension, so the sample cycles through every channel and token
    (a systematic sample; E, ‖δ‖ and the rel-L1 values are means, so it estimates them without bias in the
    channel mix). 1 = exact.
    """
    if not max_elems or numel <= max_elems:
        return 1
    stride = -(-numel // max_elems)
    while math.gcd(stride, max(1, int(last_dim))) != 1:
        stride += 1
    return stride


def _spans(steps: list[int], most: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of consecutive steps, each at most `most` long."""
    out: list[tuple[int, int]] = []
    for i in steps:
        if out and out[-1][1] == i and i - out[-1][0] < most:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


# ------------------------------------------------------------------------------------------ what hooks are given
# (core/profile_stats says what each field is.) Earlier rows are read in contiguous spans, as slices: an offloaded
# (pinned) history is filled by asynchronous device-to-host copies, and only a copy queued on the same stream (a
# slice's .to()) is ordered after them; indexing rows on the host (hist[[0, 2]]) would read them before they land.
class StepView:
    __slots__ = ("j", "dj", "times", "device", "_memo")

    def __init__(self, j: int, dj: torch.Tensor, times: np.ndarray, device: torch.device):
        self.j, self.dj, self.times, self.device, self._memo = j, dj, times, device, {}

    def cached(self, key, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


class PairChunk:
    __slots__ = ("step", "lo", "hi", "_hist", "_rows", "_own", "_absdiff")

    def __init__(self, step: StepView, lo: int, hi: int, hist: torch.Tensor):
        self.step, self.lo, self.hi, self._hist = step, lo, hi, hist
        self._rows = self._absdiff = None
        self._own = False

    @property
    def rows(self) -> torch.Tensor:
        if self._rows is None:
            rows = self._hist[self.lo:self.hi].to(self.step.device, non_blocking=True)
            self._own = rows.dtype != torch.float32 and rows.device.type in CONVERT_FIRST
            # .float() of a lower-precision tensor is a new (exact) copy: ours to write
            self._rows = rows.float() if self._own else rows
        return self._rows

    @property
    def absdiff(self) -> torch.Tensor:
        if self._absdiff is None:
            rows = self.rows
            # float32: in our own copy (then used up), or a new tensor by type promotion (a lower-precision history
            # converts exactly)
            diff = rows.sub_(self.step.dj) if self._own else rows - self.step.dj
            if self._own:
                self._rows = None
            self._absdiff = diff.abs_()
        return self._absdiff

    def take_absdiff(self) -> torch.Tensor:
        out = self.absdiff
        self._absdiff = None
        return out


class TripleChunk:
    __slots__ = ("step", "i", "lo", "hi", "_hist", "_di", "_block", "_memo")

    def __init__(self, step: StepView, i: int, hist: torch.Tensor):
        self.step, self.i, self._hist = step, i, hist
        self.lo = self.hi = 0
        self._di = self._block = None
        self._memo = {}

    def chunk(self, lo: int, hi: int) -> "TripleChunk":
        self.lo, self.hi, self._block = lo, hi, None
        return self

    @property
    def di(self) -> torch.Tensor:
        if self._di is None:
            self._di = self._hist[self.i].to(self.step.device, torch.float32, non_blocking=True, copy=True)
        return self._di

    @property
    def block(self) -> torch.Tensor:
        if self._block is None:
            self._block = self._hist[self.lo:self.hi].to(self.step.device, torch.float32, non_blocking=True,
                                                         copy=True)
        return self._block

    def take_block(self) -> torch.Tensor:
        out = self.block
        self._block = None
        return out

    def cached(self, key, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


class _BranchHistory:
    """Residual history of one branch in one run; fills one row of E (and the statistics' entries) per step."""

    def __init__(self, n_steps: int, delta: torch.Tensor, history_device: Optional[torch.device], chunk_elems: int,
                 max_elems: Optional[int], times: Sequence[float], statistics: Sequence = ()):
        self.device = delta.device
        self.times = np.asarray(times, dtype=np.float64)
        hist_dev = history_device or delta.device
        self.stride = sample_stride(delta.numel(), delta.shape[-1], max_elems)
        self.numel = len(range(0, delta.numel(), self.stride))
        # Offloaded next to a GPU: pinned, so copies in and out run asynchronously on the compute stream.
        pin = torch.device(hist_dev).type == "cpu" and delta.device.type == "cuda"
        self.hist = torch.empty((n_steps, self.numel), dtype=delta.dtype, device=hist_dev, pin_memory=pin)
        self.rows = torch.zeros((n_steps, n_steps), dtype=torch.float64, device=delta.device)
        self.norms = torch.zeros(n_steps, dtype=torch.float64, device=delta.device)
        self.rel_h = torch.zeros(n_steps, dtype=torch.float64, device=delta.device)
        # each statistic's tensors for this sample: {statistic: {file name: float64 zeros}}
        self.statistics = tuple(statistics)
        self.acc = {s.name: {name: torch.zeros(t.shape(n_steps), dtype=torch.float64, device=delta.device)
                             for name, t in s.tensors.items()} for s in self.statistics}
        self._hooks = {point: self._hooks_at(point) for point in profile_stats.HOOKS}
        self.recorded = [False] * n_steps
        self.prev_h: Optional[torch.Tensor] = None
        self.rows_per_chunk = max(1, chunk_elems // max(1, self.numel))
        self.shape = tuple(delta.shape)
        self.dtype = delta.dtype

    def _hooks_at(self, point: str) -> list:
        """(hook, its statistic's tensors) of the statistics that do something at `point`, by order (stable); the
        pair pass also holds this recorder's E, at ORDER_E."""
        hooks = [(s.order, getattr(s, point), self.acc[s.name]) for s in self.statistics if hasattr(s, point)]
        if point == "on_pairs":
            hooks.append((profile_stats.ORDER_E, self._e_row, None))
        return [(hook, acc) for _, hook, acc in sorted(hooks, key=lambda x: x[0])]

    def _e_row(self, _acc, c: PairChunk) -> None:
        vals = c.absdiff.mean(dim=1).double()
        self.rows[c.step.j, c.lo:c.hi] = vals
        self.rows[c.lo:c.hi, c.step.j] = vals

    def add(self, step: int, h: torch.Tensor, delta: torch.Tensor) -> None:
        d = delta.reshape(-1)[::self.stride]
        # Every difference is formed in float32: a bfloat16/float16 difference would round each element (8/11
        # significant bits) before the mean. `df` is δ itself when δ is float32 (the caller's tensor: read
        # only); every in-place operation is on a temporary the recorder made.
        df = d.float()
        self.norms[step] = d.abs().mean(dtype=torch.float32)
        s = StepView(step, df, self.times, self.device)
        for hook, acc in self._hooks["on_step"]:
            hook(acc, s)
        done = [i for i in range(step) if self.recorded[i]]
        for lo, hi in _spans(done, self.rows_per_chunk):
            c = PairChunk(s, lo, hi, self.hist)
            for hook, acc in self._hooks["on_pairs"]:
                hook(acc, c)
        if self._hooks["on_triples"] and len(done) >= 2:
            self._triples(s, done)
        self.hist[step].copy_(d, non_blocking=True)
        hf = h.reshape(-1)[::self.stride]
        if self.prev_h is not None:
            dh = hf.to(torch.float32, copy=True).sub_(self.prev_h)  # our own copy, float32 like δ's differences
            self.rel_h[step] = dh.abs_().mean() / self.prev_h.abs().mean(dtype=torch.float32).clamp_min(1e-12)
            self.prev_h.copy_(hf)
        else:
            self.prev_h = hf.clone()
        self.recorded[step] = True

    def _triples(self, s: StepView, done: list[int]) -> None:
        """The triple pass for step j = s.j: every recorded p < i < j, the p in chunks of contiguous rows."""
        hooks = self._hooks["on_triples"]
        for n, i in enumerate(done[1:], 1):
            c = TripleChunk(s, i, self.hist)
            for lo, hi in _spans(done[:n], self.rows_per_chunk):
                c.chunk(lo, hi)
                for hook, acc in hooks:
                    hook(acc, c)

    def nbytes(self) -> int:
        return self.hist.numel() * self.hist.element_size() + (0 if self.prev_h is None else
                                                               self.prev_h.numel() * self.prev_h.element_size())


class ProfileRecorder(EngineObserver):
    """Collects one sampling run (all branches) and turns it into a Profile sample at `finish()`.

    An observer of the engine (observer.py): `ResidualCache(None, observers=(recorder, StackClock()))`
    hands it h and δ of every computed step, and `record(step, branch, h, δ)` keeps the first evaluation of each.
    """

    reads_h = True

    def __init__(self, times: Sequence[float], sigmas: Optional[Sequence[float]] = None, meta: Optional[dict] = None,
                 history_device: Optional[str | torch.device] = None, chunk_elems: int = 1 << 25,
                 max_elems: Optional[int] = MAX_ELEMS, forecast: bool = False):
        self.times = list(times)
        self.forecast = forecast  # also record the forecasters' statistics: O(N³·m) work over the run
        self.statistics = forecast_statistics() if forecast else []
        self.sigmas = list(sigmas) if sigmas is not None else list(times)
        self.n_steps = len(self.times)
        self.meta = dict(meta or {})
        self.history_device = torch.device(history_device) if history_device is not None else None
        self.chunk_elems = chunk_elems
        self.max_elems = max_elems
        self.branches: dict[Hashable, _BranchHistory] = {}
        self.peak_bytes = 0
        self._lock = threading.Lock()

    def on_residual(self, step: int, branch: Hashable, h: torch.Tensor, delta: torch.Tensor) -> None:
        self.record(step, branch, h, delta)

    def record(self, step: int, branch: Hashable, h: torch.Tensor, delta: torch.Tensor) -> None:
        if not 0 <= step < self.n_steps:
            raise GCacheError(f"Profile got step {step} but was set up for {self.n_steps} steps.")
        b = self.branches.get(branch)
        if b is None or tuple(delta.shape) != b.shape or delta.dtype != b.dtype:
            if b is not None:
                log.warning("GCache Profile: the residual of branch %r changed from %s %s to %s %s mid-run; "
                            "restarting this branch's history.", branch, b.shape, b.dtype, tuple(delta.shape),
                            delta.dtype)
            b = _BranchHistory(self.n_steps, delta, self.history_device, self.chunk_elems, self.max_elems,
                               self.times, self.statistics)
            with self._lock:  # ComfyUI's MultiGPU CFG split records the branches from one thread per device
                self.branches[branch] = b
        if b.recorded[step]:
            return  # extra evaluations of a multi-evaluation sampler step: the first one represents the step
        b.add(step, h.detach(), delta.detach())
        with self._lock:
            self.peak_bytes = max(self.peak_bytes, sum(x.nbytes() for x in self.branches.values()))

    def finish(self) -> Profile:
        """This run as a Profile (count = complete branches). Raises on NaN/Inf; frees the history."""
        prof = Profile.empty(self.times, self.sigmas, self.meta)
        prof.meta["runs"] = 1
        dtypes = sorted({str(b.dtype).replace("torch.", "") for b in self.branches.values() if all(b.recorded)})
        if dtypes:
            prof.meta["residual_dtype"] = ",".join(dtypes)
        strides = {b.stride for b in self.branches.values()}
        if strides - {1}:
            prof.meta["sample_stride"] = max(strides)  # E was estimated on every stride-th residual element
        try:
            for key, b in self.branches.items():
                if not all(b.recorded):
                    missing = [i for i, r in enumerate(b.recorded) if not r]
                    log.warning("GCache Profile: branch %r missed steps %s (interrupted run?); not added.", key,
                                missing[:8])
                    continue
                rows = b.rows.cpu().numpy()
                norms = b.norms.cpu().numpy()
                relh = b.rel_h.cpu().numpy()
                if not (np.all(np.isfinite(rows)) and np.all(np.isfinite(norms)) and np.all(np.isfinite(relh))):
                    bad = int(np.argmax(~np.isfinite(norms))) if not np.all(np.isfinite(norms)) else \
                        int(np.argmax(~np.isfinite(rows).all(axis=1)))
                    raise GCacheError(
                        f"The block-stack residual is NaN/Inf (first at step {bad}, branch {key!r}): the model "
                        "itself produced non-finite values (precision, a broken LoRA, bad weights?). Nothing was added "
                        "to the profile; fix the model run and profile again.")
                rel = np.zeros(self.n_steps)
                rel[1:] = np.diag(rows, 1) / np.maximum(norms[:-1], 1e-12)
                prof.e_sum += rows
                for stat in b.statistics:
                    for name, t in b.acc[stat.name].items():
                        a = t.cpu().numpy()
                        if not np.all(np.isfinite(a)):
                            raise GCacheError(f"The forecast statistics ({stat.name}) of branch {key!r} are NaN/Inf; "
                                              "nothing was added.")
                        prof.sums[name] = a if name not in prof.sums else stat.merge(prof.sums[name], a)
                prof.delta_norm_sum += norms
                prof.rel_delta_sum += rel
                prof.rel_h_sum += relh
                prof.count += 1
        finally:
            self.branches.clear()
        return prof
