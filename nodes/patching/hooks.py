"""Wire GCache into a ComfyUI ModelPatcher clone: wrappers + block patches, nothing else. Imports ComfyUI.

model.clone() → the config (a RunConfig: plain data, no tensors, never changed after the node made it; the modes
in ../modes make them) in transformer_options["gcache"], three wrappers keyed "gcache" (OUTER_SAMPLE: the config
starts the per-run state, closed in `finally`; SAMPLER_SAMPLE: the step callback; APPLY_MODEL: the step of every
model call, other nodes' patches in GCache's slots (foreign.py), and the whole-model fallback) and the family's block
patches, which wrap what another node put in their slots before. Nothing is stored on the shared diffusion model;
object patches (families without dit replace) are ModelPatcher's own, restored on unpatch.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional, Protocol

from comfy.patcher_extension import WrappersMP

from . import companions, foreign, memory_compiler
from .adapters import Adapter, Route, block_slots
from .content_hash import content_hash
from .runtime import RunState, activate, current_run, deactivate, make_dit_patch, make_gated_forward

log = logging.getLogger("gcache")
KEY = "gcache"


class RunConfig(Protocol):
    """What the wrappers need from the config of a patched clone (../modes/base.py ModeConfig and its modes)."""
    owner: str          # a token unique to the clone: its patches find the clone's live run by it (runtime.py)
    adapter: Adapter    # where the family's block stack is, and how it is patched

    def start_run(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]) -> RunState:
        """The state of one sampling run (`run_sigmas`: the sampler's sigmas; `sample_key()`: what makes the run the
        same run again), made when sampling starts and closed by the OUTER_SAMPLE wrapper with `run.close(ok)`."""


def patch_model(model, config: RunConfig, what: str = "GCache"):
    """A clone of `model` with GCache wired in (replacing GCache hooks of an earlier GCache node). `what`: the node,
    for messages about what runs beside it (companions.py)."""
    companions.check_model(model, what)
    m = model.clone()
    dm = m.get_model_object("diffusion_model")
    m.model_options.setdefault("transformer_options", {})[KEY] = config
    for kind, fn in ((WrappersMP.OUTER_SAMPLE, _outer_sample), (WrappersMP.SAMPLER_SAMPLE, _sampler_sample),
                     (WrappersMP.APPLY_MODEL, _apply_model)):
        m.remove_wrappers_with_key(kind, KEY)
        m.add_wrapper_with_key(kind, KEY, fn)
    ad = config.adapter
    chained = []  # slots that hold another node's patch: GCache's gate calls it as the block (foreign.py)
    if ad.route == Route.DIT:
        held = ((m.model_options.get("transformer_options") or {}).get("patches_replace") or {}).get("dit") or {}
        for slot in block_slots(ad, dm):
            key = (slot.stack.key, slot.index)
            inner = foreign.chain_target(held.get(key))
            chained += [key] if inner is not None else []
            m.set_model_patch_replace(make_dit_patch(slot, config.owner, inner), "dit", *key)
    elif ad.route == Route.OBJECT:
        for slot in block_slots(ad, dm):
            name = _object_name(slot)
            inner = foreign.chain_target(m.object_patches.get(name))
            block = getattr(getattr(dm, slot.stack.attr), slot.child)
            original = inner if inner is not None else type(block).forward.__get__(block)  # not GCache's own patch
            chained += [name] if inner is not None else []
            m.add_object_patch(name, make_gated_forward(slot, original, config.owner, chained=inner is not None))
    foreign.say_chained(chained, what)
    companions.compile_blocks(m, ad, dm, what)  # TorchCompileModel before GCache: compile the blocks instead
    return m


def config_of(model) -> Optional[RunConfig]:
    return model.model_options.get("transformer_options", {}).get(KEY)


def _object_name(slot) -> str:
    return f"diffusion_model.{slot.stack.attr}.{slot.child}.forward"


# ------------------------------------------------------------------------------------------ the wrappers
def _outer_sample(executor, *args, **kwargs):
    guider = executor.class_obj
    config: Optional[RunConfig] = guider.model_options.get("transformer_options", {}).get(KEY)
    if config is None:
        return executor(*args, **kwargs)
    companions.check_run(guider.model_options, guider.model_patcher, "GCache")
    names = ("noise", "latent_image", "sampler", "sigmas", "denoise_mask", "callback", "disable_pbar", "seed")
    a = dict(zip(names, args), **kwargs)

    def sample_key() -> str:  # what makes a run the same run again (Profile's duplicate check)
        sampler = a.get("sampler")
        return content_hash(a.get("seed"), a.get("noise"), a.get("latent_image"), a.get("denoise_mask"),
                            getattr(guider, "original_conds", None), getattr(guider, "cfg", None),
                            getattr(getattr(sampler, "sampler_function", None), "__name__", type(sampler).__name__),
                            a["sigmas"])

    run = config.start_run(guider.model_patcher, [float(s) for s in a["sigmas"].float().cpu()], sample_key)
    run.context_handler = guider.model_options.get("context_handler") is not None  # ComfyUI's context windows
    patcher, ad = guider.model_patcher, config.adapter
    _prepare(run, patcher, ad, config)
    # the conds as ComfyUI handed them to this wrapper: outer_sample processes guider.conds in place, so a resample
    # starts again from copies of these (as CFGGuider.sample makes them)
    conds = {k: [c.copy() for c in v] for k, v in (getattr(guider, "conds", None) or {}).items()}
    token = activate(run)
    ok = False
    try:
        with memory_compiler.for_run(run, ad.route, patcher.load_device):
            out = executor(*args, **kwargs)
        ok = True
    finally:
        deactivate(token)
        run.close(ok)
    if run.after:  # sampling finished and the run is closed: what the mode does with the same inputs again
        quiet_args, quiet_kwargs = _quiet(args, kwargs)

        def resample(other):
            guider.conds = {k: [c.copy() for c in v] for k, v in conds.items()}
            other.context_handler = run.context_handler
            _prepare(other, patcher, ad, config)
            tok, fine = activate(other), False
            try:
                with memory_compiler.for_run(other, ad.route, patcher.load_device):
                    res = executor(*quiet_args, **quiet_kwargs)
                fine = True
                return res
            finally:
                deactivate(tok)
                other.close(fine)

        for fn in run.after:
            fn(resample, out)
    return out


def _prepare(run: RunState, patcher, ad, config) -> None:
    """The run's view of GCache's slots: dit slots for each call's gate, object patches another node replaced."""
    if ad.route == Route.FALLBACK:
        return
    slots = block_slots(ad, patcher.get_model_object("diffusion_model"))
    if ad.route == Route.DIT:
        run.slots = slots  # each call's other patches in them get GCache's gate (_apply_model)
    else:
        run.replaced = foreign.check_object_patches(patcher.object_patches, [_object_name(s) for s in slots],
                                                    config.owner)


def _quiet(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """OUTER_SAMPLE's arguments for a run the user does not see: no step callback (previews, progress), no bar."""
    args, kwargs = list(args), dict(kwargs)
    for i, name, value in ((5, "callback", None), (6, "disable_pbar", True)):
        if len(args) > i:
            args[i] = value
        else:
            kwargs[name] = value
    return tuple(args), kwargs


def _sampler_sample(executor, *args, **kwargs):
    config = args[2]["model_options"]["transformer_options"].get(KEY) if len(args) > 2 else None
    run = current_run(config.owner) if config is not None else None
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
    config = (topts or {}).get(KEY)
    run = current_run(config.owner) if config is not None else None
    if run is None:
        return executor(*args, **kwargs)
    # other nodes' patches in GCache's slots get GCache's gate; a call with patches the plain calls lack is a branch
    guarded, patches = foreign.guard_call(topts, run.slots, config.owner, make_dit_patch)
    if guarded is not topts:
        args, kwargs = (args[:5] + (guarded,) + args[6:], kwargs) if len(args) > 5 else \
            (args, dict(kwargs, transformer_options=guarded))
    step = run.begin_call(float(args[1].reshape(-1)[0]), topts, patches)
    if config.adapter.route != Route.FALLBACK:
        if run.selfcheck is not None:  # run 1: one call replayed through the skip path (selfcheck.py)
            out = run.selfcheck.model_call(run, step, executor, args, kwargs, foreign_options=topts)
            run.end_call()  # run 1 computes every call: its output is the computed one whatever the replay left
            return out
        out = executor(*args, **kwargs)
        if run.end_call():  # it skipped but never reached GCache's last block: computed again, every block
            out = executor(*args, **kwargs)
        return out
    # the whole model is the "stack": its input latent is h, its output the stack's output
    return run.gate(args[0], lambda x: executor(x, *args[1:], **kwargs), first=True, last=True)
