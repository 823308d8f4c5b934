"""State files written by the search before search/ was restructured (tests/data/, tests/search_fixture.py): they
load, and are migrated once when read (format 3 to 4: the forecaster check's results among the measured candidates);
a finished one gives its policy again without sampling or writing, a crashed one resumes to the same end (the
migrated finished file), and a search run now measures the old start masks first."""
import json
import math
import shutil

import pytest
import search_fixture as fx

from gcache.core.policy import Policy
from gcache.core.profile import Profile
from gcache.search.config import SearchConfig
from gcache.search.keys import method_of
from gcache.search.loop import run_search
from gcache.search.state import load_state, migrated

TIMINGS = ("seconds", "gp_seconds")  # wall-clock figures: they differ from run to run


def assert_same(new, old, where="state"):
    """Equal, floats to a relative 1e-6 (the GP's s comes from an optimizer whose last digits depend on the CPU's
    vector instructions)."""
    if isinstance(old, dict):
        assert isinstance(new, dict) and list(new) == list(old), where
        for k in old:
            assert_same(new[k], old[k], f"{where}.{k}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for i, (a, b) in enumerate(zip(new, old)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(old, float) and not isinstance(new, bool):
        assert math.isclose(new, old, rel_tol=1e-6, abs_tol=1e-12), f"{where}: {new} != {old}"
    else:
        assert new == old, f"{where}: {new!r} != {old!r}"


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


def check_evaluations() -> int:
    """The forecaster check's evaluations of the finished old search: version 3 counted them apart from its
    evaluations, version 4 among them (they are measured candidates)."""
    return len(load_state(fx.DONE)["forecasters"]["results"])


def same_policy(new: Policy, old: Policy) -> None:
    """The same policy; its provenance counts the forecaster check's evaluations among the search's."""
    assert new.mask == old.mask and new.forecast == old.forecast and new.method == old.method
    assert new.forecast_params == old.forecast_params
    assert new.provenance == dict(old.provenance, evaluations=old.provenance["evaluations"] + check_evaluations())
    assert {k: new.metrics[k] for k in old.metrics} == old.metrics  # the io share and speed-up are new beside them
    assert new.metrics["predicted_speedup"] == pytest.approx(new.n_steps / new.n_computed)  # the profile has no io


def test_the_old_files_load(profile):
    done, crashed = load_state(fx.DONE), load_state(fx.CRASHED)
    assert done["done"] and done["forecasters"]["results"] and done["polish"]["guard"] == "z"
    assert not crashed["done"] and len(crashed["pending"]) == 1 and crashed["pending"][0]["kind"] == "polish"


def test_a_version_3_file_is_migrated_once_when_read():
    """Version 5 keeps the check's results among the measured candidates under their keys (mask@forecaster), as a
    check measures them now, and once (no record of the checked candidate beside them); each measured candidate
    says how it was measured (from the history entry that measured it, the final entry, or the check); "fresh" is
    present and says the search makes no final choice on fresh seeds (it resumes as it was searched); "choices" are
    the profile-fitted forecasters its check chose among. Everything else stays as it was, and a file of version 5
    is read as it is."""
    old = load_state(fx.DONE)
    new = migrated(old)
    chosen, results = old["forecasters"]["mask"], old["forecasters"]["results"]
    assert new["version"] == 5 and old["version"] == 3 and "forecasters" not in new
    assert new["fresh"] == {"chooses": False, "masks": {}} and new["choices"] == ["fitted", "l2p"]
    assert list(new["masks"]) == list(old["masks"]) + [f"{chosen}@{name}" for name in results]
    origin = next(h for h in old["history"] if h["mask"] == chosen)
    for name, r in results.items():
        assert new["masks"][f"{chosen}@{name}"] == {
            "loss": r["loss"], "seconds": 0.0, "first": len(old["history"]), "per_seed": r["per_seed"],
            "kind": "check", "s": origin["s"], "method": method_of(origin), "of": chosen}
    for key, m in old["masks"].items():
        entry = next((h for h in old["history"] if h["mask"] == key), None)
        how = {"kind": entry["kind"], "s": entry["s"], "method": method_of(entry)} if entry else \
            {"kind": "final", "s": old["final"]["s"], "method": "gcache argmin mu"}
        assert new["masks"][key] == {**m, **how}
        assert entry or key == old["final"]["mask"]  # every measured candidate is a history entry or the final one
    assert new["kept"] == []  # no earlier budget's policy known
    assert {k: v for k, v in new.items() if k not in ("version", "masks", "fresh", "choices", "kept")} == \
        {k: v for k, v in old.items() if k not in ("version", "masks", "forecasters")}
    assert migrated(new) is new and load_state(fx.DONE) == old  # the file itself is left as it is


def test_a_version_4_file_is_migrated_once_and_resumes_as_the_search_it_was(profile, old_policy, tmp_path):
    """The crashed old search resumed to its end and written as version 4 (the GCache before version 5: the check's
    record apart, no "choices", its "fresh" entry absent): migrated when read, it gives the same policy again,
    sampling nothing, and a search continued from it with a larger budget goes on."""
    path = tmp_path / "v4.search.json"
    shutil.copy(fx.CRASHED, path)
    search(profile, path, fx.Evaluator())
    v5 = json.loads(path.read_text())
    v4 = json.loads(path.read_text())
    checks = {k: m for k, m in v4["masks"].items() if m["kind"] == "check"}
    v4["forecasters"] = {"mask": next(iter(checks.values()))["of"], "results": {
        k.partition("@")[2] or "fitted": {"loss": m["loss"], "per_seed": m["per_seed"]} for k, m in checks.items()}}
    for m in v4["masks"].values():
        for field in ("kind", "s", "method", "of"):
            m.pop(field, None)
    del v4["choices"], v4["fresh"]
    v4["version"] = 4
    path.write_text(json.dumps(v4))
    assert migrated(load_state(str(path))) == v5  # the same content, once migrated
    ev = fx.Evaluator()
    res = search(profile, path, ev)
    assert ev.calls == [] and json.loads(path.read_text()) == v4  # nothing sampled, nothing written
    same_policy(res.policy, old_policy)
    more = fx.Evaluator()
    res2 = run_search(profile, SearchConfig(**dict(fx.CONFIG, budget=fx.CONFIG["budget"] + 4)), more,
                      state_path=str(path), provenance=fx.PROVENANCE)
    assert more.calls and json.loads(path.read_text())["version"] == 5 and len(res2.history) == fx.CONFIG["budget"] + 4
    assert res2.policy.metrics["loss"] <= res.policy.metrics["loss"]


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
    done = without_timings(migrated(load_state(fx.DONE)))
    assert_same(without_timings(json.loads(path.read_text())), done)
    again = fx.Evaluator()  # the migrated file, written as version 4, resumes as the search it was: nothing to do
    assert search(profile, path, again).policy.to_dict() == res.policy.to_dict() and again.calls == []


def test_a_search_run_now_measures_the_old_start_masks_and_every_other_fitted_forecasters(profile, tmp_path):
    """Today: the old search's start masks with the same losses, then l2p's instant masks applied with l2p (the
    masks instant_policy gives, each measured with forecast="l2p"), then the TeaCache-like mask."""
    from gcache.search.instant import instant_policy
    path = tmp_path / "new.search.json"
    ev = fx.Evaluator()
    search(profile, path, ev)
    new, old = json.loads(path.read_text()), load_state(fx.DONE)
    assert new["version"] == 5 and old["version"] == 3
    own = [h for h in old["history"] if h["kind"] == "instant" and h["method"] != "teacache"]
    l2p = [h for h in new["history"] if h["kind"] == "instant" and "_l2p" in h["method"]]
    assert [without_timings(h) for h in new["history"][:len(own)]] == [without_timings(h) for h in own]
    assert new["history"][len(own):len(own) + len(l2p)] == l2p and l2p
    assert new["starts"] == old["starts"][:-1] + [h["method"] for h in l2p] + ["teacache"]
    k = fx.CONFIG["k"]
    for h in l2p:
        method, _, model = h["method"].partition("_dp_l2p")
        mask = instant_policy(profile, k, method, forecast="l2p", error_model=model.lstrip("_") or "mean_abs").mask
        assert h["mask"] == "".join(map(str, mask)) + "@l2p"
        assert h["reused"] or ("".join(map(str, mask)), "l2p") in ev.calls
    teacache = next(h for h in new["history"] if h["method" if "method" in h else "kind"] == "teacache")
    assert teacache["mask"] == next(h for h in old["history"] if h.get("method") == "teacache")["mask"]
