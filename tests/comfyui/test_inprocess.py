"""GCache inside real ComfyUI code (in-process): samplers, splits, remaps, isolation, the nodes' files.

Families built here: Flux and Lumina2 (from their classes; Lumina2 exercises the object-patch route), Wan 2.1
and HunyuanVideo (tiny safetensors through comfy.sd.load_diffusion_model, the stock UNETLoader path). The
per-family checks of every family (the residual contract, K block runs, Profile's E) are in
test_family_matrix.py.
"""

import os

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import comfy.model_management  # noqa: E402
import folder_paths  # noqa: E402
import tiny_models as tm  # noqa: E402
import torch  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from gcache.core.errors import GCacheError  # noqa: E402
from gcache.core.policy import Policy  # noqa: E402
from gcache.core.profile import Profile  # noqa: E402
from gcache.nodes.apply_node import GCacheApply  # noqa: E402
from gcache.nodes.modes import apply as apply_mode  # noqa: E402
from gcache.nodes.modes import profile as profile_mode
from gcache.nodes.patching import hooks  # noqa: E402
from gcache.nodes.search_jobs import job as search_job  # noqa: E402
from gcache.nodes.search_node import GCacheSearch  # noqa: E402

FAMILIES = ["flux", "wan", "hunyuan_video", "lumina2"]
# a module that runs only when the first block really computes (object-patched blocks are still called)
FIRST_BLOCK = {"flux": "double_blocks.0", "wan": "blocks.0", "hunyuan_video": "double_blocks.0",
               "lumina2": "layers.0.attention"}
N = 6


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("unets"))
    out = {"flux": tm.flux(), "wan": tm.wan(d), "hunyuan_video": tm.hunyuan_video(d), "lumina2": tm.lumina2()}
    return out


def ksample(model, pos, neg, lat, steps=N, cfg=1.0, sampler="euler", seed=0, **kw):
    return comfy_nodes.common_ksampler(model, seed, steps, cfg, sampler, "simple", pos, neg, {"samples": lat},
                                       **kw)[0]["samples"]


class BlockCounter:
    """Counts forward calls of the first block of the stack (and the batch each saw)."""

    def __init__(self, model, family):
        block = model.get_model_object("diffusion_model").get_submodule(FIRST_BLOCK[family])
        self.batches = []
        self.h = block.register_forward_pre_hook(lambda m, a, kw: self.batches.append(
            (a[0] if a else next(iter(kw.values()))).shape[0]), with_kwargs=True)

    def __enter__(self):
        return self

    def __exit__(self, *e):
        self.h.remove()


def apply(model, mask, **kw):
    return hooks.patch_model(model, apply_mode.apply_config(model, Policy(list(mask)), **kw))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sampler", ["euler", "heun"])
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_all_ones_is_bit_identical(built, family, sampler, cfg):
    m, pos, neg, lat = built[family]
    plain = ksample(m, pos, neg, lat, cfg=cfg, sampler=sampler)
    fast = ksample(apply(m, [1] * N), pos, neg, lat, cfg=cfg, sampler=sampler)
    assert torch.equal(plain, fast)


@pytest.mark.parametrize("family", FAMILIES)
def test_heun_skips_whole_steps(built, family):
    m, pos, neg, lat = built[family]
    with BlockCounter(m, family) as full:
        ksample(m, pos, neg, lat, sampler="heun")
    with BlockCounter(m, family) as c:
        out = ksample(apply(m, [1, 0, 1, 0, 1, 0]), pos, neg, lat, sampler="heun")
    assert 0 < len(c.batches) < len(full.batches) and torch.isfinite(out).all()


def test_other_step_count_remaps_or_refuses(built):
    m, pos, neg, lat = built["flux"]
    with BlockCounter(m, "flux") as c:
        ksample(apply(m, [1, 0, 1, 0, 1, 0]), pos, neg, lat, steps=12)
    assert len(c.batches) == 6
    with pytest.raises(GCacheError, match="made for 6 sampler steps"):
        ksample(apply(m, [1, 0, 1, 0, 1, 0], on_mismatch="error"), pos, neg, lat, steps=12)


def test_two_patched_models_share_nothing(built):
    m, pos, neg, lat = built["flux"]
    a, b = apply(m, [1, 0, 0, 0, 0, 0]), apply(m, [1, 1, 1, 1, 1, 0])
    assert hooks.config_of(a).owner != hooks.config_of(b).owner
    with BlockCounter(m, "flux") as c:
        ksample(a, pos, neg, lat)
        ksample(b, pos, neg, lat)
        ksample(m, pos, neg, lat)
    assert len(c.batches) == 1 + 5 + N
    assert not hasattr(m.get_model_object("diffusion_model"), "gcache")


def test_apply_node_with_saved_policy_file(built, gcache_dir):
    m, pos, neg, lat = built["flux"]
    Policy([1, 0, 1, 0, 1, 0]).save(str(gcache_dir / "p.json"))
    folder_paths.filename_list_cache.clear()
    model = GCacheApply.execute(m, "p.json", "cpu", "remap").result[0]
    with BlockCounter(m, "flux") as c:
        ksample(model, pos, neg, lat)
    assert len(c.batches) == 3
    with pytest.raises(GCacheError):
        GCacheApply.execute(m, "../p.json", "cpu", "remap")


def test_search_finishes_tiny_budget_and_resumes_after_interrupt(built, gcache_dir, monkeypatch):
    from gcache_test_pack import FakeVAE
    m, pos, neg, lat = built["flux"]
    args = (m, pos, neg, {"samples": lat}, FakeVAE(), 0, 1, 8, 1.0, "euler", "simple", 3, 12, 2, "ssim", "s1")
    calls = {"n": 0}
    real = search_job.sample

    def interrupting(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:  # reference run + 1 evaluation, then the user presses Interrupt
            comfy.model_management.interrupt_current_processing(True)
        return real(*a, **kw)

    monkeypatch.setattr(search_job, "sample", interrupting)
    with pytest.raises(comfy.model_management.InterruptProcessingException):
        GCacheSearch.execute(*args)
    import json
    state = json.loads((gcache_dir / "s1.search.json").read_text())
    assert len(state["masks"]) == 1 and not state["done"]
    calls["n"] = -100
    out = GCacheSearch.execute(*args)
    policy, image = out.result
    assert policy.n_steps == 8 and policy.n_computed == 3 and image.shape[-1] == 3
    state = json.loads((gcache_dir / "s1.search.json").read_text())
    assert state["done"] and len(state["history"]) == 12
    assert Policy.load(str(gcache_dir / "s1.json")).mask == policy.mask
    assert len(state["masks"]) > 1
    assert calls["n"] - (-100) == 1 + len(state["masks"]) - 1  # resumed: the earlier mask is not sampled again


def test_the_search_nodes_inputs_state_the_numbers_the_search_computes():
    """The budget tooltip's start masks and least budgets come from search/budget.py; K must stay below steps."""
    from gcache.search.budget import minimum_budgets, start_range
    inputs = {i.id: i for i in GCacheSearch.define_schema().inputs}
    tip = inputs["budget"].tooltip
    least, (fewest, most) = minimum_budgets(3), start_range()
    assert f"{fewest} to {most})" in tip and f"at least {least['reuse']} for degree 3 ({least['forecasting']} when " \
        "forecasting" in tip
    assert "K < steps" in inputs["k"].tooltip
    # the seeds the paired rules need by default (2: the halves need two); the tooltip says what one seed skips
    assert inputs["seeds"].default == 2 and "1 seed the polish guard, the forecaster check and that final choice " \
        "decide by a lower mean loss" in inputs["seeds"].tooltip


def test_k_equal_to_steps_is_refused_before_any_sampling(built, gcache_dir, monkeypatch):
    from gcache_test_pack import FakeVAE
    m, pos, neg, lat = built["flux"]
    monkeypatch.setattr(search_job, "sample", lambda *a, **kw: pytest.fail("sampled"))
    for k in (8, 9):
        with pytest.raises(GCacheError, match=f"K = {k}"):
            GCacheSearch.execute(m, pos, neg, {"samples": lat}, FakeVAE(), 0, 1, 8, 1.0, "euler", "simple", k, 40, 2,
                                 "ssim", f"keq{k}")
    assert not (gcache_dir / "keq8.search.json").exists()


def test_a_fitted_search_measures_l2p_too_in_comfyui(built, gcache_dir, caplog):
    """GCache Search with the profile-fitted forecaster: its reference runs record the forecast statistics, the
    search's evaluate applies l2p to l2p's start masks and to the best masks under the other forecaster (the
    forecaster check), the finalists are sampled on fresh seeds and the saved policy is the lowest loss there, and
    GCache Apply runs the saved policy."""
    import json

    from gcache_test_pack import FakeVAE
    m, pos, neg, lat = built["flux"]
    args = (m, pos, neg, {"samples": lat}, FakeVAE(), 0, 2, 8, 1.0, "euler", "simple", 3, 20, 1, "ssim", "fc1", None,
            "fitted (profile)")
    with caplog.at_level("INFO", logger="gcache"):
        policy = GCacheSearch.execute(*args).result[0]
    state = json.loads((gcache_dir / "fc1.search.json").read_text())
    bits = "".join(map(str, policy.mask))
    key = bits if policy.forecast == "fitted" else f"{bits}@{policy.forecast}"
    assert state["done"] and state["version"] == 5 and any(h["mask"].endswith("@l2p") for h in state["history"])
    choices = set(state["choices"])  # every forecaster the end game chooses among (fixed rules too)
    assert {"fitted", "l2p", "reuse", "linear"} <= choices
    checks = {k: r for k, r in state["masks"].items() if r["kind"] == "check"}  # the check ran, once
    checked = {r["of"] for r in checks.values()}.pop()  # its candidate, measured under the other forecasters
    same_mask = {k.partition("@")[2] or "fitted" for k in state["masks"] if k.partition("@")[0] ==
                 checked.partition("@")[0]}
    assert checks and same_mask == choices and all(len(r["per_seed"]) == 2 for r in checks.values())
    assert "8 steps; forecast l2p, 4 residuals kept per branch" in caplog.text  # sampled under l2p
    assert policy.forecast in choices and policy.metrics["loss"] == state["masks"][key]["loss"]
    # the final choice on fresh seeds: seeds 2 and 3 (seed 0, 2 seeds), full-compute images first, 2 or 3 finalists
    fresh = state["fresh"]["masks"]
    assert "full-compute images of 2 fresh seeds (2, 3)" in caplog.text and 2 <= len(fresh) <= len(choices) + 1
    assert all(len(r["per_seed"]) == 2 for r in fresh.values())
    assert key in fresh and fresh[key]["loss"] == min(r["loss"] for r in fresh.values())
    assert {k.partition("@")[2] or "fitted" for k in fresh} == choices  # each forecaster's best
    prov = policy.provenance["fresh_seeds"]
    assert prov["seeds"] == 2 and set(prov["losses"]) == set(fresh)
    if not prov["replaced"]:  # the check's pick: the lowest loss on the search seeds of its candidates
        assert checked.partition("@")[0] == bits
        assert policy.metrics["loss"] <= min(h["loss"] for h in state["history"] if h["kind"] == "instant")
    saved = Policy.load(str(gcache_dir / "fc1.json"))
    assert saved.forecast == policy.forecast and saved.forecast_params == policy.forecast_params
    folder_paths.filename_list_cache.clear()
    with BlockCounter(m, "flux") as c:
        ksample(GCacheApply.execute(m, "fc1.json", "cpu", "remap").result[0], pos, neg, lat, steps=8)
    assert len(c.batches) == 3


def test_conds_in_separate_calls_keep_separate_caches(built, monkeypatch):
    """ConditioningCombine of two prompts with different token lengths: ComfyUI runs them in separate model
    calls; each must reuse its own residual on skipped steps, not the other prompt's."""
    from gcache.core import engine
    m, pos, neg, lat = built["flux"]
    g = torch.Generator().manual_seed(9)
    other = [[torch.randn(1, pos[0][0].shape[1] + 3, pos[0][0].shape[2], generator=g),
              {k: torch.randn(v.shape, generator=g) if torch.is_tensor(v) else v for k, v in pos[0][1].items()}]]
    seen = []
    original = engine.ResidualCache.enter

    def spy(self, h, branches=("all",)):
        compute = original(self, h, branches)
        seen.append((self.step, tuple(branches), compute))
        return compute
    monkeypatch.setattr(engine.ResidualCache, "enter", spy)
    ksample(apply(m, [1, 0, 1, 0, 0, 1]), pos + other, neg, lat)
    by_step: dict = {}
    for step, keys, compute in seen:
        by_step.setdefault(step, []).append(keys)
    assert all(len(calls) == 2 for calls in by_step.values())       # really two calls per step
    assert all(calls[0] != calls[1] for calls in by_step.values())  # ... with two caches
    assert not any(compute for step, _, compute in seen if step in (1, 3, 4))  # and the skips still happen


def test_denoise_below_one_uses_the_runs_own_steps(built, tmp_path, monkeypatch):
    """KSampler denoise < 1 samples the tail of a longer schedule; Profile records it and Apply follows the
    policy over the run's own N steps (not a remap onto the longer schedule)."""
    from gcache.core import engine
    m, pos, neg, lat = built["flux"]
    path = str(tmp_path / "dn.profile.safetensors")
    ksample(hooks.patch_model(m, profile_mode.profile_config(m, path)), pos, neg, lat, denoise=0.5)
    assert Profile.load(path).n_steps == N
    stats = []
    original = engine.ResidualCache.close
    monkeypatch.setattr(engine.ResidualCache, "close", lambda self: stats.append(original(self)) or stats[-1])
    ksample(apply(m, [1, 0, 1, 0, 1, 0]), pos, neg, lat, denoise=0.5)
    assert (stats[-1].computed_steps, stats[-1].skipped_steps) == (3, 3)


# ------------------------------------------------------------------------------------------- reliability
def _damage(path):
    with open(path, "wb") as f:
        f.write(b"\x00" * 40)


def test_damaged_profile_file_stops_before_sampling(built, gcache_dir):
    from gcache.nodes.profile_node import GCacheProfile
    m = built["flux"][0]
    _damage(gcache_dir / "bad.profile.safetensors")
    with pytest.raises(GCacheError, match="damaged|truncated"):
        GCacheProfile.execute(m, "bad", "model device")


def test_profile_file_damaged_during_sampling_keeps_the_image_and_the_run(built, tmp_path, monkeypatch, caplog):
    from gcache.core import recorder as core_recorder
    m, pos, neg, lat = built["flux"]
    path = tmp_path / "x.profile.safetensors"
    real_finish = core_recorder.ProfileRecorder.finish

    def finish_after_damage(self):
        _damage(path)  # another process or a full disk wrote the file while we sampled
        return real_finish(self)
    monkeypatch.setattr(core_recorder.ProfileRecorder, "finish", finish_after_damage)
    with caplog.at_level("ERROR", logger="gcache"):
        out = ksample(hooks.patch_model(m, profile_mode.profile_config(m, str(path))), pos, neg, lat, cfg=3.0)
    assert torch.equal(out, ksample(m, pos, neg, lat, cfg=3.0))  # the image is not lost
    side = tmp_path / "x.unmerged-1.profile.safetensors"
    assert Profile.load(str(side)).count == 2 and "saved as" in caplog.text


def test_load_profile_sees_changes_in_every_gcache_folder(built, gcache_dir, tmp_path_factory):
    from gcache.nodes.profile_node import GCacheLoadProfile
    second = tmp_path_factory.mktemp("second_gcache")
    folder_paths.folder_names_and_paths["gcache"] = ([str(gcache_dir), str(second)], {".json", ".safetensors"})
    folder_paths.filename_list_cache.clear()
    path = second / "p.profile.safetensors"
    m, pos, neg, lat = built["flux"]
    ksample(hooks.patch_model(m, profile_mode.profile_config(m, str(path))), pos, neg, lat)
    folder_paths.filename_list_cache.clear()
    before = GCacheLoadProfile.fingerprint_inputs("p")
    os.utime(path, (1e9, 1e9))
    assert GCacheLoadProfile.fingerprint_inputs("p") != before


def test_unknown_combo_values_are_refused(built, gcache_dir):
    from gcache.nodes.profile_node import GCacheProfile
    m = built["flux"][0]
    Policy([1, 0, 1, 0, 1, 0]).save(str(gcache_dir / "p.json"))
    folder_paths.filename_list_cache.clear()
    # Apply has no validate_inputs (ComfyUI would report its message under each input it takes: test_server.py)
    assert "history_device" in GCacheProfile.validate_inputs("disk")
    with pytest.raises(GCacheError, match="^cache_device must be one of"):
        GCacheApply.execute(m, "p.json", "gpu", "remap")
    with pytest.raises(GCacheError, match="^step_mismatch must be one of"):
        GCacheApply.execute(m, "p.json", "cpu", "ignore")
    with pytest.raises(GCacheError, match="^step_mismatch must be one of"):
        GCacheApply.execute(m, "(auto)", "cpu", "ignore")
    with pytest.raises(GCacheError, match="history_device"):
        GCacheProfile.execute(m, "q", "disk")


def test_abandoned_split_recording_is_dropped_when_the_next_prompt_starts(built, tmp_path, monkeypatch):
    m, pos, neg, lat = built["wan"]
    prompt = ["p1"]
    monkeypatch.setattr(profile_mode.SPLITS, "prompt_id", lambda: prompt[0])
    monkeypatch.setattr(profile_mode.SPLITS, "_halves", {})
    half = hooks.patch_model(m, profile_mode.profile_config(m, str(tmp_path / "split.profile.safetensors")))
    ksample(half, pos, neg, lat, start_step=0, last_step=3, force_full_denoise=False)
    assert len(profile_mode.SPLITS) == 1  # the first expert's half waits for the second sampler
    prompt[0] = "p2"  # the user queues something else; the second sampler never came
    ksample(hooks.patch_model(m, profile_mode.profile_config(m, str(tmp_path / "other.profile.safetensors"))),
            pos, neg, lat)
    assert len(profile_mode.SPLITS) == 0


# ------------------------------------------------------------------------------------------- instant / auto
def visible(folder) -> list:
    """The files a user sees in the folder (not the hidden lock files beside profiles, nor the self-check's record,
    which run 1 writes: tests/comfyui/test_selfcheck.py)."""
    return sorted(f for f in os.listdir(folder) if not f.startswith(".") and f != "selfcheck.json")


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_apply_auto_profiles_once_then_forecasts_with_the_best_instant_policy(built, gcache_dir, caplog, family):
    from gcache.search.instant import choose_forecaster, instant_policy
    m, pos, neg, lat = built[family]
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0]
    with caplog.at_level("INFO", logger="gcache"), BlockCounter(m, family) as first:
        plain_run = ksample(model, pos, neg, lat, cfg=3.0)
    assert len(first.batches) == N  # the first run computes every step (and profiles it)
    assert torch.equal(plain_run, ksample(m, pos, neg, lat, cfg=3.0))
    names = visible(gcache_dir)  # (plus the profile's hidden lock file)
    model_cls = type(m.get_model_object("diffusion_model")).__name__
    assert len(names) == 2 and all(n.startswith(f"auto_{model_cls}-") and "_6steps_simple" in n for n in names), names
    pol_name = next(n for n in names if n.endswith("_6steps_simple_2x.json"))
    prof_name = next(n for n in names if n.endswith("_6steps_simple.profile.safetensors"))
    pol, prof = Policy.load(str(gcache_dir / pol_name)), Profile.load(str(gcache_dir / prof_name))
    k = pol.n_computed
    best, scores = choose_forecaster(prof, k)
    assert prof.has_fit_stats() and set(scores) == {"reuse", "linear", "fitted"}  # auto records what forecasting needs
    assert pol.forecast == best and pol.mask == instant_policy(prof, k, "theory", forecast=best).mask and k < N
    assert pol.metrics["io_share"] == pytest.approx(prof.io_share, abs=1e-4) and len(prof.meta["io_runs"]) == 1
    assert f"forecast {best} for K = {k}" in caplog.text and "the next run applies it" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), BlockCounter(m, family) as second:
        forecast_run = ksample(model, pos, neg, lat, cfg=3.0)
    assert sum(second.batches) == k * 2  # K steps, two branches (cond and uncond) in one batch
    assert f"applying {pol_name} (forecast {best})" in caplog.text
    if best != "reuse":
        assert f"forecast {best}, 2 residuals kept per branch" in caplog.text
    # the same policy applied by hand gives the same latent
    assert torch.equal(forecast_run, ksample(hooks.patch_model(m, apply_mode.apply_config(m, pol)), pos, neg, lat,
                                             cfg=3.0))
    # an explicit "reuse" on Apply gives reuse: the reuse instant policy from the saved profile, not saved
    caplog.clear()
    reuse = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0, "reuse (0)").result[0]
    with caplog.at_level("INFO", logger="gcache"):
        reuse_run = ksample(reuse, pos, neg, lat, cfg=3.0)
    want = instant_policy(prof, k, "theory", forecast="reuse")
    assert torch.equal(reuse_run, ksample(hooks.patch_model(m, apply_mode.apply_config(m, want)), pos, neg, lat,
                                          cfg=3.0))
    assert f"built the policy for the forecast input (reuse; K = {k} of {N}) from the saved " in caplog.text
    assert ", not saved as auto_" in caplog.text and visible(gcache_dir) == names
    # another batch size keeps the policy; another step count remaps it; neither profiles again
    with BlockCounter(m, family) as c:
        ksample(model, pos, neg, lat.repeat(2, *[1] * (lat.dim() - 1)))
    assert len(c.batches) == k and c.batches[0] == 2
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), BlockCounter(m, family) as c:
        ksample(model, pos, neg, lat, steps=12)
    assert "remapping " + pol_name in caplog.text and len(c.batches) == k * 2  # K scales with N
    assert visible(gcache_dir) == names
    # another speed-up reuses the profile: its policy is built at once, with no full-compute run
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), BlockCounter(m, family) as c:
        ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 1.5).result[0], pos, neg, lat)
    assert "from the saved " + prof_name in caplog.text and len(c.batches) < N


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_apply_auto_forecasts_with_the_forecast_input(built, gcache_dir, caplog, family):
    """Apply's forecast input in (auto): the instant policy for that forecaster from auto's profile, applied with it."""
    from gcache.search.instant import instant_policy
    m, pos, neg, lat = built[family]
    ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat, cfg=3.0)
    prof = Profile.load(str(next(p for p in gcache_dir.iterdir() if p.name.endswith(".profile.safetensors"))))
    k = Policy.load(str(next(p for p in gcache_dir.iterdir() if p.suffix == ".json" and p.name.startswith("auto_")))
                    ).n_computed
    for label, fc in (("linear (1)", "linear"), ("fitted (profile)", "fitted")):
        caplog.clear()
        with caplog.at_level("INFO", logger="gcache"), BlockCounter(m, family) as c:
            out = ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0, label).result[0], pos, neg,
                          lat, cfg=3.0)
        assert f"forecast {fc}, 2 residuals kept per branch" in caplog.text and sum(c.batches) == 2 * k
        # auto's mask for a forecaster is the reuse policy's (search/instant.py AUTO_ERROR_MODEL), fitted to it
        want = instant_policy(prof, k, "theory", forecast=fc, error_model="reuse_abs")
        assert want.mask == instant_policy(prof, k, "theory", forecast="reuse").mask
        assert want.forecast == fc and torch.equal(
            out, ksample(hooks.patch_model(m, apply_mode.apply_config(m, want)), pos, neg, lat, cfg=3.0))


def test_apply_auto_says_when_the_target_speedup_is_out_of_reach(built, gcache_dir, caplog):
    m, pos, neg, lat = built["flux"]
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 20.0).result[0]
    with caplog.at_level("INFO", logger="gcache"):
        ksample(model, pos, neg, lat)
    assert "20x speed-up is out of reach at 6 steps" in caplog.text and "K = 1" in caplog.text


def test_apply_auto_made_before_forecasting_keeps_working_and_is_rebuilt_from_a_forecast_profile(built, gcache_dir,
                                                                                                   caplog):
    m, pos, neg, lat = built["flux"]
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0]
    ksample(model, pos, neg, lat)
    pol_path = next(p for p in gcache_dir.iterdir() if p.suffix == ".json" and p.name.startswith("auto_"))
    prof_path = next(p for p in gcache_dir.iterdir() if p.name.endswith(".profile.safetensors"))
    import json
    old = json.loads(pol_path.read_text())  # as auto wrote it before forecasting: reuse, no auto version
    old.update(version=1, forecast=0, forecast_params={})
    old["provenance"]["auto"].pop("version")
    pol_path.write_text(json.dumps(old))
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"):
        ksample(model, pos, neg, lat)
    assert "rebuilt " + pol_path.name + ", made before auto forecasting" in caplog.text  # the profile can forecast
    prof = Profile.load(str(prof_path))
    prof.fit_sq_sum = prof.fit_cross_sum = prof.e1_sum = None  # a profile made before, too
    prof.save(str(prof_path))
    pol_path.write_text(json.dumps(old))
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), BlockCounter(m, "flux") as c:
        ksample(model, pos, neg, lat)
    assert "made before auto forecasting (forecast reuse)" in caplog.text and len(c.batches) == sum(old["mask"])


def test_a_truncated_auto_profile_is_set_aside_and_profiled_again(built, gcache_dir, caplog):
    m, pos, neg, lat = built["flux"]
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0]
    ksample(model, pos, neg, lat)
    for p in list(gcache_dir.iterdir()):
        if p.suffix == ".json":
            p.unlink()
        elif p.name.endswith(".profile.safetensors"):
            p.write_bytes(p.read_bytes()[:100])  # a crash or a full disk cut it short
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), BlockCounter(m, "flux") as c:
        ksample(model, pos, neg, lat)
    assert "can't be read" in caplog.text and "damaged-1" in caplog.text and len(c.batches) == N  # profiled again
    assert any(p.name.endswith(".damaged-1.profile.safetensors") for p in gcache_dir.iterdir())
    assert any(p.suffix == ".json" and p.name.startswith("auto_") for p in gcache_dir.iterdir())


def test_apply_auto_in_an_unwritable_folder_keeps_the_image(built, gcache_dir, monkeypatch, caplog):
    """Where no file can be made (every save starts with a temporary file): said before sampling, the image is the
    full-compute one. (test_messages.py does this with a folder that is read-only for real.)"""
    from gcache.core import files as core_files
    m, pos, neg, lat = built["flux"]

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(core_files.tempfile, "mkstemp", refuse)
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0]
    with caplog.at_level("WARNING", logger="gcache"):
        out = ksample(model, pos, neg, lat)
    ours = [r for r in caplog.records if r.name == "gcache"]  # (ComfyUI's own warnings may come between)
    assert torch.equal(out, ksample(m, pos, neg, lat)) and len(ours) == 1
    assert "can't be written (Permission denied)" in caplog.text and "without profiling" in caplog.text


def test_policy_node_equals_theory_dp_policy(built, gcache_dir):
    from gcache.nodes.policy_node import GCachePolicy
    from gcache.search.baselines import theory_dp_policy
    m, pos, neg, lat = built["flux"]
    path = str(gcache_dir / "t.profile.safetensors")
    ksample(hooks.patch_model(m, profile_mode.profile_config(m, path)), pos, neg, lat, cfg=3.0)
    prof = Profile.load(path)
    pol, image = GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", "mine").result
    assert pol.mask == theory_dp_policy(prof, 3).mask and image.shape[-1] == 3
    assert Policy.load(str(gcache_dir / "mine.json")).mask == pol.mask
    pol2 = GCachePolicy.execute(prof, "speed-up", 1.5, 3, "local", "", "").result[0]
    assert pol2.metrics["predicted_speedup"] <= 1.5 and pol2.method == "local_dp"
    assert GCachePolicy.execute(prof, "K", 2.0, 2, "bernstein", "3, 1, 0", "").result[0].n_computed == 2
    with pytest.raises(GCacheError, match="bernstein_s"):
        GCachePolicy.execute(prof, "K", 2.0, 2, "bernstein", "a, b", "")


def test_profile_node_records_forecast_errors_for_a_forecast_policy(built, gcache_dir, caplog):
    from gcache.nodes.policy_node import GCachePolicy
    from gcache.nodes.profile_node import GCacheProfile
    from gcache.search.instant import instant_policy
    m, pos, neg, lat = built["wan"]
    ksample(GCacheProfile.execute(m, "fc", "model device", True).result[0], pos, neg, lat, cfg=3.0)
    prof = Profile.load(str(gcache_dir / "fc.profile.safetensors"))
    assert prof.E1.shape == (N, N, N) and prof.E1[0, 1, 2] > 0
    pol = GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", "", "linear (1)").result[0]
    assert pol.forecast == "linear" and pol.mask == instant_policy(prof, 3, "theory", forecast="linear").mask
    rms = GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", "", "fitted (profile)", "rms").result[0]
    assert rms.method == "theory_dp_fitted_rms" and rms.provenance["error_model"] == "rms"
    assert rms.mask == instant_policy(prof, 3, "theory", forecast="fitted", error_model="rms").mask
    with pytest.raises(GCacheError, match="error_model must be one of"):
        GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", "", "fitted (profile)", "median")
    with BlockCounter(m, "wan") as c:  # applied with forecasting: still K block runs
        ksample(hooks.patch_model(m, apply_mode.apply_config(m, pol)), pos, neg, lat)
    assert len(c.batches) == 3
    # the forecaster combo holds every forecaster's label (saved workflows hold the first four), l2p's included
    combo = next(i for i in GCachePolicy.define_schema().inputs if i.id == "forecast")
    assert combo.options == ["reuse (0)", "linear (1)", "quadratic (2)", "fitted (profile)", "l2p (profile)"]
    l2p = GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", "", "l2p (profile)").result[0]
    want = instant_policy(prof, 3, "theory", forecast="l2p")
    assert l2p.forecast == "l2p" and (l2p.mask, l2p.forecast_params) == (want.mask, want.forecast_params)
    with BlockCounter(m, "wan") as c:
        ksample(hooks.patch_model(m, apply_mode.apply_config(m, l2p)), pos, neg, lat)
    assert len(c.batches) == 3
    on_mask = Policy.for_mask(prof, [1, 1, 0, 1, 0, 1], "l2p")  # skipped steps with two and three computed before
    assert sorted(on_mask.forecast_params["w"]) == ["2", "4"]
    with BlockCounter(m, "wan") as c:
        ksample(hooks.patch_model(m, apply_mode.apply_config(m, on_mask)), pos, neg, lat)
    assert len(c.batches) == 4
    # forcing a profile-fitted forecaster on a policy made for another: said, and it forecasts linearly
    caplog.clear()
    with caplog.at_level("WARNING", logger="gcache"):
        forced = ksample(hooks.patch_model(m, apply_mode.apply_config(m, pol, forecast="l2p")), pos, neg, lat)
    assert "forecast l2p has no parameters for this run's mask (the policy was made for linear)" in caplog.text
    assert torch.equal(forced, ksample(hooks.patch_model(m, apply_mode.apply_config(m, pol)), pos, neg, lat))
