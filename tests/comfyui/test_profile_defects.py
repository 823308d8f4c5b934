"""Profiles made by a GCache before profile format 2 with forecast recording on may hold a squared E: inside real
ComfyUI, GCache Apply (auto) sets them aside and profiles again (and rebuilds its older policies), GCache Policy and
GCache Search refuse them, GCache Load Profile warns, GCache Profile does not add runs to them."""
import json
import os

import numpy as np
import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import folder_paths  # noqa: E402
import tiny_models as tm  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save as st_save  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from gcache.core.errors import GCacheError  # noqa: E402
from gcache.core.policy import Policy  # noqa: E402
from gcache.core.profile import Profile  # noqa: E402
from gcache.nodes.apply_node import GCacheApply  # noqa: E402
from gcache.nodes.modes.auto import AUTO_VERSION  # noqa: E402
from gcache.nodes.policy_node import GCachePolicy  # noqa: E402
from gcache.nodes.profile_node import GCacheLoadProfile, GCacheProfile  # noqa: E402
from gcache.nodes.search_jobs import job as search_job  # noqa: E402
from gcache.nodes.search_node import GCacheSearch  # noqa: E402

N = 6


@pytest.fixture(scope="module")
def flux():
    return tm.flux()


def ksample(model, pos, neg, lat, cfg=3.0):
    return comfy_nodes.common_ksampler(model, 0, N, cfg, "euler", "simple", pos, neg, {"samples": lat})[0]["samples"]


def version1_bytes(p: Profile) -> bytes:
    """The file a version-1 GCache wrote for this profile (no e_definition; E the mean squared differences, as its
    float32 recorder stored them with forecast recording on)."""
    tensors = {k: torch.from_numpy(np.ascontiguousarray(getattr(p, k), dtype=np.float64))
               for k in ("e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "times", "sigmas",
                         "e1_sum", "fit_sq_sum", "fit_cross_sum") if getattr(p, k) is not None}
    if p.fit_sq_sum is not None:
        tensors["e_sum"] = torch.from_numpy(p.fit_sq_sum.mean(axis=-1))
    meta = {k: v for k, v in p.meta.items() if k != "residual_dtype"}
    return st_save(tensors, metadata={"format": "gcache.profile", "version": "1", "n_steps": str(p.n_steps),
                                      "count": str(p.count), "meta": json.dumps(meta)})




def auto_files(folder):
    pol = next(p for p in folder.iterdir() if p.suffix == ".json" and p.name.startswith("auto_"))
    prof = next(p for p in folder.iterdir() if p.name.endswith("steps_simple.profile.safetensors"))
    return pol, prof


def make_old(pol_path, prof_path, version=2):
    """Turn auto's files into what an older auto left: a version-1 forecast profile and an auto-`version` policy."""
    prof_path.write_bytes(version1_bytes(Profile.load(str(prof_path))))
    data = json.loads(pol_path.read_text())
    data["provenance"]["auto"]["version"] = version
    pol_path.write_text(json.dumps(data))


def defective(flux, folder) -> Profile:
    """A version-1 forecast profile of the tiny Flux (recorded by auto, rewritten as the old GCache wrote it)."""
    m, pos, neg, lat = flux
    ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat)
    _, prof = auto_files(folder)
    old = Profile.from_bytes(version1_bytes(Profile.load(str(prof))))
    assert old.defect
    return old


def test_auto_sets_a_defective_profile_aside_profiles_again_and_rebuilds_its_policy(flux, gcache_dir, caplog):
    m, pos, neg, lat = flux
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0]
    ksample(model, pos, neg, lat)
    pol_path, prof_path = auto_files(gcache_dir)
    assert Policy.load(str(pol_path)).provenance["auto"]["version"] == AUTO_VERSION
    assert Profile.load(str(prof_path)).defect is None
    make_old(pol_path, prof_path)
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        out = ksample(model, pos, neg, lat)
    assert runs.n == N  # profiled again: every step computed
    assert torch.equal(out, ksample(m, pos, neg, lat))
    assert "squared" in caplog.text and "defective-1" in caplog.text
    assert f"{pol_path.name} was built from that profile and is not applied; no policy for this model, 6 steps and " \
        "2x yet: this run computes every step and profiles it" in caplog.text
    side = next(p for p in gcache_dir.iterdir() if ".defective-1." in p.name)
    assert Profile.load(str(side)).defect  # the user's file is kept, beside
    fresh = Profile.load(str(prof_path))
    assert fresh.defect is None and fresh.e_definition == 2 and fresh.count == 2
    pol = Policy.load(str(pol_path))
    assert pol.provenance["auto"]["version"] == AUTO_VERSION and pol.n_computed < N
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        ksample(model, pos, neg, lat)
    assert runs.n == pol.n_computed and f"applying {pol_path.name}" in caplog.text


def test_auto_rebuilds_an_older_policy_from_a_clean_profile_and_profiles_again_without_one(flux, gcache_dir, caplog):
    m, pos, neg, lat = flux
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0]
    ksample(model, pos, neg, lat)
    pol_path, prof_path = auto_files(gcache_dir)
    data = json.loads(pol_path.read_text())
    data["provenance"]["auto"]["version"] = 2
    pol_path.write_text(json.dumps(data))
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        ksample(model, pos, neg, lat)
    assert f"rebuilt {pol_path.name}, made by an older auto (version 2)" in caplog.text and runs.n < N
    assert Policy.load(str(pol_path)).provenance["auto"]["version"] == AUTO_VERSION
    # an auto-version-2 policy whose profile is gone can't be checked: profiled again, not applied
    pol_path.write_text(json.dumps(data))
    prof_path.unlink()
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        ksample(model, pos, neg, lat)
    assert runs.n == N and "that profile is gone: it is not applied; no policy for this model, 6 steps and 2x " \
        "yet: this run computes every step and profiles it" in caplog.text
    assert Policy.load(str(pol_path)).provenance["auto"]["version"] == AUTO_VERSION


def test_policy_node_refuses_a_defective_profile(flux, gcache_dir):
    old = defective(flux, gcache_dir)
    with pytest.raises(GCacheError, match="GCache Policy can't use this profile.*squared.*Profile again"):
        GCachePolicy.execute(old, "K", 2.0, 3, "theory", "", "")


def test_search_refuses_a_connected_defective_profile_before_sampling(flux, gcache_dir, monkeypatch):
    from gcache_test_pack import FakeVAE
    old = defective(flux, gcache_dir)
    m, pos, neg, lat = flux

    def no_sampling(*a, **k):
        raise AssertionError("GCache Search sampled with a defective profile connected")
    monkeypatch.setattr(search_job, "sample", no_sampling)
    with pytest.raises(GCacheError, match="can't use the connected profile.*squared.*Profile again"):
        GCacheSearch.execute(m, pos, neg, {"samples": lat}, FakeVAE(), 0, 1, N, 1.0, "euler", "simple", 3, 30, 2,
                             "ssim", "s_defect", profile=old)
    assert not (gcache_dir / "s_defect.search.json").exists()


def test_load_profile_warns_and_profile_node_refuses_to_add_to_a_defective_file(flux, gcache_dir, caplog):
    old = defective(flux, gcache_dir)
    (gcache_dir / "legacy.profile.safetensors").write_bytes(version1_bytes(old))
    folder_paths.filename_list_cache.clear()
    with caplog.at_level("WARNING", logger="gcache"):
        prof, image = GCacheLoadProfile.execute("legacy").result
    assert prof.defect and "GCache Load Profile: legacy" in caplog.text and "profile again" in caplog.text
    assert image.shape[-1] == 3
    before = (gcache_dir / "legacy.profile.safetensors").read_bytes()
    with pytest.raises(GCacheError, match="legacy.profile.safetensors.*squared.*delete or rename"):
        GCacheProfile.execute(flux[0], "legacy", "model device", True)
    assert (gcache_dir / "legacy.profile.safetensors").read_bytes() == before
    assert os.path.isfile(str(gcache_dir / "legacy.profile.safetensors"))
