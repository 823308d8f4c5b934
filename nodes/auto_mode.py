"""GCache Apply (auto)'s mode: find this model's policy for the run's steps, scheduler and speed-up, else make one
(profile this run with every step computed, then the best instant policy). Imports ComfyUI.

The instant policy is the theory-DP mask for the forecaster the profile says is best (search/instant.py
choose_forecaster: reuse, linear or profile-fitted, by a held-out bound), at the K whose predicted speed-up, with the
io share the profiling run measured, is the largest not above the target. Apply's forecast input overrides the
choice: the policy is then built for that forecaster from the saved profile (milliseconds, not saved).

Files (artifacts.AutoName): auto_<Model>-<key>_<N>steps_<scheduler>.profile.safetensors (the budget does not
change a profile: another speed-up reuses it) and ..._<speed-up>x.json. A file that can't be read is set aside
(renamed beside itself, with a log line) and made again: one truncated file must not block every later run.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..core.engine import CacheStats
from ..core.errors import GCacheError
from ..core import forecasters
from ..core.policy import Policy, few_computed, k_for_speedup, out_of_reach, predicted_speedup
from ..core.profile import Profile
from . import artifacts
from .apply_mode import ApplyConfig
from .content_hash import content_hash
from .profile_mode import ProfileConfig
from .run_config import RunConfig, catalog_for, check_step_mismatch
from .runtime import RunState
from .steps import Schedule, place_run

log = logging.getLogger("gcache")
AUTO_VERSION = 2  # 2: the forecaster the profile says is best, at a measured io share (1: reuse, estimated share)


def model_key(model) -> str:
    """A short name for the weights a ModelPatcher samples with (checkpoint and LoRAs): shapes, a few values
    and the patches, hashed. Two checkpoints of one family get different keys; batch and resolution don't count."""
    dm = model.get_model_object("diffusion_model")
    params = list(dm.named_parameters())
    picks = sorted({0, len(params) // 2, len(params) - 1}) if params else []
    patches = sorted((str(k), [(float(p[0]), _tensor_samples(p[1])) for p in v if isinstance(p[0], (int, float))])
                     for k, v in getattr(model, "patches", {}).items())
    return content_hash(type(dm).__name__, sum(p.numel() for _, p in params),
                        [(n, tuple(p.shape)) for n, p in params[:16]],
                        [params[i][1].detach().reshape(-1)[:256] for i in picks], patches)[:8]


def _tensor_samples(obj, depth: int = 0) -> list:
    """The first values of every tensor in a patch (a LoRA's up/down weights, an adapter's .weights): two LoRAs on
    the same layers at the same strength must not share a key."""
    if torch.is_tensor(obj):
        return [obj.detach().reshape(-1)[:64]]
    if depth < 3 and isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensor_samples(o, depth + 1)]
    if depth < 3 and hasattr(obj, "weights"):
        return _tensor_samples(getattr(obj, "weights"), depth + 1)
    return []


@dataclass
class AutoConfig(RunConfig):
    folder: str = ""
    key: str = ""                   # model_key(model)
    speedup: float = 2.0            # the budget, as a target speed-up (K via the io share)
    on_mismatch: str = "remap"
    cache_device: Optional[str] = None
    forecast: Optional[str] = None  # Apply's forecast input: None = auto's choice (from the profile)

    def name_for(self, patcher, run_sigmas: list[float]) -> tuple[Optional[artifacts.AutoName], Schedule]:
        """The run's auto file names (None for a slice of a schedule) and its place in its schedule."""
        return _name(patcher, run_sigmas, self.model_name, self.key, self.speedup)

    def start_run(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]) -> RunState:
        name, sched = self.name_for(patcher, run_sigmas)
        if name is None:  # a KSamplerAdvanced slice (Wan 2.2's experts): one sampler sees half the schedule
            log.warning("GCache Apply auto: this sampler runs %s, a slice of a schedule; auto mode profiles whole "
                        "runs only, so every step is computed. For split samplers give both models a GCache Profile "
                        "with one name, then GCache Policy → GCache Apply.", sched.where())
            return ApplyConfig(**self.common(), policy=Policy.all_ones(sched.n_global)).start_run(
                patcher, run_sigmas, sample_key)
        policy, how = self.find_policy(name)
        if policy is not None:
            log.info("GCache Apply auto: %s", how)
            return ApplyConfig(**self.common(), policy=policy, on_mismatch="remap", cache_device=self.cache_device,
                               forecast=self.forecast).start_run(patcher, run_sigmas, sample_key)
        prof_path = name.profile_path(self.folder)
        log.info("GCache Apply auto: no policy for this model, %d steps and %gx yet: this run computes every step "
                 "and profiles it (%s).", sched.n_run, self.speedup, os.path.basename(prof_path))
        # cache_device "cpu": the profile history is offloaded too; forecasting needs E1 and the fit statistics
        run = ProfileConfig(**self.common(), profile_path=prof_path, history_device=self.cache_device,
                            forecast=True).start_run(patcher, run_sigmas, sample_key)

        def finish(run: RunState, stats: CacheStats, ok: bool):
            if not (ok and os.path.isfile(prof_path)):
                return
            try:  # after sampling: a file problem is logged, never raised (the image is kept)
                prof = Profile.load(prof_path)
                pol = self.build(name, prof)
            except (GCacheError, OSError) as e:
                log.error("GCache Apply auto: could not make or save the policy %s (%s); the next run tries again.",
                          name.policy_path(self.folder), e)
                return
            log.info("GCache Apply auto: saved %s (K = %d of %d, forecast %s, %s at a measured %s); the next run "
                     "applies it.", name.policy_path(self.folder), pol.n_computed, pol.n_steps, pol.forecast,
                     prof.io.describe_speedup(pol.n_steps, pol.n_computed), prof.io.describe())
        run.on_close.append(finish)
        return run

    def _readable(self, path: str, load):
        """The file at `path` loaded, or None when there is none; a damaged one is set aside (and None)."""
        if not os.path.isfile(path):
            return None
        try:
            return load(path)
        except GCacheError as e:
            side = artifacts.set_aside(path)
            log.warning("GCache Apply auto: %s can't be read (%s); it was moved to %s and is made again.",
                        os.path.basename(path), e, os.path.basename(side))
            return None

    def searched(self, name: artifacts.AutoName) -> Optional[Policy]:
        """A policy GCache Search found for this model, steps and scheduler at the K this speed-up asks for."""
        if not os.path.isdir(self.folder):
            return None
        head = name.stem + "_K"
        for f in sorted(os.listdir(self.folder)):
            if not (f.startswith(head) and f.endswith("_searched.json")):
                continue
            pol = self._readable(os.path.join(self.folder, f), artifacts.read_policy)
            if pol is None or (self.forecast is not None and pol.forecast != self.forecast):
                continue
            io_share = float(pol.metrics.get("io_share", self.io_share))
            if pol.n_steps == name.n_steps and pol.n_computed == k_for_speedup(pol.n_steps, self.speedup, io_share):
                return pol
        return None

    def find_policy(self, name: artifacts.AutoName) -> tuple[Optional[Policy], str]:
        path, prof_path = name.policy_path(self.folder), name.profile_path(self.folder)
        found = self.searched(name)
        if found is not None:
            return found, (f"applying the policy GCache Search found ({found.provenance.get('won', 'searched')}, "
                           f"K = {found.n_computed}) instead of the instant one")
        pol = self._readable(path, artifacts.read_policy) if self.forecast is None else None
        if pol is not None and (pol.provenance.get("auto") or {}).get("version", 1) >= AUTO_VERSION:
            return pol, f"applying {os.path.basename(path)} (forecast {pol.forecast})"
        prof = self._readable(prof_path, Profile.load)
        if prof is not None and prof.count > 0 and (pol is None or prof.has_fit_stats()):
            made = self.build(name, prof)
            if pol is not None:
                return made, (f"rebuilt {os.path.basename(path)}, made before auto forecasting, from the saved "
                              f"{os.path.basename(prof_path)} (forecast {made.forecast})")
            how = "built" if self.forecast is None else f"built for the forecast input ({self.forecast}), not saved,"
            return made, f"{how} {os.path.basename(path)} from the saved {os.path.basename(prof_path)}"
        if pol is not None:  # made before auto forecasting, and its profile can't forecast: it keeps working as it is
            return pol, (f"applying {os.path.basename(path)}, made before auto forecasting (forecast {pol.forecast}); "
                         f"delete it and {os.path.basename(prof_path)} to have auto profile again and forecast")
        if self.on_mismatch == "remap":  # the same model, scheduler and budget at another step count
            counts = name.policy_step_counts(os.listdir(self.folder)) if os.path.isdir(self.folder) else []
            for n in sorted(counts, key=lambda c: (abs(c - name.n_steps), c)):
                other = name.with_steps(n).policy_path(self.folder)
                pol = self._readable(other, artifacts.read_policy)
                if pol is not None:
                    return pol, f"remapping {os.path.basename(other)} to {name.n_steps} steps"
        return None, ""

    def build(self, name: artifacts.AutoName, profile: Profile) -> Policy:
        """The best instant policy for the profile (saved unless Apply's forecast input chose the forecaster)."""
        from ..search.instant import choose_forecaster, instant_policy  # search/ is needed once a policy is made
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
        pol = instant_policy(profile, k, "theory", forecast=fc)
        pol.metrics.update(share.metrics(pol.n_steps, pol.n_computed))
        pol.provenance["auto"] = {"model": self.model_name, "key": self.key, "speedup": self.speedup,
                                  "version": AUTO_VERSION, "forecaster_scores": {n: round(v, 6) for n, v in scores.items()},
                                  "forecaster": "Apply's forecast input" if self.forecast is not None else
                                  "lowest held-out bound of the profile"}
        if scores:
            log.info("GCache Apply auto: forecast %s for K = %d (held-out bounds: %s).", fc, k,
                     ", ".join(f"{n} {v:.4g}" for n, v in scores.items()))
        if self.forecast is None:
            pol.save(name.policy_path(self.folder))
        return pol


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
                cache_device: Optional[str] = None, forecast: Optional[str] = None) -> AutoConfig:
    if not speedup >= 1.0:
        raise GCacheError(f"auto_speedup must be at least 1.0, got {speedup}.")
    check_step_mismatch(on_mismatch)
    return AutoConfig(**RunConfig.describe(model.get_model_object("diffusion_model")), folder=folder,
                      key=model_key(model), speedup=float(speedup), on_mismatch=on_mismatch,
                      cache_device=cache_device, forecast=None if forecast is None else forecasters.canonical(forecast))
