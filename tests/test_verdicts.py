"""The self-check's verdicts as GCache keeps them (core/verdicts.py): the record file (round trip, a damaged file,
a fail that stays, a new subject per model key, ComfyUI, model code and GCache version), a profile's meta through a
merge, a policy's provenance (headless)."""
import json
import os

import numpy as np
import pytest

from gcache.core.errors import GCacheError
from gcache.core.policy import Policy
from gcache.core.profile import Profile
from gcache.core.verdicts import (
    MAX_RECORDS,
    VerdictBook,
    checks_of,
    clean,
    confirmed,
    failed,
    merged_checks,
    record,
    stamp,
    subject_key,
    summary,
    with_check,
)


def verdict(result="pass", **kw):
    v = {"result": result, "why": "" if result == "pass" else "the skip path's output differs from the computed step's",
         "error": 2e-7 if result == "pass" else 0.61, "tolerance": 5.9e-7, "dtype": "float32", "model": "Flux",
         "key": "ab12cd34", "family": "flux", "comfyui": "0.33.0", "code": "1a2b3c4d", "gcache": "0.1.0",
         "compute": "tf32 off, cast none", "date": "2026-11-27 12:00 UTC"}
    if result == "fail":
        v["fails"] = 1
    v.update(kw)
    return clean(v)  # as GCache writes it (the fields it lacks: empty)


def test_the_record_file_round_trips(tmp_path):
    path = str(tmp_path / "selfcheck.json")
    assert VerdictBook.load(path).get(verdict()) is None  # no file: an empty book
    kept = record(path, verdict())
    assert kept == verdict()
    again = VerdictBook.load(path)
    assert again.get(verdict()) == verdict() and again.get(verdict(comfyui="0.38.0")) is None
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    assert d["format"] == "gcache.selfcheck" and d["version"] == 1 and d["verdicts"] == [verdict()]


@pytest.mark.parametrize("field, value", [("key", "ffff0000"), ("comfyui", "0.38.0"), ("code", "99999999"),
                                          ("gcache", "0.2.0"), ("family", "chroma"),
                                          ("compute", "tf32 on, cast bfloat16")])
def test_a_change_of_model_comfyui_code_or_gcache_is_a_new_subject(tmp_path, field, value):
    path = str(tmp_path / "selfcheck.json")
    record(path, verdict("fail"))
    book = VerdictBook.load(path)
    assert book.get(verdict())["result"] == "fail"
    assert book.get(verdict(**{field: value})) is None  # checked again
    assert subject_key(verdict()) != subject_key(verdict(**{field: value}))
    assert subject_key(verdict()) == subject_key(verdict(error=1.0, date="x", model="Other", why="y"))


def test_a_fail_stays_once_it_repeats_and_a_pass_is_replaced(tmp_path):
    """Issue 47: one run decided for good (a transient fault became a permanent fail). A first fail stays until the
    next check: a pass replaces it, a "not checked" does not; the second fail in a row is kept for good."""
    path = str(tmp_path / "selfcheck.json")
    record(path, verdict(error=1e-7))
    assert record(path, verdict(error=3e-7))["error"] == 3e-7  # the latest pass stands
    first = record(path, verdict("fail"))
    assert first["result"] == "fail" and first["fails"] == 1 and not confirmed(first)
    assert record(path, verdict("not checked", error=None, tolerance=None)) == first  # says nothing: kept
    assert record(path, verdict("pass"))["result"] == "pass"  # checked again, and it passed
    record(path, verdict("fail"))
    second = record(path, verdict("fail", error=0.7))
    assert second["fails"] == 2 and confirmed(second) and second["error"] == 0.7
    assert record(path, verdict("pass"))["result"] == "fail"   # nothing checks a subject failed twice again
    assert record(path, verdict("fail"))["fails"] == 2
    assert record(path, verdict("not checked", error=None, tolerance=None))["result"] == "fail"
    assert len(VerdictBook.load(path).verdicts) == 1
    legacy = {k: v for k, v in verdict("fail").items() if k != "fails"}  # recorded before the count was kept
    assert confirmed(clean(legacy))


def test_a_second_fail_in_the_prompt_of_a_first_counts_with_it(tmp_path):
    """A first fail became a fail kept for good inside one prompt: GCache Search's two reference runs (two seeds)
    each check the model. A fail counts again only from a later prompt (its run's prompt id); one that no prompt
    made ("": outside ComfyUI's executor) is its own run, as before."""
    path = str(tmp_path / "selfcheck.json")
    first = record(path, verdict("fail", prompt="prompt-a"))
    assert first["fails"] == 1 and first["prompt"] == "prompt-a"
    again = record(path, verdict("fail", error=0.9, prompt="prompt-a"))  # the prompt's second reference run
    assert again == first and not confirmed(again)  # the first fail stands, once: a later prompt checks it again
    assert VerdictBook.load(path).get(verdict()) == first
    later = record(path, verdict("fail", error=0.7, prompt="prompt-b"))
    assert later["fails"] == 2 and confirmed(later) and later["prompt"] == "prompt-b"
    other = str(tmp_path / "other.json")  # a pass in the prompt of a first fail replaces it, as in any run
    record(other, verdict("fail", prompt="prompt-a"))
    assert record(other, verdict("pass", prompt="prompt-a"))["result"] == "pass"
    unknown = str(tmp_path / "unknown.json")  # no prompt id: each run its own, two in a row are kept for good
    record(unknown, verdict("fail"))
    assert confirmed(record(unknown, verdict("fail")))

@pytest.mark.parametrize("text, why", [("{", "not valid JSON"), ('{"format": "x"}', "self-check record"),
                                       ('{"format": "gcache.selfcheck", "version": 9, "verdicts": []}', "version"),
                                       ('{"format": "gcache.selfcheck", "version": 1, "verdicts": [{"result": "ok"}]}',
                                        "did not write"),
                                       ('{"format": "gcache.selfcheck", "version": 1, "verdicts": '
                                        '[{"result": "pass", "error": -1}]}', "did not write")])
def test_a_damaged_record_file_is_refused_and_not_overwritten(tmp_path, text, why):
    path = str(tmp_path / "selfcheck.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(GCacheError, match=why):
        VerdictBook.load(path)
    with pytest.raises(GCacheError):
        record(path, verdict())
    with open(path, encoding="utf-8") as f:
        assert f.read() == text  # the caller sets it aside; nothing here writes over it
    with open(path, "wb") as f:
        f.write(b"\xff\xfe\x00")
    with pytest.raises(GCacheError, match="not a text file"):
        VerdictBook.load(path)


def test_the_record_file_keeps_the_latest_verdicts():
    book = VerdictBook()
    for i in range(MAX_RECORDS + 5):
        book.put(verdict(key=f"{i:08x}"))
    assert len(book.verdicts) == MAX_RECORDS and book.get(verdict(key="00000000")) is None
    assert book.get(verdict(key=f"{MAX_RECORDS + 4:08x}")) is not None


def test_a_fail_is_never_evicted_by_passes_of_other_models(tmp_path):
    """One fail, then more passes of other models than the book holds: the fail stays (the oldest passes go)."""
    path = str(tmp_path / "selfcheck.json")
    book = VerdictBook()
    book.put(verdict("fail", key="ffffffff"))
    for i in range(MAX_RECORDS + 50):
        book.put(verdict(key=f"{i:08x}"))
    assert book.get(verdict(key="ffffffff"))["result"] == "fail"
    assert len(book.verdicts) == MAX_RECORDS
    assert book.get(verdict(key="00000000")) is None and book.get(verdict(key=f"{MAX_RECORDS + 49:08x}")) is not None
    # the same through the record file, read and written again on every verdict
    atomic = VerdictBook.from_json(book.to_json())
    atomic.put(verdict(key="eeeeeeee"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(atomic.to_json())
    record(path, verdict(key="dddddddd"))
    kept = VerdictBook.load(path)
    assert kept.get(verdict(key="ffffffff"))["result"] == "fail" and len(kept.verdicts) == MAX_RECORDS


def test_a_fail_goes_only_when_a_fail_of_the_same_model_replaces_it():
    """A full book: the oldest pass goes first; with no pass left, the oldest fail of a model that has a newer fail
    (its weights key, checked again on another ComfyUI, model code or GCache) goes; a fail nothing replaced stays."""
    book = VerdictBook(limit=4)
    book.put(verdict("fail", key="a", comfyui="0.33.0"))
    book.put(verdict("fail", key="b"))
    book.put(verdict(key="c"))
    book.put(verdict("fail", key="d"))
    book.put(verdict("fail", key="a", comfyui="0.34.0"))  # the pass of c goes, not the older fail of a
    assert [(v["key"], v["comfyui"]) for v in book.verdicts.values()] == \
        [("a", "0.33.0"), ("b", "0.33.0"), ("d", "0.33.0"), ("a", "0.34.0")]
    book.put(verdict("fail", key="e"))  # no pass left: a's older fail, replaced by its newer one, goes
    assert [(v["key"], v["comfyui"]) for v in book.verdicts.values()] == \
        [("b", "0.33.0"), ("d", "0.33.0"), ("a", "0.34.0"), ("e", "0.33.0")]


def test_a_book_full_of_fails_grows_and_keeps_the_newest_pass():
    """Decided: fails are never forgotten, so a book of fails alone grows past its limit (each is a model that
    failed; a few hundred bytes). A pass put then is kept too (the newest non-fail), and it is the first to go."""
    book = VerdictBook(limit=3)
    for k in "abcd":
        book.put(verdict("fail", key=k))
    assert len(book.verdicts) == 4 and all(v["result"] == "fail" for v in book.verdicts.values())
    assert book.put(verdict(key="p"))["result"] == "pass" and book.get(verdict(key="p")) is not None
    book.put(verdict("not checked", key="q", error=None, tolerance=None))
    assert book.get(verdict(key="p")) is None and book.get(verdict(key="q")) is not None  # the older non-fail went
    assert len(book.verdicts) == 5 and sum(v["result"] == "fail" for v in book.verdicts.values()) == 4


def test_a_profiles_verdicts_keep_every_fail():
    checks = with_check([], verdict("fail", key="ffffffff"))
    for i in range(40):
        checks = with_check(checks, verdict(key=f"{i:08x}"))
    assert len(checks) == 16 and failed(checks)["key"] == "ffffffff" and checks[-1]["key"] == f"{39:08x}"


def test_an_infinite_error_is_written_as_a_number(tmp_path):
    path = str(tmp_path / "selfcheck.json")
    kept = record(path, verdict("fail", error=float("inf")))
    assert kept["error"] == 1e300 and VerdictBook.load(path).get(verdict())["error"] == 1e300


def _profile(checks=None):
    p = Profile.empty([1.0, 0.5, 0.0], meta={"family": "flux", "model": "Flux"})
    p.count = 1
    p.e_sum = np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]], dtype=float)
    p.delta_norm_sum = np.ones(3)
    if checks is not None:
        p.meta["selfcheck"] = checks
    return p


def test_a_profile_keeps_its_verdicts_through_a_file_and_a_merge(tmp_path):
    a = _profile([verdict()])
    path = str(tmp_path / "a.profile.safetensors")
    a.save(path)
    assert checks_of(Profile.load(path).meta) == [verdict()]
    other_comfy = verdict(comfyui="0.38.0", error=4e-7)
    merged = Profile.load(path).merge(_profile([other_comfy]))
    assert checks_of(merged.meta) == [verdict(), other_comfy] and summary(checks_of(merged.meta)) == "pass"
    failing = verdict("fail", comfyui="0.38.0")
    merged = merged.merge(_profile([failing]))  # the same subject, now failed: the fail wins
    assert checks_of(merged.meta) == [verdict(), failing] and failed(checks_of(merged.meta)) == failing
    assert summary(checks_of(merged.meta)) == "fail"
    assert _profile().merge(_profile()).meta.get("selfcheck") is None  # profiles from before the check: nothing
    assert checks_of(_profile().merge(_profile([verdict()])).meta) == [verdict()]


def test_merged_checks_and_malformed_entries():
    assert merged_checks({"selfcheck": [verdict(), {"result": "maybe"}, "x"]}, {"selfcheck": "no"}) == [verdict()]
    assert checks_of({"selfcheck": None}) == [] and checks_of("not a dict") == []
    assert summary([]) == "not checked" and summary([verdict("not checked", error=None, tolerance=None)]) == \
        "not checked"
    many = []
    for i in range(40):
        many = with_check(many, verdict(key=f"{i:08x}"))
    assert len(many) == 16 and many[-1]["key"] == f"{39:08x}"


def test_a_policy_carries_its_profiles_verdicts_and_old_policies_still_load(tmp_path):
    pol = Policy([1, 0, 1])
    stamp(pol.provenance, _profile([verdict()]).meta)
    assert pol.provenance["selfcheck"] == [verdict()]
    path = str(tmp_path / "p.json")
    pol.save(path)
    assert Policy.load(path).provenance["selfcheck"] == [verdict()]
    old = Policy([1, 1, 0])
    stamp(old.provenance, _profile().meta)  # a profile without verdicts stamps nothing
    assert "selfcheck" not in old.provenance
    old.save(path)
    assert checks_of(Policy.load(path).provenance) == []
    assert os.path.isfile(path)
