"""Policy artifact: validation, JSON round-trip, remap, speed-up prediction, safe files."""
import json
import os

import pytest

from gcache.core.errors import GCacheError
from gcache.core.files import safe_name
from gcache.core.policy import Policy, check_budget, few_computed, predicted_speedup


def make(n=10):
    return Policy(mask=[1, 0, 1, 0, 0, 1, 0, 1, 0, 0][:n], times=[1 - i / n for i in range(n)], method="test",
                  provenance={"s": [1.0, 2.0]}, metrics={"loss": 0.25})


def test_round_trip(tmp_path):
    p = make()
    path = tmp_path / "p.json"
    p.save(str(path))
    q = Policy.load(str(path))
    assert q.to_dict() == p.to_dict() and q.n_computed == 4 and q.n_steps == 10
    assert json.loads(path.read_text())["format"] == "gcache.policy"


@pytest.mark.parametrize("mask,msg", [([0, 1, 1], "first step"), ([], "empty"), ([1, 2, 0], "only hold")])
def test_bad_masks(mask, msg):
    with pytest.raises(GCacheError, match=msg):
        Policy(mask=mask)


def test_times_length_must_match():
    with pytest.raises(GCacheError, match="must match"):
        Policy(mask=[1, 0, 1], times=[1.0, 0.5])


@pytest.mark.parametrize("k", [0, 11, -1])
def test_budget_out_of_range(k):
    with pytest.raises(GCacheError, match=r"outside \[1, 10\]"):
        check_budget(k, 10)


def test_predicted_speedup():
    assert predicted_speedup(10, 5, 0.0) == 2.0
    assert predicted_speedup(10, 10, 0.3) == 1.0
    assert make().predicted_speedup(0.1) == pytest.approx(10 / (4 + 6 * 0.1))
    with pytest.raises(GCacheError):
        predicted_speedup(10, 5, 1.5)


def test_remap_keeps_shape_and_budget():
    p = Policy.from_steps(30, [0, 1, 2, 5, 10, 20, 29])
    q = p.remap(60)
    assert q.n_steps == 60 and q.n_computed == 14 and q.mask[0] == 1
    r = p.remap(15)
    assert r.n_steps == 15 and r.n_computed == 4 and r.mask[0] == 1  # round(7 * 15 / 30)
    # Same N: the policy maps onto itself.
    assert p.remap(30).mask == p.mask
    # Early-heavy stays early-heavy.
    assert sum(q.mask[:12]) >= 4


def test_remap_to_one_step():
    assert Policy.from_steps(8, [0, 4]).remap(1).mask == [1]


def test_truncated_file_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "p.json"
    make().save(str(path))
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    before = path.read_bytes()
    with pytest.raises(GCacheError, match="not valid JSON"):
        Policy.load(str(path))
    assert path.read_bytes() == before


def test_hand_edited_inconsistent_file(tmp_path):
    d = make().to_dict()
    d["k"] = 7
    with pytest.raises(GCacheError, match="edited inconsistently"):
        Policy.from_dict(d)
    d = make().to_dict()
    d["mask"][0] = 0
    with pytest.raises(GCacheError, match="first step"):
        Policy.from_dict(d)


def test_unknown_version_and_foreign_file():
    d = make().to_dict()
    d["version"] = 99
    with pytest.raises(GCacheError, match="version 99"):
        Policy.from_dict(d)
    with pytest.raises(GCacheError, match="not a GCache policy"):
        Policy.from_dict({"nodes": []})


def test_failed_save_keeps_old_file(tmp_path):
    path = tmp_path / "p.json"
    make().save(str(path))
    before = path.read_bytes()
    bad = make()
    bad.metrics["loss"] = float("nan")  # JSON cannot hold NaN: the save must fail without touching the file
    with pytest.raises(ValueError):
        bad.save(str(path))
    assert path.read_bytes() == before
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []


@pytest.mark.parametrize("name", ["../evil", "a/b", "a\\b", "..", "", "   ", "x" * 200, "bad\x00name"])
def test_unsafe_names_are_refused(name):
    with pytest.raises(GCacheError):
        safe_name(name)


def test_safe_names_pass():
    assert safe_name("flux dev_30-steps.v2") == "flux dev_30-steps.v2"


def test_binary_file_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(GCacheError, match="not a text file"):
        Policy.load(str(path))


def test_saved_files_get_normal_permissions(tmp_path):
    path = tmp_path / "p.json"
    make().save(str(path))
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    os.chmod(path, 0o640)
    make().save(str(path))
    assert path.stat().st_mode & 0o777 == 0o640


def test_for_mask_is_the_policy_of_a_profile_a_mask_and_a_forecaster():
    import torch

    from gcache.core import forecasters
    from gcache.core.recorder import ProfileRecorder
    n = 6
    g = torch.Generator().manual_seed(0)
    rec = ProfileRecorder([1 - j / n for j in range(n)], [2 * (1 - j / n) for j in range(n)], forecast=True)
    for j in range(n):
        rec.record(j, "all", torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g) + j)
    prof = rec.finish()
    mask = [1, 1, 0, 1, 0, 0]
    pol = Policy.for_mask(prof, mask, "fitted", method="m", metrics={"loss": 1.0})
    assert pol.mask == mask and pol.times == [1 - j / n for j in range(n)] and pol.sigmas == [2 * t for t in pol.times]
    alpha = prof.fit_stats().alpha()
    assert pol.forecast == "fitted" and pol.forecast_params == forecasters.get("fitted").fit(prof, mask)
    assert pol.forecast_params["alpha"]["4"] == [1, 3, round(float(alpha[1, 3, 4]), 6)]  # the last two computed steps
    assert pol.method == "m" and pol.metrics == {"loss": 1.0}
    assert Policy.for_mask(prof, mask).forecast == "reuse" and Policy.for_mask(prof, mask).forecast_params == {}


def test_few_computed_notes_only_k_of_two_or_less_and_counts_steps_in_words():
    assert few_computed(30, 3) is None and few_computed(2, 2) is None  # K = N: nothing is cached
    one, two = few_computed(4, 1), few_computed(4, 2)
    assert "only K = 1 of 4 steps" in one and "simply sampling 1 step (" in one
    assert "only K = 2 of 4 steps" in two and "simply sampling 2 steps (" in two
