"""GCache Apply (auto)'s mode: find this model's policy for the run's steps, scheduler and speed-up, else make one
(profile this run with every step computed, then the best instant policy). Imports ComfyUI.

The instant policy is the forecaster the profile says is best (search/instant.py choose_forecaster: reuse, linear or
profile-fitted, by a held-out bound) on the reuse DP's theory mask (search/instant.py auto_policy: measured better
than the forecaster's own DP mask), at the K whose predicted speed-up, with the
io share the profiling run measured, is the largest not above the target. Apply's forecast input overrides the
choice: the policy is then built for that forecaster from the saved profile (milliseconds, not saved).

A policy GCache Search found for the same model, step count and scheduler (..._K<K>_searched.json) comes first when
it meets the target speed-up (see AutoConfig.searched); when none does, the log says why.

Files (artifacts.AutoName): auto_<Model>-<key>_<N>steps_<scheduler>.profile.safetensors (the budget does not
change a profile: another speed-up reuses it) and ..._<speed-up>x.json. A file that can't be read is set aside
(renamed beside itself): one truncated file must not block every later run. The run's one log line says what was
found on the way and what the run does instead (apply, remap, build or profile). A gcache folder that can't be
written is found before sampling: the run then computes every step without profiling.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

from ...core import forecasters
from ...core.engine import CacheStats
from ...core.errors import GCacheError
from ...core.io_share import IoShare
from ...core.policy import Policy, few_computed, k_for_speedup, out_of_reach, predicted_speedup
from ...core.profile import Profile
from ...core.selfcheck import FAIL
from ...core.verdicts import checks_of, confirmed, failed, stamp
from .. import artifacts
from ..artifacts import FOLDER_FIX, cant_write
from ..patching.adapters import Route
from ..patching.content_hash import content_hash, model_key
from ..patching.runtime import RunState
from ..patching.selfcheck import interrupted
from ..patching.steps import Schedule, place_run
from . import verdicts
from .apply import ApplyConfig
from .base import ModeConfig, catalog_for, check_step_mismatch
from .profile import ProfileConfig

log = logging.getLogger("gcache")
# 5: run 1 saves the policy a true-loss check chose among candidates on its own inputs (search/auto_check.py),
# where the budget pays for two or more (a policy built later from the saved profile is the instant one); 4: a
# forecaster's mask is the reuse DP's (search/instant.py AUTO_ERROR_MODEL); 3: built from a profile whose E is
# the mean absolute difference (profile format 2); 2: the forecaster the profile
# says is best, at a measured io share, from profiles that may hold a squared E (core/profile.py); 1: reuse,
# estimated share, from profiles without forecast statistics
AUTO_VERSION = 5


@dataclass
class AutoConfig(ModeConfig):
    folder: str = ""
    key: str = ""                   # model_key(model)
    speedup: float = 2.0            # the budget, as a target speed-up (K via the io share)
    on_mismatch: str = "remap"
    cache_device: Optional[str] = None
    forecast: Optional[str] = None  # Apply's forecast input: None = auto's choice (from the profile)

    def name_for(self, patcher, run_sigmas: list[float]) -> tuple[Optional[artifacts.AutoName], Schedule]:
        """The run's auto file names (None for a slice of a schedule) and its place in its schedule."""
        return _name(patcher, run_sigmas, self.model_name, self.key, self.speedup)

    def begin(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]) -> RunState:
        name, sched = self.name_for(patcher, run_sigmas)
        if verdicts.recorded_fail(self.subject) is not None:  # never skipped, never profiled: Apply says why
            return ApplyConfig(**self.common(), policy=Policy.all_ones(sched.n_global)).begin(
                patcher, run_sigmas, sample_key)
        if name is None:  # a KSamplerAdvanced slice (Wan 2.2's experts): one sampler sees half the schedule
            log.warning("GCache Apply auto: this sampler runs %s, a slice of a schedule; auto mode profiles whole "
                        "runs only, so every step is computed. For split samplers give both models a GCache Profile "
                        "with one name, then GCache Policy → GCache Apply.", sched.where())
            return ApplyConfig(**self.common(), policy=Policy.all_ones(sched.n_global), check=True).begin(
                patcher, run_sigmas, sample_key)
        notes: list[str] = []  # what this run found on the way (damaged files, searched policies it does not take)
        policy, how = self.find_policy(name, notes)
        if policy is not None and self._unchecked():  # a ComfyUI (or GCache) this model was not checked on yet
            _say(notes, f"{how} from the next run: the skip path of {self.subject.where()} has not been "
                        "self-checked yet, so this run computes every step and checks it")
            return ApplyConfig(**self.common(), policy=Policy.all_ones(sched.n_global), check=True).begin(
                patcher, run_sigmas, sample_key)
        if policy is not None:
            _say(notes, how)
            return ApplyConfig(**self.common(), policy=policy, on_mismatch="remap", cache_device=self.cache_device,
                               forecast=self.forecast).begin(patcher, run_sigmas, sample_key)
        prof_path = name.profile_path(self.folder)
        blocked = cant_write(self.folder)
        if blocked:  # a profile that can't be saved is sampling time for nothing: the image, at full compute
            _say(notes + [f"no policy for this model, {sched.n_run} steps and {self.speedup:g}x, and {blocked}"],
                 f"this run computes every step without profiling (nothing could be saved). To have auto profile "
                 f"and make a policy, {FOLDER_FIX}", logging.WARNING)
            return ApplyConfig(**self.common(), policy=Policy.all_ones(sched.n_global)).begin(
                patcher, run_sigmas, sample_key)
        _say(notes, f"no policy for this model, {sched.n_run} steps and {self.speedup:g}x yet: this run computes "
                    f"every step and profiles it ({os.path.basename(prof_path)}).")
        # cache_device "cpu": the profile history is offloaded too; forecasting needs E1 and the fit statistics
        run = ProfileConfig(**self.common(), profile_path=prof_path, history_device=self.cache_device,
                            forecast=True).begin(patcher, run_sigmas, sample_key)

        def finish(run: RunState, stats: CacheStats, ok: bool):
            if not (ok and os.path.isfile(prof_path)):
                return  # Profile's own line said why nothing was added
            verdict = getattr(run.selfcheck, "verdict", None)
            if verdict is not None and verdict["result"] == FAIL:  # its own line said so; no policy that skips
                log.warning("GCache Apply auto: no policy made for %s: its self-check failed%s.", self.model_name,
                            ", so every later run computes every step" if confirmed(verdict) else
                            " once, so the next run computes every step and checks again")
                return
            try:  # after sampling: a file problem is logged, never raised (the image is kept)
                prof = Profile.load(prof_path)
                pol = self.build(name, prof)
            except GCacheError as e:
                log.error("GCache Apply auto: could not make a policy from %s (%s); the next run tries again.",
                          os.path.basename(prof_path), e)
                return
            if self.forecast is not None:  # Apply's forecast input chose the forecaster: such policies aren't saved
                log.info("GCache Apply auto: built the policy for the forecast input (%s; K = %d of %d, forecast %s, "
                         "%s at a measured %s), not saved as %s; the next run builds it again from the saved %s.",
                         self.forecast, pol.n_computed, pol.n_steps, pol.forecast,
                         prof.io.describe_speedup(pol.n_steps, pol.n_computed), prof.io.describe(),
                         os.path.basename(name.policy_path(self.folder)), os.path.basename(prof_path))
                return
            self._check_then_save(run, pol, prof, name, patcher, run_sigmas, sample_key)
        run.on_close.append(finish)
        return run

    # ---------------------------------------------------------------- the true-loss check (search/auto_check.py)
    def _candidates(self, pol: Policy, prof: Profile) -> list:
        from ...search.auto_check import candidates
        if self.forecast is not None or not prof.has_fit_stats():
            return [pol]
        out = candidates(prof, pol.n_computed, first=pol, io_share=prof.io.value)
        for c in out[1:]:  # saved like the instant policy: the same io share, stamps and auto record
            c.metrics.update(prof.io.metrics(c.n_steps, c.n_computed))
            stamp(c.provenance, prof.meta)
            c.provenance["auto"] = dict(pol.provenance.get("auto") or {})
        return out

    def _check_then_save(self, run: RunState, pol: Policy, prof: Profile, name, patcher, run_sigmas, sample_key):
        """Saves `pol`, or, when the check has candidates to compare, registers the check (it runs once this run
        has finished: hooks.py resamples its inputs under each candidate) and saves what it chooses."""
        from ...search import auto_check
        cands = self._candidates(pol, prof)
        if not auto_check.worth_checking(cands):
            self._save_and_say(pol, prof, name)
            return
        share = prof.io.value

        def after(resample, out):
            def sample(c):
                cfg = ApplyConfig(**self.common(), policy=c, on_mismatch="remap", cache_device=self.cache_device,
                                  quiet=True)
                res = resample(cfg.begin(patcher, run_sigmas, sample_key))
                return res["samples"] if isinstance(res, dict) else res

            ref = out["samples"] if isinstance(out, dict) else out
            try:
                chosen, rec = auto_check.check(cands, sample, ref, auto_check.mse)
            except Exception as e:  # noqa: BLE001  the image of this run is kept whatever the check raises
                if interrupted(e):  # nothing saved: the next run checks again
                    raise
                log.error("GCache Apply auto: the check of %d candidate policies failed (%s: %s); saving the instant "
                          "policy.", len(cands), type(e).__name__, e)
                self._save_and_say(pol, prof, name)
                return
            spent = sum(auto_check.cost_steps(c, share) for c in cands)
            rec["spent_steps"] = round(spent, 3)
            chosen.provenance["auto"]["forecaster"] = "the check on run 1's inputs (lowest loss against its output)"
            log.info("GCache Apply auto: checked %d candidate policies on this run's inputs against its output "
                     "(spent %.1f steps, %.2f of a full run; latent mean squared error: %s): %s.", len(cands), spent,
                     spent / max(1, chosen.n_steps), rec["what"],
                     "kept the instant policy" if chosen is cands[0] else
                     f"chose forecast {chosen.forecast} on steps {chosen.compute_steps()}")
            self._save_and_say(chosen, prof, name)

        run.after.append(after)

    def _save_and_say(self, pol: Policy, prof: Profile, name) -> None:
        pol_name = os.path.basename(name.policy_path(self.folder))
        prof_name = os.path.basename(name.profile_path(self.folder))
        unsaved = self._save(pol, name.policy_path(self.folder))
        if unsaved:
            log.error("GCache Apply auto: could not save %s (%s); the next run builds it again from the saved %s.",
                      pol_name, unsaved, prof_name)
            return
        log.info("GCache Apply auto: saved %s (K = %d of %d, forecast %s, %s at a measured %s); the next run "
                 "applies it.", pol_name, pol.n_computed, pol.n_steps, pol.forecast,
                 prof.io.describe_speedup(pol.n_steps, pol.n_computed), prof.io.describe())

    def _unchecked(self) -> bool:
        """The model's skip path has no verdict for this ComfyUI and GCache yet (or failed once: checked again), and
        one can be recorded."""
        return self.subject is not None and bool(self.subject.folder) and self.adapter.route != Route.FALLBACK \
            and (self.subject.recorded() is None or verdicts.failed_once(self.subject) is not None) \
            and cant_write(self.folder) is None

    def _readable(self, path: str, load, notes: list[str]):
        """The file at `path` loaded, or None when there is none; a damaged one is set aside (and None), with a
        note. What happens instead is the caller's to say."""
        if not os.path.isfile(path):
            return None
        try:
            return load(path)
        except GCacheError as e:  # what is wrong, not the advice: what auto does about it follows
            notes.append(f"{os.path.basename(path)} can't be read ({e.problem.rstrip('.')}); "
                         f"{_set_aside(path, 'damaged')}")
            return None

    def _save(self, pol: Policy, path: str) -> Optional[str]:
        """Saves `pol`; why it could not be (None: saved)."""
        try:
            pol.save(path)
        except OSError as e:
            blocked = cant_write(self.folder)
            return f"{blocked}; {FOLDER_FIX}" if blocked else (e.strerror or str(e))
        return None

    def searched(self, name: artifacts.AutoName, notes: list[str]) -> tuple[Optional[Policy], str]:
        """The policy GCache Search found for this model, step count and scheduler that meets this speed-up, and
        how it is applied; else (None, "") with, in `notes`, why each searched policy is not applied.

        A searched policy meets the target when it computes no more steps than the instant policy auto would make
        for it (K ≤ k_for_speedup at the policy's own measured io share), i.e. it predicts at least that speed-up."""
        if not os.path.isdir(self.folder):
            return None, ""
        head = name.stem + "_K"
        meets, why_not = [], []
        for f in sorted(os.listdir(self.folder)):
            if not (f.startswith(head) and f.endswith("_searched.json")):
                continue
            pol = self._readable(os.path.join(self.folder, f), artifacts.read_policy, notes)
            if pol is None:
                continue
            io_share = pol.metrics.get("io_share")
            io_share = float(io_share) if isinstance(io_share, (int, float)) and 0 <= io_share < 1 else self.io_share
            k_most = k_for_speedup(name.n_steps, self.speedup, io_share)
            if pol.n_steps != name.n_steps:
                why_not.append(f"{f} has {pol.n_steps} steps, not {name.n_steps}")
            elif self.forecast is not None and pol.forecast != self.forecast:
                why_not.append(f"{f} (K = {pol.n_computed}) forecasts with {pol.forecast}; the forecast input asks "
                               f"for {self.forecast}")
            elif pol.n_computed > k_most:
                why_not.append(f"{f} (K = {pol.n_computed}) predicts {pol.predicted_speedup(io_share):.2f}x, less than "
                               f"the {self.speedup:g}x target asks for (K ≤ {k_most}, "
                               f"{predicted_speedup(name.n_steps, k_most, io_share):.2f}x)")
            else:
                meets.append((pol, f, io_share, k_most))
        if meets:
            # When several meet the target, the one that computes the most steps: the user asked for this speed-up,
            # not for more, and every step computed instead of skipped gives an image closer to the full run.
            # GCache Search keeps one file per K (artifacts.save_searched: the better of two on the same seeds);
            # a tie between files named otherwise goes to the first in name order (max keeps the first): the pick
            # depends on the files only.
            pol, f, io_share, k_most = max(meets, key=lambda m: m[0].n_computed)
            which = f"; of the {len(meets)} that meet it, the one that computes the most steps" if len(meets) > 1 \
                else ""
            return pol, (f"applying the policy GCache Search found ({pol.provenance.get('won', 'searched')}, "
                         f"K = {pol.n_computed}, {f}) instead of the instant one: it predicts "
                         f"{IoShare.from_metrics(pol.metrics, io_share).speedup_text(pol.n_steps, pol.n_computed)} "
                         f"and the {self.speedup:g}x target asks for K ≤ {k_most}{which}")
        if why_not:
            notes.append("not applying the policy GCache Search found: " + "; ".join(why_not))
        return None, ""

    def find_policy(self, name: artifacts.AutoName, notes: list[str]) -> tuple[Optional[Policy], str]:
        """The policy this run applies and how it was found (None: this run must profile); what was found on the
        way (damaged files set aside, searched policies not applied) goes to `notes`."""
        path, prof_path = name.policy_path(self.folder), name.profile_path(self.folder)
        found, how = self.searched(name, notes)
        if found is not None:
            return found, how
        pol = self._readable(path, artifacts.read_policy, notes) if self.forecast is None else None
        version = _auto_version(pol)
        if pol is not None and version >= AUTO_VERSION:
            return pol, f"applying {os.path.basename(path)} (forecast {pol.forecast})"
        prof = self._readable(prof_path, Profile.load, notes)
        dropped = None  # this step count's policy, refused below: not remapped onto its own step count either
        if prof is not None and prof.defect:
            aside = _set_aside(prof_path, "defective")
            notes.append(f"{os.path.basename(prof_path)}: {prof.defect} {aside[0].upper()}{aside[1:]}")
            prof = None
            if pol is not None:
                notes.append(f"{os.path.basename(path)} was built from that profile and is not applied")
                pol, dropped = None, path
        bad = failed(checks_of(prof.meta)) if prof is not None else None
        if bad is not None:  # recorded where the self-check failed (another ComfyUI): its residuals may be wrong
            aside = _set_aside(prof_path, "selfcheck-failed")
            notes.append(f"{os.path.basename(prof_path)} was recorded where GCache's self-check failed (ComfyUI "
                         f"{bad['comfyui']}, GCache {bad['gcache']}); {aside}")
            prof = None
        if pol is not None and version == 2 and prof is None:
            notes.append(f"{os.path.basename(path)} was built from a profile that may hold a squared E (GCache "
                         "before profile format 2) and that profile is gone: it is not applied")
            pol, dropped = None, path
        if prof is not None and prof.count > 0 and (pol is None or prof.has_fit_stats()):
            made = self.build(name, prof)
            if self.forecast is not None:
                return made, (f"built the policy for the forecast input ({self.forecast}; K = {made.n_computed} of "
                              f"{made.n_steps}) from the saved {os.path.basename(prof_path)}, not saved as "
                              f"{os.path.basename(path)}")
            unsaved = self._save(made, path)
            saved = "" if unsaved is None else f" (not saved: {unsaved})"
            if pol is not None:
                why = "made before auto forecasting" if version < 2 else f"made by an older auto (version {version})"
                return made, (f"rebuilt {os.path.basename(path)}{saved}, {why}, from the saved "
                              f"{os.path.basename(prof_path)} (forecast {made.forecast})")
            return made, f"built {os.path.basename(path)}{saved} from the saved {os.path.basename(prof_path)}"
        if pol is not None:  # made before auto forecasting, and its profile can't forecast: it keeps working as it is
            return pol, (f"applying {os.path.basename(path)}, made before auto forecasting (forecast {pol.forecast}); "
                         f"delete it and {os.path.basename(prof_path)} to have auto profile again and forecast")
        if self.on_mismatch == "remap":  # the same model, scheduler and budget at another step count
            counts = name.policy_step_counts(os.listdir(self.folder)) if os.path.isdir(self.folder) else []
            for n in sorted(counts, key=lambda c: (abs(c - name.n_steps), c)):
                other = name.with_steps(n).policy_path(self.folder)
                if other == dropped:
                    continue
                pol = self._readable(other, artifacts.read_policy, notes)
                if pol is not None and _auto_version(pol) == 2:  # maybe from a squared E: not remapped
                    log.info("GCache Apply auto: not remapping %s (made by auto version 2, from a profile that may "
                             "hold a squared E).", os.path.basename(other))
                elif pol is not None and n == name.n_steps:  # only with the forecast input: no profile to build from
                    return pol, (f"applying {os.path.basename(other)} with the forecast input ({self.forecast}): "
                                 f"{os.path.basename(prof_path)} is missing, so no policy can be built for it")
                elif pol is not None:
                    return pol, f"remapping {os.path.basename(other)} to {name.n_steps} steps"
        return None, ""

    def build(self, name: artifacts.AutoName, profile: Profile) -> Policy:
        """The best instant policy for the profile (not saved here: the caller saves it unless Apply's forecast
        input chose the forecaster)."""
        from ...search.instant import FEW_STEPS, auto_policy, choose_forecaster  # search/ once a policy is made
        share = profile.io  # measured while profiling: its median decides K, its range is reported
        io_share = share.value
        k = k_for_speedup(profile.n_steps, self.speedup, io_share)
        why = out_of_reach(profile.n_steps, self.speedup, io_share)
        if why:
            log.warning("GCache Apply auto: %s; using K = 1 (%.2fx predicted).", why,
                        predicted_speedup(profile.n_steps, 1, io_share))
        note = few_computed(profile.n_steps, k)
        if note:
            log.warning("GCache Apply auto: %s.", note)
        fc, scores = (self.forecast, {}) if self.forecast is not None else choose_forecaster(profile, k)
        pol = auto_policy(profile, k, fc)
        pol.metrics.update(share.metrics(pol.n_steps, pol.n_computed))
        stamp(pol.provenance, profile.meta)
        pol.provenance["auto"] = {"model": self.model_name, "key": self.key, "speedup": self.speedup,
                                  "version": AUTO_VERSION,
                                  "forecaster_scores": {n: round(v, 6) for n, v in scores.items()},
                                  "forecaster": "Apply's forecast input" if self.forecast is not None else
                                  "lowest held-out bound of the profile"}
        if scores:
            lowest = min(scores, key=lambda n: (scores[n], n != fc))  # on a tie, the forecaster auto took
            rule = "" if lowest == fc or profile.n_steps > FEW_STEPS else (
                f"; the bound favours {lowest}, but at {FEW_STEPS} steps or fewer auto forecasts with {fc}: there the "
                f"bound ranks forecasters wrongly (measured on the reference model, search/instant.py FEW_STEPS)")
            if rule:
                pol.provenance["auto"]["forecaster"] = f"reuse at {FEW_STEPS} steps or fewer"
            log.info("GCache Apply auto: forecast %s for K = %d (held-out bounds: %s%s).", fc, k,
                     ", ".join(f"{n} {v:.4g}" for n, v in scores.items()), rule)
        return pol


def _say(notes: list[str], how: str, level: int = logging.INFO) -> None:
    """One log line: what this run found on the way, then what it does (a warning when it found something)."""
    log.log(max(level, logging.WARNING) if notes else level, "GCache Apply auto: %s", "; ".join(notes + [how]))


def _set_aside(path: str, tag: str) -> str:
    """Moves a file auto can't use out of the way (kept, renamed beside it) and says where, or why it stays."""
    try:
        return f"it was moved to {os.path.basename(artifacts.set_aside(path, tag))}"
    except OSError as e:
        return f"it could not be moved aside ({e.strerror or e}) and is left as it is"


def _auto_version(pol: Optional[Policy]) -> int:
    """The auto version a saved auto policy was built by (1: before versions were recorded)."""
    return int((pol.provenance.get("auto") or {}).get("version", 1)) if pol is not None else 0


def _name(patcher, run_sigmas: list[float], model_name: str, key: str,
          speedup: Optional[float]) -> tuple[Optional[artifacts.AutoName], Schedule]:
    ms = patcher.get_model_object("model_sampling")
    cat = catalog_for(ms)
    sched = place_run(run_sigmas, float(ms.sigma_max), None, cat, lambda s: True)
    if sched.is_slice:
        return None, sched
    scheduler = cat.scheduler_of(run_sigmas) or "custom-" + content_hash(run_sigmas)[:6]
    return artifacts.AutoName(model_name, key, sched.n_run, scheduler, speedup), sched


def auto_name(model, run_sigmas: list[float]) -> Optional[artifacts.AutoName]:
    """The auto file names of a model sampled with `run_sigmas` (GCache Search saves its policy under them too)."""
    dm = model.get_model_object("diffusion_model")
    return _name(model, run_sigmas, type(dm).__name__, model_key(model), None)[0]


def auto_config(model, folder: str, speedup: float, on_mismatch: str = "remap",
                cache_device: Optional[str] = None, forecast: Optional[str] = None, node_id=None) -> AutoConfig:
    """folder: auto's files and the self-check's verdicts; node_id: the node that shows the verdicts."""
    if not speedup >= 1.0:
        raise GCacheError(f"auto_speedup must be at least 1.0, got {speedup}.")
    check_step_mismatch(on_mismatch)
    fields = ModeConfig.of_model(model, folder, node_id)
    return AutoConfig(**fields, folder=folder, key=fields["subject"].key, speedup=float(speedup),
                      on_mismatch=on_mismatch,
                      cache_device=cache_device, forecast=None if forecast is None else forecasters.canonical(forecast))
