"""The search's state file: every evaluation so far, enough to resume after a crash or an interrupt.

One JSON object, written atomically after every change (format "gcache.search_state", version 4; a file of
version 3 is read and resumed as the search it was, and stays version 3):

A measured candidate is a mask applied with a forecaster: its key is the mask ("1001…") when the forecaster is the
search's own, else the mask and the forecaster's name ("1001…@l2p", `key_of`). A search with a profile-fitted
forecaster measures the instant masks of every profile-fitted forecaster under that forecaster (starts.py), and its
forecaster check measures its best masks under the others (forecaster_check.py), so a history entry's "mask" and the
keys of "masks" are such keys (version 4).

    fingerprint  the search id: a hash of the config's identity (config.identity_of: less the budget and the polish
                 guard), the profile, the provenance and the names of the start masks (what the search proposes
                 depends on all of them)
    config, profile, provenance, starts    what the id was made of (to say in words what differs)
    history      one entry per proposal, in the order its result came back: i, kind (instant | grid | gp | polish),
                 s, mask, loss, reused, seconds, bound, kappa, gp_seconds (+ method for start masks; parent and
                 accepted for polish moves)
    masks        each distinct mask's loss (and per-seed losses): a mask is evaluated once
    gp           {"theta": the last fit's log-hyperparameters}, the next fit's warm start
    polish       the polish stage's climb: incumbent, roots, guard (polish.py; the guard's name: paired.SAVED_GUARDS)
    final, done  the argmin-μ mask measured at the end
    pending      proposals dispatched and not back yet; a resumed search dispatches them again
    forecasters  the forecaster check (forecaster_check.py): the mask it ran on and each forecaster's loss on it;
                 absent until it ran (version 4: the check of the key the search returns; what the check measured is
                 in "masks" under its keys)

Code outside this module reads and writes the file's content only through SearchState's accessors.

A state file of another search, a newer or older format, or a damaged file is refused and left untouched.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict
from typing import Any, Optional

import numpy as np

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.files import atomic_write_text
from ..core.profile import Profile
from .config import SearchConfig, identity_of
from .paired import SAVED_GUARDS

STATE_FORMAT = "gcache.search_state"
STATE_VERSION = 4  # 4: candidates are (mask, forecaster) keys; 3: start masks of several error models, polish moves
READS = (3, 4)     # 3 is resumed as it was written (its own start masks, the check on its chosen mask); older: refused
# What a history entry's "kind" is: the phase that proposed it (loop.py). Start masks keep their first name, "instant".
START, GRID, GP, POLISH = KINDS = ("instant", "grid", "gp", "polish")
FINAL = "final"  # the argmin-μ entry measured at the end (state.final), as best() and the progress reports name it


def key_of(mask, forecast: Optional[str] = None) -> str:
    """The key of a mask ("1001…", or a sequence of 0/1) applied with `forecast` (None: the search's own forecaster)."""
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
                          f"{' and '.join(map(str, READS))}. Delete it to search again, or use the GCache version "
                          "that wrote it.")
    try:
        _check(state)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise GCacheError(f"{name} is damaged ({e!r}). It was left untouched: delete it to start the search over.") from None
    return state


def _check(state: dict) -> None:
    """Raises on anything a hand edit or a bug could leave that the search would trip over later."""
    dim = int(state["config"]["degree"]) + 1
    n = int(state["profile"]["n_steps"])

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    def mask_ok(m) -> bool:  # a candidate key: the mask, and from version 4 "@" and a forecaster's name
        if not isinstance(m, str):
            return False
        bits, fc = split_key(m)
        if fc is not None and (state["version"] < 4 or not fc.replace("_", "").isalnum()):
            return False
        return len(bits) == n and not set(bits) - {"0", "1"} and bits[0] == "1"

    def s_ok(e: dict) -> bool:  # start masks and polish moves have no s; GP proposals one of the search's dimension
        if e.get("kind") == START:
            return e["s"] is None and isinstance(e.get("method"), str)
        if e.get("kind") == POLISH:
            return e["s"] is None and mask_ok(e.get("parent"))
        return isinstance(e["s"], list) and len(e["s"]) == dim and all(number(v) for v in e["s"])

    if not isinstance(state["history"], list) or not isinstance(state["masks"], dict):
        raise ValueError("bad history or masks")
    for j, h in enumerate(state["history"]):
        if not (isinstance(h, dict) and h.get("i") == j and h.get("kind") in KINDS and s_ok(h) and mask_ok(h["mask"])
                and number(h["loss"])):
            raise ValueError(f"bad history entry {j}")
    for key, m in state["masks"].items():
        if not (mask_ok(key) and isinstance(m, dict) and number(m["loss"])):
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
    checked = state.get("forecasters")  # the forecaster check (forecaster_check.py); absent before it ran
    if checked is not None and not (isinstance(checked, dict) and mask_ok(checked.get("mask"))
                                    and isinstance(checked.get("results"), dict)
                                    and all(isinstance(k, str) and isinstance(r, dict) and number(r.get("loss"))
                                            for k, r in checked["results"].items())):
        raise ValueError("bad forecaster check entry")
    fresh = state.get("fresh")  # the final choice on fresh seeds (fresh_choice.py); absent in files made before it
    if fresh is not None and not (isinstance(fresh, dict) and isinstance(fresh.get("masks"), dict)
                                  and all(mask_ok(k) and isinstance(r, dict) and number(r.get("loss"))
                                          for k, r in fresh["masks"].items())):
        raise ValueError("bad fresh-seed entry")
    if not isinstance(state["fingerprint"], str):
        raise ValueError("bad search id ('fingerprint')")


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


def loss_of(raw: Any) -> tuple[float, Optional[list]]:
    """(mean loss, per-seed losses or None) of what an evaluation returned; NaN where it is no number."""
    try:
        if isinstance(raw, (list, tuple, np.ndarray)):  # one loss per seed: kept for paired comparisons
            per_seed = [float(v) for v in raw]
            ok = per_seed and all(map(math.isfinite, per_seed))
            return (float(np.mean(per_seed)) if ok else float("nan")), per_seed
        return float(raw), None
    except (TypeError, ValueError):
        return float("nan"), None


class PolishClimb:
    """The polish stage's climb as the state file keeps it ("polish"): the mask being climbed from (incumbent), the
    masks climbs started from (roots), and the guard the search polishes with (paired.SAVED_GUARDS: None until the
    first move)."""

    def __init__(self, data: dict):
        self._data = data

    @property
    def incumbent(self) -> Optional[str]:
        return self._data["incumbent"]

    @incumbent.setter
    def incumbent(self, key: Optional[str]) -> None:
        self._data["incumbent"] = key

    @property
    def roots(self) -> list:
        return self._data["roots"]

    @property
    def guard(self) -> Optional[str]:
        return self._data["guard"]

    @guard.setter
    def guard(self, name: str) -> None:
        self._data["guard"] = name

    def as_dict(self) -> dict:
        return dict(self._data, roots=list(self.roots))


class SearchState:
    """The state of one search and its file (`path`; None keeps it in memory): every read and write of the state
    file's content goes through here."""

    def __init__(self, data: dict, path: Optional[str]):
        self._data, self.path = data, path

    @classmethod
    def open(cls, path: Optional[str], config: SearchConfig, profile: Profile, provenance: dict,
             starts: list, own_starts: Optional[list] = None) -> "SearchState":
        """The state in `path` when it belongs to this search (a larger budget continues it), else a new one.
        `starts`: the names of the start masks; `own_starts`: those of the search's own forecaster only (what a
        search of version 3 had: such a file is resumed with them, `starts_names` says which). A state file of
        another search is refused and left untouched."""
        prof_id = profile_identity(profile)
        sid = search_id(config, prof_id, provenance, starts)
        if path and os.path.exists(path) and own_starts is not None and own_starts != starts:
            data = load_state(path)
            if data["version"] == 3 and data["fingerprint"] == search_id(config, prof_id, provenance, own_starts):
                sid = data["fingerprint"]  # a search made before version 4: resumed with its own start masks
        if not (path and os.path.exists(path)):
            return cls({"format": STATE_FORMAT, "version": STATE_VERSION, "fingerprint": sid, "config": asdict(config),
                        "profile": prof_id, "provenance": provenance, "starts": list(starts), "history": [],
                        "masks": {}, "gp": {"theta": None}, "polish": {"incumbent": None, "roots": [], "guard": None},
                        "final": None, "done": False, "pending": [], "fresh": {"masks": {}}}, path)
        data = load_state(path)
        if data["fingerprint"] != sid:  # the search id
            raise _another_search(path, _differences(data, config, prof_id, provenance, starts))
        data["config"]["budget"] = config.budget
        if len(data["history"]) < config.budget:
            data["done"], data["final"] = False, None  # a larger budget continues the search
        return cls(data, path)

    @classmethod
    def peek(cls, path: str) -> Optional["SearchState"]:
        """The state file at `path` as it is, read-only (None when there is none or it can't be read: the search
        itself says why when it runs)."""
        try:
            return cls(load_state(path), None) if os.path.isfile(path) else None
        except GCacheError:
            return None

    # ------------------------------------------------------------------------------------------ reading
    @property
    def history(self) -> list:
        """One entry per proposal, in the order results came back (module docstring)."""
        return self._data["history"]

    @property
    def masks(self) -> dict:
        """mask key -> {"loss", "seconds", "first", "per_seed"?}: each distinct mask's measurement."""
        return self._data["masks"]

    @property
    def pending(self) -> list:
        return self._data["pending"]

    @property
    def final(self) -> Optional[dict]:
        """The argmin-μ mask measured at the end (None before)."""
        return self._data.get("final")

    @property
    def polish(self) -> PolishClimb:
        return PolishClimb(self._data["polish"])

    @property
    def checked(self) -> Optional[dict]:
        """The forecaster check (forecaster_check.py): {"mask", "results": name -> {"loss", "per_seed"?}}, or None
        before it ran."""
        return self._data.get("forecasters")

    @property
    def config(self) -> dict:
        """The config the file was written with (SearchConfig as a dict)."""
        return self._data.get("config") or {}

    @property
    def seed(self) -> int:
        """The search seed (SearchConfig.seed): the GP's candidates, the polish's move order, the halves' split."""
        return int(self.config.get("seed", 0))

    @property
    def provenance(self) -> dict:
        return dict(self._data.get("provenance") or {})

    @property
    def profile_id(self) -> dict:
        return self._data.get("profile")

    @property
    def search_id(self) -> str:
        return self._data["fingerprint"]  # the file's name for it (format version 2)

    @property
    def done(self) -> bool:
        return self._data["done"]

    @property
    def version(self) -> int:
        """The file's format version: 3 for a search made before candidates had a forecaster (resumed as it was)."""
        return int(self._data["version"])

    @property
    def starts_names(self) -> list:
        """The names of the start masks this search measures."""
        return list(self._data["starts"])

    @property
    def theta(self) -> Optional[list]:
        return self._data["gp"]["theta"]

    @theta.setter
    def theta(self, value: Optional[list]) -> None:
        self._data["gp"]["theta"] = value

    def best(self, upto: Optional[int] = None, kinds: Optional[tuple] = None, with_final: bool = False
             ) -> Optional[dict]:
        """The best history entry: the lowest loss, ties to the earliest (a start mask is kept over a later entry that
        equals it). `upto`: among the first entries only; `kinds`: of these kinds only; `with_final`: the argmin-μ
        entry measured at the end competes too (after every entry on a tie). None when there is none."""
        hist = self.history[:upto] if upto is not None else self.history
        pool = [h for h in hist if kinds is None or h["kind"] in kinds]
        fin = self.final
        if with_final and fin is not None and (kinds is None or FINAL in kinds):
            pool.append(fin)
        return min(pool, key=lambda h: (h["loss"], h.get("i", math.inf)), default=None)

    def proposed(self) -> int:
        """Proposals made so far: the finished ones and those still out."""
        return len(self.history) + len(self.pending)

    def is_pending(self, key: str) -> bool:
        return any(p["mask"] == key for p in self.pending)

    # ------------------------------------------------------------------------------------------ writing
    def measure(self, key: str, raw: Any, seconds: float, first: int) -> None:
        """Keep what evaluate() returned for mask `key` (the loss, and the per-seed losses for paired comparisons);
        `first` is the history index that measured it. A loss that is no finite number stops the search."""
        loss, per_seed = loss_of(raw)
        if not math.isfinite(loss):
            raise GCacheError(f"The evaluation of mask {key} returned {raw!r:.120}, not a finite loss (the run diverged or "
                              f"the objective failed). The state file keeps the {len(self.history)} evaluations "
                              "before it; fix the evaluation and run the search again to resume.")
        self.masks[key] = {"loss": loss, "seconds": round(seconds, 4), "first": first}
        if per_seed is not None:
            self.masks[key]["per_seed"] = per_seed

    def dispatch(self, proposal: dict) -> None:
        """A proposal goes out: pending until its result comes back."""
        self.pending.append(proposal)

    def returned(self, proposal: dict) -> list:
        """The proposal's result is back: it and every other pending proposal of the same mask (proposed while it was
        out) leave the pending list; returns those others."""
        others = [o for o in self.pending if o["mask"] == proposal["mask"] and o is not proposal]
        self.pending[:] = [o for o in self.pending if o["mask"] != proposal["mask"]]
        return others

    def record(self, proposal: dict, seconds: float, reused: bool) -> dict:
        """Append the history entry of a proposal whose mask is measured; returns the entry."""
        entry = {"i": len(self.history), "kind": proposal["kind"], "s": proposal["s"], "mask": proposal["mask"],
                 "loss": self.masks[proposal["mask"]]["loss"], "reused": reused, "seconds": round(seconds, 4),
                 "bound": proposal.get("bound"), "kappa": proposal.get("kappa"), "gp_seconds": proposal.get("gp_seconds")}
        for key in ("method", "parent"):
            if proposal.get(key):
                entry[key] = proposal[key]
        self.history.append(entry)
        return entry

    @property
    def fresh(self) -> Optional[dict]:
        """The candidates measured on the fresh seeds (key -> {"loss", "per_seed"?}); None in a file made before the
        final choice on fresh seeds (its search resumes without it)."""
        fresh = self._data.get("fresh")
        return None if fresh is None else fresh["masks"]

    def check_results(self, key: str) -> dict:
        """The forecaster check's results on mask `key` (name -> {"loss", "per_seed"?}), to be filled: a check of
        another mask is dropped."""
        checked = self.checked
        if not checked or checked.get("mask") != key:
            checked = self._data["forecasters"] = {"mask": key, "results": {}}
        return checked["results"]

    def finish(self, final: dict) -> None:
        self._data["final"], self._data["done"] = final, True
        self.save()

    def save(self) -> None:
        if self.path:
            atomic_write_text(self.path, json.dumps(self._data, indent=1, allow_nan=False))
