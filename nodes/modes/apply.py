"""GCache Apply's mode: sample under a policy (skip the block stack on its reuse steps). Imports ComfyUI (base.py).

A model whose self-check failed on this ComfyUI (verdicts.py) is never skipped: the run computes every step, with
none of GCache's patches doing anything, and says why. A policy that computes every step may carry the self-check
itself (`check`: GCache Apply (auto)'s first run on a ComfyUI that has not checked this model yet, GCache Search's
reference runs).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Optional

from ...core import forecasters
from ...core.engine import CacheStats, ResidualCache
from ...core.io_share import IoShare
from ...core.policy import Policy
from ...core.step_clock import StepClock
from ..patching.adapters import Route
from ..patching.runtime import RunState
from ..patching.steps import place_policy
from . import verdicts
from .base import ModeConfig, check_step_mismatch, where_run

log = logging.getLogger("gcache")


@dataclass
class ApplyConfig(ModeConfig):
    policy: Optional[Policy] = None
    on_mismatch: str = "remap"       # "remap" | "error"
    cache_device: Optional[str] = None  # None: the model's device; "cpu"
    forecast: Optional[str] = None   # None: the policy's forecaster; a forecaster's name overrides it
    check: bool = False              # self-check the skip path when the policy computes every step
    quiet: bool = False              # a run the user does not see (auto's check of a candidate): its line at debug

    def begin(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]) -> RunState:
        pol = self.policy
        sched, times, tracker = where_run(patcher, run_sigmas, pol.sigmas, lambda s: pol.n_steps == s.n_run)
        failed = verdicts.recorded_fail(self.subject)
        if failed is not None:
            return self._refused(failed, sched, tracker)
        if verdicts.failed_once(self.subject) is not None and not all(pol.mask):  # checked again before it skips
            log.warning("GCache Apply: the self-check of %s failed once; this run computes every step and checks it "
                        "again before the policy skips.", self.subject.where())
            return replace(self, policy=Policy.all_ones(sched.n_global), check=True).begin(patcher, run_sigmas,
                                                                                         sample_key)
        placement = place_policy(pol, sched, times, self.on_mismatch)
        fc = forecasters.get(pol.forecast if self.forecast is None else self.forecast)
        params = pol.forecast_params if fc.name == pol.forecast and placement.mask == pol.mask else {}
        # what the run's skipped steps really add, in the words both log lines use
        how = f"forecast {fc.name}"
        if fc.needs_profile and not params:  # said, not silently forecast another way
            why = f"the policy was made for {pol.forecast}" if fc.name != pol.forecast else "its mask was remapped"
            # a profile-fitted forecaster's weights() without parameters: the linear forecast of the last two
            fallback = f"linearly from the last {forecasters.get('linear').keeps} computed steps"
            how = f"forecast {fc.name} without its parameters ({why}): {fallback}"
            log.warning("GCache: forecast %s has no parameters for this run's mask (%s): its skipped steps forecast "
                        "%s. For %s itself, make the policy with it (GCache Policy or Search).", fc.name, why,
                        fallback, fc.name)
        mask, cache_device = placement.mask, self.cache_device
        share = IoShare.from_metrics(pol.metrics, self.io_share)  # measured by the profile it was made from

        def finish(run: RunState, stats: CacheStats, ok: bool):
            self.warn_if_unpatched(run, stats)
            extra = [x for x in (placement.note,
                                 self.adapter.name if self.adapter.route == Route.FALLBACK else "",
                                 f"{how}, {fc.keeps} residuals kept per branch" if fc.keeps > 1 else "",
                                 windows_note(run, stats))
                     if x]
            log.log(logging.DEBUG if self.quiet else logging.INFO, "%s [%s, %s%s]%s", stats.summary(share),
                    self.model_name, sched.where(), "".join(f"; {x}" for x in extra),
                    "" if ok else " (sampling did not finish)")

        # forecasting in the model's normalized time of the global schedule (t = σ for flow models); a clock per
        # lane times its steps (the measured speed-up of the log line)
        run = RunState(lambda: ResidualCache(mask, cache_device=cache_device, forecast=fc, times=times,
                                             forecast_params=params, observers=(StepClock(),)),
                       tracker, self.owner, on_close=finish)
        if self.subject is not None and all(mask[sched.offset:sched.end]):
            if self.check and self.adapter.route != Route.FALLBACK:  # (the fallback has no blocks to check)
                verdicts.start_check(run, self.subject, self.adapter, sched)
        elif self.subject is not None and self.subject.recorded() is None:
            verdicts.note_unverified(self.subject, pol.provenance)
        return run

    def _refused(self, failed: dict, sched, tracker) -> RunState:
        """A run of a model whose self-check failed: every step computed, GCache's patches pass every call on."""
        why = verdicts.refusal(failed, self.subject)
        log.warning("GCache Apply: %s.", why)
        verdicts.show(self.subject.node_id, f"GCache Apply: {why}.")

        def finish(run: RunState, stats: CacheStats, ok: bool):
            log.info("GCache: computed every step (skipping is off: the self-check failed) [%s, %s]%s",
                     self.model_name, sched.where(), "" if ok else " (sampling did not finish)")

        run = RunState(lambda: ResidualCache(None), tracker, self.owner, on_close=finish, may_skip=False)
        run.disabled = "its self-check failed"  # set, not run.disable(): its error line is for faults found now
        return run


def windows_note(run: RunState, stats: CacheStats) -> str:
    """What ComfyUI's context windows did to the run's skipping, for its log line ("" without windows)."""
    if not run.windows:
        return ""
    note = f"{len(run.windows)} context windows, each with its own residual"
    if stats.forced_calls:  # a schedule that moves its windows: a window new since the last computed step computes
        note += (f"; {stats.forced_calls} window call(s) of skipped steps computed (their window did not run at the "
                 "last computed step: a schedule that moves its windows; standard_static keeps them in place)")
    return note


def apply_config(model, policy: Policy, on_mismatch: str = "remap", cache_device: Optional[str] = None,
                 forecast: Optional[int] = None, folder: str = "", node_id=None, check: bool = False) -> ApplyConfig:
    """folder: where the self-check's verdicts are kept ("": none read, none kept); node_id: the node that shows
    them; check: self-check a policy that computes every step."""
    check_step_mismatch(on_mismatch)
    return ApplyConfig(**ModeConfig.of_model(model, folder, node_id), policy=policy,
                       on_mismatch=on_mismatch, cache_device=cache_device,
                       forecast=None if forecast is None else forecasters.canonical(forecast), check=check)
