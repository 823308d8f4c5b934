"""The search's state file: every evaluation so far, enough to resume after a crash or an interrupt.

One JSON object, written atomically after every change (format "gcache.search_state", version 4). A file of version
3 is migrated once, when it is read (`migrated`), and written back as version 4 when the search changes it: nothing
after the read tells the versions apart.

A measured candidate is a mask applied with a forecaster: its key is the mask ("1001…") when the forecaster is the
search's own, else the mask and the forecaster's name ("1001…@l2p", `key_of`). A search with a profile-fitted
forecaster measures the instant masks of every profile-fitted forecaster under that forecaster (starts.py), and its
forecaster check measures its chosen mask under the others (end_game.py), so a history entry's "mask" and the keys of
"masks" are such keys.

    fingerprint  the search id: a hash of the config's identity (config.identity_of: less the budget and the polish
                 guard), the profile, the provenance and the names of the start masks (what the search proposes
                 depends on all of them)
    config, profile, provenance, starts    what the id was made of (to say in words what differs)
    history      one entry per proposal, in the order its result came back: i, kind (instant | grid | gp | polish),
                 s, mask, loss, reused, seconds, bound, kappa, gp_seconds (+ method for start masks; parent and
                 accepted for polish moves)
    masks        each distinct candidate's loss (and per-seed losses): a candidate is evaluated once
    gp           {"theta": the last fit's log-hyperparameters}, the next fit's warm start
    polish       the polish stage's climb: incumbent, roots, guard (polish.py; the guard's name: paired.SAVED_GUARDS)
    final, done  the argmin-μ mask measured at the end
    finals       the argmin-μ entries of earlier ends, when a larger budget continued a finished search: candidates
                 still (choice.py); absent until then
    pending      proposals dispatched and not back yet; a resumed search dispatches them again
    forecasters  the forecaster check (end_game.py): the candidate it checked and each other forecaster's loss on its
                 mask (also in "masks" under their keys); absent until it ran
    choices      the forecasters the end game chooses among, the search's own first (end_game.chooses_among): kept
                 from the search's start; absent in a file made before (it chose among the profile-fitted ones)
    fresh        the final choice on fresh seeds (end_game.py): {"masks": key -> its loss on the fresh seeds}; absent
                 in a file made before that choice (its search resumes without it)

Code outside this module reads the file's content only through SearchState's accessors, which hand out read-only
copies (`frozen`), and changes it only through SearchState's methods.

A state file of another search, a newer or older format, or a damaged file is refused and left untouched.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.files import atomic_write_text
from ..core.profile import Profile
from .config import SearchConfig, identity_of
from .paired import SAVED_GUARDS

STATE_FORMAT = "gcache.search_state"
STATE_VERSION = 4  # 4: candidates are (mask, forecaster) keys; 3: start masks of several error models, polish moves
READS = (3, 4)     # 3 is migrated when read (migrated); older: refused
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
    finals = state.get("finals", [])  # earlier finishes' argmin-μ entries (a larger budget continued the search)
    if not (isinstance(finals, list) and all(isinstance(f, dict) and mask_ok(f.get("mask")) and number(f.get("loss"))
                                             for f in finals)):
        raise ValueError("bad earlier final entries")
    checked = state.get("forecasters")  # the forecaster check (end_game.py); absent before it ran
    if checked is not None and not (isinstance(checked, dict) and mask_ok(checked.get("mask"))
                                    and isinstance(checked.get("results"), dict)
                                    and all(isinstance(k, str) and isinstance(r, dict) and number(r.get("loss"))
                                            for k, r in checked["results"].items())):
        raise ValueError("bad forecaster check entry")
    choices = state.get("choices", [])  # the forecasters the end game chooses among; absent in older files
    if not (isinstance(choices, list) and all(isinstance(n, str) for n in choices)):
        raise ValueError("bad end-game forecasters ('choices')")
    fresh = state.get("fresh")  # the final choice on fresh seeds (end_game.py); absent in files made before it
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


def _read_only(self, *args, **kwargs):
    raise TypeError("a search state's entries are read-only: SearchState's methods change them")


class ReadOnlyDict(dict):
    """A dict that can't be changed: what SearchState's accessors hand out (equal to a dict, JSON as a dict; its copy
    and pickle are plain dicts)."""
    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _read_only

    def copy(self) -> dict:
        return dict(self)

    def __reduce__(self):
        return dict, (dict(self),)


class ReadOnlyList(list):
    """A list that can't be changed (ReadOnlyDict's companion)."""
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = pop = remove = clear = sort = \
        reverse = _read_only

    def copy(self) -> list:
        return list(self)

    def __reduce__(self):
        return list, (list(self),)


def frozen(value: Any) -> Any:
    """A read-only copy of a JSON value (ReadOnlyDict, ReadOnlyList): what the accessors hand out."""
    if isinstance(value, dict):
        return ReadOnlyDict({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return ReadOnlyList(frozen(v) for v in value)
    return value


def migrated(data: dict) -> dict:
    """A checked state file's content in the current format (version 4), migrated once when it is read: a version-3
    file kept the forecaster check's results beside its masks; version 4 keeps them among the measured candidates,
    under their keys (key_of), as a check measures them now. A file of version 3 has no "fresh" entry: it resumes
    without the final choice on fresh seeds, as any file made before that choice."""
    if data.get("version") != 3:
        return data
    data = json.loads(json.dumps(data))
    checked = data.get("forecasters")
    if checked:
        for name, r in checked["results"].items():
            data["masks"].setdefault(key_of(checked["mask"], name), {
                "loss": r["loss"], "seconds": 0.0, "first": len(data["history"]),
                **({"per_seed": r["per_seed"]} if r.get("per_seed") is not None else {})})
    data["version"] = STATE_VERSION
    return data


@dataclass(frozen=True)
class PolishClimb:
    """The polish stage's climb as the state file keeps it ("polish"): the mask being climbed from (incumbent), the
    masks climbs started from (roots), and the guard the search polishes with (paired.SAVED_GUARDS: None until the
    first move). A copy: SearchState's climb methods change it."""
    incumbent: Optional[str]
    roots: tuple
    guard: Optional[str]

    def as_dict(self) -> dict:
        return {"incumbent": self.incumbent, "roots": list(self.roots), "guard": self.guard}


class SearchState:
    """The state of one search and its file (`path`; None keeps it in memory): every read and write of the state
    file's content goes through here. The accessors hand out read-only copies (`frozen`: mappings that can't be
    changed), every change is a method below, and the file is written by `save`."""

    def __init__(self, data: dict, path: Optional[str]):
        self._data, self.path = data, path
        self._views: dict = {}  # read-only copies handed out since the last change

    @classmethod
    def open(cls, path: Optional[str], config: SearchConfig, profile: Profile, provenance: dict,
             starts: list, own_starts: Optional[list] = None, choices: Sequence[str] = ()) -> "SearchState":
        """The state in `path` when it belongs to this search (a larger budget continues it), else a new one.
        `starts`: the names of the start masks; `own_starts`: those of the search's own forecaster only. A file made
        with its own forecaster's start masks only (one of version 3, made before searches measured the others, or
        one whose evaluation could not apply another forecaster) resumes with them: `starts_names` says which. A
        state file of another search is refused and left untouched. `choices`: the forecasters the end game of a new
        search chooses among (end_game.chooses_among); a file keeps those it was made with."""
        prof_id = profile_identity(profile)
        sid = search_id(config, prof_id, provenance, starts)
        if not (path and os.path.exists(path)):
            return cls({"format": STATE_FORMAT, "version": STATE_VERSION, "fingerprint": sid, "config": asdict(config),
                        "profile": prof_id, "provenance": provenance, "starts": list(starts), "history": [],
                        "masks": {}, "gp": {"theta": None}, "polish": {"incumbent": None, "roots": [], "guard": None},
                        "final": None, "done": False, "pending": [], "fresh": {"masks": {}},
                        "choices": list(choices)}, path)
        data = migrated(load_state(path))
        if data["fingerprint"] != sid and not (own_starts is not None and data["starts"] == list(own_starts) and
                                               data["fingerprint"] == search_id(config, prof_id, provenance,
                                                                                own_starts)):
            raise _another_search(path, _differences(data, config, prof_id, provenance, starts))
        data["config"]["budget"] = config.budget
        if len(data["history"]) < config.budget:  # a larger budget continues the search
            if data["final"] is not None:  # its argmin-μ mask stays a candidate (choice.py), as measured
                data["finals"] = data.get("finals", []) + [data["final"]]
            data["done"], data["final"] = False, None
        return cls(data, path)

    @classmethod
    def peek(cls, path: str) -> Optional["SearchState"]:
        """The state file at `path` as it is, read-only (None when there is none or it can't be read: the search
        itself says why when it runs)."""
        try:
            return cls(migrated(load_state(path)), None) if os.path.isfile(path) else None
        except GCacheError:
            return None

    # ------------------------------------------------------------------------------------------ reading
    def _view(self, name: str, make) -> Any:
        if name not in self._views:
            self._views[name] = frozen(make())
        return self._views[name]

    @property
    def history(self) -> list:
        """One entry per proposal, in the order results came back (module docstring)."""
        return self._view("history", lambda: self._data["history"])

    @property
    def masks(self) -> Mapping:
        """mask key -> {"loss", "seconds", "first", "per_seed"?}: each distinct candidate's measurement."""
        return self._view("masks", lambda: self._data["masks"])

    @property
    def pending(self) -> list:
        return self._view("pending", lambda: self._data["pending"])

    @property
    def final(self) -> Optional[Mapping]:
        """The argmin-μ mask measured at the end (None before)."""
        return self._view("final", lambda: self._data.get("final"))

    @property
    def finals(self) -> list:
        """The argmin-μ entries of earlier finishes, oldest first: a finished search continued with a larger budget
        keeps each as a candidate (state.final is the last finish's)."""
        return self._view("finals", lambda: self._data.get("finals", []))

    @property
    def polish(self) -> PolishClimb:
        pol = self._data["polish"]
        return PolishClimb(pol["incumbent"], tuple(pol["roots"]), pol["guard"])

    @property
    def checked(self) -> Optional[Mapping]:
        """The forecaster check (end_game.py): {"mask" (the candidate checked), "results": forecaster -> {"loss",
        "per_seed"?}}, or None before it ran."""
        return self._view("checked", lambda: self._data.get("forecasters"))

    @property
    def choices(self) -> Optional[list]:
        """The forecasters the end game chooses among, the search's own first (end_game.chooses_among); None in a file
        made before they were recorded (end_game.among: its search chose among the profile-fitted ones)."""
        return self._view("choices", lambda: self._data.get("choices"))

    @property
    def fresh(self) -> Optional[Mapping]:
        """The candidates measured on the fresh seeds (key -> {"loss", "per_seed"?}); None in a file made before the
        final choice on fresh seeds (its search resumes without it)."""
        return self._view("fresh", lambda: None if self._data.get("fresh") is None else self._data["fresh"]["masks"])

    @property
    def config(self) -> Mapping:
        """The config the file was written with (SearchConfig as a dict)."""
        return self._view("config", lambda: self._data.get("config") or {})

    @property
    def seed(self) -> int:
        """The search seed (SearchConfig.seed): the GP's candidates, the polish's move order, the halves' split."""
        return int(self.config.get("seed", 0))

    @property
    def provenance(self) -> Mapping:
        """What the search's caller said of it (the policy's provenance starts from it)."""
        return self._view("provenance", lambda: self._data.get("provenance") or {})

    @property
    def profile_id(self) -> Optional[Mapping]:
        """The profile's identity (profile_identity)."""
        return self._view("profile", lambda: self._data.get("profile"))

    @property
    def search_id(self) -> str:
        return self._data["fingerprint"]  # the file's name for it (format version 2)

    @property
    def done(self) -> bool:
        return self._data["done"]

    @property
    def starts_names(self) -> list:
        """The names of the start masks this search measures."""
        return self._view("starts", lambda: self._data["starts"])

    @property
    def theta(self) -> Optional[list]:
        """The GP's last log-hyperparameters (its next fit's warm start)."""
        return self._view("theta", lambda: self._data["gp"]["theta"])

    def best(self, upto: Optional[int] = None, kinds: Optional[tuple] = None, with_final: bool = False
             ) -> Optional[Mapping]:
        """The best history entry: the lowest loss, ties to the earliest (a start mask is kept over a later entry that
        equals it). `upto`: among the first entries only; `kinds`: of these kinds only; `with_final`: the argmin-μ
        entries measured at the ends compete too (after every entry on a tie). None when there is none."""
        hist = self.history[:upto] if upto is not None else self.history
        pool = [h for h in hist if kinds is None or h["kind"] in kinds]
        if with_final and (kinds is None or FINAL in kinds):
            pool += self.all_finals()
        return min(pool, key=lambda h: (h["loss"], h.get("i", math.inf)), default=None)

    def all_finals(self) -> list:
        """Every argmin-μ entry measured so far: the earlier finishes' (finals), then the last one (final)."""
        return list(self.finals) + ([self.final] if self.final is not None else [])

    def proposed(self) -> int:
        """Proposals made so far: the finished ones and those still out."""
        return len(self._data["history"]) + len(self._data["pending"])

    def is_pending(self, key: str) -> bool:
        return any(p["mask"] == key for p in self._data["pending"])

    # ------------------------------------------------------------------------------------------ writing
    def _changed(self) -> None:
        self._views.clear()

    @theta.setter
    def theta(self, value) -> None:
        self._data["gp"]["theta"] = None if value is None else [float(v) for v in value]
        self._changed()

    def measure(self, key: str, raw: Any, seconds: float, first: int) -> None:
        """Keep what evaluate() returned for mask `key` (the loss, and the per-seed losses for paired comparisons);
        `first` is the history index that measured it. A loss that is no finite number stops the search."""
        loss, per_seed = loss_of(raw)
        if not math.isfinite(loss):
            raise GCacheError(f"The evaluation of mask {key} returned {raw!r:.120}, not a finite loss (the run diverged or "
                              f"the objective failed). The state file keeps the {len(self._data['history'])} "
                              "evaluations before it; fix the evaluation and run the search again to resume.")
        self._data["masks"][key] = {"loss": loss, "seconds": round(seconds, 4), "first": first,
                                    **({"per_seed": per_seed} if per_seed is not None else {})}
        self._changed()

    def dispatch(self, proposal: Mapping) -> None:
        """A proposal goes out: pending until its result comes back."""
        self._data["pending"].append(_plain(proposal))
        self._changed()

    def returned(self, key: str) -> list:
        """The result of candidate `key` is back: every pending proposal of it leaves the pending list; returns them,
        the one dispatched first (the one whose evaluation ran: a proposal of a candidate already out is not
        dispatched again) and then those proposed while it was out."""
        pending = self._data["pending"]
        back = [p for p in pending if p["mask"] == key]
        pending[:] = [p for p in pending if p["mask"] != key]
        self._changed()
        return frozen(back)

    def record(self, proposal: Mapping, seconds: float, reused: bool) -> Mapping:
        """Append the history entry of a proposal whose mask is measured; returns the entry."""
        hist = self._data["history"]
        entry = {"i": len(hist), "kind": proposal["kind"], "s": _plain(proposal["s"]), "mask": proposal["mask"],
                 "loss": self._data["masks"][proposal["mask"]]["loss"], "reused": reused, "seconds": round(seconds, 4),
                 "bound": proposal.get("bound"), "kappa": proposal.get("kappa"), "gp_seconds": proposal.get("gp_seconds")}
        for key in ("method", "parent"):
            if proposal.get(key):
                entry[key] = proposal[key]
        hist.append(entry)
        self._changed()
        return frozen(entry)

    # the polish stage's climb (polish.py)
    def start_climb(self, root: str, guard: str) -> None:
        """A climb starts from `root`; `guard`: the polish guard's name, kept when the search has one already."""
        pol = self._data["polish"]
        pol["roots"].append(root)
        pol["incumbent"] = root
        if pol["guard"] is None:
            pol["guard"] = guard
        self._changed()

    def judge_move(self, i: int, accepted: bool) -> None:
        """History entry i, a polish move, was accepted by the guard (it becomes the incumbent) or not."""
        entry = self._data["history"][i]
        entry["accepted"] = bool(accepted)
        if accepted:
            self._data["polish"]["incumbent"] = entry["mask"]
        self._changed()

    def end_climb(self) -> None:
        """The incumbent is a local optimum: the next climb starts from another root."""
        self._data["polish"]["incumbent"] = None
        self._changed()

    # the end game (end_game.py)
    def finish(self, final: Mapping) -> None:
        self._data["final"], self._data["done"] = _plain(final), True
        self._changed()
        self.save()

    def record_check(self, key: str, results: Mapping) -> bool:
        """The forecaster check of candidate `key`: forecaster -> {"loss", "per_seed"?} (what it measured of the
        candidate under the others). Returns whether the state changed."""
        record = {"mask": key, "results": {g: {k: _plain(r[k]) for k in ("loss", "per_seed") if k in r}
                                           for g, r in results.items()}}
        if self._data.get("forecasters") == record:
            return False
        self._data["forecasters"] = record
        self._changed()
        return True

    def measure_fresh(self, key: str, loss: float, per_seed: Optional[list]) -> None:
        """Candidate `key`'s loss on the fresh seeds (the final choice, end_game.py)."""
        self._data["fresh"]["masks"][key] = {"loss": float(loss),
                                             **({"per_seed": list(per_seed)} if per_seed is not None else {})}
        self._changed()

    def save(self) -> None:
        if self.path:
            atomic_write_text(self.path, json.dumps(self._data, indent=1, allow_nan=False))


def _plain(value: Any) -> Any:
    """A plain JSON copy of a value that may hold what the accessors hand out (read-only or not)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
