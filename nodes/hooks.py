"""Wire GCache into a ComfyUI ModelPatcher clone: wrappers + block patches. Imports ComfyUI.

model.clone() → a Holder (plain config, no tensors) in transformer_options["gcache"], three wrappers keyed
"gcache" (OUTER_SAMPLE: per-run state, released in `finally`; SAMPLER_SAMPLE: the step callback;
APPLY_MODEL: the step of every model call, and the whole-model fallback) and the family's block patches.
Nothing is stored on the shared diffusion model; object patches (families without dit replace) are
ModelPatcher's own, restored on unpatch.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

import comfy.samplers
from comfy.patcher_extension import WrappersMP

from ..core.engine import ResidualCache
from ..core.errors import GCacheError
from ..core.policy import Policy
from ..core.profile import Profile, ProfileRecorder
from . import files
from .adapters import Adapter, Route, block_slots, choose_adapter, io_share
from .runtime import RunState, activate, current_run, deactivate, make_dit_patch, make_gated_forward
from .steps import Schedule, StepTracker, find_schedule, normalized_times, place_policy

log = logging.getLogger("gcache")
KEY = "gcache"
MAX_SCHEDULE_SEARCH = 400  # longest full schedule we try when placing a KSamplerAdvanced slice


@dataclass
class Holder:
    """Per-clone configuration (deep-copied by ModelPatcher.clone: keep it small, no tensors)."""
    mode: str                                # "apply" | "profile"
    adapter: Adapter
    io_share: float
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    policy: Optional[Policy] = None          # apply
    on_mismatch: str = "remap"               # apply: "remap" | "error"
    cache_device: Optional[str] = None       # apply: None = model device, "cpu"
    profile_path: Optional[str] = None       # profile: accumulate into this file
    history_device: Optional[str] = None     # profile
    sink: Optional[str] = None               # profile: key of an in-memory list instead of a file (Search)
    model_name: str = ""


# Finished in-memory profiles (GCache Search's reference runs) and split-schedule recorders waiting for the
# second sampler (Wan 2.2 experts). Module-level on purpose: they belong to a profile name, not to a model.
SINKS: dict[str, list] = {}
_PENDING: dict[str, tuple] = {}


def patch_model(model, holder: Holder):
    """A clone of `model` with GCache wired in (replacing GCache hooks of an earlier GCache node)."""
    m = model.clone()
    dm = m.get_model_object("diffusion_model")
    m.model_options.setdefault("transformer_options", {})[KEY] = holder
    for kind, fn in ((WrappersMP.OUTER_SAMPLE, _outer_sample), (WrappersMP.SAMPLER_SAMPLE, _sampler_sample),
                     (WrappersMP.APPLY_MODEL, _apply_model)):
        m.remove_wrappers_with_key(kind, KEY)
        m.add_wrapper_with_key(kind, KEY, fn)
    ad = holder.adapter
    if ad.route == Route.DIT:
        for slot in block_slots(ad, dm):
            m.set_model_patch_replace(make_dit_patch(slot, holder.token), "dit", slot.stack.key, slot.index)
    elif ad.route == Route.OBJECT:
        for slot in block_slots(ad, dm):
            block = getattr(getattr(dm, slot.stack.attr), slot.child)
            original = type(block).forward.__get__(block)  # the class's forward, not an earlier patch
            m.add_object_patch(f"diffusion_model.{slot.stack.attr}.{slot.child}.forward",
                               make_gated_forward(slot, original, holder.token, ad.batch_dim))
    return m


def make_holder(model, mode: str, **kw) -> Holder:
    dm = model.get_model_object("diffusion_model")
    ad = choose_adapter(dm)
    return Holder(mode=mode, adapter=ad, io_share=io_share(ad, dm), model_name=type(dm).__name__, **kw)


# ------------------------------------------------------------------------------------------ schedules
def _to_t(ms) -> Callable[[float], float]:
    top = float(ms.timestep(ms.sigma_max.reshape(1).float()).item()) or 1.0
    return lambda s: float(ms.timestep(torch.tensor([s], dtype=torch.float32)).item()) / top


def _candidates(ms, n_run: int):
    """Standard full schedules of this model, shortest first (for locating a slice)."""
    for n in range(n_run + 1, max(MAX_SCHEDULE_SEARCH, 4 * n_run)):
        for name in comfy.samplers.SCHEDULER_NAMES:
            try:
                yield name, comfy.samplers.calculate_sigmas(ms, name, n).tolist()
            except Exception:  # a scheduler that cannot make n steps for this model is no candidate
                continue


def schedule_of(ms, run_sigmas: list[float], policy_sigmas=None) -> Schedule:
    is_full = abs(run_sigmas[0] - float(ms.sigma_max)) <= 1e-4 * float(ms.sigma_max) and run_sigmas[-1] == 0.0
    # A full run (σ_max … 0) is its own schedule unless the policy's sigmas say otherwise: searching the
    # standard schedules (thousands of calculate_sigmas calls) is only needed to place a slice.
    cands = () if is_full else _candidates(ms, len(run_sigmas) - 1)
    return find_schedule(run_sigmas, policy_sigmas, cands)


# ------------------------------------------------------------------------------------------ the wrappers
def _outer_sample(executor, *args, **kwargs):
    guider = executor.class_obj
    holder: Optional[Holder] = guider.model_options.get("transformer_options", {}).get(KEY)
    if holder is None:
        return executor(*args, **kwargs)
    sigmas = args[3] if len(args) > 3 else kwargs["sigmas"]
    run, finish = _start_run(holder, guider.model_patcher, [float(s) for s in sigmas.float().cpu()])
    token = activate(run)
    ok = False
    try:
        out = executor(*args, **kwargs)
        ok = True
        return out
    finally:
        deactivate(token)
        finish(ok)


def _sampler_sample(executor, *args, **kwargs):
    holder = args[2]["model_options"]["transformer_options"].get(KEY) if len(args) > 2 else None
    run = current_run(holder.token) if holder is not None else None
    if run is None:
        return executor(*args, **kwargs)
    original = args[3]

    def callback(step, x0, x, total):
        run.tracker.completed(step)
        if original is not None:
            original(step, x0, x, total)

    return executor(*args[:3], callback, *args[4:], **kwargs)


def _apply_model(executor, *args, **kwargs):
    topts = args[5] if len(args) > 5 else kwargs.get("transformer_options", {})
    holder = (topts or {}).get(KEY)
    run = current_run(holder.token) if holder is not None else None
    if run is None:
        return executor(*args, **kwargs)
    run.begin_call(float(args[1].reshape(-1)[0]), topts)
    if holder.adapter.route != Route.FALLBACK:
        return executor(*args, **kwargs)
    x = args[0]
    if not run.enter(x):
        return run.leave(None)
    try:
        out = executor(*args, **kwargs)
    except BaseException:
        run.abort()
        raise
    run.leave(out)
    return out


# ------------------------------------------------------------------------------------------ per-run state
def _start_run(holder: Holder, patcher, run_sigmas: list[float]):
    ms = patcher.get_model_object("model_sampling")
    policy = holder.policy if holder.mode == "apply" else None
    sched = schedule_of(ms, run_sigmas, policy.sigmas if policy is not None else None)
    if sched.source.startswith("model:") and sched.offset > 0 and _own_steps(holder, sched):
        # The tail of a standard schedule that is not the rest of a split (KSampler denoise < 1, or a second
        # sampler without its first half): its steps are the run's own N steps.
        log.info("GCache: this run is the tail of a longer schedule (denoise < 1?); using its own %d steps.",
                 sched.n_run)
        sched = Schedule(list(run_sigmas), 0, sched.n_run, "run")
    times = normalized_times(sched.sigmas[:-1], _to_t(ms))
    tracker = StepTracker(run_sigmas, sched.offset)
    where = f"steps {sched.offset}-{sched.offset + sched.n_run - 1} of {sched.n_global}" if sched.is_slice \
        else f"{sched.n_global} steps"
    if holder.mode == "apply":
        placement = place_policy(policy, sched, times, holder.on_mismatch)
        cache = ResidualCache(placement.mask, cache_device=holder.cache_device)
        run = RunState(cache, tracker, holder.token)

        def finish(ok: bool):
            cache.close()
            _warn_if_unpatched(holder, run)
            extra = [x for x in (placement.note, holder.adapter.name if holder.adapter.route == Route.FALLBACK else "")
                     if x]
            log.info("%s [%s, %s%s]%s", cache.summary(holder.io_share), holder.model_name, where,
                     "".join(f"; {x}" for x in extra), "" if ok else " (sampling did not finish)")
        return run, finish
    return _start_profile_run(holder, sched, times, tracker, where)


def _warn_if_unpatched(holder: Holder, run: RunState) -> None:
    """The model was called but no block patch ever was: its block loop does not ask for the patches the
    adapter set (a changed ComfyUI or a custom forward). Say so rather than silently doing nothing."""
    if run.calls and not run.cache.stats.stack_calls and holder.adapter.route != Route.FALLBACK:
        log.warning("GCache: %s was sampled %d times but its %s blocks were never reached through the %s "
                    "patches: nothing was cached or profiled. Please report this model and ComfyUI version.",
                    holder.model_name, run.calls, holder.adapter.name, holder.adapter.route.value)


def _own_steps(holder: Holder, sched: Schedule) -> bool:
    if holder.mode == "apply":
        return holder.policy.n_steps == sched.n_run
    pending = _PENDING.get(_profile_key(holder))
    return pending is None or pending[1] != sched.offset or pending[2] != sched.sigmas


def _profile_key(holder: Holder) -> str:
    return holder.profile_path or f"sink:{holder.sink}"


def _start_profile_run(holder: Holder, sched: Schedule, times: list[float], tracker: StepTracker, where: str):
    key = _profile_key(holder)
    meta = {"family": holder.adapter.name, "model": holder.model_name, "schedule": sched.source}
    pending = _PENDING.pop(key, None)
    if pending is not None and pending[1] == sched.offset and pending[2] == sched.sigmas:
        recorder = pending[0]  # the second sampler of a split schedule continues the first one's record
    else:
        recorder = ProfileRecorder(times, sched.sigmas[:-1], meta, history_device=holder.history_device)
        if holder.profile_path:
            old = files.load_profile_opt(holder.profile_path)
            if old is not None:
                try:
                    old.check_compatible(Profile.empty(times, sched.sigmas[:-1], meta))
                except GCacheError as e:
                    raise GCacheError(f"{e} (profile file {holder.profile_path})") from None
    cache = ResidualCache(None, recorder=recorder)
    run = RunState(cache, tracker, holder.token)
    end = sched.offset + sched.n_run

    def finish(ok: bool):
        cache.close()
        _warn_if_unpatched(holder, run)
        if not ok:
            log.info("GCache Profile: sampling did not finish; nothing was added.")
            return
        if end < sched.n_global:
            _PENDING.clear()  # at most one half-recorded split waits: an abandoned one must not pin its history
            _PENDING[key] = (recorder, end, sched.sigmas)
            log.info("GCache Profile: recorded %s (%.1f MiB held); waiting for the sampler of the remaining steps.",
                     where, recorder.peak_bytes / 2**20)
            return
        prof = recorder.finish()
        if prof.count == 0:
            log.warning("GCache Profile: no branch recorded every step; nothing was added.")
            return
        if holder.sink is not None:
            SINKS.setdefault(holder.sink, []).append(prof)
            return
        total = files.merge_into_file(holder.profile_path, prof)
        log.info("GCache Profile: added %d sample(s) over %s to %s (%d runs in total).", prof.count, where,
                 holder.profile_path, int(total.meta.get("runs", 0)))
    return run, finish
