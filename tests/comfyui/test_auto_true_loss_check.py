"""GCache Apply (auto)'s true-loss check in ComfyUI (search/auto_check.py, nodes/modes/auto.py): run 1 resamples its
own inputs under each candidate policy (hooks.py's OUTER_SAMPLE wrapper), saves the one closest to its own output,
and spends at most one full run on it."""
from __future__ import annotations  # the annotations name ComfyUI-only imports (none without COMFYUI_PATH)

import pytest
from conftest import COMFY, REASON

pytestmark = pytest.mark.skipif(not COMFY, reason=REASON)

if COMFY:
    import tiny_models as tm  # noqa: E402

    from gcache.core.policy import Policy  # noqa: E402
    from gcache.core.profile import Profile  # noqa: E402
    from gcache.nodes.apply_node import GCacheApply  # noqa: E402
    from gcache.nodes.modes import apply as apply_mode  # noqa: E402
    from gcache.nodes.patching import hooks  # noqa: E402
    from gcache.search import auto_check  # noqa: E402

N = 8


def ksample(model, pos, neg, lat, steps=N):
    return tm.ksample(model, pos, neg, lat, steps)


def run_1(flux, caplog, speedup):
    m, pos, neg, lat = flux
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        out = ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", speedup).result[0], pos, neg, lat)
    return out, runs.n


def saved(folder) -> Policy:
    return Policy.load(str(next(p for p in folder.iterdir() if p.name.startswith("auto_") and p.suffix == ".json")))


def test_run_1_saves_the_candidate_closest_to_its_own_output(flux, gcache_dir, caplog, monkeypatch):
    monkeypatch.setattr(auto_check, "BUDGET_RUNS", 10.0)  # every candidate, whatever io share this machine measures
    m, pos, neg, lat = flux
    out, blocks = run_1(flux, caplog, 2.0)
    pol = saved(gcache_dir)
    rec = pol.provenance["check"]
    cands = rec["candidates"]
    assert len(cands) >= 2 and "checked %d candidate policies" % len(cands) in caplog.text
    # run 1 computed every step, then each candidate's computed steps (one block-stack run each, at CFG 1)
    assert blocks == N + sum(len(c["steps"]) for c in cands)
    # independently: each candidate applied through GCache Apply with a policy input, against a plain run
    plain = ksample(m, pos, neg, lat)
    assert auto_check.mse(out, plain) == 0.0
    prof = Profile.load(str(next(p for p in gcache_dir.iterdir() if p.name.endswith(".profile.safetensors"))))
    for c in cands:  # (the profile-fitted forecaster's α: the profile's, fitted to the candidate's mask)
        cand = Policy.for_mask(prof, [int(i in c["steps"]) for i in range(N)], c["forecast"])
        got = ksample(hooks.patch_model(m, apply_mode.apply_config(m, cand)), pos, neg, lat)
        assert auto_check.mse(got, plain) == pytest.approx(c["loss"], rel=1e-4, abs=1e-12), c
    best = min(range(len(cands)), key=lambda i: (cands[i]["loss"], i))
    assert rec["chosen"] == best and pol.compute_steps() == cands[best]["steps"]
    assert pol.forecast == cands[best]["forecast"]


def test_the_check_spends_at_most_one_full_run_and_says_so(flux, gcache_dir, caplog):
    out, blocks = run_1(flux, caplog, 2.0)
    pol = saved(gcache_dir)
    assert blocks <= 2 * N  # run 1 and at most one full run of candidates (at CFG 1: one stack run per step)
    rec = pol.provenance.get("check")
    if rec is not None:
        assert "spent " in caplog.text and rec["spent_steps"] <= N + 1e-9
    # the next run applies the saved policy: its K steps, no check
    caplog.clear()
    m, pos, neg, lat = flux
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat)
    assert runs.n == pol.n_computed and "checked" not in caplog.text
