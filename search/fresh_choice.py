"""The final choice on fresh seeds: the search's pick against the best candidate of every other profile-fitted
forecaster, each sampled on seeds the search never judged a mask on; a finalist clearly better there wins.

Why: a search's pick is the lowest of some 60 losses on its own seeds, so its loss there is the most flattered of
them, and which forecaster suits a mask differs from seed to seed. On the reference model (bench/quality.py, K = 15
of 30, budget 64) the search's 16 seeds ranked its fitted pick 0.33 dB above l2p on auto's mask, while on each of
four other seed sets (16 or 32 seeds) l2p on that mask was 0.31 to 0.98 dB better; no rule on the search's own
seeds could see that. Losses on fresh seeds are not flattered by the choice, so they rank the finalists as held-out
images would (up to the seeds' noise).

- Finalists (`finalists`): the candidate the search would return (after the forecaster check), and for each
  profile-fitted forecaster the candidate of lowest loss the search measured under it (its start masks, the GP's
  masks, the check's variants). Only a search with a profile-fitted forecaster has more than one; a search with a
  fixed rule (reuse, linear) keeps its pick and samples nothing.
- Seeds (`fresh_seeds`): as many as the search's, the next ones after its largest (GCache Search: seed + n … seed +
  2n − 1), each with its full-compute image. Cost, after the budget: the fresh seeds' full-compute runs and one
  evaluation per finalist (at most 1 + the number of profile-fitted forecasters; 3 today).
- Rule (paired.py FRESH): a finalist replaces the pick when its paired gain over the pick on the fresh seeds is
  beyond FRESH_Z = 1 standard error (without per-seed losses of 2+ seeds: a lower mean loss); of several, the lowest
  fresh loss. The pick has won the whole search, so a challenger must show more than a lower mean on 16 seeds: the
  lowest fresh loss alone replaced it twice wrongly of three times (paired.py).
- The results go into the state file ("fresh"), so a resumed search measures nothing twice. A state file made before
  this choice has no "fresh" entry and resumes without it, as it was searched.
- An evaluation that can't sample fresh seeds (executor.py, can_sample_fresh: Ray actors, ComfyUI workers, a plain
  function) keeps the pick, and the log says why.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Optional, Sequence

from .paired import FRESH
from .state import SearchState, forecaster_of, loss_of, mask_of, split_key

log = logging.getLogger("gcache")

CANT_SAMPLE = "the search's evaluation samples its own seeds only (it declares no can_sample_fresh)"


def fresh_seeds(seeds: Sequence[int]) -> list[int]:
    """The fresh seeds of a search on `seeds`: as many, the next ones after the largest."""
    seeds = [int(s) for s in seeds]
    top = max(seeds) if seeds else -1
    return list(range(top + 1, top + 1 + len(seeds)))


def finalists(state: SearchState, picked: str, names: Sequence[str], own: str) -> list[str]:
    """`picked` (the key the search would return), then each forecaster of `names`' lowest-loss measured key (module
    docstring), each key once."""
    keys = [picked]
    for name in names:
        mine = [k for k in state.masks if forecaster_of(k, own) == name]
        if mine:
            best = min(mine, key=lambda k: state.masks[k]["loss"])  # the first measured of equal losses
            if best not in keys:
                keys.append(best)
    return keys


def entry_of(state: SearchState, key: str) -> dict:
    """The history entry a measured key stands for: its own, or (a variant the forecaster check measured) the entry of
    the same mask under another forecaster, the lowest-loss one."""
    entries = state.history + ([state.final] if state.final else [])
    own = [e for e in entries if e["mask"] == key]
    if own:
        return own[0]
    bits = split_key(key)[0]
    return min((e for e in entries if split_key(e["mask"])[0] == bits), key=lambda e: state.masks[e["mask"]]["loss"])


def run(state: SearchState, keys: list, measure: Optional[Callable[[list, Optional[str]], Any]], own: str,
        why_not: Optional[str] = None) -> dict:
    """Measures each of `keys` (the pick first) on the fresh seeds with `measure(mask, forecaster or None for the
    search's own)` unless measured before, and returns {"key" (the winner), "losses" (key -> fresh loss), "seeds",
    "evaluations" (this call's), "skipped" (why not)}. `measure` None: nothing new is measured (`why_not`); the pick
    stays unless every finalist was measured before."""
    fresh = state.fresh
    todo = [k for k in keys if k not in fresh]
    out = {"key": keys[0], "losses": {}, "seeds": None, "evaluations": 0, "skipped": None}
    if todo and measure is None:
        out["skipped"] = (f"the final choice on fresh seeds ({len(keys)} finalists) did not run: "
                          f"{why_not or CANT_SAMPLE}; the search's pick stays")
        log.info("GCache Search: %s.", out["skipped"])
        return out
    for key in todo:
        bits, fc = split_key(key)
        loss, per_seed = loss_of(measure(mask_of(bits), fc))
        out["evaluations"] += 1
        if not math.isfinite(loss):
            log.warning("GCache Search: %s on the fresh seeds returned no finite loss; it is left out.", key)
            continue
        fresh[key] = {"loss": loss, **({"per_seed": per_seed} if per_seed is not None else {})}
        state.save()
    measured = [k for k in keys if k in fresh]
    if keys[0] not in fresh:  # the pick has no fresh loss to compare with: it stays
        return out
    out["losses"] = {k: fresh[k]["loss"] for k in measured}
    out["seeds"] = len(fresh[keys[0]].get("per_seed") or []) or None
    better = [k for k in measured[1:] if FRESH.decide(fresh[k], fresh[keys[0]], state.seed)]
    out["key"] = min(better, key=lambda k: (fresh[k]["loss"], keys.index(k))) if better else keys[0]
    log.info("GCache Search: final choice on %s: %s; %s.",
             f"{out['seeds']} fresh seeds" if out["seeds"] else "the fresh seeds",
             ", ".join(f"{forecaster_of(k, own)} {'(the pick) ' if k == keys[0] else ''}loss {fresh[k]['loss']:.5g} "
                       f"(search seeds {state.masks[k]['loss']:.5g})" for k in measured),
             "the pick stays" if out["key"] == keys[0] else
             f"{forecaster_of(out['key'], own)} on another mask replaces it" if split_key(out["key"])[0] !=
             split_key(keys[0])[0] else f"{forecaster_of(out['key'], own)} replaces it on the same mask")
    return out


def provenance(fresh: dict, picked: str) -> dict:
    """What the policy's provenance records of the choice ({} when it had nothing to compare)."""
    if fresh["skipped"]:
        return {"skipped": fresh["skipped"]}
    if len(fresh["losses"]) < 2:
        return {}
    return {"seeds": fresh["seeds"], "replaced": fresh["key"] != picked,
            "losses": {k: round(v, 9) for k, v in fresh["losses"].items()}}
