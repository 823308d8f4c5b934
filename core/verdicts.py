"""The self-check's verdicts as GCache keeps them (selfcheck.py says what a check measures). JSON only.

- The record file (models/gcache/selfcheck.json in ComfyUI): one verdict per model (its weights key), family adapter,
  ComfyUI version (and the model's code), GCache version and compute settings. A first fail is checked again by the
  next run of a later prompt (every step computed meanwhile: a second sampling in the same prompt, such as GCache
  Search's second reference seed, counts with the first); a second fail of the same subject, in a later prompt,
  turns skipping off for that model until one of them changes, and is never overwritten by a later pass (no later run
  checks it again), and never evicted for room: passes go first, a fail only once a newer fail of the same model
  replaces it. Written atomically, under a lock; a damaged file raises DamagedRecord (the caller sets it aside).
- A profile's meta "selfcheck": the verdicts of the runs it holds, one per environment (merged profiles keep both
  sides'; a fail wins over a pass of the same environment).
- A policy's provenance "selfcheck": the verdicts of the profile it was made from.

A verdict is a flat dict: result ("pass" | "fail" | "not checked"), why, error, tolerance (the deciding statistic's:
statistic), group_error, group_tolerance, dtype, fails (prompts in a row whose run failed; a fail is kept for good at
CONFIRMED), prompt (the id of the ComfyUI prompt whose run made it; "": none known, each run its own), model, key,
family, comfyui, code, gcache, compute (TF32 and the cast dtype it ran under), date.
"""
from __future__ import annotations

import json
import math
import os
from typing import Mapping, Optional

from .errors import GCacheError
from .files import atomic_write_text, exclusive
from .selfcheck import FAIL, NOT_CHECKED, PASS, RESULTS

RECORD_FORMAT = "gcache.selfcheck"
RECORD_VERSION = 1
# what a verdict is about: a change to any one checks again (compute: the settings it ran under, TF32, cast dtype)
SUBJECT = ("key", "family", "comfyui", "code", "gcache", "compute")
TEXT = ("result", "why", "dtype", "model", "date", "statistic", "prompt") + SUBJECT
NUMBERS = ("error", "tolerance", "group_error", "group_tolerance", "fails")
CONFIRMED = 2  # fails of one subject that keep skipping off for good: one fail alone is checked again (issue 47)
MAX_RECORDS = 1024  # verdicts kept in the record file (the latest; fails beyond it, VerdictBook.put); a few hundred
#                    bytes each
MAX_IN_META = 16    # verdicts kept in a profile's meta and a policy's provenance


class DamagedRecord(GCacheError):
    """The record file can't be read: the caller sets it aside (a lock that can't be taken is not this)."""


def subject_key(v: Mapping) -> str:
    return "|".join(str(v.get(f, "")) for f in SUBJECT)


def fails(v: Mapping) -> int:
    """How many runs in a row failed this subject's check (a fail recorded before the count was kept: for good)."""
    if v.get("result") != FAIL:
        return 0
    n = v.get("fails")
    return CONFIRMED if n is None else int(n)


def confirmed(v: Optional[Mapping]) -> bool:
    """A fail kept for good: the same subject failed twice (a first fail is checked again on the next run)."""
    return v is not None and fails(v) >= CONFIRMED


def same_prompt_again(old: Optional[Mapping], v: Mapping) -> bool:
    """Whether `v` is a fail of the prompt whose run made `old`, a first fail of the same subject: a second sampling
    of one prompt (GCache Search's second reference seed, a second sampler on the model) is not the next run, so a
    fault of that prompt (another node of it, a one-off) counts once."""
    return (old is not None and old.get("result") == FAIL and not confirmed(old) and v.get("result") == FAIL
            and bool(v.get("prompt")) and v.get("prompt") == old.get("prompt"))


def valid(v) -> bool:
    """A verdict as GCache writes it (anything else in a file is damage or an edit)."""
    if not isinstance(v, dict) or v.get("result") not in RESULTS:
        return False
    if not all(isinstance(v.get(f, ""), str) for f in TEXT):
        return False
    return all(v.get(f) is None or (isinstance(v[f], (int, float)) and not isinstance(v[f], bool)
                                    and math.isfinite(v[f]) and v[f] >= 0) for f in NUMBERS)


def clean(v: Mapping) -> dict:
    """The verdict's fields only, JSON-safe (an infinite error, a replay that gave NaN/Inf, is written as 1e300)."""
    out = {f: str(v.get(f, "") or "") for f in TEXT}
    for f in NUMBERS:
        x = v.get(f)
        out[f] = None if x is None else (float(x) if math.isfinite(float(x)) else 1e300)
    return out


class VerdictBook:
    """The record file's verdicts by subject, the latest `limit` kept, fails never forgotten (`put`)."""

    def __init__(self, verdicts: Optional[dict] = None, limit: int = MAX_RECORDS):
        self.verdicts: dict[str, dict] = dict(verdicts or {})
        self.limit = limit

    def get(self, subject: Mapping) -> Optional[dict]:
        return self.verdicts.get(subject_key(subject))

    def put(self, verdict: Mapping) -> dict:
        """Keeps `verdict`; returns the one kept. A fail after a fail of the same subject in an earlier prompt is kept
        for good (nothing checks that subject again); a first fail stays until a later run checks it again: a pass
        then replaces it, a "not checked" does not, nor a fail of the first fail's own prompt (same_prompt_again).

        Past the limit the oldest pass or "not checked" goes first; a fail goes only once a newer fail of the same
        model (weights key) has replaced it. A fail nothing replaced is never forgotten: a book of such fails alone
        grows past the limit (each one a model that failed, a few hundred bytes), and then keeps the newest other
        verdict beside them."""
        v = clean(verdict)
        if v["result"] == FAIL and v["fails"] is None:  # a run's own fail (a record read from a file has its count)
            v["fails"] = 1.0
        key = subject_key(v)
        old = self.verdicts.get(key)
        if old is not None and old["result"] == FAIL:
            if confirmed(old) or v["result"] == NOT_CHECKED or same_prompt_again(old, v):
                return old
            if v["result"] == FAIL:
                v["fails"] = float(min(fails(old) + fails(v), CONFIRMED))
        self.verdicts.pop(key, None)
        self.verdicts[key] = v
        while len(self.verdicts) > self.limit:
            gone = self._evictable(key)
            if gone is None:
                break
            del self.verdicts[gone]
        return v

    def _evictable(self, newest: str) -> Optional[str]:
        """The subject to forget first (oldest first): a pass or "not checked" other than `newest`, else a fail
        with a newer fail of the same model key; None when every other verdict is a fail nothing replaced."""
        for k, v in self.verdicts.items():
            if v["result"] != FAIL and k != newest:
                return k
        replaced, seen = None, set()
        for k, v in reversed(self.verdicts.items()):  # newest first: a fail is replaced by one seen before it
            if v["result"] == FAIL:
                if v["key"] in seen:
                    replaced = k  # the oldest such wins (the loop ends on it)
                seen.add(v["key"])
        return replaced

    def to_json(self) -> str:
        return json.dumps({"format": RECORD_FORMAT, "version": RECORD_VERSION,
                           "verdicts": list(self.verdicts.values())}, indent=1, allow_nan=False)

    @classmethod
    def from_json(cls, text: str, source: str = "selfcheck.json") -> "VerdictBook":
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise DamagedRecord(f"{source} is not valid JSON ({e})") from None
        if not isinstance(d, dict) or d.get("format") != RECORD_FORMAT:
            raise DamagedRecord(f"{source} is not GCache's self-check record (no 'format': '{RECORD_FORMAT}')")
        if d.get("version") != RECORD_VERSION:
            raise DamagedRecord(f"{source} has record version {d.get('version')!r}; this GCache reads {RECORD_VERSION}")
        items = d.get("verdicts")
        if not isinstance(items, list) or not all(valid(v) for v in items):
            raise DamagedRecord(f"{source} holds a verdict GCache did not write (edited or damaged)")
        book = cls()
        for v in items:
            book.verdicts[subject_key(v)] = clean(v)
        return book

    @classmethod
    def load(cls, path: str) -> "VerdictBook":
        """The record file (an empty book when there is none); DamagedRecord when it can't be read."""
        if not os.path.isfile(path):
            return cls()
        try:
            with open(path, "r", encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            raise DamagedRecord(f"{os.path.basename(path)} is not a text file") from None
        return cls.from_json(text, os.path.basename(path))


def record(path: str, verdict: Mapping, lock_timeout_s: float = 30.0) -> dict:
    """Adds `verdict` to the record file at `path` (created if missing): read, changed and written atomically under
    a lock, so that two ComfyUI processes on one models folder both land. Returns the verdict kept for its subject.
    DamagedRecord when the file is damaged (nothing written), GCacheError when its lock can't be taken, OSError when
    it can't be written."""
    with exclusive(path, lock_timeout_s):
        book = VerdictBook.load(path)
        kept = book.put(verdict)
        atomic_write_text(path, book.to_json())
    return kept


# ------------------------------------------------------------------------------ profiles and policies
def checks_of(meta: Mapping) -> list[dict]:
    """The verdicts a profile's meta (or a policy's provenance) holds; anything malformed is left out."""
    items = meta.get("selfcheck") if isinstance(meta, Mapping) else None
    return [clean(v) for v in items if valid(v)] if isinstance(items, list) else []


def with_check(checks: list[dict], verdict: Mapping) -> list[dict]:
    """`checks` with `verdict` for its subject (a fail of the same subject stays), the latest MAX_IN_META kept
    (fails are kept as in the record file: VerdictBook.put)."""
    book = VerdictBook({subject_key(v): v for v in checks}, limit=MAX_IN_META)
    book.put(verdict)
    return list(book.verdicts.values())


def merged_checks(meta_a: Mapping, meta_b: Mapping) -> list[dict]:
    """The verdicts of two merged profiles: a's, then b's (per subject, a fail wins)."""
    out = checks_of(meta_a)
    for v in checks_of(meta_b):
        out = with_check(out, v)
    return out


def failed(checks: list[dict]) -> Optional[dict]:
    """The first failed verdict among `checks` (None: none failed), a first fail too: a profile recorded in a run
    whose check failed makes nothing that skips."""
    return next((v for v in checks if v["result"] == FAIL), None)


def summary(checks: list[dict]) -> str:
    """'pass' when one passed and none failed, 'fail' when any failed, else 'not checked'."""
    if failed(checks):
        return FAIL
    return PASS if any(v["result"] == PASS for v in checks) else NOT_CHECKED


def stamp(provenance: dict, profile_meta: Mapping) -> None:
    """Carries a profile's verdicts into the provenance of a policy made from it (nothing when it has none)."""
    checks = checks_of(profile_meta)
    if checks:
        provenance["selfcheck"] = checks
