"""The self-check's subject and its record in a folder (nodes/modes/verdicts.py, no ComfyUI needed): a damaged
record is set aside and written anew, a lock that can't be taken is not damage, a write is seen by the next lookup,
and the subject changes with the model's code (headless)."""
import importlib
import logging
import sys

import pytest
import torch

from gcache.core.errors import GCacheError
from gcache.core.selfcheck import Outcome
from gcache.core.verdicts import VerdictBook
from gcache.nodes.modes import verdicts
from gcache.nodes.patching.adapters import Adapter, Route, Stack
from gcache.nodes.patching.streams import Layout


def subject(folder, **kw):
    fields = dict(model="Flux", key="ab12cd34", family="flux", comfyui="0.33.0", code="1a2b3c4d", folder=str(folder))
    fields.update(kw)
    return verdicts.Subject(**fields)


FAIL = Outcome("fail", "the skip path's output differs from the computed step's", 0.61, 8.5e-6, "float32")
PASS = Outcome("pass", "", 2e-7, 8.5e-6, "float32")


def test_a_verdict_is_recorded_and_seen_by_the_next_lookup(tmp_path):
    s = subject(tmp_path)
    assert s.recorded() is None and verdicts.recorded_fail(s) is None
    assert s.record(PASS)["result"] == "pass" and s.recorded()["result"] == "pass"
    assert s.record(FAIL)["result"] == "fail" and verdicts.recorded_fail(s) is None  # a first fail: checked again
    assert verdicts.failed_once(s)["error"] == 0.61
    assert s.record(FAIL)["result"] == "fail" and verdicts.recorded_fail(s)["error"] == 0.61  # twice: for good
    assert verdicts.failed_once(s) is None
    assert s.record(PASS)["result"] == "fail"  # a fail that repeated stays
    assert verdicts.recorded_fail(subject(tmp_path, comfyui="0.38.0")) is None  # another ComfyUI: checked again
    other = subject(tmp_path, compute="tf32 matmul on, conv on, cast none")
    assert verdicts.recorded_fail(other) is None  # other compute settings: checked again
    assert subject("").record(FAIL)["result"] == "fail" and subject("").recorded() is None  # no folder: nothing kept
    assert "GCache checks again when the model, ComfyUI, GCache or the compute settings change" in \
        verdicts.refusal(s.recorded(), s)


def test_the_compute_settings_are_tf32_and_the_cast_dtype():
    from types import SimpleNamespace as NS
    old = NS(cuda=NS(matmul=NS(allow_tf32=False)), cudnn=NS(allow_tf32=True))  # torch before 2.9
    assert verdicts.compute_settings(NS(manual_cast_dtype=None), old) == "tf32 matmul off, conv on, cast none"
    new = NS(cuda=NS(matmul=NS(fp32_precision="tf32")), cudnn=NS(fp32_precision="ieee"))
    assert verdicts.compute_settings(NS(manual_cast_dtype=torch.bfloat16), new) == \
        "tf32 matmul on, conv off, cast bfloat16"
    assert verdicts.compute_settings(None).startswith("tf32 matmul ")  # this torch's own, whatever it is


def test_a_damaged_record_is_set_aside_when_read_and_when_written(tmp_path, caplog):
    path = tmp_path / "selfcheck.json"
    path.write_text("{ damaged")
    with caplog.at_level(logging.WARNING, logger="gcache"):
        assert subject(tmp_path).recorded() is None
    assert (tmp_path / "selfcheck.damaged-1.json").read_text() == "{ damaged" and not path.exists()
    assert "selfcheck.json can't be read" in caplog.text and "moved to selfcheck.damaged-1.json" in caplog.text
    path.write_text('{"format": "gcache.selfcheck", "version": 1, "verdicts": 3}')
    assert subject(tmp_path).record(FAIL)["result"] == "fail"
    assert (tmp_path / "selfcheck.damaged-2.json").is_file()
    assert VerdictBook.load(str(path)).get(subject(tmp_path).fields())["result"] == "fail"


def test_a_lock_that_cant_be_taken_is_not_damage(tmp_path, monkeypatch, caplog):
    s = subject(tmp_path)
    s.record(PASS)
    import gcache.core.verdicts as core_verdicts

    def locked(path, timeout_s):
        raise GCacheError("selfcheck.json stayed locked by another process for 30 s; it was not changed.")
    monkeypatch.setattr(core_verdicts, "exclusive", locked)
    with caplog.at_level(logging.ERROR, logger="gcache"):
        assert s.record(FAIL)["result"] == "fail"  # this run's verdict, said, not kept
    assert "the verdict was not recorded" in caplog.text
    assert not list(tmp_path.glob("selfcheck.damaged-*")) and s.recorded()["result"] == "pass"


def test_the_model_code_is_part_of_the_subject(tmp_path, monkeypatch):
    """A ComfyUI installed from git changes a model's file between version numbers: the subject changes with it."""
    (tmp_path / "comfy_fake_model.py").write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("comfy_fake_model")
    ad = Adapter("fake", (), Route.DIT, (Stack("double_block", "blocks", Layout.IMG),))
    dm = mod.Model()
    dm.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    first = verdicts.model_code(dm, ad)
    assert first == verdicts.model_code(dm, ad) and len(first) == 8
    (tmp_path / "comfy_fake_model.py").write_text("import torch\nclass Model(torch.nn.Module):\n    x = 1\n")
    assert verdicts.model_code(dm, ad) != first  # read again: the file changed
    sys.modules.pop("comfy_fake_model", None)


def test_without_comfyui_the_version_is_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "comfyui_version", None)
    assert verdicts.comfyui_version() == "unknown"


@pytest.mark.parametrize("result, level, words", [("pass", logging.INFO, "GCache self-check passed for"),
                                                  ("fail", logging.WARNING, "GCache self-check failed once for"),
                                                  ("fail twice", logging.ERROR, "GCache self-check FAILED for"),
                                                  ("not checked", logging.INFO, "GCache self-check: not checked for")])
def test_one_line_per_verdict_and_the_same_text_on_the_node(result, level, words, tmp_path, caplog, monkeypatch):
    shown = []
    monkeypatch.setattr(verdicts, "show", lambda node_id, text: shown.append((node_id, text)))
    s = subject(tmp_path, node_id="7")
    if result == "fail twice":
        s.record(FAIL)
    split = Outcome(why="ComfyUI's MultiGPU CFG split runs this call in a thread of its own device")
    outcome = {"pass": PASS, "fail": FAIL, "fail twice": FAIL, "not checked": split}[result]
    with caplog.at_level(logging.INFO, logger="gcache"):
        verdicts.say(s.record(outcome), s)
    records = [r for r in caplog.records if r.name == "gcache"]
    assert len(records) == 1 and records[0].levelno == level and words in records[0].getMessage()
    assert "Flux (flux) on ComfyUI 0.33.0" in records[0].getMessage()
    assert shown == [("7", records[0].getMessage())]
    if result.startswith("fail"):
        assert "error 0.61 > tolerance 8.5e-06 for float32" in shown[0][1]
        assert (verdicts.REPORT in shown[0][1]) == (result == "fail twice")
        assert ("checking again on the next run" in shown[0][1]) == (result == "fail")
    assert ".." not in shown[0][1]  # issue 47: "Please report this model.. GCache"


def test_a_why_that_ends_in_a_period_makes_no_double_period(tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(verdicts, "show", lambda node_id, text: shown.append(text))
    s = subject(tmp_path, node_id="7")
    why = "the skip path failed: The stream changed within one step. Please report this model."
    for _ in range(2):
        verdicts.say(s.record(Outcome("fail", why)), s)
    assert len(shown) == 2 and all(".." not in t and "Please report this model. GCache" not in t for t in shown)


def test_a_run_not_checked_after_a_first_fail_says_so_and_not_that_it_failed(tmp_path, caplog):
    """A first fail stands until a run checks again; a run whose check could not be made (another node's wrapper
    sees the replay) says it was not checked, and why, instead of repeating the earlier fail as this run's."""
    s = subject(tmp_path)
    s.record(FAIL)
    unchecked = Outcome("not checked", "another node's code runs inside GCache's model call and would see the replay")
    kept = s.record(unchecked)
    assert kept["result"] == "fail"  # the first fail stands
    with caplog.at_level(logging.INFO, logger="gcache"):
        verdicts.say(kept, s, unchecked)
    text = caplog.records[-1].getMessage()
    assert "not checked" in text and "would see the replay" in text and "earlier fail" in text
    assert "failed once" not in text and "This run computed" not in text
