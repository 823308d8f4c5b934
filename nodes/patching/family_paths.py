"""Which model classes of the family table this ComfyUI has, checked once when the nodes load. Imports ComfyUI's model
modules only inside `check` (by name; the table itself imports none, adapters.py).

ComfyUI moves and renames model code between weekly releases. A class path of the table that does not import here
(its module moved or vanished, its class was renamed, the module fails to import, or the family is newer than this
ComfyUI) is left out of the table's lookup: a model of that class, or one whose class has the same name somewhere
else (moved), gets the whole-model fallback with a warning that names the family (adapters.choose_adapter). Nothing
here can fail loading the nodes: one log line names the families left out, and the nodes load.
"""
from __future__ import annotations

import importlib
import logging
from typing import Callable

from . import adapters

log = logging.getLogger("gcache")


def _why_gone(path: str, import_module: Callable) -> str:
    """"" when module.Class of `path` imports and is a class; else why not."""
    module, _, cls = path.rpartition(".")
    try:
        found = getattr(import_module(module), cls, None)
    except Exception as e:  # noqa: BLE001  any failure of a model module (missing, moved, broken) leaves it out
        return f"{module} does not import ({type(e).__name__})"
    if not isinstance(found, type):
        return f"{module} has no class {cls}"
    return ""


def check(import_module: Callable = importlib.import_module) -> list[str]:
    """Resolve every class path of the family table on this ComfyUI; leave out the ones that don't resolve
    (adapters.set_gone) and log one line naming the families none of whose classes resolve. Returns those
    families' names. Never raises."""
    gone = {}
    for ad in adapters.ADAPTERS:
        for path in ad.classes:
            try:
                why = _why_gone(path, import_module)
            except Exception as e:  # noqa: BLE001  never fail loading the nodes
                why = f"check failed ({type(e).__name__})"
            if why:
                gone[path] = why
    adapters.set_gone(gone)
    left_out = [ad.name for ad in adapters.ADAPTERS if ad.classes and all(p in gone for p in ad.classes)]
    if left_out:
        log.info("GCache: %d of %d model families are left out on this ComfyUI (their model classes are not where "
                 "GCache knows them: not in this version, moved or renamed): %s. Their models are cached as a whole "
                 "model, with a warning.", len(left_out), len(adapters.ADAPTERS), ", ".join(left_out))
    for path, why in sorted(gone.items()):
        log.debug("GCache: family table class %s left out: %s", path, why)
    return left_out
