"""Policy: which sampler steps compute the block stack (1) and which reuse the cached residual (0).

A policy is a mask over *sampler steps* (the N steps of the sigma schedule), never over model calls.
It is stored as human-readable JSON with a format version.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

from . import forecasters
from .errors import GCacheError
from .files import atomic_write_text

POLICY_FORMAT = "gcache.policy"
POLICY_VERSION = 2  # 2: the forecaster by name (+ its parameters); version 1 held an order 0/1/2, still read


def k_for_speedup(n_steps: int, speedup: float, io_share: float) -> int:
    """The K (computed steps of N) whose predicted speed-up is the largest not above `speedup`, from
    N / (K + (N − K)·io_share); at least 1. Raises when the target is below 1."""
    if not math.isfinite(speedup) or speedup < 1.0:
        raise GCacheError(f"A target speed-up must be at least 1.0 (no speed-up), got {speedup}.")
    if not 0.0 <= io_share < 1.0:
        raise GCacheError(f"io_share must lie in [0, 1), got {io_share}.")
    k = math.ceil((n_steps / speedup - n_steps * io_share) / (1.0 - io_share) - 1e-9)
    return max(1, min(n_steps, k))


def out_of_reach(n_steps: int, speedup: float, io_share: float) -> Optional[str]:
    """Why a target speed-up can't be had at this step count and io share (None when it can): even K = 1 computed
    step gives at most N / (1 + (N − 1)·io_share)."""
    most = predicted_speedup(n_steps, 1, io_share)
    if speedup <= most * (1 + 1e-9):
        return None
    return (f"a {speedup:g}x speed-up is out of reach at {n_steps} steps with an io share of {io_share:.3f} (the part "
            f"of a step outside the block stack): the most is {most:.2f}x, with K = 1 computed step")


def few_computed(n_steps: int, k: int) -> Optional[str]:
    """A note when K is so small that caching may lose to simply running K steps (None otherwise): measured on the
    reference model (bench/few_steps.py), 2 of 4 steps cached gave 22.3-23.5 dB against 24.5 dB for a 2-step run."""
    if k > 2 or k >= n_steps:
        return None
    return (f"only K = {k} of {n_steps} steps compute the block stack: with so few, caching can be worse than simply "
            f"sampling {k} step{'' if k == 1 else 's'} (on the reference model at 4 steps, 2x by caching gave "
            "22.3-23.5 dB against 24.5 dB for a 2-step run); a few-step (distilled) model may do better with fewer "
            "steps than with GCache")


def predicted_speedup(n_steps: int, n_computed: int, io_share: float) -> float:
    """N·T / (K·T + (N−K)·T_io) with io_share = T_io / T (cost of a step without the block stack)."""
    if not 0.0 <= io_share <= 1.0:
        raise GCacheError("io_share must lie in [0, 1] (time of a step without blocks / time of a full step), got "
                          f"{io_share}.")
    return n_steps / (n_computed + (n_steps - n_computed) * io_share)


@dataclass
class Policy:
    mask: list[int]
    times: Optional[list[float]] = None   # normalized time t of each step (1 = start of sampling, 0 = end)
    sigmas: Optional[list[float]] = None  # the sampler's sigmas of each step, when known
    method: str = "manual"
    provenance: dict = field(default_factory=dict)  # s, degree, objective, evaluations, seeds, profile…
    metrics: dict = field(default_factory=dict)     # measured loss, psnr, ssim, predicted speed-up…
    forecast: str = "reuse"  # what a skipped step adds to h: a forecaster's name (core/forecasters; 0/1/2 accepted)
    forecast_params: dict = field(default_factory=dict)  # the forecaster's parameters (profile-fitted: α per step)

    def __post_init__(self):
        self.mask = [int(v) if v in (0, 1, True, False) else v for v in self.mask]
        self.forecast = forecasters.canonical(self.forecast)
        self.validate()

    # ------------------------------------------------------------------ basics
    @property
    def n_steps(self) -> int:
        return len(self.mask)

    @property
    def n_computed(self) -> int:
        return int(sum(self.mask))

    def validate(self) -> None:
        m = self.mask
        if not isinstance(m, list) or len(m) == 0:
            raise GCacheError("The policy mask is empty: it needs one 0/1 entry per sampler step.")
        bad = [v for v in m if v not in (0, 1)]
        if bad:
            raise GCacheError(f"The policy mask may only hold 0 (reuse) and 1 (compute); found {bad[:3]}.")
        if m[0] != 1:
            raise GCacheError(
                "The first step of a policy must compute the blocks (mask[0] = 1): there is no cached residual "
                "to reuse before it. Set the first entry to 1."
            )
        if not isinstance(self.forecast_params, dict):
            raise GCacheError("The policy's forecast_params must be a JSON object.")
        forecasters.get(self.forecast).check_params(self.forecast_params, m)
        for name, seq in (("times", self.times), ("sigmas", self.sigmas)):
            if seq is not None:
                if len(seq) != len(m):
                    raise GCacheError(
                        f"The policy has {len(m)} mask entries but {len(seq)} {name}: they must match one per step."
                    )
                if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in seq):
                    raise GCacheError(f"The policy's {name} contain a non-number or NaN/Inf value.")

    def predicted_speedup(self, io_share: float) -> float:
        return predicted_speedup(self.n_steps, self.n_computed, io_share)

    def compute_steps(self) -> list[int]:
        return [i for i, v in enumerate(self.mask) if v]

    def describe(self) -> str:
        return "".join("█" if v else "·" for v in self.mask)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def all_ones(cls, n_steps: int, **kw) -> "Policy":
        check_budget(n_steps, n_steps)
        return cls(mask=[1] * n_steps, method="full", **kw)

    @classmethod
    def for_mask(cls, profile, mask: Sequence[int], forecaster="reuse", **kw) -> "Policy":
        """The policy that applies `mask` with `forecaster` on the steps of `profile` (its times and sigmas), with
        the forecaster's parameters fitted to the mask from the profile (the profile-fitted one's α). `kw`: method,
        provenance, metrics."""
        fc = forecasters.get(forecaster)
        mask = [int(v) for v in mask]
        return cls(mask=mask, times=[float(t) for t in profile.times], sigmas=[float(s) for s in profile.sigmas],
                   forecast=fc.name, forecast_params=fc.fit(profile, mask), **kw)

    @classmethod
    def from_steps(cls, n_steps: int, steps: Sequence[int], **kw) -> "Policy":
        mask = [0] * n_steps
        for s in steps:
            if not 0 <= int(s) < n_steps:
                raise GCacheError(f"Step {s} is outside 0..{n_steps - 1}.")
            mask[int(s)] = 1
        return cls(mask=mask, **kw)

    # ------------------------------------------------------------------ remap
    def remap(self, n_steps: int, times: Optional[Sequence[float]] = None) -> "Policy":
        """The same policy for another step count, matched by normalized time.

        K scales with N (K' = round(K·N'/N), at least 1). Each computed step goes to the new step nearest in
        normalized time; collisions take the nearest free step, so the result has exactly K' computed steps.
        """
        if n_steps < 1:
            raise GCacheError(f"Cannot remap a policy to {n_steps} steps.")
        # Match on one time axis: a policy without times knows only step positions, so both sides use them.
        old_t = self.times if self.times is not None else _uniform_times(self.n_steps)
        new_t = list(times) if times is not None and self.times is not None else _uniform_times(n_steps)
        if times is not None and len(times) != n_steps:
            raise GCacheError(f"remap got {len(times)} times for {n_steps} steps.")
        k_new = max(1, min(n_steps, round(self.n_computed * n_steps / self.n_steps)))
        # Rank old computed steps so that the first step always wins its slot.
        targets = [old_t[i] for i in self.compute_steps()]
        chosen: set[int] = {0}
        for t in targets[1:]:
            if len(chosen) >= k_new:
                break
            order = sorted(range(n_steps), key=lambda j: (abs(new_t[j] - t), j))
            for j in order:
                if j not in chosen:
                    chosen.add(j)
                    break
        # A shrinking K may leave targets unused; a growing K fills the largest gaps.
        while len(chosen) < k_new:
            steps = sorted(chosen) + [n_steps]
            gaps = [(steps[a + 1] - steps[a], steps[a]) for a in range(len(steps) - 1)]
            size, start = max(gaps)
            chosen.add(start + size // 2)
        prov = dict(self.provenance, remapped_from=self.n_steps)
        return Policy.from_steps(n_steps, sorted(chosen), times=list(times) if times is not None else None,
                                 method=self.method, provenance=prov, metrics={}, forecast=self.forecast)
        # (fitted α belong to the old steps: without them the profile-fitted forecaster forecasts linearly)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return {
            "format": POLICY_FORMAT,
            "version": POLICY_VERSION,
            "n_steps": self.n_steps,
            "k": self.n_computed,
            "mask": self.mask,
            "times": self.times,
            "sigmas": self.sigmas,
            "method": self.method,
            "provenance": self.provenance,
            "metrics": self.metrics,
            "forecast": self.forecast,
            "forecast_params": self.forecast_params,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict, source: str = "policy") -> "Policy":
        if not isinstance(d, dict) or d.get("format") != POLICY_FORMAT:
            raise GCacheError(f"{source} is not a GCache policy file (no 'format': '{POLICY_FORMAT}').")
        if d.get("version") not in (1, POLICY_VERSION):
            raise GCacheError(
                f"{source} has policy format version {d.get('version')!r}; this GCache reads version "
                f"{POLICY_VERSION}. Update GCache, or run GCache Search again to make a new policy."
            )
        try:
            mask = list(d["mask"])
            pol = cls(mask=mask, times=d.get("times"), sigmas=d.get("sigmas"), method=str(d.get("method", "manual")),
                      provenance=dict(d.get("provenance") or {}), metrics=dict(d.get("metrics") or {}),
                      forecast=d.get("forecast", "reuse"),  # files written before forecasting reuse
                      forecast_params=dict(d.get("forecast_params") or {}))
        except GCacheError as e:
            raise GCacheError(f"{source}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise GCacheError(f"{source} is damaged ({e!r}).", "Run GCache Search again or restore a backup.") from None
        for key, val in (("n_steps", pol.n_steps), ("k", pol.n_computed)):
            if key in d and d[key] != val:
                raise GCacheError(f"{source} says {key}={d[key]} but its mask has {val}: the file was edited "
                                  "inconsistently. Fix the mask or the count.")
        return pol

    @classmethod
    def from_json(cls, text: str, source: str = "policy") -> "Policy":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise GCacheError(f"{source} is not valid JSON ({e.msg} at line {e.lineno}); the file is truncated or "
                              "was edited by hand.", "Restore it or run GCache Search again.") from None
        except RecursionError:
            raise GCacheError(f"{source} is not a GCache policy (absurdly nested JSON).") from None
        return cls.from_dict(d, source)

    def save(self, path: str) -> None:
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str) -> "Policy":
        if not os.path.isfile(path):
            raise GCacheError(f"No policy file at {path}.")
        try:
            with open(path, "r", encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            raise GCacheError(f"{os.path.basename(path)} is not a text file, so not a GCache policy (JSON). "
                              "Choose the policy's .json file.") from None
        return cls.from_json(text, source=os.path.basename(path))


def check_budget(k: int, n_steps: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool):
        raise GCacheError(f"K must be a whole number, got {k!r}.")
    if not 1 <= k <= n_steps:
        raise GCacheError(f"K = {k} computed steps is outside [1, {n_steps}] for {n_steps} sampler steps: "
                          f"choose K between 1 and {n_steps}.")


def _uniform_times(n: int) -> list[float]:
    """Normalized time of step i when nothing better is known: 1 at the first step, → 0 at the end."""
    return [1.0 - i / n for i in range(n)]
