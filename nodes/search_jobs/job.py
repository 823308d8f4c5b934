"""One GCache Search, inside ComfyUI: its reference runs, its profile, evaluate(mask), and running it in the
foreground or one background slice at a time. Imports ComfyUI.

The reference runs compute every step and self-check the skip path (../modes/verdicts.py). A model whose check
failed on this ComfyUI, or a profile recorded where it failed, is not searched (NothingToSearch): the node then
gives a policy that computes every step, saves nothing, and says why. A first fail (checked again by the next prompt's
reference runs) evaluates no skip mask either: no mask is sampled while the model's last verdict is a fail.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import comfy.model_management
import comfy.samplers
import comfy.utils

from ...core import forecasters
from ...core.errors import GCacheError
from ...core.policy import Policy, predicted_speedup
from ...core.profile import Profile
from ...core.verdicts import checks_of, failed, stamp
from ...search.config import SearchConfig
from ...search.end_game import fresh_seeds
from ...search.infra.objectives import make_objective
from ...search.loop import SearchInterrupted, SearchResult, run_search
from ...search.result import predicted_speedup_text, searched_policy
from ...search.starts import start_count
from ...search.state import SearchState, check_state, forecaster_of, mask_of
from .. import artifacts
from ..artifacts import FOLDER_FIX, cant_write
from ..modes.apply import apply_config
from ..modes.auto import auto_name
from ..modes.base import ModeConfig
from ..modes.profile import profile_config
from ..modes.verdicts import describe, failed_once, recorded_fail, refusal
from ..patching import hooks
from ..patching.content_hash import content_hash, model_key
from .sampling import decode, sample

log = logging.getLogger("gcache")


class NothingToSearch(GCacheError):
    """The model's self-check failed (recorded, or in the profile the search would use): nothing is searched."""


@dataclass
class SearchJob:
    """What one queue of GCache Search asks for (the node's inputs), and how to run it."""
    model: object
    positive: object
    negative: object
    latent: dict
    vae: object
    seeds: list
    steps: int
    cfg: float
    sampler_name: str
    scheduler: str
    config: SearchConfig
    folder: str
    name: str
    profile: Optional[Profile] = None   # connected; else the reference runs are profiled
    not_recorded: list = field(default_factory=list)  # why a reference run was not added to the search's profile
    node_id: Optional[str] = None       # the node that shows the self-check's verdicts
    cancelled: Callable[[], bool] = lambda: False  # asked before every image (run): a Cancel samples nothing more

    @property
    def state_path(self) -> str:
        return artifacts.state_path(self.folder, self.name)

    @property
    def own_profile(self) -> str:
        return artifacts.search_profile_path(self.folder, self.name)

    def provenance(self) -> dict:
        """What the references depend on, so that a state file made with another prompt/LoRA or another checkpoint
        (its weights: model_key; the class name alone can't tell two checkpoints of one family apart) is not resumed,
        nor its finished policy handed to the other model. A state file made before the weights were recorded
        resumes as it was made (its provenance has no "weights")."""
        vae = type(self.vae.first_stage_model).__name__ if hasattr(self.vae, "first_stage_model") else ""
        prov = {"model": type(self.model.get_model_object("diffusion_model")).__name__, "seeds": self.seeds,
                "inputs": content_hash(self.positive, self.negative, self.latent["samples"],
                                       sorted(map(str, self.model.patches)), vae),
                "steps": self.steps, "cfg": self.cfg, "sampler": self.sampler_name, "scheduler": self.scheduler,
                "latent_shape": list(self.latent["samples"].shape), "weights": model_key(self.model)}
        if _made_without_weights(self.state_path):
            del prov["weights"]
        return prov

    def refs_key(self) -> str:
        return content_hash(self.provenance())

    def identity(self) -> str:
        """What this search is, beyond its name: its model's weights (model_key), its references (provenance) and its
        config (less the budget, which a search may grow). Two queues of one policy name with another identity are
        two searches."""
        return content_hash(json.dumps({"weights": model_key(self.model), "references": self.refs_key(),
                                        "config": self.config.identity()}, sort_keys=True, default=str))

    def run(self, m, seed: int):
        """One image of `seed` under `m` (a reference, an evaluation's or a fresh seed's): SearchInterrupted instead
        once the search is cancelled, so that nothing is sampled after a Cancel (an evaluation cut short is
        dispatched again on resume: the state file holds it as pending)."""
        if self.cancelled():
            raise SearchInterrupted(f"GCache Search {self.name} was cancelled; nothing more is sampled.")
        return self.sample_image(m, seed)

    def sample_image(self, m, seed: int):
        return decode(self.vae, sample(m, seed, self.steps, self.cfg, self.sampler_name, self.scheduler,
                                       self.positive, self.negative, self.latent))

    # ---------------------------------------------------------------- before any sampling
    @property
    def records_fit_stats(self) -> bool:
        """Whether the reference runs record the forecast fit statistics into the search's own profile (they do for
        a forecasting search): what the start masks, and so the least budget, depend on."""
        return forecasters.get(self.config.forecast).forecasts

    def check_config(self) -> None:
        """K and the budget against the profile the search will have: the connected one, or the one its reference
        runs will record (search/starts.py counts its start masks, search/budget.py the least budget)."""
        has_stats = self.profile.has_fit_stats() if self.profile is not None else self.records_fit_stats
        self.config.validate(self.steps, start_count(self.config.forecast, has_stats))

    def check_files(self) -> None:
        """What would otherwise stop the search after its reference runs, found before any sampling (and before a
        profile is written): a gcache folder that can't be written, a damaged state file, or one of another
        search (its config or references; its profile is compared once it exists)."""
        blocked = cant_write(self.folder)
        if blocked:
            raise GCacheError(f"GCache Search can't keep its state file and policy: {blocked}. Nothing was sampled: "
                              f"{FOLDER_FIX}, then queue GCache Search again.")
        check_state(self.state_path, self.config, self.provenance())

    # ---------------------------------------------------------------- references and profile
    def references(self, tick: Callable[[], None] = lambda: None) -> list:
        """The full-compute images of the seeds; they are also the profile when none is connected, recorded through
        the same file path GCache Profile uses (<name>.search.profile.safetensors)."""
        self.not_recorded.clear()
        if self.records_profile():
            if os.path.isfile(self.own_profile):
                os.remove(self.own_profile)  # left by a search whose state is gone: it is recorded again now
            ref_model = hooks.patch_model(self.model, profile_config(
                self.model, self.own_profile, forecast=self.records_fit_stats,
                on_not_added=self.not_recorded.append, folder=self.folder, node_id=self.node_id))
        else:  # every step computed through GCache (bit-identical to the model alone), the skip path checked
            ref_model = hooks.patch_model(self.model, apply_config(
                self.model, Policy.all_ones(self.steps), folder=self.folder, node_id=self.node_id, check=True))
        refs = []
        for s in self.seeds:
            refs.append(self.run(ref_model, s))
            tick()
        self.check_selfcheck(first_fail_too=True)  # the reference runs just checked the model
        return refs

    def records_profile(self) -> bool:
        """Whether the reference runs record the search's own profile (again): none is connected, and no state file
        has started from the one there is."""
        return self.profile is None and not (os.path.isfile(self.state_path) and os.path.isfile(self.own_profile))

    def check_selfcheck(self, first_fail_too: bool = False) -> None:
        """NothingToSearch when the model's self-check failed on this ComfyUI, or the profile the search would use
        was recorded where it failed: the search would judge masks by a skip path that is wrong there. With
        `first_fail_too` (before any skip mask is sampled) a first fail refuses too: before the reference runs it
        does not, as they check the model again."""
        subject = ModeConfig.of_model(self.model, self.folder, self.node_id)["subject"]
        bad = recorded_fail(subject)
        if bad is not None:
            raise NothingToSearch(f"GCache Search searches nothing: {refusal(bad, subject)}")
        once = failed_once(subject) if first_fail_too else None
        if once is not None:
            raise NothingToSearch(
                f"GCache Search evaluates no skip mask now: the self-check of {subject.where()} failed once "
                f"({describe(once)}), so its skip path may be wrong: no skip mask is sampled until a run checks it "
                f"again. The search's state is kept; queue GCache Search again: its reference runs check the model "
                f"again (a pass continues the search; a second fail turns skipping off for this model)")
        # the search's own profile before reference runs that record it again (left by a search refused after a
        # first fail) is not what the search will use: they check the model again
        own = _readable(self.own_profile) if first_fail_too or not self.records_profile() else None
        for prof, what in ((self.profile, "the connected profile"), (own, os.path.basename(self.own_profile))):
            bad = failed(checks_of(prof.meta)) if prof is not None else None
            if bad is not None:
                raise NothingToSearch(
                    f"GCache Search searches nothing: {what} was recorded where GCache's self-check failed "
                    f"({bad['model']} ({bad['family']}) on ComfyUI {bad['comfyui']}, GCache {bad['gcache']}: "
                    f"{describe(bad)}), so its residuals may be wrong. Profile again where the check passes (a new "
                    f"profile name; for the search's own profile delete it and {os.path.basename(self.state_path)})")

    def check_profile(self) -> None:
        """A connected profile with a defect is refused before any sampling."""
        if self.profile is not None and self.profile.defect:
            raise GCacheError(f"GCache Search can't use the connected profile. {self.profile.defect} Profile again "
                              "with GCache Profile (under a new name) and connect that one, or disconnect it: the "
                              "search then profiles its own reference runs.")

    def load_profile(self) -> Profile:
        self.check_profile()
        profile = self.profile
        own = os.path.basename(self.own_profile)
        if profile is None:
            if not os.path.isfile(self.own_profile):
                why = "; ".join(dict.fromkeys(self.not_recorded)) or \
                    "none of them finished (was sampling interrupted?)"
                raise GCacheError(f"The reference runs recorded no profile ({own}): {why}. Nothing was searched; "
                                  "queue GCache Search again once that is fixed.")
            profile = Profile.load(self.own_profile)
            if profile.defect:
                raise GCacheError(f"GCache Search can't use {own}, the profile of its reference runs. "
                                  f"{profile.defect} Delete it and {os.path.basename(self.state_path)} (the search "
                                  "started from it), then queue GCache Search again: it profiles its reference runs "
                                  "again.")
        if profile.n_steps != self.steps:
            raise GCacheError(f"The profile has {profile.n_steps} steps but steps = {self.steps}: set steps to "
                              f"{profile.n_steps} or profile this step count.")
        return profile

    # ---------------------------------------------------------------- the search
    def search(self, profile: Profile, refs: list, should_stop: Callable[[], bool],
               progress: Optional[Callable[[dict], None]] = None) -> SearchResult:
        """Runs (or resumes) the search until it is done or should_stop() says stop (SearchInterrupted)."""
        evaluation = Evaluation(self, profile, refs, make_objective(self.config.objective))
        return run_search(profile, self.config, evaluation, state_path=self.state_path, progress=progress,
                          should_stop=should_stop, provenance=self.provenance(),
                          skip_check=None if refs else "the search had finished and this prompt sampled no "
                                                       "reference images for it")

    def finish(self, result: SearchResult, profile: Profile) -> Policy:
        """Saves the policy the search made (and a copy for GCache Apply (auto) of the same model, steps and
        scheduler)."""
        policy = result.policy  # with the profile's io share and the speed-up it predicts (search/result.py)
        stamp(policy.provenance, profile.meta)  # the self-check's verdict the profile carries
        path = artifacts.policy_path(self.folder, self.name)
        policy.save(path)
        log.info("GCache Search: saved %s (K = %d of %d, %s, %s).", os.path.basename(path), policy.n_computed,
                 policy.n_steps, predicted_speedup_text(policy), profile.io.describe())
        try:
            sigmas = comfy.samplers.calculate_sigmas(self.model.get_model_object("model_sampling"), self.scheduler,
                                                     self.steps + (1 if self.trims() else 0)).tolist()
            if self.trims():
                sigmas = sigmas[:-2] + sigmas[-1:]
            name = auto_name(self.model, sigmas)
            if name is not None:
                path = name.searched_path(self.folder, policy.n_computed)
                kept = artifacts.save_searched(path, policy)  # never silently over a better searched policy
                if kept.ours:
                    log.info("GCache Search: GCache Apply (auto) on this model, %d steps and %s applies it (%s) %s%s.",
                             self.steps, self.scheduler, os.path.basename(path), _auto_takes(policy),
                             f"; {kept.note}" if kept.note else "")
                else:
                    log.info("GCache Search: %s, so GCache Apply (auto) on this model, %d steps and %s goes on "
                             "applying that one %s; this search's policy is %s.", kept.note, self.steps,
                             self.scheduler, _auto_takes(kept.policy), os.path.basename(artifacts.policy_path(
                                 self.folder, self.name)))
        except (GCacheError, OSError, RuntimeError) as e:  # the search's own policy is saved: say, don't fail
            why = (e.strerror or e) if isinstance(e, OSError) else e  # an OSError's text repeats a server path
            log.warning("GCache Search: could not save the policy for GCache Apply (auto) too (%s).", why)
        return policy

    def trims(self) -> bool:
        """Samplers that drop the penultimate sigma of a schedule one step longer (as KSampler does)."""
        return self.sampler_name in getattr(comfy.samplers.KSampler, "DISCARD_PENULTIMATE_SIGMA_SAMPLERS", ())

    def best_so_far(self, profile: Profile) -> Policy:
        """The mask the search would return now (search/choice.py: never worse on its loss than its best start mask,
        a searched one only when its gain is believable), else the instant policy of its forecaster."""
        from ...search.choice import choose
        from ...search.instant import instant_policy
        fc = forecasters.get(self.config.forecast)
        state = SearchState.peek(self.state_path)
        if state is None or not state.history:
            pol = instant_policy(profile, self.config.k, "theory", forecast=fc.name)
            pol.provenance["search"] = "no evaluation yet: the instant policy"
            return pol
        chosen = choose(state)
        return searched_policy(profile, mask_of(chosen.entry["mask"]), forecaster_of(chosen.entry["mask"], fc.name),
                               "gcache (in progress)",
                               {"search": f"{chosen.how} of {len(state.history)} of {self.config.budget} evaluations "
                                          "so far"},
                               {"loss": chosen.entry["loss"], "objective": self.config.objective})


class Evaluation:
    """evaluate(mask) of one GCache Search: its seeds sampled under the mask through a patched clone, each scored
    against its reference image (one loss per seed: paired comparisons). It applies any forecaster the profile can
    fit (the forecaster check: evaluate(mask, forecast=name)) and samples the fresh seeds (the final choice on fresh
    seeds, search/end_game.py: seed + n … seed + 2n − 1, their full-compute images sampled from the connected
    model on first use); each candidate policy carries the profile's io share, so Apply's log predicts the speed-up
    the saved policy will."""

    can_apply_forecaster = True
    can_sample_fresh = True

    def __init__(self, job: SearchJob, profile: Profile, refs: list, loss_fn):
        self.job, self.profile, self.refs, self.loss_fn = job, profile, refs, loss_fn
        self.fresh_seeds, self.fresh_refs = fresh_seeds(job.seeds), None

    def __call__(self, mask, forecast=None, fresh=False) -> list:
        job = self.job
        seeds, refs = job.seeds, self.refs
        if fresh:
            if self.fresh_refs is None:
                log.info("GCache Search: full-compute images of %d fresh seeds (%s) for the final choice.",
                         len(self.fresh_seeds), ", ".join(map(str, self.fresh_seeds)))
                self.fresh_refs = [job.run(job.model, s) for s in self.fresh_seeds]
            seeds, refs = self.fresh_seeds, self.fresh_refs
        pol = searched_policy(self.profile, mask, forecast or job.config.forecast, "search-candidate")
        m = hooks.patch_model(job.model, apply_config(job.model, pol, on_mismatch="error"))
        return [self.loss_fn(job.run(m, s), r) for s, r in zip(seeds, refs)]


def _auto_takes(policy: Policy) -> str:
    """At which auto_speedup GCache Apply (auto) applies a searched policy: wherever its own policy would compute
    as many steps or more (AutoConfig.searched), i.e. any target below the predicted speed-up of one step less."""
    if policy.n_computed <= 1:
        return "at any auto_speedup"
    io_share = policy.metrics.get("io_share")
    if not isinstance(io_share, (int, float)) or not 0 <= io_share < 1:  # a searched file from before io shares
        return "wherever auto's own policy would compute as many steps or more"
    io_share = float(io_share)
    return (f"at any auto_speedup below {predicted_speedup(policy.n_steps, policy.n_computed - 1, io_share):.2f}x "
            f"(where auto's own policy would compute K = {policy.n_computed} steps or more)")


def run_slice(job: SearchJob, profile: Profile, refs: list, seconds: float, cancelled: Callable[[], bool],
              progress: Optional[Callable[[dict], None]] = None) -> tuple[Optional[SearchResult], str]:
    """Evaluations until `seconds` are spent (at least one), or the search is done, cancelled or interrupted.
    Returns (the result when done, why it stopped: "done" | "time" | "cancelled" | "interrupted")."""
    t0 = time.monotonic()
    state = SearchState.peek(job.state_path)
    start = len(state.history) if state is not None else 0
    seen = [start]
    why = ["time"]

    def on_progress(info):
        seen[0] = int(info.get("iteration", seen[0]))
        if progress:
            progress(info)

    def should_stop() -> bool:
        if comfy.model_management.processing_interrupted():
            why[0] = "interrupted"
            return True
        if cancelled():
            why[0] = "cancelled"
            return True
        return seen[0] > start and time.monotonic() - t0 >= seconds

    try:
        return job.search(profile, refs, should_stop, on_progress), "done"
    except SearchInterrupted:  # should_stop said why; else job.run found the search cancelled mid-evaluation
        return None, "cancelled" if why[0] == "time" and cancelled() else why[0]


def _made_without_weights(path: str) -> bool:
    """Whether the state file at `path` was made before GCache Search recorded the model's weights in its provenance
    (False when there is none or it can't be read: the search says why when it reads it)."""
    try:
        with open(path, encoding="utf-8") as fh:
            prov = json.load(fh).get("provenance")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(prov, dict) and "weights" not in prov


def _readable(path: str) -> Optional[Profile]:
    """The profile at `path` when it can be read (what can't is said where the search loads it)."""
    try:
        return Profile.load(path) if os.path.isfile(path) else None
    except GCacheError:
        return None
