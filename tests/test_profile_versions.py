"""Profile format 2 (how E was computed is in the file), version-1 files, which may hold a squared E, and a format-2
file written before profile statistics were declared (core/profile_stats)."""
import json
import pathlib
import subprocess

import numpy as np
import profile_fixture
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from gcache.core.errors import GCacheError
from gcache.core.profile import E_DEFINITION, PROFILE_VERSION, Profile
from gcache.core.recorder import ProfileRecorder
from gcache.search.config import SearchConfig
from gcache.search.instant import choose_forecaster, instant_policy
from gcache.search.loop import run_search

TIMES = [1.0, 0.8, 0.6, 0.4, 0.2]


def recorded(forecast: bool, dtype=torch.float32, seed=0) -> Profile:
    g = torch.Generator().manual_seed(seed)
    rec = ProfileRecorder(TIMES, meta={"model": "m"}, forecast=forecast)
    for j in range(len(TIMES)):
        rec.record(j, "c", torch.randn(1, 4, 6, generator=g).to(dtype), torch.randn(1, 4, 6, generator=g).to(dtype))
    return rec.finish()


def version1_bytes(p: Profile, squared: bool = True) -> bytes:
    """The file a version-1 GCache wrote for this profile: no e_definition, no residual_dtype, and (forecast
    recording on, float32) E holding the mean squared differences, which its fold statistics give."""
    tensors = {k: torch.from_numpy(np.ascontiguousarray(getattr(p, k), dtype=np.float64))
               for k in ("e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "times", "sigmas",
                         "e1_sum", "fit_sq_sum", "fit_cross_sum") if getattr(p, k) is not None}
    if squared and p.fit_sq_sum is not None:
        tensors["e_sum"] = torch.from_numpy(p.fit_sq_sum.mean(axis=-1))
    meta = {k: v for k, v in p.meta.items() if k != "residual_dtype"}
    return st_save(tensors, metadata={"format": "gcache.profile", "version": "1", "n_steps": str(p.n_steps),
                                      "count": str(p.count), "meta": json.dumps(meta)})


def test_format_2_records_how_E_was_computed():
    p = recorded(True, torch.bfloat16)
    data = p.to_bytes()
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    assert header["version"] == str(PROFILE_VERSION) == "2" and header["e_definition"] == str(E_DEFINITION) == "2"
    q = Profile.from_bytes(data)
    assert q.e_definition == 2 and q.meta["residual_dtype"] == "bfloat16" and q.defect is None
    assert recorded(False).meta["residual_dtype"] == "float32"


def test_a_version_1_profile_with_forecast_statistics_has_a_defect_that_survives_saving():
    old = Profile.from_bytes(version1_bytes(recorded(True)))
    assert old.e_definition == 1 and "squared" in old.defect and "format 2" in old.defect
    again = Profile.from_bytes(old.to_bytes())  # written by this GCache (format 2): still E definition 1
    assert again.e_definition == 1 and again.defect == old.defect
    clean_old = Profile.from_bytes(version1_bytes(recorded(False)))  # no forecast recording: E was |δ_i − δ_j|
    assert clean_old.e_definition == 1 and clean_old.defect is None


def test_nothing_builds_a_mask_from_a_defective_profile():
    old = Profile.from_bytes(version1_bytes(recorded(True)))
    for build in (lambda: instant_policy(old, 2, "theory"), lambda: instant_policy(old, 3, "local", forecast="linear"),
                  lambda: choose_forecaster(old, 2),
                  lambda: run_search(old, SearchConfig(k=2, budget=20), lambda m: 0.0)):
        with pytest.raises(GCacheError, match="can't use this profile.*squared.*Profile again"):
            build()


def test_merging_a_defective_profile_with_a_clean_one_is_refused():
    old = Profile.from_bytes(version1_bytes(recorded(True)))
    new = recorded(True, seed=1)
    for a, b in ((old, new), (new, old)):
        with pytest.raises(GCacheError, match="Cannot merge a profile with a defect.*Delete or rename"):
            a.merge(b)
    both_old = old.merge(Profile.from_bytes(version1_bytes(recorded(True, seed=2))))
    assert both_old.defect and both_old.e_definition == 1 and both_old.count == 2
    # a clean version-1 profile (no forecast statistics) merges with new runs; the result says E definition 1
    mixed = Profile.from_bytes(version1_bytes(recorded(False))).merge(recorded(False, seed=3))
    assert mixed.defect is None and mixed.e_definition == 1 and mixed.meta["residual_dtype"] == "float32"
    # an empty profile takes the other's definition
    assert Profile.empty(TIMES).merge(old).defect and Profile.empty(TIMES).merge(new).e_definition == 2


def test_residual_dtypes_of_merged_profiles_are_all_listed():
    merged = recorded(False, torch.float16).merge(recorded(False, torch.bfloat16)).merge(recorded(False))
    assert merged.meta["residual_dtype"] == "bfloat16,float16,float32"


def test_format_2_files_without_or_with_a_bad_e_definition_are_refused():
    good = recorded(False).to_bytes()
    tensors = st_load(good)
    header = json.loads(good[8:8 + int.from_bytes(good[:8], "little")])["__metadata__"]
    missing = dict(header)
    missing.pop("e_definition")
    with pytest.raises(GCacheError, match="damaged"):
        Profile.from_bytes(st_save(tensors, metadata=missing))
    for bad in ("3", "0"):
        with pytest.raises(GCacheError, match="inconsistent"):
            Profile.from_bytes(st_save(tensors, metadata=dict(header, e_definition=bad)))


def test_a_dtype_change_mid_run_restarts_the_branch(caplog):
    rec = ProfileRecorder([1.0, 0.5])
    rec.record(0, "c", torch.zeros(1, 2, 2), torch.ones(1, 2, 2))
    with caplog.at_level("WARNING", logger="gcache"):
        rec.record(1, "c", torch.zeros(1, 2, 2, dtype=torch.bfloat16), torch.ones(1, 2, 2, dtype=torch.bfloat16))
    assert "restarting" in caplog.text and rec.finish().count == 0  # step 0 of the new history is missing


# ------------------------------------------------------------------------------------------ written before statistics
FIXTURE = pathlib.Path(__file__).parent / "data" / "profile_v2_forecast.safetensors"
WRITTEN_BY = "2656f64"  # the commit whose GCache wrote FIXTURE (tests/profile_fixture.py)


def _header(data: bytes) -> dict:
    return json.loads(data[8:8 + int.from_bytes(data[:8], "little")])


def test_a_profile_written_before_statistics_were_declared_loads_to_the_same_tensors():
    data = FIXTURE.read_bytes()
    raw = st_load(data)
    p = Profile.from_bytes(data)
    assert {"e1_sum", "fit_sq_sum", "fit_cross_sum", "gram_sum"} <= set(raw) and set(p.sums) == set(raw) - {
        "e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "times", "sigmas"}
    for name, t in raw.items():
        assert np.array_equal(getattr(p, name), t.numpy()), name
    meta = _header(data)["__metadata__"]
    assert (p.n_steps, p.count, p.e_definition) == (6, 4, 2) and p.meta == json.loads(meta["meta"])
    assert p.has("e1") and p.has("fit") and p.has("gram") and p.defect is None
    # written again by this GCache: the same tensors, byte for byte, and the same metadata (safetensors orders the
    # metadata's keys as it likes, so the file's bytes may differ)
    again = p.to_bytes()
    assert _header(again) == _header(data)
    new, old = st_load(again), raw
    assert set(new) == set(old) and all(new[k].dtype == torch.float64 and torch.equal(new[k], old[k]) for k in old)
    # its views are what they were: E1, α, the Gram weights
    assert np.array_equal(p.E1, raw["e1_sum"].numpy() / 4)
    assert np.array_equal(p.fit_stats().alpha(), Profile.from_bytes(again).fit_stats().alpha())


def test_the_same_runs_recorded_now_give_the_fixtures_numbers():
    """tests/profile_fixture.py's runs (float32, and bfloat16 sampled and chunked), recorded by this GCache: the
    numbers the GCache before declared statistics wrote (bit for bit on the machine that wrote them; float32 sums
    may round differently on another CPU)."""
    raw = st_load(FIXTURE.read_bytes())
    fresh = profile_fixture.record(ProfileRecorder)
    assert set(fresh.sums) | {"e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "times", "sigmas"} == set(raw)
    for name, t in raw.items():
        want = t.numpy()
        assert np.allclose(getattr(fresh, name), want, rtol=1e-6, atol=1e-9 * np.abs(want).max()), name
    assert fresh.meta == Profile.from_bytes(FIXTURE.read_bytes()).meta


def test_the_gcache_that_wrote_the_fixture_reads_what_this_one_writes():
    """core/ at WRITTEN_BY, loaded from git as a package of its own (bench/recorder.py's loader), reads this GCache's
    file of the fixture's runs to the same arrays."""
    from gcache.bench import recorder as bench
    known = subprocess.run(["git", "-C", bench.REPO, "cat-file", "-e", f"{WRITTEN_BY}^{{commit}}"],
                           capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"needs a git checkout that holds commit {WRITTEN_BY}")
    old = bench.profile_module_at(WRITTEN_BY)
    p = profile_fixture.record(ProfileRecorder)
    q = old.Profile.from_bytes(p.to_bytes())
    assert q.count == p.count and q.meta == p.meta and q.has_fit_stats()
    for name in ("e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "times", "sigmas", "e1_sum", "fit_sq_sum",
                 "fit_cross_sum", "gram_sum"):
        assert np.array_equal(getattr(q, name), getattr(p, name)), name
