"""A measured candidate's key: a mask applied with a forecaster. The key is the mask ("1001…") when the forecaster is
the search's own, else the mask and the forecaster's name ("1001…@l2p"). A history entry's "mask", the keys of the
state file's "masks" and of its fresh-seed losses are such keys (state.py)."""
from __future__ import annotations

from typing import Optional

# What a history entry's "kind" is: the phase that proposed it (loop.py). Start masks keep their first name, "instant".
START, GRID, GP, POLISH = KINDS = ("instant", "grid", "gp", "polish")
FINAL = "final"  # the argmin-μ mask measured at the end of a budget (state.final)
CHECK = "check"  # the chosen candidate's mask under another forecaster, measured by the forecaster check
MEASURED_BY = KINDS + (FINAL, CHECK)  # what measured a candidate (Measured.kind)


def key_of(mask, forecast: Optional[str] = None) -> str:
    """The key of a mask ("1001…", or a sequence of 0/1) applied with `forecast` (None: the search's own
    forecaster)."""
    bits = mask if isinstance(mask, str) else "".join("1" if int(m) else "0" for m in mask)
    return bits if forecast is None else f"{bits}@{forecast}"


def split_key(key: str) -> tuple[str, Optional[str]]:
    """(the mask as "1001…", the forecaster's name or None for the search's own) of a candidate key."""
    bits, _, forecast = key.partition("@")
    return bits, (forecast or None)


def mask_of(key: str) -> list:
    """The mask of a candidate key as a list of 0/1."""
    return [int(c) for c in split_key(key)[0]]


def forecaster_of(key: str, own: str) -> str:
    """The forecaster a candidate key is applied with (`own`: the search's)."""
    return split_key(key)[1] or own


def method_of(entry) -> str:
    """The method a history entry (or a proposal) stands for: its start mask's name, else its phase's (the policy's
    provenance "won"; an end's argmin-μ mask: "gcache argmin mu")."""
    return entry.get("method") or {GRID: "gcache start grid", GP: "gcache GP-LCB",
                                   POLISH: "gcache polish"}.get(entry.get("kind"), "gcache argmin mu")
