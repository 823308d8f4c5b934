"""The search's state file on disk: its format, what makes two runs the same search (`search_id`), reading and checking
a file (`load_state`), saying in words what differs from another search, and the one-time migration of older formats
(`migrated`). The state object that reads and changes a loaded file's content is state.py.

One JSON object, written atomically after every change (format "gcache.search_state", version 5). A file of version
3 or 4 is migrated once, when it is read (`migrated`), and written back as version 5 when the search changes it:
nothing after the read tells the versions apart.

    fingerprint  the search id: a hash of the config's identity (config.identity_of: less the budget and the polish
                 guard), the profile, the provenance and the names of the start masks (what the search proposes
                 depends on all of them)
    config, profile, provenance    what the id was made of (to say in words what differs)
    starts       the names of the start masks this search measures (one list; a file made with its own forecaster's
                 start masks only resumes with them)
    history      one entry per proposal, in the order its result came back: i, kind (instant | grid | gp | polish),
                 s, mask, loss, reused, seconds, bound, kappa, gp_seconds (+ method for start masks; parent and
                 accepted for polish moves)
    masks        each measured candidate once (keys.py: a mask with its forecaster): loss, per_seed (absent when the
                 evaluation gave one number), seconds, first (the history index when it was measured) and how it was
                 measured: kind (a history entry's kind, "final" for an end's argmin-μ mask, "check" for the
                 forecaster check's), s and method (what found the mask: the policy's provenance "won"; a check's are
                 those of the candidate it checked, whose key is its "of")
    gp           {"theta": the last fit's log-hyperparameters}, the next fit's warm start
    polish       the polish stage's climb: incumbent, roots, guard (polish.py; the guard's name: paired.SAVED_GUARDS)
    final, done  the argmin-μ entry measured at the end of the last budget (an earlier budget's stays among the
                 masks, kind "final": a candidate still)
    pending      proposals dispatched and not back yet; a resumed search dispatches them again
    choices      the forecasters the end game chooses among, the search's own first (end_game.chooses_among)
    kept         the keys of the candidates earlier budgets' end games returned: a finished search continued with a
                 larger budget keeps its policy as a candidate (choice.py)
    fresh        the final choice on fresh seeds (end_game.py): {"chooses": whether this search makes it (false: a
                 file made before it, which resumes without it), "masks": key -> {"loss", "per_seed"?} on the fresh
                 seeds}

A state file of another search, a newer or older format, or a damaged file is refused and left untouched.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Optional

import numpy as np

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.profile import Profile
from .config import SearchConfig, identity_of
from .keys import CHECK, FINAL, KINDS, MEASURED_BY, POLISH, START, key_of, method_of, split_key
from .paired import SAVED_GUARDS

STATE_FORMAT = "gcache.search_state"
STATE_VERSION = 5  # 5: measured candidates say how; the check once (among them); fresh and choices always present
READS = (3, 4, 5)  # 3 and 4 are migrated when read (migrated); older: refused


def profile_identity(profile: Profile) -> dict:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(profile.E, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(profile.times, dtype=np.float64).tobytes())
    return {"n_steps": int(profile.n_steps), "sha256": h.hexdigest()[:16], "count": int(profile.count)}


def search_id(config: SearchConfig, prof_id: dict, provenance: dict, starts: list) -> str:
    """What makes two runs the same search (a larger budget continues it): stored as the state's 'fingerprint'."""
    blob = json.dumps({"config": config.identity(), "profile": prof_id, "provenance": provenance, "starts": starts},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_state(path: str) -> dict:
    """Read and check a state file; never modifies it."""
    name = os.path.basename(path)
    try:
        with open(path, "r", encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e  # an OSError's text repeats the path
        raise GCacheError(f"The search state {name} is unreadable or damaged ({why}). It was left as it is: delete it "
                          "to start the search over, or choose another state file name.") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise GCacheError(f"{name} is not a GCache search state (no 'format': '{STATE_FORMAT}'). It was left "
                          "untouched: choose another state file name.")
    if state.get("version") not in READS:
        raise GCacheError(f"{name} has search-state version {state.get('version')!r}; this GCache reads "
                          f"{', '.join(map(str, READS[:-1]))} and {READS[-1]}. Delete it to search again, or use the "
                          "GCache version "
                          "that wrote it.")
    try:
        _check(state)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise GCacheError(f"{name} is damaged ({e!r}). It was left untouched: delete it to start the search "
                          "over.") from None
    return state


def _check(state: dict) -> None:
    """Raises on anything a hand edit or a bug could leave that the search would trip over later."""
    version = state["version"]
    dim = int(state["config"]["degree"]) + 1
    n = int(state["profile"]["n_steps"])

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    def mask_ok(m) -> bool:  # a candidate key: the mask, and from version 4 "@" and a forecaster's name
        if not isinstance(m, str):
            return False
        bits, fc = split_key(m)
        if fc is not None and (version < 4 or not fc.replace("_", "").isalnum()):
            return False
        return len(bits) == n and not set(bits) - {"0", "1"} and bits[0] == "1"

    def s_ok(e: dict) -> bool:  # start masks and polish moves have no s; GP proposals one of the search's dimension
        if e.get("kind") == START:
            return e["s"] is None and isinstance(e.get("method"), str)
        if e.get("kind") == POLISH:
            return e["s"] is None and mask_ok(e.get("parent"))
        return isinstance(e["s"], list) and len(e["s"]) == dim and all(number(v) for v in e["s"])

    def s_or_none(s) -> bool:
        return s is None or (isinstance(s, list) and len(s) == dim and all(number(v) for v in s))

    def losses_ok(r) -> bool:
        return isinstance(r, dict) and number(r.get("loss")) and (
            r.get("per_seed") is None or (isinstance(r["per_seed"], list) and all(number(v) for v in r["per_seed"])))

    def how_ok(m: dict) -> bool:  # version 5: how a candidate was measured
        return (m.get("kind") in MEASURED_BY and s_or_none(m.get("s")) and isinstance(m.get("method"), str)
                and (mask_ok(m.get("of")) if m["kind"] == CHECK else "of" not in m))

    if not isinstance(state["history"], list) or not isinstance(state["masks"], dict):
        raise ValueError("bad history or masks")
    for j, h in enumerate(state["history"]):
        if not (isinstance(h, dict) and h.get("i") == j and h.get("kind") in KINDS and s_ok(h) and mask_ok(h["mask"])
                and number(h["loss"])):
            raise ValueError(f"bad history entry {j}")
    for key, m in state["masks"].items():
        if not (mask_ok(key) and isinstance(m, dict) and number(m["loss"]) and (version < 5 or how_ok(m))):
            raise ValueError("bad mask entry")
    pending = state["pending"]
    if not isinstance(pending, list):
        raise ValueError("bad pending list")
    for j, p in enumerate(pending):
        if not (isinstance(p, dict) and p.get("kind") in KINDS and s_ok(p) and mask_ok(p["mask"])):
            raise ValueError(f"bad pending entry {j}")
    pol = state["polish"]
    if not (isinstance(pol, dict) and (pol["incumbent"] is None or mask_ok(pol["incumbent"]))
            and isinstance(pol["roots"], list) and all(mask_ok(r) for r in pol["roots"])
            and (pol["guard"] is None or pol["guard"] in SAVED_GUARDS)):
        raise ValueError("bad polish entry")
    if not (isinstance(state["starts"], list) and all(isinstance(v, str) for v in state["starts"])):
        raise ValueError("bad start mask names")
    theta = state["gp"]["theta"]
    if theta is not None and not (isinstance(theta, list) and len(theta) == dim + 2 and all(number(v) for v in theta)):
        raise ValueError("bad GP hyperparameters")
    if not isinstance(state["done"], bool) or (state["done"] and not (
            isinstance(state["final"], dict) and mask_ok(state["final"].get("mask"))
            and number(state["final"].get("loss")))):
        raise ValueError("bad final entry")
    if not isinstance(state["fingerprint"], str):
        raise ValueError("bad search id ('fingerprint')")
    fresh = state["fresh"] if version >= 5 else state.get("fresh", {"masks": {}})  # the final choice on fresh seeds
    if not (isinstance(fresh, dict) and isinstance(fresh.get("masks"), dict)
            and all(mask_ok(k) and losses_ok(r) for k, r in fresh["masks"].items())
            and (version < 5 or isinstance(fresh.get("chooses"), bool))):
        raise ValueError("bad fresh-seed entry")
    if version >= 5:
        if not (isinstance(state["choices"], list) and all(isinstance(v, str) for v in state["choices"])):
            raise ValueError("bad end-game forecasters ('choices')")
        if not (isinstance(state["kept"], list) and all(k in state["masks"] for k in state["kept"])):
            raise ValueError("bad kept candidates")
        return
    checked = state.get("forecasters")  # versions 3 and 4: the forecaster check's record; absent before it ran
    if checked is not None and not (isinstance(checked, dict) and mask_ok(checked.get("mask"))
                                    and isinstance(checked.get("results"), dict)
                                    and all(isinstance(k, str) and losses_ok(r)
                                            for k, r in checked["results"].items())):
        raise ValueError("bad forecaster check entry")


def _config_differences(state: dict, config: SearchConfig, provenance: dict) -> list[str]:
    """What differs, in words, between a state file's search and this one in config and provenance (the profile
    aside). Forecasters compare by name: a state file may hold an order (0/1/2), the config a name."""
    old_cfg, new_cfg = identity_of(state.get("config") or {}), config.identity()
    for cfg in (old_cfg, new_cfg):
        if "forecast" in cfg:
            cfg["forecast"] = _forecaster_name(cfg["forecast"])
    diffs = [f"{k}: file {old_cfg.get(k)!r}, now {v!r}" for k, v in new_cfg.items() if old_cfg.get(k) != v]
    old_prov = state.get("provenance") or {}
    if old_prov != provenance:
        keys = sorted(k for k in set(old_prov) | set(provenance) if old_prov.get(k) != provenance.get(k))
        diffs.append("provenance differs in " + ", ".join(keys)
                     + (" (another ComfyUI workflow)" if "workflow_sha256" in keys else ""))
    return diffs


def _forecaster_name(value: Any) -> Any:
    try:
        return forecasters.canonical(value)
    except (GCacheError, TypeError, ValueError):
        return value  # not a forecaster: shown as the file has it


def _differences(state: dict, config: SearchConfig, prof_id: dict, provenance: dict, starts: list) -> str:
    """What differs between a state file's search and this one, in words."""
    diffs = _config_differences(state, config, provenance)
    old_prof = state.get("profile") or {}
    if old_prof.get("n_steps") != prof_id["n_steps"]:
        diffs.append(f"profile steps N: file {old_prof.get('n_steps')}, now {prof_id['n_steps']}")
    elif old_prof.get("sha256") != prof_id["sha256"]:
        diffs.append(f"profile: file {old_prof.get('sha256')}, now {prof_id['sha256']} (another profile of the same N)")
    if state.get("starts") != starts:
        diffs.append(f"start masks: file {state.get('starts')}, now {starts}")
    return "; ".join(diffs) or "its search id differs"


def _another_search(path: str, differences: str) -> GCacheError:
    return GCacheError(f"{os.path.basename(path)} belongs to another search ({differences}). It was left untouched: "
                       "use another state file name, or delete it to start over.")


def check_state(path: Optional[str], config: SearchConfig, provenance: dict) -> Optional[dict]:
    """The state file at `path` read and checked before any sampling (None when there is none): a damaged one, or
    one whose config or provenance differs from this search's, is refused as SearchState.open would refuse it
    later. The profile can't be compared yet (it may come from the reference runs): open() does that."""
    if not (path and os.path.exists(path)):
        return None
    data = load_state(path)
    diffs = _config_differences(data, config, json.loads(json.dumps(dict(provenance or {}), default=str)))
    if diffs:
        raise _another_search(path, "; ".join(diffs))
    return data


def made_before_choices(forecast: Any) -> list[str]:
    """The forecasters the end game of a search made before they were recorded chose among: for a profile-fitted
    forecaster, its own and the other profile-fitted ones; for a fixed rule none."""
    def fitted(name: str) -> bool:
        fc = forecasters.get(name)
        return bool(fc.forecasts and fc.needs_profile)
    own = forecasters.canonical(forecast)
    return [own] + [n for n in forecasters.names() if n != own and fitted(n)] if fitted(own) else []


def migrated(data: dict) -> dict:
    """A checked state file's content in the current format (version 5), migrated once when it is read (a copy; a file
    of version 5 is returned as it is):
    - each measured candidate says how it was measured (kind, s, method; a check's "of"): from the history entry that
      measured it, the final entry, or the forecaster check's record; a candidate none of them names is an earlier
      budget's argmin-μ mask (a search continued with a larger budget dropped its entry: its s is lost);
    - the forecaster check is kept once, among the measured candidates: version 3 kept its results beside them (they
      join them under their keys), versions 3 and 4 a record of the checked candidate (dropped);
    - "fresh" is always present: a file made before the final choice on fresh seeds gets {"chooses": false} and
      resumes without it, as it was searched;
    - "choices": the forecasters its end game chose among (made_before_choices); "kept": none."""
    if data.get("version") == STATE_VERSION:
        return data
    data = json.loads(json.dumps(data))
    masks, history, final = data["masks"], data["history"], data.get("final")
    checked = data.pop("forecasters", None)
    finals = {f["mask"]: f for f in data.pop("finals", [])}  # an unreleased version 4 kept earlier ends here
    if checked and data["version"] == 3:
        for name, r in checked["results"].items():
            masks.setdefault(key_of(checked["mask"], name), {
                "loss": r["loss"], "seconds": 0.0, "first": len(history),
                **({"per_seed": r["per_seed"]} if r.get("per_seed") is not None else {})})
    entries = {}
    for e in history:
        entries.setdefault(e["mask"], {"kind": e["kind"], "s": e["s"], "method": method_of(e)})
    if final is not None:
        entries.setdefault(final["mask"], {"kind": FINAL, "s": final["s"], "method": method_of({})})
    for key, f in finals.items():
        entries.setdefault(key, {"kind": FINAL, "s": f.get("s"), "method": method_of({})})
    checked_bits = split_key(checked["mask"])[0] if checked else None
    for key, m in masks.items():
        how = entries.get(key)
        if how is None and checked and split_key(key)[0] == checked_bits and checked["mask"] in entries:
            origin = entries[checked["mask"]]
            how = {"kind": CHECK, "s": origin["s"], "method": origin["method"], "of": checked["mask"]}
        m.update(how or {"kind": FINAL, "s": None, "method": method_of({})})
    data["fresh"] = {"chooses": "fresh" in data, "masks": data.get("fresh", {}).get("masks", {})}
    data["choices"] = made_before_choices(data["config"].get("forecast"))
    data["kept"] = []
    data["version"] = STATE_VERSION
    return data
