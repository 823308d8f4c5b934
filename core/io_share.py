"""The io share: the part of a sampler step's time spent outside the block stack, measured while profiling, and the
speed-up it predicts, N / (K + (N − K)·io_share), with a range.

One profiling run gives one io share per step: 1 − (block-stack time) / (step time), the profile's own recording
left out of the step. The first step is left out (its calls warm up kernels, allocator and caches) and so is the
last (it ends with the sampling run and has no next step's model input in it), when the run has 3 steps or more.
A run keeps the median and quartiles of its steps' shares (`run_summary`); a profile keeps the latest MAX_RUNS runs
in its metadata ("io_runs"), and merging profiles concatenates them.

A profile's io share is the median of its runs' medians (medians twice: a burst of load on a shared machine, a
recording that stalls a step, moves neither). Its range is the interquartile range of the steps (the median over
runs of each run's first and third quartile), widened to every run's median: the io shares of the profiled steps'
middle half, and of every profiled run. The predicted speed-up's range is the prediction at the range's two ends, and
the log lines say so ("at the io shares of the profiled steps' middle half"). It is a range of the profile's steps,
not a bound on the speed-up one Apply run measures: that figure rests on the run's own few computed steps (one or two
at small K), so it strays further than the profiled steps' middle half does. Profiles from before per-step timing
hold one timed total ("io_time": seconds in the stack and in whole steps): their share has no range. Profiles with
neither carry the parameter-count estimate they were made with ("io_share"): no range either, said so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from .errors import GCacheError
from .policy import predicted_speedup

MAX_RUNS = 32  # runs kept per profile (the latest): enough for medians, a few KB of JSON


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), linear between order statistics (numpy's default percentile)."""
    if len(values) == 0:
        raise GCacheError("No timed step to take an io share from.")
    q1, med, q3 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return float(q1), float(med), float(q3)


def step_shares(step_seconds: Mapping, stack_seconds: Mapping, record_seconds: Mapping) -> list[float]:
    """One io share per timed step, in step order, the first and the last left out (when 3 or more were timed).
    A step's time is its wall time less the profile's recording in it; shares are clipped to [0, 1]."""
    steps = sorted(s for s in stack_seconds if s is not None and stack_seconds[s] > 0 and s in step_seconds)
    if len(steps) >= 3:
        steps = steps[1:-1]
    out = []
    for s in steps:
        call = step_seconds[s] - record_seconds.get(s, 0.0)
        if call > 0:
            out.append(min(max(1.0 - stack_seconds[s] / call, 0.0), 1.0))
    return out


def run_summary(shares: Sequence[float]) -> dict:
    """What a profile keeps of one run: the median and quartiles of its steps' io shares, and how many steps."""
    q1, med, q3 = quartiles(shares)
    return {"median": round(med, 6), "q1": round(q1, 6), "q3": round(q3, 6), "steps": len(shares)}


def _valid_run(r) -> bool:
    if not isinstance(r, dict):
        return False
    vals = [r.get(k) for k in ("q1", "median", "q3")]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1
               for v in vals) and vals[0] <= vals[1] <= vals[2] \
        and isinstance(r.get("steps"), int) and not isinstance(r.get("steps"), bool) and r["steps"] >= 0


def check_meta(meta: Mapping, source: str) -> None:
    """A profile's io metadata as written by GCache, or a clear error (the file was edited or damaged)."""
    runs = meta.get("io_runs")
    if runs is not None and not (isinstance(runs, list) and all(_valid_run(r) for r in runs)):
        raise GCacheError(f"{source} has damaged io timings (metadata 'io_runs': each run needs q1 ≤ median ≤ q3 "
                          "in [0, 1] and a step count): it was edited or damaged.", "Delete it and profile again.")


def runs_of(meta: Mapping) -> list[dict]:
    """The profile's timed runs; a profile from before per-step timing gives its one timed total as one run
    (median = quartiles = its share, 0 steps: no spread of its own)."""
    runs = meta.get("io_runs")
    if isinstance(runs, list):
        return [dict(r) for r in runs if _valid_run(r)]
    t = meta.get("io_time")
    if isinstance(t, dict) and isinstance(t.get("call"), (int, float)) and t["call"] > 0:
        v = round(float(min(max(1.0 - float(t.get("stack", 0.0)) / float(t["call"]), 0.0), 0.99)), 6)
        return [{"median": v, "q1": v, "q3": v, "steps": 0}]
    return []


def merged_runs(meta_a: Mapping, meta_b: Mapping) -> list[dict]:
    """The timed runs of two merged profiles: a's, then b's, the latest MAX_RUNS kept."""
    return (runs_of(meta_a) + runs_of(meta_b))[-MAX_RUNS:]


@dataclass(frozen=True)
class IoShare:
    """An io share with its range (low, high: None when it has none) and where it comes from."""
    value: float
    low: Optional[float] = None
    high: Optional[float] = None
    source: str = "measured"  # "measured" | "one timed total" | "parameter count" | "none" | "policy without range"
    runs: int = 0

    @property
    def has_range(self) -> bool:
        return self.low is not None and self.high is not None

    @classmethod
    def from_runs(cls, runs: Sequence[dict]) -> "IoShare":
        meds = [float(r["median"]) for r in runs]
        value = quartiles(meds)[1]
        if all(r.get("steps", 0) == 0 for r in runs) and len(runs) == 1:  # an old profile's one total
            return cls(value, None, None, "one timed total", 1)
        q1 = quartiles([float(r["q1"]) for r in runs])[1]
        q3 = quartiles([float(r["q3"]) for r in runs])[1]
        return cls(value, min(q1, min(meds)), max(q3, max(meds)), "measured", len(runs))

    @classmethod
    def from_meta(cls, meta: Mapping) -> "IoShare":
        """A profile's io share (module docstring): measured runs, else an old one timed total, else the
        parameter-count estimate, else 0."""
        runs = runs_of(meta)
        if runs:
            return cls.from_runs(runs)
        est = meta.get("io_share")
        if isinstance(est, (int, float)) and not isinstance(est, bool) and 0 <= est < 1:
            return cls(float(est), None, None, "parameter count")
        return cls(0.0, None, None, "none")

    @classmethod
    def from_metrics(cls, metrics: Mapping, fallback: float) -> "IoShare":
        """The io share a policy was made with (its metrics), else `fallback` (the parameter-count estimate)."""
        v = metrics.get("io_share")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 1:
            return cls(float(fallback), None, None, "parameter count")
        r = metrics.get("io_share_range")
        ok = isinstance(r, list) and len(r) == 2 and all(isinstance(x, (int, float)) for x in r) \
            and 0 <= r[0] <= v <= r[1] <= 1
        source = metrics.get("io_share_source")
        return cls(float(v), float(r[0]) if ok else None, float(r[1]) if ok else None,
                   str(source) if isinstance(source, str) else ("measured" if ok else "policy without range"))

    # ---------------------------------------------------------------- the speed-up it predicts
    def speedup(self, n_steps: int, n_computed: int) -> tuple[float, Optional[float], Optional[float]]:
        """(predicted, lowest, highest) speed-up: the share's high end gives the lowest speed-up."""
        mid = predicted_speedup(n_steps, n_computed, self.value)
        if not self.has_range:
            return mid, None, None
        return mid, predicted_speedup(n_steps, n_computed, self.high), predicted_speedup(n_steps, n_computed, self.low)

    def why_no_range(self) -> str:
        return {"one timed total": "a profile from before per-step timing: one timed total",
                "parameter count": "io share estimated from parameter counts, not measured",
                "none": "no io share known: speed-up = N / K",
                "policy without range": "a policy made before io-share ranges"}.get(
                    self.source, "io share given without a range")

    def speedup_text(self, n_steps: int, n_computed: int) -> str:
        """'2.40× (2.31–2.52)': the median, then the range from the io share's range ('2.40×' without one)."""
        mid, lo, hi = self.speedup(n_steps, n_computed)
        return f"{mid:.2f}×" if lo is None else f"{mid:.2f}× ({lo:.2f}–{hi:.2f})"

    def range_meaning(self) -> str:
        """What the range is a range of (module docstring), as the log lines say it."""
        return "at the io shares of the profiled steps' middle half" + \
            (" and of every profiled run" if self.runs > 1 else "")

    def describe_speedup(self, n_steps: int, n_computed: int) -> str:
        """'predicted 2.40× (2.31–2.52 at the io shares of the profiled steps' middle half)', or
        'predicted 2.40× (no range: why)'."""
        mid, lo, hi = self.speedup(n_steps, n_computed)
        if lo is None:
            return f"predicted {mid:.2f}× (no range: {self.why_no_range()})"
        return f"predicted {mid:.2f}× ({lo:.2f}–{hi:.2f} {self.range_meaning()})"

    def describe(self) -> str:
        """'io share 0.033 (0.026–0.039, 3 profiled runs)'."""
        if not self.has_range:
            return f"io share {self.value:.3f} ({self.why_no_range()})"
        runs = "1 profiled run: its steps' interquartile range" if self.runs == 1 else \
            f"{self.runs} profiled runs: steps' interquartile range and the runs' medians"
        return f"io share {self.value:.3f} ({self.low:.3f}–{self.high:.3f}, {runs})"

    def metrics(self, n_steps: int, n_computed: int) -> dict:
        """What a policy records: the io share with its range and source, the predicted speed-up with its range."""
        mid, lo, hi = self.speedup(n_steps, n_computed)
        return {"io_share": round(self.value, 4),
                "io_share_range": [round(self.low, 4), round(self.high, 4)] if self.has_range else None,
                "io_share_source": self.source,
                "predicted_speedup": round(mid, 3),
                "predicted_speedup_range": [round(lo, 3), round(hi, 3)] if lo is not None else None}
