"""Profile: residual errors E[i, j] = mean |δ_i − δ_j| over full-compute runs, plus local indicators.

Memory model of the recorder (per branch of a run, measured by bench/engine.py and bench/speed.py):
- the residual history, N × m in δ's dtype, on `history_device` (default: δ's own device; "cpu" offloads
  it, pinned, and streams it back in chunks for each new row). m = numel(δ) up to `max_elems` (default 2^25);
  beyond that every s-th element is kept (s = ⌈numel / max_elems⌉, coprime with the channel count), and E,
  still a mean, is estimated on that sample,
- one copy of the previous block input h (for the rel-L1 change of h),
- a float32 temporary of at most `chunk_elems` elements while a row of E is computed (differences are formed in
  float32 whatever δ's dtype: for a bfloat16/float16 δ that is twice the bytes of a difference in its own dtype,
  which rounded every element), plus a float32 copy of δ and of h when they are not float32 (and flattened
  copies when the model hands over non-contiguous token views, e.g. Wan's transposed patch embedding).
E is built row by row as each step arrives (O(N²·numel) work spread over the run), so nothing is
recomputed at the end. With `forecast=True` the recorder also builds E1[p, i, j] (the error of the linear
forecast of δ_j from computed steps p < i, for the order-1 DP) from the same history: O(N³·m) work over the run,
plus E1 itself (N³ float64 on δ's device: 216 KB at N = 30, 1 MB at N = 50) and float32 temporaries of at most
chunk rows + 2 rows of m elements while a step's E1 entries are computed; the fit statistics (fit_stats.py: squared
differences, cross terms and the Gram statistics mean δ_i·δ_j, per fold) use the same temporaries (the Gram
product's is freed before the difference is made; its fold means add partial sums of m/32 elements).
Values are means (not sums) so profiles at different resolutions can be merged.

The artifact stores sums and a count (mergeable), saved as safetensors with JSON metadata.

Format versions: 2 records how E was computed (`e_definition`, and meta "residual_dtype": the dtype of the recorded
δ). Version-1 files still load; those with forecast statistics were made by a recorder that, on float32 residuals,
stored the mean *squared* difference as E: `Profile.defect` says so, and nothing builds a mask from them.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Hashable, Optional, Sequence

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .errors import GCacheError
from .files import atomic_write_bytes
from .fit_stats import FitStats
from .io_share import IoShare, check_meta as check_io_meta, merged_runs
from .observer import EngineObserver

log = logging.getLogger("gcache")

PROFILE_FORMAT = "gcache.profile"
PROFILE_VERSION = 2
READABLE_VERSIONS = ("1", "2")
# How E was computed. 1: version-1 files (with forecast recording on, float32 residuals gave a squared E, and
# bfloat16/float16 differences were rounded to their dtype); 2: mean |δ_i − δ_j| of float32 differences.
E_DEFINITION = 2
# Residual elements kept per step and branch (2^25 = 64 MiB in bf16). Flux at 1024² (12.6 M) is recorded
# exactly; larger residuals (video: Wan 1.3B 81 frames 480p has 50 M, Wan 14B 720p ~384 M) are sampled.
MAX_ELEMS = 1 << 25
# Devices whose kernels on mixed dtypes (bfloat16 − float32) are slow: on the CPU (not vectorized) one took 2x
# converting to float32 first and 4x a bfloat16 − bfloat16 subtraction (bench/recorder.py --kernels, 8 × 2^20
# elements). There lower-precision history rows are converted first; elsewhere the kernel promotes them.
CONVERT_FIRST = {"cpu"}
MAX_SAMPLE_KEYS = 4096  # run keys remembered per profile for the duplicate check (16 hex digits each)
_TENSORS = ("e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "times", "sigmas")
# recorded with forecasting on (E1, fit statistics): name -> shape for N steps
_OPTIONAL = {"e1_sum": lambda n: (n, n, n), "fit_sq_sum": lambda n: (n, n, 2), "fit_cross_sum": lambda n: (n, n, n, 2),
             "gram_sum": lambda n: (n, n, 2)}


@dataclass
class Profile:
    n_steps: int
    e_sum: np.ndarray                 # [N, N] Σ over samples of mean |δ_i − δ_j|
    count: int                        # samples = (run, branch) pairs with every step recorded
    delta_norm_sum: np.ndarray        # [N] Σ mean |δ_j|
    rel_delta_sum: np.ndarray         # [N] Σ mean|δ_j − δ_{j−1}| / mean|δ_{j−1}| (entry 0 is 0)
    rel_h_sum: np.ndarray             # [N] Σ mean|h_j − h_{j−1}| / mean|h_{j−1}| (entry 0 is 0)
    times: np.ndarray                 # [N] normalized time per step (1 → 0)
    sigmas: np.ndarray                # [N] sampler sigma per step
    meta: dict = field(default_factory=dict)
    e1_sum: Optional[np.ndarray] = None  # [N, N, N] Σ mean |δ_j − linear forecast from p < i| (p < i < j), or None
    fit_sq_sum: Optional[np.ndarray] = None     # [N, N, 2] Σ mean (δ_i − δ_j)² per fold (fit_stats.py), or None
    fit_cross_sum: Optional[np.ndarray] = None  # [N, N, N, 2] Σ mean (δ_i − δ_p)(δ_j − δ_i) per fold, or None
    gram_sum: Optional[np.ndarray] = None       # [N, N, 2] Σ mean δ_i·δ_j per fold, or None (older profiles)
    e_definition: int = E_DEFINITION  # how E was computed (E_DEFINITION); 1 for version-1 files

    # ------------------------------------------------------------------ views
    @property
    def E(self) -> np.ndarray:
        self._need_samples()
        return self.e_sum / self.count

    @property
    def delta_norm(self) -> np.ndarray:
        self._need_samples()
        return self.delta_norm_sum / self.count

    @property
    def rel_delta(self) -> np.ndarray:
        self._need_samples()
        return self.rel_delta_sum / self.count

    @property
    def rel_h(self) -> np.ndarray:
        self._need_samples()
        return self.rel_h_sum / self.count

    @property
    def E1(self) -> np.ndarray:
        """E1[p, i, j]: mean |δ_j − δ̂_j| of the linear forecast from computed steps p < i (order-1 DP input)."""
        self._need_samples()
        if self.e1_sum is None:
            raise GCacheError("This profile has no forecast errors (E1): profile again with forecast recording on "
                              "(GCache Profile's 'record forecast errors', or ProfileRecorder(forecast=True)).")
        return self.e1_sum / self.count

    def has_fit_stats(self) -> bool:
        return self.fit_sq_sum is not None and self.fit_cross_sum is not None

    def fit_stats(self) -> FitStats:
        """The squared-error statistics of linear-form forecasts (the profile-fitted forecaster needs them)."""
        self._need_samples()
        if not self.has_fit_stats():
            raise GCacheError("This profile has no forecast statistics: profile again with forecast recording on "
                              "(GCache Profile's 'record_forecast', GCache Apply (auto) records them itself).")
        return FitStats(self.fit_sq_sum / self.count, self.fit_cross_sum / self.count,
                        None if self.gram_sum is None else self.gram_sum / self.count)

    @property
    def io_share(self) -> float:
        """Share of a step's time outside the block stack: measured while profiling (the median over runs of each
        run's median over its steps, core/io_share.py) when the profile has it, else the parameter-count estimate
        it was made with (0: none)."""
        return self.io.value

    @property
    def io(self) -> IoShare:
        """The io share with its range (none for profiles from before per-step timing or without timings) and
        where it comes from."""
        return IoShare.from_meta(self.meta)

    @property
    def defect(self) -> Optional[str]:
        """Why the profile can't be trusted, as a sentence for a person (None when it can): a version-1 profile
        with forecast statistics may hold a squared E."""
        forecast = self.e1_sum is not None or self.fit_sq_sum is not None or self.fit_cross_sum is not None
        if self.e_definition < 2 and forecast and self.count > 0:
            return ("This profile was recorded with forecast recording on by a GCache older than profile format 2: "
                    "on a float32 model its E holds the mean squared instead of the mean absolute residual "
                    "differences (a bug fixed since), so masks, instant policies and forecaster choices made from it "
                    "may be wrong.")
        return None

    def require_clean(self, who: str) -> None:
        """Raise, with what to do, when `who` is about to build on a profile with a defect."""
        if self.defect:
            raise GCacheError(f"{who} can't use this profile. {self.defect} Profile again (into a new profile name, "
                              "or delete this file first); GCache Apply (auto) does that by itself.")

    @property
    def sample_keys(self) -> list[str]:
        """Keys of the runs already in this profile (seed, conditioning, latent, schedule), so that a re-queued
        identical run is not counted twice."""
        return list(self.meta.get("sample_keys", []))

    def _need_samples(self):
        if self.count <= 0:
            raise GCacheError("This profile holds no complete run yet: run sampling with GCache Profile first.")

    # ------------------------------------------------------------------ construction
    @classmethod
    def empty(cls, times: Sequence[float], sigmas: Optional[Sequence[float]] = None, meta: Optional[dict] = None):
        n = len(times)
        if n < 1:
            raise GCacheError("A profile needs at least one step.")
        z = np.zeros(n)
        return cls(n, np.zeros((n, n)), 0, z.copy(), z.copy(), z.copy(), np.asarray(times, dtype=np.float64),
                   np.asarray(sigmas if sigmas is not None else times, dtype=np.float64), dict(meta or {}))

    def check_compatible(self, other: "Profile") -> None:
        if other.n_steps != self.n_steps:
            raise GCacheError(f"Cannot merge profiles of {self.n_steps} and {other.n_steps} steps: profile each step "
                              "count under its own name.")
        if not np.allclose(self.times, other.times, atol=1e-4):
            raise GCacheError("Cannot merge profiles made with different schedules (sampler/scheduler/shift): "
                              "profile each schedule under its own name.")
        for key in ("model", "family"):
            a, b = self.meta.get(key), other.meta.get(key)
            if a and b and a != b:
                raise GCacheError(f"Cannot merge a profile of {key} {b!r} into one of {a!r}: use another name.")

    def merge(self, other: "Profile") -> "Profile":
        self.check_compatible(other)
        if self.count and other.count and bool(self.defect) != bool(other.defect):
            raise GCacheError(f"Cannot merge a profile with a defect into one without (or back): "
                              f"{self.defect or other.defect} Delete or rename the old profile file and profile "
                              "again; the new runs then start a clean file.")
        meta = dict(self.meta)
        for k, v in other.meta.items():
            meta.setdefault(k, v)
        meta["runs"] = int(self.meta.get("runs", 0)) + int(other.meta.get("runs", 0))
        keys = self.sample_keys + [k for k in other.sample_keys if k not in self.sample_keys]
        if keys:
            meta["sample_keys"] = keys[-MAX_SAMPLE_KEYS:]
        dtypes = {d for m in (self.meta, other.meta) for d in str(m.get("residual_dtype", "")).split(",") if d}
        if dtypes:
            meta["residual_dtype"] = ",".join(sorted(dtypes))
        io_runs = merged_runs(self.meta, other.meta)  # timed runs: concatenated (an old total counts as one)
        meta.pop("io_time", None)
        if io_runs:
            meta["io_runs"] = io_runs
        extra = {}
        for name in _OPTIONAL:
            a, b = getattr(self, name), getattr(other, name)
            if a is not None and b is not None:
                extra[name] = a + b
            elif self.count == 0 or other.count == 0:
                kept = a if other.count == 0 else b
                extra[name] = None if kept is None else kept.copy()  # never an array of another profile
        if (self.e1_sum is None) != (other.e1_sum is None) and self.count and other.count:
            log.warning("GCache Profile: one of the merged profiles has no forecast errors (E1); the result keeps "
                        "none. Profile every run with forecast recording on to keep them.")
        elif self.has_fit_stats() != other.has_fit_stats() and self.count and other.count:
            log.warning("GCache Profile: one of the merged profiles has no forecast statistics (made before the "
                        "profile-fitted forecaster); the result keeps none. Profile again to fit forecasts.")
        elif (self.gram_sum is None) != (other.gram_sum is None) and self.count and other.count:
            log.warning("GCache Profile: one of the merged profiles has no Gram statistics (made before them); the "
                        "result keeps none.")
        sampled = [p.e_definition for p in (self, other) if p.count] or [min(self.e_definition, other.e_definition)]
        return Profile(self.n_steps, self.e_sum + other.e_sum, self.count + other.count,
                       self.delta_norm_sum + other.delta_norm_sum, self.rel_delta_sum + other.rel_delta_sum,
                       self.rel_h_sum + other.rel_h_sum, self.times.copy(), self.sigmas.copy(), meta, **extra,
                       e_definition=min(sampled))

    # ------------------------------------------------------------------ file
    def to_bytes(self) -> bytes:
        tensors = {k: torch.from_numpy(np.ascontiguousarray(getattr(self, k), dtype=np.float64)) for k in _TENSORS}
        for name in _OPTIONAL:
            if getattr(self, name) is not None:
                tensors[name] = torch.from_numpy(np.ascontiguousarray(getattr(self, name), dtype=np.float64))
        meta = {"format": PROFILE_FORMAT, "version": str(PROFILE_VERSION), "n_steps": str(self.n_steps),
                "count": str(self.count), "e_definition": str(self.e_definition),
                "meta": json.dumps(self.meta, allow_nan=False)}
        return st_save(tensors, metadata=meta)

    def save(self, path: str) -> None:
        atomic_write_bytes(path, self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "profile") -> "Profile":
        try:
            tensors = st_load(data)
            meta = _read_st_metadata(data)
        except (SafetensorError, ValueError, json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
            raise GCacheError(f"{source} is not a readable safetensors profile ({e}); the file is truncated or "
                              "damaged.", "Delete it and profile again.") from None
        if meta.get("format") != PROFILE_FORMAT:
            raise GCacheError(f"{source} is not a GCache profile (metadata 'format' is {meta.get('format')!r}).")
        if meta.get("version") not in READABLE_VERSIONS:
            raise GCacheError(f"{source} has profile format version {meta.get('version')!r}; this GCache reads "
                              f"{' and '.join(READABLE_VERSIONS)}. Update GCache or profile again.")
        try:
            n = int(meta["n_steps"])
            count = int(meta["count"])
            e_def = 1 if meta["version"] == "1" else int(meta["e_definition"])
            extra = json.loads(meta.get("meta", "{}"))
            arrays = {k: tensors[k].double().numpy() for k in _TENSORS}
            opt = {k: tensors[k].double().numpy() if k in tensors else None for k in _OPTIONAL}
        except (KeyError, ValueError, json.JSONDecodeError) as e:
            raise GCacheError(f"{source} is damaged (missing or bad {e}).", "Delete it and profile again.") from None
        shapes_ok = arrays["e_sum"].shape == (n, n) and all(arrays[k].shape == (n,) for k in _TENSORS[1:]) \
            and all(a is None or (a.shape == shape(n) and np.all(np.isfinite(a)))
                    for a, shape in zip(opt.values(), _OPTIONAL.values())) \
            and all(opt[k] is None or not np.any(opt[k] < 0) for k in ("e1_sum", "fit_sq_sum")) \
            and (opt["gram_sum"] is None or not np.any(np.diagonal(opt["gram_sum"]) < 0))  # mean δ_i² ≥ 0
        if not shapes_ok or count < 0 or not 1 <= e_def <= E_DEFINITION:
            raise GCacheError(f"{source} is inconsistent (its arrays do not match n_steps={n}).",
                              "Delete it and profile again.")
        if not all(np.all(np.isfinite(a)) for a in arrays.values()):
            raise GCacheError(f"{source} contains NaN/Inf values.", "Delete it and profile again.")
        runs = extra.get("runs", 0) if isinstance(extra, dict) else None
        keys = extra.get("sample_keys", []) if isinstance(extra, dict) else None
        sums = (arrays["e_sum"], arrays["delta_norm_sum"], arrays["rel_delta_sum"], arrays["rel_h_sum"])
        if not isinstance(extra, dict) or isinstance(runs, bool) or not isinstance(runs, int) or runs < 0 \
                or not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) \
                or any(np.any(a < 0) for a in sums) or np.any(np.diag(arrays["e_sum"]) != 0) \
                or (count == 0 and any(np.any(a != 0) for a in sums)):
            raise GCacheError(f"{source} is inconsistent (bad metadata, negative or non-zero-diagonal errors, or sums "
                              "without samples): it was edited or damaged.", "Delete it and profile again.")
        check_io_meta(extra, source)
        return cls(n, arrays["e_sum"], count, arrays["delta_norm_sum"], arrays["rel_delta_sum"],
                   arrays["rel_h_sum"], arrays["times"], arrays["sigmas"], extra, **opt, e_definition=e_def)

    @classmethod
    def load(cls, path: str) -> "Profile":
        if not os.path.isfile(path):
            raise GCacheError(f"No profile file at {path}.")
        with open(path, "rb") as f:
            return cls.from_bytes(f.read(), source=os.path.basename(path))


def _read_st_metadata(data: bytes) -> dict:
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or n > len(data) - 8:
        raise ValueError("bad header length")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    return dict(header.get("__metadata__") or {})


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


class _BranchHistory:
    """Residual history of one branch in one run; fills one row of E per recorded step."""

    def __init__(self, n_steps: int, delta: torch.Tensor, history_device: Optional[torch.device], chunk_elems: int,
                 max_elems: Optional[int], forecast_times: Optional[Sequence[float]] = None):
        self.device = delta.device
        self.times = list(forecast_times) if forecast_times is not None else None
        hist_dev = history_device or delta.device
        self.stride = sample_stride(delta.numel(), delta.shape[-1], max_elems)
        self.numel = len(range(0, delta.numel(), self.stride))
        # Offloaded next to a GPU: pinned, so copies in and out run asynchronously on the compute stream.
        pin = torch.device(hist_dev).type == "cpu" and delta.device.type == "cuda"
        self.hist = torch.empty((n_steps, self.numel), dtype=delta.dtype, device=hist_dev, pin_memory=pin)
        self.rows = torch.zeros((n_steps, n_steps), dtype=torch.float64, device=delta.device)
        self.norms = torch.zeros(n_steps, dtype=torch.float64, device=delta.device)
        self.rel_h = torch.zeros(n_steps, dtype=torch.float64, device=delta.device)
        # E1[p, i, j] (order-1 forecast errors): N³ float64, 216 KB at N = 30, 1 MB at N = 50
        self.e1 = torch.zeros((n_steps,) * 3, dtype=torch.float64, device=delta.device) if self.times else None
        # the fit statistics (fit_stats.py), per fold of even / odd elements: N²·2 and N³·2 float64
        self.sq = torch.zeros((n_steps, n_steps, 2), dtype=torch.float64, device=delta.device) if self.times else None
        self.cross = torch.zeros((n_steps,) * 3 + (2,), dtype=torch.float64, device=delta.device) \
            if self.times else None
        # the Gram statistics G[i, j] = mean δ_i·δ_j per fold (fit_stats.py: unconstrained least squares): N²·2
        self.gram = torch.zeros((n_steps, n_steps, 2), dtype=torch.float64, device=delta.device) if self.times else None
        self.recorded = [False] * n_steps
        self.prev_h: Optional[torch.Tensor] = None
        self.rows_per_chunk = max(1, chunk_elems // max(1, self.numel))
        self.shape = tuple(delta.shape)
        self.dtype = delta.dtype

    def add(self, step: int, h: torch.Tensor, delta: torch.Tensor) -> None:
        d = delta.reshape(-1)[::self.stride]
        # Every difference is formed in float32: a bfloat16/float16 difference would round each element (8/11
        # significant bits) before the mean. `df` is δ itself when δ is float32 (the caller's tensor: read
        # only); every in-place operation below is on a temporary this method made.
        df = d.float()
        self.norms[step] = d.abs().mean(dtype=torch.float32)
        if self.gram is not None:
            self.gram[step, step] = _fold_means((df * df)[None], precise=True)[0]
        # Earlier rows in contiguous spans, read as slices: an offloaded (pinned) history is filled by
        # asynchronous device-to-host copies, and only a copy queued on the same stream (a slice's .to()) is
        # ordered after them; indexing rows on the host (hist[[0, 2]]) would read them before they land.
        for lo, hi in _spans([i for i in range(step) if self.recorded[i]], self.rows_per_chunk):
            rows = self.hist[lo:hi].to(self.device, non_blocking=True)
            own = rows.dtype != torch.float32 and rows.device.type in CONVERT_FIRST
            if own:
                rows = rows.float()  # .float() of a lower-precision tensor is a new (exact) copy: ours to write
            if self.gram is not None:  # a float32 temporary, freed before diff is made
                gram = _fold_means(rows * df, precise=True)
                self.gram[step, lo:hi] = gram
                self.gram[lo:hi, step] = gram
            # float32: in our own copy, or a new tensor by type promotion (a lower-precision history converts exactly)
            diff = rows.sub_(df) if own else rows - df
            vals = diff.abs_().mean(dim=1).double()
            self.rows[step, lo:hi] = vals
            self.rows[lo:hi, step] = vals
            if self.sq is not None:
                sq = _fold_means(diff.square_())  # |x|² = x²: the absolute values serve
                self.sq[step, lo:hi] = sq
                self.sq[lo:hi, step] = sq
        if self.e1 is not None:
            self._forecast_errors(step, df)
        self.hist[step].copy_(d, non_blocking=True)
        hf = h.reshape(-1)[::self.stride]
        if self.prev_h is not None:
            dh = hf.to(torch.float32, copy=True).sub_(self.prev_h)  # our own copy, float32 like δ's differences
            self.rel_h[step] = dh.abs_().mean() / self.prev_h.abs().mean(dtype=torch.float32).clamp_min(1e-12)
            self.prev_h.copy_(hf)
        else:
            self.prev_h = hf.clone()
        self.recorded[step] = True

    def _forecast_errors(self, j: int, dj: torch.Tensor) -> None:
        """E1[p, i, j] for recorded p < i < j: |δ_j − (δ_i + c·(δ_i − δ_p))|, c = (t_j − t_i)/(t_i − t_p), as
        means. Rows p come in slices (stream-ordered, as in add); one temporary of at most chunk rows.
        dj: δ_j in float32 (possibly the caller's tensor: never written)."""
        done = [i for i in range(j) if self.recorded[i]]
        if len(done) < 2:
            return
        t = np.asarray(self.times, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):  # p ≥ i entries are never read
            c_all = torch.from_numpy(np.nan_to_num((t[j] - t)[None, :] / (t[None, :] - t[:, None]))).to(
                self.device, torch.float32, non_blocking=True)   # c_all[p, i], one transfer per step
        for n, i in enumerate(done[1:], 1):
            di = self.hist[i].to(self.device, torch.float32, non_blocking=True, copy=True)
            step_ij = dj - di
            for lo, hi in _spans(done[:n], self.rows_per_chunk):
                c = c_all[lo:hi, i][:, None]
                block = self.hist[lo:hi].to(self.device, torch.float32, non_blocking=True, copy=True)
                self.cross[lo:hi, i, j] = _fold_means((di - block).mul_(step_ij))  # (δ_i − δ_p)·(δ_j − δ_i)
                pred = block.mul_(-c).add_(di * (1 + c))  # (1 + c)·δ_i − c·δ_p, in float32, in the copy
                self.e1[lo:hi, i, j] = pred.sub_(dj).abs_().mean(dim=1).double()

    def nbytes(self) -> int:
        return self.hist.numel() * self.hist.element_size() + (0 if self.prev_h is None else
                                                               self.prev_h.numel() * self.prev_h.element_size())


_BLOCK = 32  # elements per float32 partial sum in _fold_means(precise=True), then float64


def _fold_means(x: torch.Tensor, precise: bool = False) -> torch.Tensor:
    """Means of rows over their even and over their odd elements: [rows, m] -> [rows, 2] float64 (an odd last
    element is left out). `precise` (the Gram statistics, whose differences cancel: fit_stats.py): float32 sums
    over blocks of _BLOCK pairs, added up in float64 (one float32 sum over the fold lost ten times more, and
    mean(dtype=float64) would first copy x to float64: twice its bytes); it costs twice the plain mean on the CPU,
    so the difference-based statistics, which cancel far less, keep the plain float32 mean."""
    rows, half = x.shape[0], x.shape[1] // 2
    pairs = x[:, :2 * half].reshape(rows, half, 2)  # a view: rows are contiguous inside
    if not precise:
        return pairs.mean(dim=1, dtype=torch.float32).double()
    nb = half // _BLOCK
    total = pairs[:, nb * _BLOCK:].sum(dim=1).double()
    if nb:
        total += pairs[:, :nb * _BLOCK].reshape(rows, nb, _BLOCK, 2).sum(dim=2).double().sum(dim=1)
    return total / half


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
        self.forecast = forecast  # also record E1 and the fit statistics: O(N³·m) work over the run
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
                               self.times if self.forecast else None)
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
                    log.warning("GCache Profile: branch %r missed steps %s (interrupted run?); not added.", key, missing[:8])
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
                if b.e1 is not None:
                    for name, t in (("e1_sum", b.e1), ("fit_sq_sum", b.sq), ("fit_cross_sum", b.cross),
                                    ("gram_sum", b.gram)):
                        a = t.cpu().numpy()
                        if not np.all(np.isfinite(a)):
                            raise GCacheError(f"The forecast errors of branch {key!r} are NaN/Inf; nothing was added.")
                        setattr(prof, name, a if getattr(prof, name) is None else getattr(prof, name) + a)
                prof.delta_norm_sum += norms
                prof.rel_delta_sum += rel
                prof.rel_h_sum += relh
                prof.count += 1
        finally:
            self.branches.clear()
        return prof
