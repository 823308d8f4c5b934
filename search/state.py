"""The state of one search (SearchState): every evaluation so far, enough to resume after a crash or an interrupt,
read and changed only through its accessors and methods. Its file's format, reading, checking and migration are
state_file.py; a candidate's key (a mask with its forecaster) is keys.py. A measured candidate is a Measured record:
its key, its loss (and per-seed losses) and how it was measured, so whoever holds one needs nothing else.

Code outside this module reads the file's content only through SearchState's accessors, which hand out read-only
copies (`frozen`), and changes it only through SearchState's methods.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ..core.errors import GCacheError
from ..core.files import atomic_write_text
from ..core.profile import Profile
from .config import SearchConfig
from .keys import CHECK, FINAL, GP, GRID, KINDS, POLISH, START, forecaster_of, key_of, mask_of, method_of, split_key  # noqa: F401
from .state_file import (  # noqa: F401
    READS,
    STATE_FORMAT,
    STATE_VERSION,
    _another_search,
    _differences,
    check_state,
    load_state,
    migrated,
    profile_identity,
    search_id,
)


@dataclass(frozen=True)
class Measured:
    """One measured candidate (the state file's "masks" record): its key (keys.py: a mask with its forecaster), the
    mean loss over the search seeds, the per-seed losses (None: the evaluation gave one number), the history index
    when it was measured (`first`), and how: `kind` (a history entry's kind, FINAL for an end's argmin-μ mask, CHECK
    for the forecaster check's), `s` and `method` (what found the mask: the policy's provenance "s" and "won"; a
    check's are those of the candidate it checked, `of`)."""
    key: str
    loss: float
    per_seed: Optional[tuple]
    first: int
    kind: Optional[str]
    s: Optional[tuple]
    method: str
    of: Optional[str] = None

    @classmethod
    def of_record(cls, key: str, rec: Mapping) -> "Measured":
        s, per_seed = rec.get("s"), rec.get("per_seed")
        return cls(key, float(rec["loss"]), None if per_seed is None else tuple(per_seed), int(rec.get("first", 0)),
                   rec.get("kind"), None if s is None else tuple(s), rec.get("method") or method_of(rec),
                   rec.get("of"))

    @property
    def mask(self) -> list:
        return mask_of(self.key)

    @property
    def bits(self) -> str:
        return split_key(self.key)[0]

    def forecaster(self, own: str) -> str:
        """The forecaster it is applied with (`own`: the search's)."""
        return forecaster_of(self.key, own)

    def losses(self) -> dict:
        """{"loss", "per_seed"?}: what the paired rules compare (paired.py)."""
        return {"loss": self.loss, **({"per_seed": list(self.per_seed)} if self.per_seed is not None else {})}


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
        self.earlier: Optional[SearchState] = None  # open(): the finished search a larger budget continues, as it was

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
                        "final": None, "done": False, "pending": [], "choices": list(choices), "kept": [],
                        "fresh": {"chooses": True, "masks": {}}}, path)
        data = migrated(load_state(path))
        if data["fingerprint"] != sid and not (own_starts is not None and data["starts"] == list(own_starts) and
                                               data["fingerprint"] == search_id(config, prof_id, provenance,
                                                                                own_starts)):
            raise _another_search(path, _differences(data, config, prof_id, provenance, starts))
        data["config"]["budget"] = config.budget
        earlier = None
        if len(data["history"]) < config.budget:  # a larger budget continues the search: its argmin-μ mask stays
            if data["done"]:  # a candidate (a measured one of kind FINAL: all_finals), and so does its policy (keep)
                earlier = cls(json.loads(json.dumps(data)), None)
            data["done"], data["final"] = False, None
        state = cls(data, path)
        state.earlier = earlier
        return state

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
        """The argmin-μ masks of earlier ends, in the order measured, as final entries ({"mask", "loss", "s"}): a
        finished search continued with a larger budget keeps each as a candidate (state.final is the last end's)."""
        last = (self.final or {}).get("mask")
        return self._view("finals", lambda: [{"mask": m.key, "loss": m.loss, "s": None if m.s is None else list(m.s)}
                                             for m in self.all_measured() if m.kind == FINAL and m.key != last])

    @property
    def polish(self) -> PolishClimb:
        pol = self._data["polish"]
        return PolishClimb(pol["incumbent"], tuple(pol["roots"]), pol["guard"])

    @property
    def choices(self) -> list:
        """The forecasters the end game chooses among, the search's own first (end_game.chooses_among)."""
        return self._view("choices", lambda: self._data["choices"])

    @property
    def fresh(self) -> Mapping:
        """The candidates measured on the fresh seeds (key -> {"loss", "per_seed"?})."""
        return self._view("fresh", lambda: self._data["fresh"]["masks"])

    @property
    def chooses_on_fresh_seeds(self) -> bool:
        """Whether this search makes the final choice on fresh seeds (False: a file made before it, which resumes
        without it, as it was searched)."""
        return self._data["fresh"]["chooses"]

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
            pool += self.all_finals() + self.kept_entries()
        return min(pool, key=lambda h: (h["loss"], h.get("i", math.inf)), default=None)

    def all_finals(self) -> list:
        """Every argmin-μ entry measured so far: the earlier finishes' (finals), then the last one (final)."""
        return list(self.finals) + ([self.final] if self.final is not None else [])

    @property
    def kept(self) -> list:
        """The keys of the candidates earlier budgets' end games returned (their policies), in order: a finished
        search continued with a larger budget keeps each as a candidate (choice.py), so its policy is never worse on
        its own loss than the smaller budget's, unless the fresh seeds replace the pick (end_game.py)."""
        return self._view("kept", lambda: self._data.get("kept", []))

    def kept_entries(self) -> list:
        """The kept candidates as entries ({"mask", "loss", "s"}) the choice compares with the history's."""
        return self._view("kept_entries", lambda: [
            {"mask": m.key, "loss": m.loss, "s": None if m.s is None else list(m.s)}
            for m in map(self.measured, self.kept)])

    def proposed(self) -> int:
        """Proposals made so far: the finished ones and those still out."""
        return len(self._data["history"]) + len(self._data["pending"])

    def measured(self, key: str) -> Measured:
        """The measured candidate of `key` (KeyError: not measured)."""
        return Measured.of_record(key, self._data["masks"][key])

    def all_measured(self) -> list[Measured]:
        """Every measured candidate, in the order measured."""
        return [Measured.of_record(k, r) for k, r in self._data.get("masks", {}).items()]

    def is_pending(self, key: str) -> bool:
        return any(p["mask"] == key for p in self._data["pending"])

    # ------------------------------------------------------------------------------------------ writing
    def _changed(self) -> None:
        self._views.clear()

    @theta.setter
    def theta(self, value) -> None:
        self._data["gp"]["theta"] = None if value is None else [float(v) for v in value]
        self._changed()

    def measure(self, key: str, raw: Any, seconds: float, first: int, how: Optional[Mapping] = None) -> Measured:
        """Keep what evaluate() returned for candidate `key` (the loss, and the per-seed losses for paired comparisons);
        `first` is the history index that measured it; `how`: {"kind", "s", "method", "of"?} (Measured), else the
        history entry recorded for it next says it (record). A loss that is no finite number stops the search."""
        loss, per_seed = loss_of(raw)
        if not math.isfinite(loss):
            raise GCacheError(f"The evaluation of mask {key} returned {raw!r:.120}, not a finite loss (the run "
                              "diverged or the objective failed). The state file keeps the "
                              f"{len(self._data['history'])} evaluations before it; fix the evaluation and run the "
                              "search again to resume.")
        self._data["masks"][key] = {"loss": loss, "seconds": round(seconds, 4), "first": first,
                                    **({"per_seed": per_seed} if per_seed is not None else {}),
                                    **_plain(dict(how or {}))}
        self._changed()
        return self.measured(key)

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
                 "bound": proposal.get("bound"), "kappa": proposal.get("kappa"),
                 "gp_seconds": proposal.get("gp_seconds")}
        for key in ("method", "parent"):
            if proposal.get(key):
                entry[key] = proposal[key]
        hist.append(entry)
        measured = self._data["masks"][proposal["mask"]]
        if "kind" not in measured:  # the entry that measured it says how
            measured.update(kind=entry["kind"], s=entry["s"], method=method_of(entry))
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
    def keep(self, key: str) -> None:
        """Candidate `key`, the policy of the finished search a larger budget continues, stays a candidate (kept)."""
        if key not in self._data["kept"]:
            self._data["kept"].append(key)
            self._changed()

    def finish(self, final: Mapping) -> None:
        self._data["final"], self._data["done"] = _plain(final), True
        self._changed()
        self.save()

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
