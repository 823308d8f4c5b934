"""What a GCache-patched model clone is set up to do, and how it starts one sampling run. Imports ComfyUI.

ApplyConfig (GCache Apply), ProfileConfig (GCache Profile, GCache Search's reference runs) and AutoConfig (GCache
Apply with no policy: profile once, then apply an instant policy) are flat records
kept in the clone's transformer_options (ModelPatcher.clone deep-copies them: no tensors). Each has
`start_run(patcher, run_sigmas, sample_key) -> (RunState, finish)`: hooks.py calls it from the OUTER_SAMPLE
wrapper and calls `finish(ok)` in that wrapper's `finally`.
"""
from __future__ import annotations

import logging
import os
import re
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Callable, Optional

import comfy.samplers
import torch

from ..core.engine import ResidualCache, format_bytes
from ..core.errors import GCacheError
from ..core.policy import Policy, k_for_speedup
from ..core.profile import Profile, ProfileRecorder
from . import artifacts
from .adapters import Adapter, Route, choose_adapter, estimated_io_share
from .fingerprint import content_hash
from .runtime import RunState
from .steps import (Schedule, ScheduleCatalog, StepTracker, model_time, normalized_times, place_policy,
                    place_run)

log = logging.getLogger("gcache")
CACHE_DEVICES = {"model device": None, "cpu": "cpu"}  # the nodes' combo options → torch device (None: model's)
STEP_MISMATCH = ("remap", "error")

_CATALOGS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def catalog_for(model_sampling) -> ScheduleCatalog:
    """The standard-schedule catalog of a model's sampling object, kept as long as that object lives."""
    cat = _CATALOGS.get(model_sampling)
    if cat is None:
        ref = weakref.ref(model_sampling)  # a strong reference in the value would keep the key alive forever
        cat = _CATALOGS[model_sampling] = ScheduleCatalog(
            comfy.samplers.SCHEDULER_NAMES, lambda name, n: comfy.samplers.calculate_sigmas(ref(), name, n).tolist())
    return cat


def _where(patcher, run_sigmas: list[float], policy_sigmas, is_own_tail) -> tuple[Schedule, list[float], StepTracker]:
    ms = patcher.get_model_object("model_sampling")
    sched = place_run(run_sigmas, float(ms.sigma_max), policy_sigmas, catalog_for(ms), is_own_tail)
    if sched.source == "tail":
        log.info("GCache: this run is the tail of a longer schedule (KSampler denoise < 1, or a second sampler "
                 "without its first half); it uses its own %d steps.", sched.n_run)
    return sched, normalized_times(sched.sigmas[:-1], model_time(ms)), StepTracker(run_sigmas, sched.offset)


@dataclass
class RunConfig:
    adapter: Adapter
    io_share: float                  # estimated (parameter count) share of a step outside the block stack
    model_name: str
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)  # finds this clone's live run (runtime.py)

    @staticmethod
    def describe(diffusion_model) -> dict:
        ad = choose_adapter(diffusion_model)
        return {"adapter": ad, "io_share": estimated_io_share(ad, diffusion_model),
                "model_name": type(diffusion_model).__name__}

    def warn_if_unpatched(self, run: RunState) -> None:
        """The model was called but no block patch ever was: its block loop does not ask for the patches the
        adapter set (a changed ComfyUI or a custom forward). Say so rather than silently doing nothing."""
        if run.calls and not run.cache.stats.stack_calls and self.adapter.route != Route.FALLBACK:
            log.warning("GCache: %s was sampled %d times but its %s blocks were never reached through the %s "
                        "patches: nothing was cached or profiled. Please report this model and ComfyUI version.",
                        self.model_name, run.calls, self.adapter.name, self.adapter.route.value)


@dataclass
class ApplyConfig(RunConfig):
    policy: Optional[Policy] = None
    on_mismatch: str = "remap"       # "remap" | "error"
    cache_device: Optional[str] = None  # None: the model's device; "cpu"
    forecast: Optional[int] = None   # None: the policy's forecast order; 0/1/2 override it

    def start_run(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]):
        SPLITS.expire()  # a new prompt drops abandoned split recordings, whichever GCache node samples first
        pol = self.policy
        sched, times, tracker = _where(patcher, run_sigmas, pol.sigmas, lambda s: pol.n_steps == s.n_run)
        placement = place_policy(pol, sched, times, self.on_mismatch)
        order = pol.forecast if self.forecast is None else self.forecast
        # forecasting in the model's normalized time of the global schedule (t = σ for flow models)
        cache = ResidualCache(placement.mask, cache_device=self.cache_device, forecast=order, times=times)
        run = RunState(cache, tracker, self.owner)

        def finish(ok: bool):
            cache.close()
            self.warn_if_unpatched(run)
            extra = [x for x in (placement.note, self.adapter.name if self.adapter.route == Route.FALLBACK else "",
                                 f"forecast order {order}, {order + 1} residuals kept per branch" if order else "")
                     if x]
            log.info("%s [%s, %s%s]%s", cache.summary(self.io_share), self.model_name, sched.where(),
                     "".join(f"; {x}" for x in extra), "" if ok else " (sampling did not finish)")
        return run, finish


# ------------------------------------------------------------------------------------------------ profile
@dataclass
class _Half:
    """The first part of a split schedule, recorded, waiting for the sampler of the remaining steps."""
    recorder: Optional[ProfileRecorder]  # None: a duplicate run, recorded by nobody
    key: str                             # the sample key of the whole run (taken in its first part)
    end: int                             # the global step the next part must start at
    sigmas: list[float]                  # the full schedule
    prompt: Optional[str]


class PendingSplits:
    """The one owner of half-recorded split profiles (Wan 2.2's two experts: two samplers, two model clones,
    one profile file). Module-level because the two halves belong to different clones; keyed by profile
    file. Lifetime: the prompt that started them. A new prompt drops what an earlier one left (an abandoned half
    keeps its residual history, possibly on the GPU) as soon as any GCache node samples, and a new first half
    replaces an older one of the same file."""

    def __init__(self, prompt_id: Callable[[], Optional[str]]):
        self.prompt_id = prompt_id
        self._halves: dict[str, _Half] = {}

    def expire(self) -> None:
        now = self.prompt_id()
        for path in [p for p, h in self._halves.items() if now is not None and h.prompt != now]:
            log.info("GCache Profile: dropping the unfinished split recording of %s from an earlier prompt.",
                     os.path.basename(path))
            del self._halves[path]

    def continues(self, path: str, sched: Schedule) -> bool:
        h = self._halves.get(path)
        return h is not None and h.end == sched.offset and h.sigmas == sched.sigmas

    def take(self, path: str, sched: Schedule) -> Optional[_Half]:
        return self._halves.pop(path) if self.continues(path, sched) else None

    def put(self, path: str, half: _Half) -> None:
        self._halves[path] = half  # one per profile file; halves of earlier prompts are dropped by expire()

    def __len__(self) -> int:
        return len(self._halves)


def _prompt_id() -> Optional[str]:
    try:
        from comfy_execution.utils import get_executing_context
    except ImportError:  # an older ComfyUI: halves then live until consumed or replaced
        return None
    ctx = get_executing_context()
    return getattr(ctx, "prompt_id", None) if ctx is not None else None


SPLITS = PendingSplits(_prompt_id)


@dataclass
class ProfileConfig(RunConfig):
    profile_path: str = ""
    history_device: Optional[str] = None
    forecast: bool = False           # also record E1 (the order-1 forecast errors) for forecast policies

    def check_file(self) -> Optional[Profile]:
        """The profile already in the file (None if there is none); a damaged file stops here, before any
        sampling, with what to do."""
        try:
            return artifacts.load_profile_opt(self.profile_path)
        except GCacheError as e:
            raise GCacheError(f"{e} (profile file {self.profile_path}; GCache Profile adds to it, so it must be "
                              "readable before sampling starts)") from None

    def start_run(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]):
        path = self.profile_path
        SPLITS.expire()
        sched, times, tracker = _where(patcher, run_sigmas, None, lambda s: not SPLITS.continues(path, s))
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
                    raise GCacheError(f"{e} (profile file {path})") from None
            key = sample_key()
            recorder = ProfileRecorder(times, sched.sigmas[:-1], meta, history_device=self.history_device,
                                       forecast=self.forecast)
            if old is not None and key in old.sample_keys:
                log.info("GCache Profile: this run (same seed, conditioning, latent and schedule) is already in %s; "
                         "it is sampled but not added again.", os.path.basename(path))
                recorder = None
        cache = ResidualCache(None, recorder=recorder)
        run = RunState(cache, tracker, self.owner)

        def finish(ok: bool):
            cache.close()
            self.warn_if_unpatched(run)
            if not ok:
                log.info("GCache Profile: sampling did not finish; nothing was added.")
                return
            if sched.end < sched.n_global:
                SPLITS.put(path, _Half(recorder, key, sched.end, sched.sigmas, SPLITS.prompt_id()))
                if recorder is not None:
                    log.info("GCache Profile: recorded %s (%s held); waiting for the sampler of the remaining "
                             "steps.", sched.where(), format_bytes(recorder.peak_bytes))
                return
            if recorder is None:
                return
            prof = recorder.finish()
            if prof.count == 0:
                log.warning("GCache Profile: no branch recorded every step; nothing was added.")
                return
            prof.meta["sample_keys"] = [key]
            self._add(prof, sched)
        return run, finish

    def _add(self, prof: Profile, sched: Schedule) -> bool:
        """Merge into the file. A file damaged or replaced during sampling, or a folder that cannot be written,
        must not cost the user the image: the run goes to a file of its own if it can, and the log says what
        happened. Returns whether the run is in the profile file."""
        try:
            total = artifacts.merge_into_file(self.profile_path, prof)
        except (GCacheError, OSError) as e:
            try:
                side = artifacts.unique_beside(self.profile_path, "unmerged")
                prof.save(side)
                where = f"The run was saved as {side} instead."
            except OSError as e2:
                where = f"It could not be saved beside it either ({e2}); it is lost, the image is not."
            log.error("GCache Profile: could not add this run to %s (%s). %s", self.profile_path, e, where)
            return False
        log.info("GCache Profile: added %d sample(s) over %s to %s (%d runs in total).", prof.count,
                 sched.where(), self.profile_path, int(total.meta.get("runs", 0)))
        return True


# ------------------------------------------------------------------------------------------------ auto
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
    """GCache Apply with no policy: find this model's saved policy for the run's steps, scheduler and budget;
    else make one (profile this run with every step computed, then the instant theory-DP policy). Files:
    models/gcache/auto_<Model>-<key>_<N>steps_<scheduler>.profile.safetensors (the budget does not change a
    profile: another speed-up reuses it) and ..._<speed-up>x.json."""
    folder: str = ""
    key: str = ""                   # model_key(model)
    speedup: float = 2.0            # the budget, as a target speed-up (K via the estimated io share)
    on_mismatch: str = "remap"
    cache_device: Optional[str] = None

    def base_name(self, n_steps, scheduler: str) -> str:
        return f"auto_{self.model_name}-{self.key}_{n_steps}steps_{scheduler}_{self.speedup:g}x"

    def _base(self, patcher, run_sigmas: list[float]) -> tuple[Optional[str], Schedule]:
        ms = patcher.get_model_object("model_sampling")
        sched = place_run(run_sigmas, float(ms.sigma_max), None, catalog_for(ms), lambda s: True)
        scheduler = catalog_for(ms).name_of(run_sigmas) or "custom-" + content_hash(run_sigmas)[:6]
        return (None if sched.is_slice else self.base_name(sched.n_run, scheduler)), sched

    def start_run(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]):
        base, sched = self._base(patcher, run_sigmas)
        common = dict(adapter=self.adapter, io_share=self.io_share, model_name=self.model_name, owner=self.owner)
        if base is None:  # a KSamplerAdvanced slice (Wan 2.2's experts): one sampler sees half the schedule
            log.warning("GCache Apply auto: this sampler runs %s, a slice of a schedule; auto mode profiles whole "
                        "runs only, so every step is computed. For split samplers give both models a GCache Profile "
                        "with one name, then GCache Policy → GCache Apply.", sched.where())
            return ApplyConfig(**common, policy=Policy.all_ones(sched.n_global)).start_run(patcher, run_sigmas,
                                                                                           sample_key)
        policy, how = self._find_policy(base, sched.n_run)
        if policy is not None:
            log.info("GCache Apply auto: %s", how)
            return ApplyConfig(**common, policy=policy, on_mismatch="remap",
                               cache_device=self.cache_device).start_run(patcher, run_sigmas, sample_key)
        prof_path = self._profile_path(base)
        log.info("GCache Apply auto: no policy for this model, %d steps and %gx yet: this run computes every step "
                 "and profiles it (%s).", sched.n_run, self.speedup, os.path.basename(prof_path))
        run, profile_finish = ProfileConfig(**common, profile_path=prof_path, history_device=self.cache_device).start_run(
            patcher, run_sigmas, sample_key)  # cache_device "cpu": the profile history is offloaded too

        def finish(ok: bool):
            profile_finish(ok)
            if not (ok and os.path.isfile(prof_path)):
                return
            try:  # after sampling: a file problem is logged, never raised (the image is kept)
                pol = self._build(base, Profile.load(prof_path))
            except (GCacheError, OSError) as e:
                log.error("GCache Apply auto: could not make or save the policy %s (%s); the next run tries again.",
                          artifacts.policy_path(self.folder, base), e)
                return
            log.info("GCache Apply auto: saved %s (K = %d of %d, predicted %.2fx); the next run applies it.",
                     artifacts.policy_path(self.folder, base), pol.n_computed, pol.n_steps,
                     pol.metrics["predicted_speedup"])
        return run, finish

    def _find_policy(self, base: str, n: int) -> tuple[Optional[Policy], str]:
        path = artifacts.policy_path(self.folder, base)
        if os.path.isfile(path):
            return artifacts.read_policy(path), f"applying {os.path.basename(path)}"
        prof_path = self._profile_path(base)
        prof = artifacts.load_profile_opt(prof_path)
        if prof is not None and prof.count > 0:
            pol = self._build(base, prof)
            return pol, f"built {os.path.basename(path)} from the saved {os.path.basename(prof_path)}"
        if self.on_mismatch == "remap":  # the same model, scheduler and budget at another step count
            pattern = re.compile(re.escape(base).replace(f"_{n}steps_", r"_(\d+)steps_") + r"\.json")
            others = sorted((abs(int(m.group(1)) - n), f) for f in os.listdir(self.folder)
                            if (m := pattern.fullmatch(f)))
            if others:
                f = others[0][1]
                return artifacts.read_policy(os.path.join(self.folder, f)), f"remapping {f} to {n} steps"
        return None, ""

    def _profile_path(self, base: str) -> str:
        return artifacts.profile_path(self.folder, base[:-len(f"_{self.speedup:g}x")])

    def _build(self, base: str, profile: Profile) -> Policy:
        from ..search.instant import instant_policy  # search/ is only needed once a policy is made
        io_share = float(profile.meta.get("io_share", self.io_share))
        pol = instant_policy(profile, k_for_speedup(profile.n_steps, self.speedup, io_share), "theory")
        pol.metrics["predicted_speedup"] = round(pol.predicted_speedup(io_share), 3)
        pol.provenance["auto"] = {"model": self.model_name, "key": self.key, "speedup": self.speedup}
        pol.save(artifacts.policy_path(self.folder, base))
        return pol


def auto_config(model, folder: str, speedup: float, on_mismatch: str = "remap",
                cache_device: Optional[str] = None) -> AutoConfig:
    if not speedup >= 1.0:
        raise GCacheError(f"auto_speedup must be at least 1.0, got {speedup}.")
    if on_mismatch not in STEP_MISMATCH:
        raise GCacheError(f"step_mismatch must be one of {', '.join(STEP_MISMATCH)}, got {on_mismatch!r}.")
    return AutoConfig(**RunConfig.describe(model.get_model_object("diffusion_model")), folder=folder,
                      key=model_key(model), speedup=float(speedup), on_mismatch=on_mismatch,
                      cache_device=cache_device)


def apply_config(model, policy: Policy, on_mismatch: str = "remap", cache_device: Optional[str] = None,
                 forecast: Optional[int] = None) -> ApplyConfig:
    if on_mismatch not in STEP_MISMATCH:
        raise GCacheError(f"step_mismatch must be one of {', '.join(STEP_MISMATCH)}, got {on_mismatch!r}.")
    if forecast not in (None, 0, 1, 2):
        raise GCacheError(f"The forecast order must be 0, 1 or 2 (or the policy's), got {forecast!r}.")
    return ApplyConfig(**RunConfig.describe(model.get_model_object("diffusion_model")), policy=policy,
                       on_mismatch=on_mismatch, cache_device=cache_device, forecast=forecast)


def profile_config(model, profile_path: str, history_device: Optional[str] = None,
                   forecast: bool = False) -> ProfileConfig:
    cfg = ProfileConfig(**RunConfig.describe(model.get_model_object("diffusion_model")), profile_path=profile_path,
                        history_device=history_device, forecast=forecast)
    cfg.check_file()
    return cfg
