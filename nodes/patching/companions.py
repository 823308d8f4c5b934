"""What users run beside a GCache node on one model: ComfyUI's TorchCompileModel and its own cache nodes (EasyCache,
LazyCache). Imports ComfyUI.

- TorchCompileModel *before* GCache Apply / Profile: the compile is moved from the whole diffusion model to its
  blocks (ComfyUI's own set_torch_compile_wrapper, with the same settings), so GCache's per-step choice runs outside
  every compiled graph: the blocks compile once per shape, a mask, a step index or a skip never enters a graph.
  Families whose blocks GCache patches as objects (the patch *is* the block's forward) are refused: their blocks
  can't compile without GCache's gate inside.
- TorchCompileModel *after* a GCache node would compile GCache's gate into the whole-model graph (a recompile per
  step, and a graph compiled for the plain model is reused without GCache: ComfyUI's compile drops the guards on
  transformer_options, where GCache's patches live): refused when the node runs, with the order that works.
- EasyCache / LazyCache on the same model: two caches would skip steps independently and GCache's K, speed-up and
  profile would be wrong: refused, before or after.
"""
from __future__ import annotations

import logging
from typing import Optional

from ...core.errors import GCacheError
from .adapters import Adapter, Route, block_slots

log = logging.getLogger("gcache")
EASYCACHE_KEY = "easycache"  # EasyCache's and LazyCache's holder in transformer_options (comfy_extras)
CACHE_NODES = ("EasyCache", "LazyCache")
COMPILE_NODES = ("TorchCompileModel",)
BLOCK_COMPILE = "gcache_block_compile"  # in model_options: the compile settings GCache moved to the blocks


def _compile_api():
    try:
        from comfy_api.torch_helpers.torch_compile import TORCH_COMPILE_KWARGS, set_torch_compile_wrapper
    except ImportError:  # a ComfyUI without the compile helper has no TorchCompileModel to combine with
        return None, None
    return TORCH_COMPILE_KWARGS, set_torch_compile_wrapper


def _compile_wrappers(model_options: dict, patcher=None) -> list:
    """The APPLY_MODEL wrappers ComfyUI's compile helper registered, on a patcher and in model_options (which are
    copied per run; the functions are not: a wrapper is recognised by identity)."""
    try:
        from comfy.patcher_extension import WrappersMP
        from comfy_api.torch_helpers.torch_compile import COMPILE_KEY
    except ImportError:
        return []
    found = []
    for wrappers in (getattr(patcher, "wrappers", None) or {},
                     (model_options.get("transformer_options") or {}).get("wrappers") or {}):
        found += list((wrappers.get(WrappersMP.APPLY_MODEL) or {}).get(COMPILE_KEY) or [])
    return found


def check_model(model, what: str) -> None:
    """Refuse a model that already carries EasyCache or LazyCache."""
    if EASYCACHE_KEY in (model.model_options.get("transformer_options") or {}):
        raise GCacheError(f"This model already goes through EasyCache or LazyCache, which skips steps by itself; with "
                          f"{what} two caches would skip steps independently (and GCache's K, speed-up and profile "
                          f"would be wrong). Use one of them: remove the EasyCache/LazyCache node or {what}.")


def compile_blocks(m, adapter: Adapter, diffusion_model, what: str) -> None:
    """On GCache's clone `m` of a model TorchCompileModel compiled: compile the block stack's blocks instead of the
    whole model (the same compile settings), so that GCache's gate stays outside the graphs."""
    kwargs_key, set_wrapper = _compile_api()
    if kwargs_key is None or kwargs_key not in m.model_options or adapter.route == Route.FALLBACK:
        return  # no compile, or the whole-model cache runs in a wrapper outside the compiled model anyway
    if adapter.route == Route.OBJECT:
        raise GCacheError(f"TorchCompileModel and {what} don't combine on {adapter.name} models yet: GCache patches "
                          "their blocks' forward itself, so the blocks can't be compiled without GCache's per-step "
                          f"choice inside the graph. Use one of them (remove TorchCompileModel or {what}).")
    kwargs = dict(m.model_options[kwargs_key])
    keys = [f"diffusion_model.{slot.stack.attr}.{slot.child}" for slot in block_slots(adapter, diffusion_model)]
    set_wrapper(m, keys=keys, **kwargs)
    # ours, until a later compile replaces it
    m.model_options[BLOCK_COMPILE] = _compile_wrappers(m.model_options, m)[-1]
    log.info("GCache: TorchCompileModel now compiles the %d blocks of the %s block stack one by one (GCache's "
             "per-step choice stays outside the compiled graphs).", len(keys), adapter.name)


def check_prompt(prompt: Optional[dict], node_id: Optional[str], what: str) -> None:
    """Refuse, when the node runs, a TorchCompileModel or a core cache node downstream of this GCache node."""
    if not isinstance(prompt, dict) or node_id is None:
        return
    below, todo = set(), [str(node_id)]
    while todo:  # every node that takes this node's output, directly or through others
        src = todo.pop()
        for nid, node in prompt.items():
            inputs = (node or {}).get("inputs") or {}
            if nid not in below and any(isinstance(v, list) and len(v) == 2 and str(v[0]) == src
                                        for v in inputs.values()):
                below.add(nid)
                todo.append(nid)
    kinds = {prompt[nid].get("class_type") for nid in below}
    if kinds & set(COMPILE_NODES):
        raise GCacheError(f"TorchCompileModel after {what} would compile GCache's per-step choice into the whole-model "
                          "graph (a recompile per step, or a graph without GCache reused). Put TorchCompileModel "
                          f"before {what}: GCache then compiles the blocks and keeps its choice outside the graphs.")
    if kinds & set(CACHE_NODES):
        raise GCacheError(f"{'/'.join(sorted(kinds & set(CACHE_NODES)))} after {what} would skip steps independently "
                          f"of GCache (and GCache's K, speed-up and profile would be wrong). Use one of them.")


def check_run(model_options: dict, patcher, what: str) -> None:
    """At the start of sampling (API and in-process callers the prompt check can't see): a core cache node added
    after GCache is refused before any step; a whole-model compile added after it is said in the log."""
    if EASYCACHE_KEY in (model_options.get("transformer_options") or {}):
        raise GCacheError(f"EasyCache or LazyCache was applied to this model after {what}: two caches would skip steps "
                          "independently. Use one of them.")
    wrappers = _compile_wrappers(model_options, patcher)
    if wrappers and model_options.get(BLOCK_COMPILE) not in wrappers:
        log.warning("GCache: this model was compiled (TorchCompileModel) after %s: the whole-model graph has GCache's "
                    "per-step choice inside (a recompile per step, or no caching at all). Put TorchCompileModel "
                    "before %s.", what, what)
