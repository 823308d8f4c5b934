"""State files written by the search before search/ was restructured (tests/data/, tests/search_fixture.py): they
load, a finished one gives its policy again without sampling, a crashed one resumes to the same end, and a search
run now writes the same file."""
import json
import shutil

import pytest

from gcache.core.policy import Policy
from gcache.core.profile import Profile
from gcache.search.config import SearchConfig
from gcache.search.loop import run_search
from gcache.search.state import load_state

import search_fixture as fx

TIMINGS = ("seconds", "gp_seconds")  # wall-clock figures: they differ from run to run


def without_timings(value):
    if isinstance(value, dict):
        return {k: (0 if k in TIMINGS else without_timings(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


@pytest.fixture(scope="module")
def profile():
    return Profile.load(fx.PROFILE)


@pytest.fixture(scope="module")
def old_policy():
    return Policy.load(fx.POLICY)


def search(profile, path, evaluator):
    return run_search(profile, SearchConfig(**fx.CONFIG), evaluator, state_path=str(path), provenance=fx.PROVENANCE)


def same_policy(new: Policy, old: Policy) -> None:
    assert new.mask == old.mask and new.forecast == old.forecast and new.method == old.method
    assert new.forecast_params == old.forecast_params and new.provenance == old.provenance
    assert {k: new.metrics[k] for k in old.metrics} == old.metrics  # the io share and speed-up are new beside them
    assert new.metrics["predicted_speedup"] == pytest.approx(new.n_steps / new.n_computed)  # the profile has no io


def test_the_old_files_load(profile):
    done, crashed = load_state(fx.DONE), load_state(fx.CRASHED)
    assert done["done"] and done["forecasters"]["results"] and done["polish"]["guard"] == "z"
    assert not crashed["done"] and len(crashed["pending"]) == 1 and crashed["pending"][0]["kind"] == "polish"


def test_a_finished_old_search_gives_its_policy_again_without_sampling(profile, old_policy, tmp_path):
    path = tmp_path / "done.search.json"
    shutil.copy(fx.DONE, path)
    ev = fx.Evaluator()
    res = search(profile, path, ev)
    assert ev.calls == []
    same_policy(res.policy, old_policy)
    assert json.loads(path.read_text()) == json.load(open(fx.DONE))  # nothing was rewritten


def test_a_crashed_old_search_resumes_to_the_same_end(profile, old_policy, tmp_path):
    path = tmp_path / "crashed.search.json"
    shutil.copy(fx.CRASHED, path)
    crashed = load_state(fx.CRASHED)
    ev = fx.Evaluator()
    res = search(profile, path, ev)
    assert ev.calls[0] == (crashed["pending"][0]["mask"], None)  # what was out is dispatched again first
    assert not {key for key, fc in ev.calls if fc is None} & set(crashed["masks"])  # none measured before again
    same_policy(res.policy, old_policy)
    done = without_timings(load_state(fx.DONE))
    assert without_timings(json.loads(path.read_text())) == done


def test_a_search_run_now_writes_the_file_the_old_search_wrote(profile, tmp_path):
    path = tmp_path / "new.search.json"
    search(profile, path, fx.Evaluator())
    with open(fx.DONE, encoding="utf-8") as f:
        old_text = f.read()
    # the same keys in the same order, the same values (timings aside), written the same way (indent 1)
    assert json.dumps(without_timings(json.loads(path.read_text())), indent=1) == \
        json.dumps(without_timings(json.loads(old_text)), indent=1)
    assert path.read_text().count("\n") == old_text.count("\n")
