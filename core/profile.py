"""Profile: residual errors E[i, j] = mean |δ_i − δ_j| over full-compute runs, plus local indicators and the
statistics the forecasters declared (core/profile_stats), as a file.

The artifact stores sums and a count (mergeable), saved as safetensors with JSON metadata: the base tensors
(BASE_TENSORS), and each registered statistic's tensors (by their file names) when it was recorded. Saving, loading,
checking and merging name no statistic: a statistic says its tensors' shapes, how a loaded one is checked and how
two sums merge (a file's tensors that no registered statistic holds are not read). Only the views E1 and fit_stats(),
which forecasters and the search read, name built-in ones; a new statistic is read with profile.mean(file name).
The recorder, which makes a Profile from a run, is core/recorder.py.

Format versions: 2 records how E was computed (`e_definition`, and meta "residual_dtype": the dtype of the recorded
δ). Version-1 files still load; those with forecast statistics were made by a recorder that, on float32 residuals,
stored the mean *squared* difference as E: `Profile.defect` says so, and nothing builds a mask from them.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from . import profile_stats
from .errors import GCacheError
from .files import atomic_write_bytes
from .fit_stats import FitStats
from .io_share import IoShare, merged_runs
from .io_share import check_meta as check_io_meta
from .verdicts import merged_checks

log = logging.getLogger("gcache")

PROFILE_FORMAT = "gcache.profile"
PROFILE_VERSION = 2
READABLE_VERSIONS = ("1", "2")
# How E was computed. 1: version-1 files (with forecast recording on, float32 residuals gave a squared E, and
# bfloat16/float16 differences were rounded to their dtype); 2: mean |δ_i − δ_j| of float32 differences.
E_DEFINITION = 2
MAX_SAMPLE_KEYS = 4096  # run keys remembered per profile for the duplicate check (16 hex digits each)
_TENSORS = profile_stats.BASE_TENSORS
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
    sums: dict = field(default_factory=dict)  # the statistics' tensors: file name -> Σ over samples (profile_stats)
    e_definition: int = E_DEFINITION  # how E was computed (E_DEFINITION); 1 for version-1 files

    # A registered statistic's tensor also reads and writes as an attribute (profile.e1_sum; None when absent), the
    # names the code used before statistics were declared.
    def __getattr__(self, name: str):
        if name != "sums" and not name.startswith("__") and profile_stats.owner(name) is not None:
            return self.__dict__.get("sums", {}).get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if name in self.__dataclass_fields__ or profile_stats.owner(name) is None:
            object.__setattr__(self, name, value)
        elif value is None:
            self.sums.pop(name, None)
        else:
            self.sums[name] = value

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

    # ------------------------------------------------------------------ the statistics (core/profile_stats)
    def has(self, stat: str) -> bool:
        """Whether every tensor of statistic `stat` is in this profile."""
        return all(name in self.sums for name in profile_stats.get(stat).tensors)

    def mean(self, tensor: str) -> np.ndarray:
        """A statistic's tensor (by its file name) as the mean over samples; says what to do when it is absent."""
        self._need_samples()
        if tensor not in self.sums:
            stat = profile_stats.owner(tensor)
            raise GCacheError(stat.missing if stat is not None else
                              f"This profile has no {tensor!r}: profile again with forecast recording on.")
        return self.sums[tensor] / self.count

    # the views of the built-in statistics that forecasters and search read
    @property
    def E1(self) -> np.ndarray:
        """E1[p, i, j]: mean |δ_j − δ̂_j| of the linear forecast from computed steps p < i (order-1 DP input)."""
        return self.mean("e1_sum")

    def has_fit_stats(self) -> bool:
        return self.has("fit")

    def fit_stats(self) -> FitStats:
        """The squared-error statistics of linear-form forecasts (the profile-fitted forecaster needs them), with
        the Gram statistics when the profile has them."""
        return FitStats(self.mean("fit_sq_sum"), self.mean("fit_cross_sum"),
                        self.mean("gram_sum") if self.has("gram") else None)

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
        if self.e_definition < 2 and self.sums and self.count > 0:  # version 1 recorded them only with forecasting on
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
        checks = merged_checks(self.meta, other.meta)  # the self-check's verdicts: both sides' (a fail wins)
        if checks:
            meta["selfcheck"] = checks
        io_runs = merged_runs(self.meta, other.meta)  # timed runs: concatenated (an old total counts as one)
        meta.pop("io_time", None)
        if io_runs:
            meta["io_runs"] = io_runs
        sums = {}
        for name in list(self.sums) + [k for k in other.sums if k not in self.sums]:
            a, b = self.sums.get(name), other.sums.get(name)
            if a is not None and b is not None:
                stat = profile_stats.owner(name)
                sums[name] = stat.merge(a, b) if stat is not None else a + b
            elif self.count == 0 or other.count == 0:
                kept = a if other.count == 0 else b
                if kept is not None:
                    sums[name] = kept.copy()  # never an array of another profile
        if self.count and other.count:
            for stat in profile_stats.registered():
                if self.has(stat.name) != other.has(stat.name):
                    log.warning("GCache Profile: one of the merged profiles has no %s statistics (made without "
                                "forecast recording, or before they were recorded); the result keeps none. Profile "
                                "every run with forecast recording on to keep them.", stat.name)
                    break
        sampled = [p.e_definition for p in (self, other) if p.count] or [min(self.e_definition, other.e_definition)]
        return Profile(self.n_steps, self.e_sum + other.e_sum, self.count + other.count,
                       self.delta_norm_sum + other.delta_norm_sum, self.rel_delta_sum + other.rel_delta_sum,
                       self.rel_h_sum + other.rel_h_sum, self.times.copy(), self.sigmas.copy(), meta, sums,
                       e_definition=min(sampled))

    # ------------------------------------------------------------------ file
    def to_bytes(self) -> bytes:
        tensors = {k: torch.from_numpy(np.ascontiguousarray(getattr(self, k), dtype=np.float64)) for k in _TENSORS}
        for name, a in self.sums.items():
            tensors[name] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
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
            specs = {name: t for stat in profile_stats.registered() for name, t in stat.tensors.items()}
            opt = {k: tensors[k].double().numpy() for k in specs if k in tensors}
        except (KeyError, ValueError, json.JSONDecodeError) as e:
            raise GCacheError(f"{source} is damaged (missing or bad {e}).", "Delete it and profile again.") from None
        shapes_ok = arrays["e_sum"].shape == (n, n) and all(arrays[k].shape == (n,) for k in _TENSORS[1:]) \
            and all(a.shape == specs[k].shape(n) and np.all(np.isfinite(a)) and (specs[k].check is None or
                                                                                 specs[k].check(a))
                    for k, a in opt.items())
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
                   arrays["rel_h_sum"], arrays["times"], arrays["sigmas"], extra, opt, e_definition=e_def)

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
