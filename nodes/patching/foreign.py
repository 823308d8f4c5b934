"""Other nodes' patches in GCache's block slots, and model calls whose block patches differ from the run's plain
calls. No ComfyUI import (hooks.py applies these at patch time and in its APPLY_MODEL wrapper).

A block slot may hold another node's patch: Skip Layer Guidance's skip, a ControlNet, sparse attention. GCache wraps
it, it never drops it:

- *Before GCache* (the slot holds the patch when GCache patches the clone): GCache's patch calls it as the block,
  foreign(args, {"original_block": original}) (runtime.make_dit_patch's `inner`; for object patches the forward it
  replaced). Re-applying GCache replaces GCache's own patch, recognised by its marker attributes, and keeps what that
  patch wrapped.
- *After GCache* (a node after it, Skip Layer Guidance's per-call model_options, a core patch that chains to the
  previous one or one that doesn't): the APPLY_MODEL wrapper sees every call's transformer_options. `guard_call`
  puts GCache's gate around each entry in GCache's slots that is not GCache's, in a shallow copy of the options
  (ComfyUI's dicts are never changed). A patch that chains back to GCache's own patch gets one gate, not two
  (runtime.py: the lane's in_slot).

Either way the call runs the same blocks, so the two node orders give the same latent (up to the caching itself).
A call whose patches differ from the run's plain calls (`signature`: the module and qualified name of each entry
that is not GCache's; never id(), so Skip Layer Guidance's skip is the same branch on every step) is a Variant branch
of its conds (runtime.py): it keeps a residual of its own, never reads or overwrites the plain call's, and computes
on a step it has no residual for (the engine forces a branch it has never stored). Two different patches with the
same module and qualified name in one step would share a branch; ComfyUI's own patches never do.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

log = logging.getLogger("gcache")


def is_gcache(fn) -> bool:
    """A patch or forward made by GCache (runtime.make_dit_patch / make_gated_forward), of any GCache node."""
    return getattr(fn, "gcache_owner", None) is not None


def is_ours(fn, owner: str) -> bool:
    return getattr(fn, "gcache_owner", None) == owner


def chain_target(existing) -> Optional[Callable]:
    """What GCache's new patch of a slot calls as the block: the other node's patch that holds the slot, or what an
    earlier GCache patch there wrapped (never GCache's own patch: re-applying GCache replaces it); None: the block."""
    if existing is None:
        return None
    if is_gcache(existing):
        return getattr(existing, "gcache_inner", None)
    return existing if callable(existing) else None


def name_of(fn) -> str:
    """module.qualname of a patch: stable across the steps of a run and across runs (a function made once per node
    execution, a bound method, a functools.partial, a callable object)."""
    f = getattr(fn, "func", fn)      # functools.partial
    f = getattr(f, "__func__", f)    # bound method
    module = getattr(f, "__module__", None) or type(f).__module__
    qualname = getattr(f, "__qualname__", None) or type(f).__qualname__
    return f"{module}.{qualname}"


def _slot_label(key) -> str:
    return " ".join(str(k) for k in key) if isinstance(key, tuple) else str(key)


def signature(transformer_options: Optional[dict], owner: str) -> str:
    """The block patches of a call that are not GCache's (every patches_replace kind), as one stable string; ""
    when the call has none (a plain call)."""
    found = []
    for kind, entries in ((transformer_options or {}).get("patches_replace") or {}).items():
        if isinstance(entries, dict):
            found += [f"{kind} {_slot_label(key)}: {name_of(fn)}" for key, fn in entries.items()
                      if not is_ours(fn, owner)]
    return "; ".join(sorted(found))


def guard_call(transformer_options: Optional[dict], slots: Iterable, owner: str,
               make_patch: Callable) -> tuple[Optional[dict], str]:
    """This call's transformer_options with GCache's gate in each of GCache's dit slots whose entry is another
    node's (a shallow copy; the same dict when nothing needs it), and the call's signature.

    make_patch(slot, owner, inner) is runtime.make_dit_patch. A slot without an entry, while others of GCache's slots
    have one, gets GCache's patch around the block itself (the block runs either way, and the stack stays whole); a
    call with no entry in any of GCache's slots is left alone (it computes; a run of them says so at its end)."""
    topts = transformer_options or {}
    sig = signature(topts, owner)
    replace = topts.get("patches_replace") or {}
    dit = replace.get("dit") if isinstance(replace.get("dit"), dict) else {}
    wraps, missing, slots = {}, [], list(slots)
    for slot in slots:
        key = (slot.stack.key, slot.index)
        fn = dit.get(key)
        if fn is None:
            missing.append((key, slot))
        elif not is_ours(fn, owner):
            wraps[key] = make_patch(slot, owner, fn)
    if missing and len(missing) < len(slots):
        wraps.update((key, make_patch(slot, owner, None)) for key, slot in missing)
    if not wraps:
        return transformer_options, sig
    guarded = dict(topts)
    guarded["patches_replace"] = dict(replace, dit={**dit, **wraps})
    return guarded, sig


def say_chained(slots: list, what: str) -> None:
    """One log line when GCache wrapped other nodes' patches at patch time."""
    if slots:
        log.info("%s: %d block slot(s) of this model already hold another node's patch (%s); GCache calls them as the "
                 "original blocks, so they run on every step GCache computes.", what, len(slots),
                 ", ".join(_slot_label(k) for k in slots[:6]) + (", …" if len(slots) > 6 else ""))


def check_object_patches(object_patches: dict, names: Iterable[str], owner: str, what: str = "GCache") -> list:
    """Object-patched families (no per-call options to guard): a node after GCache that replaced GCache's forward of
    a block is said once per run; the gate then computes the calls that miss GCache's first or last block. Returns
    the replaced forwards' names (the run then knows why a call leaves the stack unpaired: no report to ask for)."""
    replaced = [n for n in names if n in object_patches and not is_ours(object_patches[n], owner)]
    if replaced:
        log.warning("%s: another node replaced GCache's patch of %d block forward(s) after %s (%s); GCache can't wrap "
                    "object patches per call, so calls that miss its first or last block compute without the cache. "
                    "Put that node before %s: GCache then calls its patch as the block.", what, len(replaced), what,
                    ", ".join(replaced[:4]) + (", …" if len(replaced) > 4 else ""), what)
    return replaced


# ------------------------------------------------------------------------------ what sees the self-check's replay
# ComfyUI's own code (its wrappers are stateless, or refused elsewhere: EasyCache/LazyCache, companions.py) and GCache's
_GCACHE = __name__.split(".nodes.")[0]  # "gcache", or where ComfyUI loaded the pack from
KNOWN_SAFE = ("comfy.", "comfy_extras.", "comfy_api.", "comfy_execution.", f"{_GCACHE}.nodes.", f"{_GCACHE}.core.")
INSIDE_APPLY_MODEL = ("diffusion_model",)  # ComfyUI's wrapper kinds called within BaseModel._apply_model


def unknown_wrappers(executor, transformer_options: Optional[dict], diffusion_model=None) -> list[str]:
    """Other nodes' code that would see the self-check's replay (a second call of the step): APPLY_MODEL wrappers
    inside GCache's (the rest of `executor`'s chain), the wrappers ComfyUI calls around the diffusion model, and
    methods patched on the diffusion model (a cache pack's forward); ComfyUI's and GCache's own left out. A stateful
    one (TeaCache, FBCache, MagCache) would count the replay, or serve it from its own cache."""
    found = list(getattr(executor, "wrappers", None) or [])[getattr(executor, "idx", 0) + 1:]
    wrappers = (transformer_options or {}).get("wrappers") or {}
    for kind in INSIDE_APPLY_MODEL:
        for fns in (wrappers.get(kind) or {}).values():
            found += list(fns or [])
    patched = getattr(diffusion_model, "__dict__", {}) if diffusion_model is not None else {}
    found += [fn for name, fn in patched.items()  # an object patch: an instance attribute over a method of the class
              if callable(fn) and callable(getattr(type(diffusion_model), name, None))]
    names = [name_of(fn) for fn in found if not is_gcache(fn)]
    return list(dict.fromkeys(n for n in names if not n.startswith(KNOWN_SAFE)))
