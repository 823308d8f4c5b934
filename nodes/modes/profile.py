"""GCache Profile's mode: sample normally and add the run's block-stack residual errors to a profile file. A split
schedule (Wan 2.2's two experts) is recorded in two halves; the first waits in SPLITS (splits.py) for the second.
Every profile run self-checks the skip path (verdicts.py) and its profile's meta keeps the verdict ("selfcheck"); a
model whose check failed before is profiled without a check, and its profile says it failed. Imports ComfyUI
(base.py)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

from ...core.engine import CacheStats, ResidualCache, format_bytes
from ...core.errors import GCacheError
from ...core.io_share import run_summary
from ...core.profile import Profile
from ...core.recorder import ProfileRecorder
from ...core.step_clock import StackClock, StepClock
from ...core.verdicts import checks_of, with_check
from .. import artifacts
from ..artifacts import FOLDER_FIX, cant_write
from ..patching.runtime import RunState, Variant, Windowed
from ..patching.steps import Schedule
from . import verdicts
from .base import ModeConfig, where_run
from .splits import SPLITS, Half

log = logging.getLogger("gcache")
_IO_STEPS = "io_step_shares"  # a run's per-step io shares until its last part is sampled (then one "io_runs" entry)


@dataclass
class ProfileConfig(ModeConfig):
    profile_path: str = ""
    history_device: Optional[str] = None
    forecast: bool = False           # also record E1 (the order-1 forecast errors) for forecast policies
    # told why, when a finished run is not added to the file (GCache Search names the cause, not just "no profile")
    on_not_added: Optional[Callable[[str], None]] = None

    def check_file(self) -> Optional[Profile]:
        """The profile already in the file (None if there is none); a damaged file stops here, before any
        sampling, with what to do."""
        name = os.path.basename(self.profile_path)
        try:
            old = artifacts.load_profile_opt(self.profile_path)
        except GCacheError as e:
            raise GCacheError(f"{e} (profile file {name}; GCache Profile adds to it, so it must be readable before "
                              "sampling starts)") from None
        if old is not None and old.defect:  # new runs can't be added to it (Profile.merge refuses the mix)
            raise GCacheError(f"{name}: {old.defect} GCache Profile adds new runs to this file and can't mix them "
                              "with it: delete or rename it (or use another profile name) and profile again.")
        blocked = cant_write(os.path.dirname(os.path.abspath(self.profile_path)))
        if blocked:  # found now, not after sampling
            raise GCacheError(f"GCache Profile can't add runs to {name}: {blocked}. Nothing was sampled: "
                              f"{FOLDER_FIX}, or take GCache Profile out of the workflow to sample without profiling.")
        return old

    def begin(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]) -> RunState:
        path = self.profile_path
        sched, times, tracker = where_run(patcher, run_sigmas, None, lambda s: not SPLITS.continues(path, s))
        meta = {"family": self.adapter.name, "model": self.model_name, "schedule": sched.source,
                "io_share": round(self.io_share, 4)}
        half = SPLITS.take(path, sched)
        if half is not None:  # the second sampler of a split schedule continues the first one's record
            recorder, key = half.recorder, half.key
        else:
            old = self.check_file()
            if old is not None:
                try:
                    old.check_compatible(Profile.empty(times, sched.sigmas[:-1], meta))
                except GCacheError as e:
                    raise GCacheError(f"{e} (profile file {os.path.basename(path)})") from None
            key = sample_key()
            recorder = ProfileRecorder(times, sched.sigmas[:-1], meta, history_device=self.history_device,
                                       forecast=self.forecast)
            if old is not None and key in old.sample_keys:
                log.info("GCache Profile: this run (same seed, conditioning, latent and schedule) is already in %s; "
                         "it is sampled but not added again.", os.path.basename(path))
                recorder = None

        def not_added(why: str) -> None:
            if self.on_not_added is not None:
                self.on_not_added(why)

        def finish(run: RunState, stats: CacheStats, ok: bool):
            self.warn_if_unpatched(run, stats)
            if not ok:
                log.info("GCache Profile: sampling did not finish; nothing was added.")
                return not_added("sampling did not finish")
            if run.disabled is not None:
                log.info("GCache Profile: this run recorded nothing (%s); nothing was added.", run.disabled)
                return not_added(f"the run recorded nothing: {run.disabled}")
            verdict = check.verdict if check is not None else failed
            if recorder is not None and verdict is not None:  # the profile says how its runs were checked
                recorder.meta["selfcheck"] = with_check(checks_of(recorder.meta), verdict)
            if recorder is not None:  # the block stack against whole steps: the measured io share, step by step
                shares = recorder.meta.pop(_IO_STEPS, []) + stats.io_step_shares()  # (a split run's parts together)
                if shares:
                    recorder.meta[_IO_STEPS] = shares
            if sched.end < sched.n_global:
                SPLITS.put(path, Half(recorder, key, sched.end, sched.sigmas, SPLITS.prompt_id()))
                if recorder is not None:
                    log.info("GCache Profile: recorded %s (%s held); waiting for the sampler of the remaining "
                             "steps.", sched.where(), format_bytes(recorder.peak_bytes))
                return
            if recorder is None:
                return
            shares = recorder.meta.pop(_IO_STEPS, [])
            if shares:
                recorder.meta["io_runs"] = [run_summary(shares)]
            _drop_partial_variants(recorder)
            moved = _drop_partial_windows(recorder)
            prof = recorder.finish()
            if prof.count == 0 and moved:
                why = (f"no context window ran at every step (the schedule moves its {moved} windows from step to "
                       "step)")
                log.warning("GCache Profile: %s; nothing was added. Profile with the context windows' standard_static "
                            "schedule (the same windows at every step), or without context windows.", why)
                return not_added(why)
            if prof.count == 0:
                log.warning("GCache Profile: no branch recorded every step; nothing was added.")
                return not_added("no branch recorded every step")
            prof.meta["sample_keys"] = [key]
            why = self._add(prof, sched)
            if why:
                not_added(why)

        def engine() -> ResidualCache:  # one per device lane, with a clock of its own; the recorder is the run's
            # cache_device: where a skipped step would find its δ (the self-check's replay takes that path too)
            if recorder is None:  # a duplicate run: sampled and timed, recorded by nobody
                return ResidualCache(None, cache_device=self.history_device, observers=(StepClock(),))
            return ResidualCache(None, cache_device=self.history_device,
                                 observers=(recorder, StackClock()))  # the stack timed: the io share

        run = RunState(engine, tracker, self.owner, on_close=finish, may_skip=False)  # computes every step
        failed = verdicts.recorded_fail(self.subject)
        check = None
        if failed is not None:
            log.warning("GCache Profile: %s. This run is profiled as usual (every step is computed anyway); the "
                        "profile records the failed check, and no policy made from it skips.",
                        verdicts.refusal(failed, self.subject))
        elif self.subject is not None:
            check = verdicts.start_check(run, self.subject, self.adapter, sched)
        return run

    def _add(self, prof: Profile, sched: Schedule) -> Optional[str]:
        """Merge into the file. A file damaged or replaced during sampling, or a folder that cannot be written,
        must not cost the user the image: the run goes to a file of its own if it can, and the log says what
        happened. Returns why the run is not in the profile file (None: it is)."""
        name = os.path.basename(self.profile_path)
        try:
            total = artifacts.merge_into_file(self.profile_path, prof)
        except (GCacheError, OSError) as e:
            why = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
            blocked = cant_write(os.path.dirname(os.path.abspath(self.profile_path)))
            if blocked:
                why = f"{blocked}; {FOLDER_FIX}"
            try:
                side = artifacts.unique_beside(self.profile_path, "unmerged")
                prof.save(side)
                where = f"The run was saved as {os.path.basename(side)} instead."
            except OSError as e2:
                where = f"It could not be saved beside it either ({e2.strerror or e2}); it is lost, the image is not."
            log.error("GCache Profile: could not add this run to %s (%s). %s", name, why, where)
            return f"could not add the run to {name} ({why})"
        log.info("GCache Profile: added %d sample(s) over %s to %s (%d runs in total).", prof.count,
                 sched.where(), name, int(total.meta.get("runs", 0)))
        return None


def _drop_partial_variants(recorder: ProfileRecorder) -> None:
    """A call with block patches of its own (Skip Layer Guidance's extra call: a Variant branch) that ran on some
    steps only (the guidance's start and end) is not a sample of the run: left out, said once, instead of the
    recorder's "missed steps (interrupted run?)". One that ran on every step is a branch GCache caches: it is added."""
    partial = [k for k, b in recorder.branches.items() if isinstance(k, Variant) and not all(b.recorded)]
    for k in partial:
        del recorder.branches[k]
    if partial:
        log.info("GCache Profile: %d model call(s) per step with other block patches (%s) ran on some steps only; "
                 "they are not added to the profile (the plain calls are).", len(partial),
                 "; ".join(sorted({k.patches for k in partial})))


def _drop_partial_windows(recorder: ProfileRecorder) -> int:
    """A context window that ran on some steps only (a schedule that moves its windows: standard_uniform,
    looped_uniform) is not a sample of the run: left out, said once, instead of the recorder's "missed steps
    (interrupted run?)" per window. The windows that ran at every step are added, each a sample. Returns how many."""
    def windowed(k):
        return isinstance(k, Windowed) or (isinstance(k, Variant) and isinstance(k.base, Windowed))
    partial = [k for k, b in recorder.branches.items() if windowed(k) and not all(b.recorded)]
    for k in partial:
        del recorder.branches[k]
    if partial:
        log.info("GCache Profile: %d context window(s) ran on some steps only (the schedule moves its windows from "
                 "step to step); they are not added to the profile%s.", len(partial),
                 " (the windows that ran at every step are)" if recorder.branches else "")
    return len(partial)


def profile_config(model, profile_path: str, history_device: Optional[str] = None, forecast: bool = False,
                   on_not_added: Optional[Callable[[str], None]] = None, folder: Optional[str] = None,
                   node_id=None) -> ProfileConfig:
    """folder: where the self-check's verdicts are kept (None: the profile's own folder; "": none kept)."""
    folder = os.path.dirname(os.path.abspath(profile_path)) if folder is None else folder
    cfg = ProfileConfig(**ModeConfig.of_model(model, folder, node_id), profile_path=profile_path,
                        history_device=history_device, forecast=forecast, on_not_added=on_not_added)
    cfg.check_file()
    return cfg
