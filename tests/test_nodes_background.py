"""What the GCache tab lists from the state files (headless): finished searches with their policy's loss, unfinished
ones as paused, and file names, never server folders."""
import json
import os
import shutil

import pytest
import search_fixture as fx
from test_search_bilevel import CFG, Evaluator, make_profile
from test_search_end_game_complete import CONFIG as STOPPED_CONFIG
from test_search_end_game_complete import StopsOnFreshSeeds
from test_search_larger_budget import FreshEvaluator

from gcache.core.errors import GCacheError
from gcache.core.profile import Profile
from gcache.nodes.artifacts import PROFILE_SUFFIX, search_profile_path
from gcache.nodes.search_jobs.background import MOVES, Job, Jobs, file_names
from gcache.search.config import SearchConfig
from gcache.search.loop import run_search
from gcache.search.state import SearchState, load_state


@pytest.mark.parametrize("text, shown", [
    ("The search state /srv/ComfyUI/models/gcache/a.search.json is damaged.",
     "The search state a.search.json is damaged."),
    ("[Errno 13] Permission denied: '/home/u/ComfyUI/models/gcache/p.json'", "[Errno 13] Permission denied: 'p.json'"),
    (r"C:\ComfyUI\models\gcache\x.json is locked", "x.json is locked"),
    (r"[WinError 5] Access is denied: 'D:\\ComfyUI\\models\\gcache\\x.json'",
     "[WinError 5] Access is denied: 'x.json'"),
    ("Can't lock x.json in /srv/models/gcache (busy)", "Can't lock x.json in gcache (busy)"),
    # not paths: left alone
    ("computed 3/8 steps, 12 of 30 evaluations", "computed 3/8 steps, 12 of 30 evaluations"),
    ("from https://download.pytorch.org/models/alexnet.pth", "from https://download.pytorch.org/models/alexnet.pth"),
    ("done: my_policy.json saved", "done: my_policy.json saved"),
])
def test_file_names_shortens_absolute_paths_only(text, shown):
    assert file_names(text) == shown


def _search(folder, name, crash_at=None):
    """A real search state (and its policy file when it finishes), as GCache Search leaves them in models/gcache."""
    prof = make_profile()
    path = os.path.join(folder, name + ".search.json")
    try:
        res = run_search(prof, SearchConfig(**CFG), Evaluator(prof, crash_at=crash_at), state_path=path)
    except RuntimeError:  # the simulated crash: an unfinished state file
        return None
    res.policy.save(os.path.join(folder, name + ".json"))
    return res.policy


def test_the_listing_shows_finished_searches_with_their_policy_loss_and_unfinished_ones_as_paused(tmp_path):
    done = _search(str(tmp_path), "finished")
    _search(str(tmp_path), "half", crash_at=5)
    _search(str(tmp_path), "lost")
    os.remove(tmp_path / "lost.json")
    (tmp_path / "broken.search.json").write_text("{")
    rows = {r["id"]: r for r in Jobs().listing([str(tmp_path), str(tmp_path / "missing")])}
    assert sorted(rows) == ["finished", "half", "lost"]  # an unreadable state is not a row
    fin = rows["finished"]
    assert fin["status"] == "done" and fin["evaluations"] == fin["budget"] == CFG["budget"]
    assert fin["best_loss"] == json.loads((tmp_path / "finished.json").read_text())["metrics"]["loss"] == \
        done.metrics["loss"]
    assert fin["message"] == "done: finished.json saved" and fin["state_file"] == "finished.search.json"
    half = rows["half"]
    hist = json.loads((tmp_path / "half.search.json").read_text())["history"]
    assert half["status"] == "paused" and half["evaluations"] == len(hist) and 0 < len(hist) < CFG["budget"]
    assert half["best_loss"] == min(h["loss"] for h in hist) and "queue GCache Search again" in half["message"]
    lost = rows["lost"]  # finished, but its policy file is gone: says so, and what to do
    assert lost["status"] == "done" and "lost.json is missing" in lost["message"]
    assert "queue GCache Search again" in lost["message"]
    assert not any(str(tmp_path) in json.dumps(r) for r in rows.values())


def test_a_policy_file_of_another_search_is_not_taken_for_the_finished_one(tmp_path):
    _search(str(tmp_path), "a")
    other = json.loads((tmp_path / "a.json").read_text())
    other["provenance"]["state"] = "0123456789abcdef"  # GCache Policy or another search wrote a.json since
    (tmp_path / "a.json").write_text(json.dumps(other))
    row = Jobs().listing([str(tmp_path)])[0]
    assert row["status"] == "done" and "a.json is missing or from another search" in row["message"]


def test_an_unreadable_state_file_is_named_by_its_file_name(tmp_path):
    path = tmp_path / "x.search.json"
    path.mkdir()  # exists, but can't be read as a file
    with pytest.raises(GCacheError) as e:
        load_state(str(path))
    assert "x.search.json" in str(e.value) and str(tmp_path) not in str(e.value)


# ------------------------------------------------------------------------------------------- a job's status
def _job(status="queued", mode="background"):
    return Job("s", "/x/s.search.json", 30, "6", {}, status=status, mode=mode)


def test_a_jobs_status_moves_only_as_the_state_machine_allows():
    jobs = Jobs()
    bg = jobs.put(_job())
    assert jobs.update(bg, status="running", message="evaluating") and bg.status == "running"
    assert jobs.update(bg, status="queued", message="next slice queued") and bg.status == "queued"
    jobs.keep_refs(bg, ["image"], "k")
    assert bg.refs == ["image"] and bg.refs_key == "k"
    assert jobs.cancel("s") is bg and bg.status == "cancelled" and bg.refs is None
    jobs.keep_refs(bg, ["sampled as it was cancelled"], "k2")  # a stopped search keeps no images
    assert bg.refs is None and bg.refs_key == "k"
    for to in ("running", "queued", "paused", "failed", "done"):  # cancelled is terminal: refused, nothing changed
        assert not jobs.update(bg, status=to, message="overwritten") and bg.status == "cancelled"
        assert bg.message.startswith("cancelled")
    for end in ("done", "failed"):
        job = jobs.put(Job(end, "/x/e.search.json", 30, "6", {}, status="running"))
        assert jobs.update(job, status=end, message="the end")
        assert jobs.cancel(end).status == end and job.message == "the end"  # an ended search is left as it is
        assert not jobs.update(job, status="running")
    paused = jobs.put(Job("p", "/x/p.search.json", 30, "6", {}, status="running"))
    assert jobs.update(paused, status="paused")
    assert not jobs.update(paused, status="running") and not jobs.update(paused, status="queued")  # resumed anew
    assert jobs.cancel("p").status == "cancelled"
    running = jobs.put(Job("r", "/x/r.search.json", 30, "6", {}, status="running"))
    assert not jobs.update(running, status="running")  # a second slice of a running search does nothing
    assert jobs.update(running, evaluations=3) and running.evaluations == 3  # no move: always allowed
    assert jobs.cancel("nobody") is None
    with pytest.raises(ValueError, match="no job status"):
        jobs.update(running, status="finished")
    with pytest.raises(ValueError, match="can't start"):
        jobs.put(Job("z", "/x/z.search.json", 30, "6", {}, status="whatever"))


def test_every_state_in_the_machine_is_named_and_only_the_documented_moves_exist():
    assert set(MOVES) == {"queued", "running", "paused", "cancelled", "done", "failed"}
    assert all(MOVES[s] <= set(MOVES) for s in MOVES)
    assert MOVES["cancelled"] == MOVES["done"] == MOVES["failed"] == set()  # terminal
    assert MOVES["paused"] == {"cancelled"}
    assert "cancelled" in MOVES["queued"] and "cancelled" in MOVES["running"]


class _Watched(Job):
    """A job that notes, at each change of a field and at each public(), whether its Jobs' lock was held."""
    lock = None
    seen: list = []

    def __setattr__(self, k, v):
        if self.lock is not None and k not in ("lock",):
            _Watched.seen.append((k, self.lock.locked()))
        super().__setattr__(k, v)

    def public(self):
        if self.lock is not None:
            _Watched.seen.append(("public", self.lock.locked()))
        return super().public()


def test_update_cancel_and_listing_run_under_the_lock(tmp_path):
    jobs = Jobs()
    job = _Watched("s", str(tmp_path / "s.search.json"), 30, "6", {})
    jobs.put(job)
    job.lock = jobs._lock
    _Watched.seen = []
    jobs.update(job, status="running", evaluations=2, message="evaluating")
    jobs.listing([str(tmp_path)])
    jobs.cancel("s")
    fields = {k for k, _ in _Watched.seen}
    assert {"status", "evaluations", "message", "updated", "public", "refs"} <= fields
    assert all(held for _, held in _Watched.seen), _Watched.seen


@pytest.mark.parametrize("own", [True, False], ids=["own profile", "connected profile"])
def test_a_search_whose_end_game_was_stopped_is_paused_until_a_queue_finishes_it(tmp_path, own):
    """Its state says done, but its end game owes evaluations (stopped on its fresh seeds): the old listing said
    "done" while queueing it again samples and may change the policy. The profile it was made from is its own (where
    its reference runs record it) or a connected one in the gcache folder (as GCache Profile saves it)."""
    profile, folder = Profile.load(fx.PROFILE), str(tmp_path)
    shutil.copy(fx.PROFILE, search_profile_path(folder, "s") if own else os.path.join(folder, "mine" + PROFILE_SUFFIX))
    path, config = os.path.join(folder, "s.search.json"), STOPPED_CONFIG
    with pytest.raises(RuntimeError, match="interrupted"):
        run_search(profile, config, StopsOnFreshSeeds(), state_path=path, provenance=fx.PROVENANCE)
    assert SearchState.peek(path).done
    row = Jobs().listing([folder])[0]
    assert row["status"] == "paused" and row["evaluations"] == row["budget"] == config.budget
    assert row["message"].startswith("end game unfinished") and "queue GCache Search again to finish it" in \
        row["message"]
    ev = FreshEvaluator()  # the queue the row asks for: it samples what the end game owed
    result = run_search(profile, config, ev, state_path=path, provenance=fx.PROVENANCE)
    assert ev.calls == [] and len(ev.fresh_calls) >= 1
    result.policy.save(os.path.join(folder, "s.json"))
    row = Jobs().listing([folder])[0]
    assert row["status"] == "done" and row["message"] == "done: s.json saved"
    assert row["best_loss"] == result.policy.metrics["loss"]
