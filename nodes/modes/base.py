"""What every mode's config shares (ModeConfig), and where a sampling run sits in its schedule. Imports ComfyUI.

A config (apply.ApplyConfig, profile.ProfileConfig, auto.AutoConfig) is a flat record kept in the clone's
transformer_options["gcache"]; no tensors, never changed after the node made it (ComfyUI 0.33 shares it between
clones of the patched model, 0.3.64 copies it). It is what ../patching/hooks.py calls a RunConfig:
`start_run(patcher, run_sigmas, sample_key)` returns the RunState of one sampling run, which the OUTER_SAMPLE wrapper
closes with `run.close(ok)` in its `finally`. start_run is ModeConfig's own: it expires abandoned split recordings
(splits.py) once per run, whichever mode runs, then the mode's `begin` makes the run (auto begins as apply or
profile).
"""
from __future__ import annotations

import logging
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Callable, Optional

import comfy.samplers

from ...core.engine import CacheStats
from ...core.errors import GCacheError
from ...core.user_text import quoted
from ..patching.adapters import Adapter, Route, choose_adapter, estimated_io_share
from ..patching.runtime import RunState
from ..patching.steps import Schedule, ScheduleCatalog, StepTracker, model_time, normalized_times, place_run
from .splits import SPLITS
from .verdicts import Subject, subject_of

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


def where_run(patcher, run_sigmas: list[float], policy_sigmas,
              is_own_tail) -> tuple[Schedule, list[float], StepTracker]:
    """The run's place in its full schedule, the normalized time of each of that schedule's steps, its step tracker."""
    ms = patcher.get_model_object("model_sampling")
    sched = place_run(run_sigmas, float(ms.sigma_max), policy_sigmas, catalog_for(ms), is_own_tail)
    if sched.source == "tail":
        log.info("GCache: this run is the tail of a longer schedule (KSampler denoise < 1, or a second sampler "
                 "without its first half); it uses its own %d steps.", sched.n_run)
    return sched, normalized_times(sched.sigmas[:-1], model_time(ms)), StepTracker(run_sigmas, sched.offset)


def check_step_mismatch(on_mismatch: str) -> None:
    if on_mismatch not in STEP_MISMATCH:
        raise GCacheError(f"step_mismatch must be one of {', '.join(STEP_MISMATCH)}, got {quoted(on_mismatch)}.")


@dataclass
class ModeConfig:
    adapter: Adapter
    io_share: float                  # estimated (parameter count) share of a step outside the block stack
    model_name: str
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)  # finds this clone's live run (patching/runtime.py)
    subject: Optional[Subject] = None  # the self-check's subject: its verdicts (verdicts.py); None: none kept

    def start_run(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]) -> RunState:
        """One sampling run of this clone (RunConfig.start_run): a new prompt first drops the split recordings an
        earlier one abandoned, whichever GCache node samples first; then the mode begins the run."""
        SPLITS.expire()
        return self.begin(patcher, run_sigmas, sample_key)

    def begin(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]) -> RunState:
        """The mode's part of start_run: the run's RunState (its lanes' caches, and what the mode does at close)."""
        raise NotImplementedError

    @staticmethod
    def describe(diffusion_model) -> dict:
        ad = choose_adapter(diffusion_model)
        return {"adapter": ad, "io_share": estimated_io_share(ad, diffusion_model),
                "model_name": type(diffusion_model).__name__}

    @staticmethod
    def of_model(model, folder: str = "", node_id=None) -> dict:
        """describe() of a ModelPatcher's diffusion model, with the self-check's subject (verdicts kept in `folder`;
        "": none kept, the check still runs; node_id: the GCache node that shows them)."""
        fields = ModeConfig.describe(model.get_model_object("diffusion_model"))
        fields["subject"] = subject_of(model, fields["adapter"], folder, node_id)
        return fields

    def common(self) -> dict:
        """The fields a mode hands to the mode it runs as (auto runs as apply or profile)."""
        return dict(adapter=self.adapter, io_share=self.io_share, model_name=self.model_name, owner=self.owner,
                    subject=self.subject)

    def warn_if_unpatched(self, run: RunState, stats: CacheStats) -> None:
        """The model was called but no block patch ever was: its block loop does not ask for the patches the
        adapter set (a changed ComfyUI or a custom forward). Say so rather than silently doing nothing."""
        if run.calls and not stats.stack_calls and self.adapter.route != Route.FALLBACK and run.disabled is None:
            if run.replaced:  # another node's object patch replaced GCache's first block: said at the run's start
                log.info("GCache: %s's blocks were never reached through GCache's patches (another node replaced "
                         "%s): every step computed, nothing cached or profiled.", self.model_name,
                         ", ".join(run.replaced[:4]))
                return
            log.warning("GCache: %s was sampled %d times but its %s blocks were never reached through the %s "
                        "patches: nothing was cached or profiled. Please report this model and ComfyUI version.",
                        self.model_name, run.calls, self.adapter.name, self.adapter.route.value)
