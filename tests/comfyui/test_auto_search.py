"""GCache Apply (auto) after GCache Search, inside real ComfyUI: a searched policy for the model, step count and
scheduler is applied whenever it meets the target speed-up (the one computing the most steps when several do), and
when none does the log says which policy was used instead and why."""
import re

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import tiny_models as tm  # noqa: E402
import torch  # noqa: E402

from gcache.core.policy import Policy  # noqa: E402
from gcache.core.profile import Profile  # noqa: E402
from gcache.nodes.apply_node import GCacheApply  # noqa: E402
from gcache.nodes.modes import apply as apply_mode  # noqa: E402
from gcache.nodes.patching import hooks  # noqa: E402
from gcache.nodes.profile_node import GCacheProfile  # noqa: E402
from gcache.nodes.search_node import GCacheSearch  # noqa: E402

N = 8
# io share 0.25, so predicted(K) = 8 / (K + (8 − K)/4) = 32 / (3K + 8), by hand:
# K = 1: 2.909x, K = 2: 2.286x, K = 3: 1.882x, K = 4: 1.600x
STACK, CALL = 3.0, 4.0


def ksample(model, pos, neg, lat, steps=N):
    return tm.ksample(model, pos, neg, lat, steps)




def profile_with_io_share(flux, folder) -> Profile:
    """A profile of the tiny Flux whose measured io share is 0.25 exactly: the timing is the machine's (it varied
    from 0.17 to 0.44 here), auto's choice among searched policies is what is tested."""
    m, pos, neg, lat = flux
    ksample(GCacheProfile.execute(m, "searched_from", "model device").result[0], pos, neg, lat)
    prof = Profile.load(str(folder / "searched_from.profile.safetensors"))
    share = 1 - STACK / CALL
    prof.meta["io_runs"] = [{"median": share, "q1": share, "q3": share, "steps": N - 2}]
    assert prof.io_share == 0.25
    return prof


def search(flux, prof, k, name, caplog):
    from gcache_test_pack import FakeVAE
    m, pos, neg, lat = flux
    with caplog.at_level("INFO", logger="gcache"):
        policy = GCacheSearch.execute(m, pos, neg, {"samples": lat}, FakeVAE(), 0, 1, N, 1.0, "euler", "simple", k,
                                      12, 2, "ssim", name, profile=prof).result[0]
    assert policy.n_computed == k and policy.metrics["io_share"] == 0.25
    return policy


def auto(flux, caplog, *speedup):
    """One auto run (at Apply's default speed-up when none is given): (latent, block runs, log)."""
    m, pos, neg, lat = flux
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        out = ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", *speedup).result[0], pos, neg, lat)
    return out, runs.n, caplog.text


def applied(flux, policy):
    m, pos, neg, lat = flux
    return ksample(hooks.patch_model(m, apply_mode.apply_config(m, policy)), pos, neg, lat)


def test_auto_applies_a_searched_policy_that_meets_the_target_and_says_why_when_none_does(flux, gcache_dir, caplog):
    prof = profile_with_io_share(flux, gcache_dir)
    # K = 4 predicts 1.60x; the 2x target asks for K ≤ 3 (1.88x): not applied, and the log says so
    search(flux, prof, 4, "k4", caplog)
    assert "applies it (auto_Flux-" in caplog.text and "_8steps_simple_K4_searched.json) at any auto_speedup below " \
        "1.88x (where auto's own policy would compute K = 4 steps or more)" in caplog.text
    _, runs, text = auto(flux, caplog)
    assert "not applying the policy GCache Search found: auto_Flux-" in text
    assert "_K4_searched.json (K = 4) predicts 1.60x, less than the 2x target asks for (K ≤ 3, 1.88x); no policy " \
        "for this model, 8 steps and 2x yet: this run computes every step and profiles it" in text
    assert runs == N  # profiled: every step computed

    # K = 2 predicts 2.29x: it meets the default 2x target (before, auto wanted K to equal its own K = 3 exactly)
    k2 = search(flux, prof, 2, "k2", caplog)
    out, runs, text = auto(flux, caplog)
    assert "applying the policy GCache Search found (" in text and "K = 2, auto_Flux-" in text
    assert re.search(r"it predicts 2\.29× \(\d\.\d\d–\d\.\d\d\) and the 2x target asks for K ≤ 3", text), text
    assert runs == 2 and torch.equal(out, applied(flux, k2))

    # K = 3 meets it too (1.88x, the K auto itself would take): of the two, the one that computes more steps
    k3 = search(flux, prof, 3, "k3", caplog)
    out, runs, text = auto(flux, caplog)
    assert "K = 3, auto_Flux-" in text and runs == 3 and torch.equal(out, applied(flux, k3))

    # at 2.5x auto itself takes K = 2 (2.29x ≤ 2.5 < 2.91x): K = 2 is the one that meets it
    out, runs, text = auto(flux, caplog, 2.5)
    assert "K = 2, auto_Flux-" in text and "the 2.5x target asks for K ≤ 2" in text and runs == 2
    assert torch.equal(out, applied(flux, k2))

    # 2.95x is out of reach (K = 1 gives 2.91x): none meets it; each is named with its prediction, then what auto
    # does instead (its own profile is there: it builds the instant policy from it, no full-compute run)
    out, runs, text = auto(flux, caplog, 2.95)
    assert "not applying the policy GCache Search found: " in text
    for k, pred in ((2, "2.29"), (3, "1.88"), (4, "1.60")):
        assert f"_K{k}_searched.json (K = {k}) predicts {pred}x, less than the 2.95x target asks for (K ≤ 1, 2.91x)" \
            in text
    assert "; built auto_Flux-" in text and "_8steps_simple_2.95x.json from the saved auto_Flux-" in text
    own = Policy.load(str(next(gcache_dir.glob("auto_Flux-*_8steps_simple_2.95x.json"))))
    assert runs == own.n_computed and torch.equal(out, applied(flux, own))


def test_the_forecast_input_skips_a_searched_policy_of_another_forecaster_and_says_so(flux, gcache_dir, caplog):
    prof = profile_with_io_share(flux, gcache_dir)
    search(flux, prof, 2, "k2_reuse", caplog)
    _, runs, text = auto(flux, caplog, 2.0, "linear (1)")
    assert "_K2_searched.json (K = 2) forecasts with reuse; the forecast input asks for linear" in text
    assert runs == N  # no auto profile yet: this run profiles


def test_a_search_never_silently_replaces_a_better_searched_policy(flux, gcache_dir, caplog):
    """Every search at one K wrote the same auto_…_K<K>_searched.json, and the last to finish replaced the earlier
    one even when it was worse. On the same seeds and references the lower loss stays; a search on other seeds takes
    the file and the earlier one is kept beside it; each time the log says which one auto applies."""
    from gcache_test_pack import FakeVAE
    m, pos, neg, lat = flux
    prof = profile_with_io_share(flux, gcache_dir)

    def search_k3(name, budget, seed=0):
        caplog.clear()
        with caplog.at_level("INFO", logger="gcache"):
            pol = GCacheSearch.execute(m, pos, neg, {"samples": lat}, FakeVAE(), seed, 1, N, 1.0, "euler", "simple",
                                       3, budget, 2, "ssim", name, profile=prof).result[0]
        return pol, caplog.text
    a, _ = search_k3("a", 12)
    (path,) = gcache_dir.glob("auto_Flux-*_8steps_simple_K3_searched.json")
    b, text = search_k3("b", 16)  # the same seed and references, another budget
    best = min((a, b), key=lambda p: p.metrics["loss"])  # a tie keeps the one saved first
    assert Policy.load(str(path)).metrics["loss"] == best.metrics["loss"]
    if best is a:
        assert f"GCache Search: kept the policy an earlier search saved as {path.name}: on the same seeds and " \
            "reference images, ranked on the search seeds" in text and "goes on applying that one" in text
        assert "this search's policy is b.json" in text
    else:
        assert "it replaces the policy an earlier search saved there: on the same seeds and reference images, ranked " \
            "on the search seeds" in text and f"applies it ({path.name})" in text
    # another seed: the losses don't compare; the latest search takes the file, the earlier one is kept beside it
    c, text = search_k3("c", 12, seed=5)
    side = path.name.replace("_searched.json", "_searched.replaced-1.json")
    assert Policy.load(str(path)).provenance["seeds"] == [5] and Policy.load(str(path)).mask == c.mask
    assert Policy.load(str(gcache_dir / side)).metrics["loss"] == best.metrics["loss"]
    assert f"the policy an earlier search saved there was measured on another seeds, so the two losses don't " \
        f"compare: it was moved to {side}" in text
    # auto applies what the file holds, and says which
    out, runs, text = auto(flux, caplog)
    assert "applying the policy GCache Search found (" in text and f"K = 3, {path.name})" in text
    assert runs == 3 and torch.equal(out, applied(flux, c))


def test_each_evaluation_logs_the_speedup_the_saved_policy_states(flux, gcache_dir, caplog):
    """GCache Apply logs a predicted speed-up for every evaluation of the search; it is the figure the saved policy
    states (both from the profile's measured io share: search/result.py), not the parameter-count estimate."""
    prof = profile_with_io_share(flux, gcache_dir)
    policy = search(flux, prof, 4, "k4_logged", caplog)
    predicted = re.compile(r"predicted ([0-9.]+×(?: \([^)]*\))?)")
    evaluations = [m for m in caplog.messages if m.startswith(f"GCache: computed 4/{N} steps")]
    saved = [m for m in caplog.messages if m.startswith("GCache Search: saved k4_logged.json")]
    assert len(evaluations) >= 2 and len(saved) == 1
    assert {predicted.search(m).group(1) for m in evaluations} == {predicted.search(saved[0]).group(1)}
    assert predicted.search(saved[0]).group(1).startswith(f"{policy.metrics['predicted_speedup']:.2f}×")
