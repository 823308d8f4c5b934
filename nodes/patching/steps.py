"""Step attribution: which sampler step a model call belongs to, and where a run sits in its schedule.

One function for GCache Apply and GCache Profile. No ComfyUI import: sigmas arrive as
plain floats, the model's sigma → normalized-time map and its candidate schedules arrive as callables.

Within a run. Samplers report the end of step i through their callback (k-diffusion calls it once per step
with x["i"]). A call after the callback of step i − 1 belongs to step i, except a call whose sigma lies
strictly inside (σ_i, σ_{i−1}): that is an intermediate evaluation of step i − 1 made after its callback
(dpm_2's midpoint, dpmpp_2s_ancestral's half step). Heun-type correctors evaluate the model exactly at σ_{i+1},
the time point of step i + 1, and count as step i + 1. CFG's cond/uncond calls share the step of their
evaluation. A sampler that never calls back falls back to the sigma interval of the call.

Across runs. KSamplerAdvanced (Wan 2.2's two experts) hands each sampler a slice of one schedule; steps are
global: the run's sigmas are located in the full schedule (the policy's own sigmas first, else the model's
standard schedules, from a ScheduleCatalog that keeps what it computed), and step = offset + local step.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from ...core.errors import GCacheError
from ...core.policy import Policy

log = logging.getLogger("gcache")

REL_TOL = 1e-4  # sigmas travel as float32 tensors; compare them relative to the schedule's scale
MAX_SCHEDULE_SEARCH = 400  # longest full schedule tried when placing a slice
TIME_TOL = 1e-3  # normalized times closer than this are the same step (float32 sigmas, one time map)


def _close(a: float, b: float, scale: float) -> bool:
    return abs(a - b) <= REL_TOL * max(scale, 1e-8)


def offset_in(run: Sequence[float], full: Sequence[float]) -> Optional[int]:
    """Offset of `run` (n + 1 sigmas incl. its end) inside `full` (N + 1 sigmas), or None.

    The run's last sigma may be 0 where the full schedule continues (KSamplerAdvanced force_full_denoise).
    """
    run, full = [float(v) for v in run], [float(v) for v in full]
    n = len(run) - 1
    if n < 1 or len(full) < len(run):
        return None
    scale = max(abs(v) for v in full)
    for off in range(len(full) - n):
        seg = full[off:off + n + 1]
        if all(_close(a, b, scale) for a, b in zip(run[:-1], seg[:-1])) and \
                (_close(run[-1], seg[-1], scale) or run[-1] == 0.0):
            return off
    return None


@dataclass
class Schedule:
    """Where one sampling run sits: its global step offset inside a full schedule of n_global steps."""
    sigmas: list[float]           # the full schedule, N + 1 values (end included)
    offset: int                   # global index of the run's first step
    n_run: int                    # steps of this run
    source: str                   # "policy", "model:<scheduler>" or "run" (run's own sigmas)

    @property
    def n_global(self) -> int:
        return len(self.sigmas) - 1

    @property
    def is_slice(self) -> bool:
        return self.offset > 0 or self.offset + self.n_run < self.n_global

    @property
    def end(self) -> int:
        return self.offset + self.n_run

    def where(self) -> str:
        """For log lines: "6 steps" or "steps 3-5 of 6"."""
        return f"steps {self.offset}-{self.end - 1} of {self.n_global}" if self.is_slice else f"{self.n_global} steps"


def find_schedule(run_sigmas: Sequence[float], policy_sigmas: Optional[Sequence[float]] = None,
                  candidates: Iterable[tuple[str, Sequence[float]]] = ()) -> Schedule:
    """Locate a run in the policy's schedule, else in the model's standard schedules, else itself.

    `policy_sigmas` are the N step sigmas of a policy (no end value); `candidates` yields (name, N + 1 sigmas)
    of full schedules, shortest first. A run that is a full schedule in itself is taken as is.
    """
    run = [float(v) for v in run_sigmas]
    n = len(run) - 1
    if n < 1:
        raise GCacheError("The sampler got fewer than two sigmas: there is no step to run.")
    if policy_sigmas:
        full = [float(v) for v in policy_sigmas] + [0.0]
        off = offset_in(run, full)
        if off is not None:
            return Schedule(full, off, n, "policy")
    for name, full in candidates:
        full = [float(v) for v in full]
        if len(full) == len(run) and offset_in(run, full) == 0:
            return Schedule(full, 0, n, f"model:{name}")  # a full run of a standard schedule
        if len(full) > len(run):
            off = offset_in(run, full)
            if off is not None:
                return Schedule(full, off, n, f"model:{name}")
    return Schedule(run, 0, n, "run")


class ScheduleCatalog:
    """A model's standard full schedules (every scheduler × step count), computed on demand and kept: a slice
    (KSamplerAdvanced, denoise < 1) is located by scanning them, and the same model is sampled again and again.

    `calculate(name, n)` returns n + 1 sigmas or raises (a scheduler that cannot make n steps is no candidate).
    """

    def __init__(self, names: Sequence[str], calculate: Callable[[str, int], Sequence[float]]):
        self.names = list(names)
        self.calculate = calculate
        self._known: dict[tuple[str, int], Optional[list[float]]] = {}
        self._placed: dict[tuple, Schedule] = {}

    def _get(self, name: str, n: int) -> Optional[list[float]]:
        key = (name, n)
        if key not in self._known:
            try:
                self._known[key] = [float(v) for v in self.calculate(name, n)]
            except Exception:  # noqa: BLE001  any failure means "no such schedule", never a crash
                self._known[key] = None
        return self._known[key]

    def name_of(self, run_sigmas: Sequence[float]) -> Optional[str]:
        """The scheduler whose full schedule of this length is `run_sigmas` (first in `names` order), or None."""
        run = [float(v) for v in run_sigmas]
        n = len(run) - 1
        scale = max(abs(v) for v in run) if run else 1.0
        for name in self.names:
            full = self._get(name, n)
            if full is not None and len(full) == len(run) and all(_close(a, b, scale) for a, b in zip(run, full)):
                return name
        return None

    def scheduler_of(self, run_sigmas: Sequence[float]) -> Optional[str]:
        """The scheduler that made a full run's sigmas, also when the sampler dropped the penultimate sigma of a
        schedule one step longer (dpm_2, uni_pc: "<scheduler>-penultimate-dropped"); None if no scheduler did."""
        name = self.name_of(run_sigmas)
        if name is not None:
            return name
        run = [float(v) for v in run_sigmas]
        scale = max(abs(v) for v in run) if run else 1.0
        for name in self.names:
            full = self._get(name, len(run))
            if full is not None and len(full) == len(run) + 1 and \
                    all(_close(a, b, scale) for a, b in zip(run, full[:-2] + full[-1:])):
                return f"{name}-penultimate-dropped"
        return None

    def place(self, run: list[float]) -> Schedule:
        """find_schedule over this catalog, remembered per run (found or not: a miss scans everything)."""
        key = tuple(run)
        if key not in self._placed:
            self._placed[key] = find_schedule(run, None, self.candidates(len(run) - 1))
        return self._placed[key]

    def candidates(self, n_run: int) -> Iterable[tuple[str, list[float]]]:
        """Full schedules longer than a run of n_run steps, shortest first."""
        for n in range(n_run + 1, max(MAX_SCHEDULE_SEARCH, 4 * n_run)):
            for name in self.names:
                full = self._get(name, n)
                if full is not None:
                    yield name, full


def place_run(run_sigmas: Sequence[float], sigma_max: float, policy_sigmas: Optional[Sequence[float]],
              catalog: Optional[ScheduleCatalog], is_own_tail: Callable[[Schedule], bool]) -> Schedule:
    """Where a sampling run sits: a full run (σ_max … 0) is its own schedule unless the policy's sigmas say
    otherwise; a slice is located in the policy's schedule, else in the model's standard ones.

    A run found as the tail of a standard schedule is either the rest of a split (Wan 2.2's second expert:
    global steps) or a schedule of its own (KSampler denoise < 1, or a second sampler without its first half):
    `is_own_tail(schedule)` tells which, and an own tail uses the run's own N steps.
    """
    run = [float(v) for v in run_sigmas]
    # full: from σ_max to 0, or a standard schedule of its own length (ddim_uniform starts below σ_max)
    is_full = (abs(run[0] - sigma_max) <= REL_TOL * sigma_max and run[-1] == 0.0) or \
        (catalog is not None and catalog.name_of(run) is not None)
    sched = find_schedule(run, policy_sigmas, ())
    if sched.source == "run" and not is_full and catalog is not None:
        sched = catalog.place(run)
    if sched.source.startswith("model:") and sched.offset > 0 and is_own_tail(sched):
        sched = Schedule(run, 0, sched.n_run, "tail")  # logged by the caller: "its own N steps"
    return sched


class StepTracker:
    """Maps each model call of one run to its global sampler step (see module docstring)."""

    def __init__(self, run_sigmas: Sequence[float], offset: int = 0):
        self.sigmas = [float(v) for v in run_sigmas]
        self.n = len(self.sigmas) - 1
        self.offset = offset
        self.done = 0            # steps the sampler has reported finished (callbacks)
        self.saw_callback = False
        self.scale = max(abs(v) for v in self.sigmas) if self.sigmas else 1.0

    def completed(self, i: int) -> None:
        """The sampler's callback for local step i."""
        self.saw_callback = True
        self.done = max(self.done, int(i) + 1)

    def interval(self, sigma: float) -> int:
        """Local step whose interval σ_i ≥ sigma > σ_{i+1} holds sigma (above σ_0 → 0, at the end → last)."""
        for i in range(self.n):
            if sigma > self.sigmas[i + 1] and not _close(sigma, self.sigmas[i + 1], self.scale):
                return i
        return self.n - 1

    def local_step(self, sigma: float) -> int:
        sigma = float(sigma)
        if not self.saw_callback:
            return min(self.interval(sigma), self.n - 1)
        i = min(self.done, self.n - 1)
        if i > 0 and self.sigmas[i] < sigma < self.sigmas[i - 1] and \
                not _close(sigma, self.sigmas[i], self.scale) and not _close(sigma, self.sigmas[i - 1], self.scale):
            return i - 1
        return i

    def step(self, sigma: float) -> int:
        return self.offset + self.local_step(sigma)


def normalized_times(sigmas: Sequence[float], to_t: Callable[[float], float]) -> list[float]:
    """t in [0, 1] of each sigma via the model's own map (t = σ for flow models, timestep/999 for ε models)."""
    return [min(1.0, max(0.0, float(to_t(float(s))))) for s in sigmas]


def model_time(model_sampling) -> Callable[[float], float]:
    """σ → normalized time by the model's own timestep map (a ComfyUI ModelSampling, duck-typed)."""
    import torch
    top = float(model_sampling.timestep(model_sampling.sigma_max.reshape(1).float()).item()) or 1.0
    return lambda s: float(model_sampling.timestep(torch.tensor([s], dtype=torch.float32)).item()) / top


@dataclass
class Placement:
    mask: list[int]      # over the global schedule's steps
    note: str = ""       # what was done to fit the policy (remap), for the log line


def place_policy(policy: Policy, schedule: Schedule, times: Sequence[float], on_mismatch: str = "remap") -> Placement:
    """The mask this run uses over the global steps of `schedule` (times: its N step times).

    Same step count → the policy as is. Otherwise remap by normalized time, or refuse (on_mismatch="error").
    """
    n = schedule.n_global
    same_times = policy.times is None or all(abs(a - b) <= TIME_TOL for a, b in zip(policy.times, times))
    if policy.n_steps == n and same_times:
        return Placement(list(policy.mask))
    if policy.n_steps == n:  # same count, another schedule (scheduler, shift, denoise): step i is another time
        msg = (f"The policy was made for another schedule of {n} steps (its normalized times differ from this "
               "run's by up to "
               f"{max(abs(a - b) for a, b in zip(policy.times, times)):.3f}: another scheduler, shift or denoise).")
    else:
        msg = (f"The policy was made for {policy.n_steps} sampler steps but this sampler runs {n}"
               f"{' (a slice of a longer schedule)' if schedule.is_slice else ''}.")
    if on_mismatch != "remap":
        raise GCacheError(msg + " Set the sampler to the policy's steps and scheduler, set 'step mismatch' to "
                                "'remap' (matches steps by normalized time), or make a policy for this schedule.")
    remapped = policy.remap(n, list(times))
    return Placement(list(remapped.mask), note=f"remapped {policy.n_steps}→{n} steps by normalized time"
                     + ("" if policy.n_steps != n else " (another schedule)"))
