"""GCache with ComfyUI's own context windows (comfy/context_windows.py, the Context Windows / Wan Context Windows
nodes), on the tiny Wan with 8 latent frames, windows of 4 latent frames, overlap 1 (issue 47, case 2).

ComfyUI calls the model once per window with the same conds. Each window is a branch of its own (runtime.Windowed):
its own δ, its own shape (the causal fix feeds the windows after the first one an extra frame), its own self-check
replay and its own profile history. Checked: run 1 of auto replays every window and passes, run 2 skips and says its
speed-up without a cache reset, and GCache + windows stays as close to plain + windows, frame by frame, as GCache
without windows is to the plain model (within 1.5x), with the causal fix off and on and with Wan's own node.
"""
import inspect
import logging
import re

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import tiny_models as tm  # noqa: E402
import torch  # noqa: E402

import nodes as comfy_nodes  # noqa: E402

cw_nodes = pytest.importorskip("comfy_extras.nodes_context_windows",
                               reason="this ComfyUI has no context windows (comfy_extras/nodes_context_windows.py)")

from gcache.core.engine import ResidualCache  # noqa: E402
from gcache.core.policy import Policy  # noqa: E402
from gcache.core.profile import Profile  # noqa: E402
from gcache.nodes.apply_node import GCacheApply  # noqa: E402
from gcache.nodes.modes import apply as apply_mode  # noqa: E402
from gcache.nodes.modes import profile as profile_mode  # noqa: E402
from gcache.nodes.patching import hooks  # noqa: E402

N = 8
FRAMES, LENGTH, OVERLAP = 8, 4, 1  # latent frames; ComfyUI's standard_static makes windows 0-3, 3-6, 4-7
WINDOWS = 3
MASK = [1, 1, 0, 1, 0, 1, 0, 1]
RULE = 1.5
HAS_CAUSAL_FIX = "causal_window_fix" in inspect.signature(cw_nodes.ContextWindowsManualNode.execute).parameters


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    m, pos, neg, _ = tm.wan(str(tmp_path_factory.mktemp("windows_wan")))
    return m, pos, neg, torch.zeros(1, 16, FRAMES, 8, 8)


def execute(node, model, **kw):
    """A context windows node's execute with the inputs this ComfyUI has (0.3.64's have no freenoise, no causal
    fix)."""
    has = inspect.signature(node.execute).parameters
    return node.execute(model, **{k: v for k, v in kw.items() if k in has}).result[0]


def windows(model, causal: bool, schedule: str = "standard_static"):
    """The Context Windows (Manual) node on Wan's frame axis (dim 2)."""
    node = cw_nodes.ContextWindowsManualNode
    if causal and not HAS_CAUSAL_FIX:
        pytest.skip("this ComfyUI's context windows have no causal fix")
    return execute(node, model, context_length=LENGTH, context_overlap=OVERLAP, context_schedule=schedule,
                   context_stride=1, closed_loop=False, fuse_method="pyramid", dim=2, freenoise=False,
                   causal_window_fix=causal)


def wan_windows(model):
    """Wan's own node (on 0.33 its causal fix is on): lengths and overlaps in real frames, 4 per latent frame."""
    return execute(cw_nodes.WanContextWindowsManualNode, model, context_length=4 * LENGTH - 3,
                   context_overlap=4 * OVERLAP, context_schedule="standard_static", context_stride=1,
                   closed_loop=False, fuse_method="pyramid", freenoise=False)


def ksample(model, pos, neg, lat, cfg=1.0):
    return comfy_nodes.common_ksampler(model, 0, N, cfg, "euler", "simple", pos, neg, {"samples": lat})[0]["samples"]


def per_frame(a, b) -> list:
    return [(a[:, :, f] - b[:, :, f]).abs().mean().item() for f in range(a.shape[2])]


def with_policy(model, mask):
    return hooks.patch_model(model, apply_mode.apply_config(model, Policy(list(mask))))


def gcache_messages(caplog, level=logging.INFO) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "gcache" and r.levelno >= level]


def cache_trouble(caplog) -> list:
    """Warnings of a cache reset or a profile history restarted or left out (what one key for all windows gave)."""
    return [s for s in gcache_messages(caplog, logging.WARNING)
            if any(w in s for w in ("is reset", "restarting", "missed steps", "nothing was added"))]


def assert_within_rule(wan, policy, windowed):
    """GCache + windows against plain + windows, frame by frame, within RULE x GCache against plain without them
    (the same policy, the same seed)."""
    m, pos, neg, lat = wan
    alone = per_frame(ksample(with_policy(m, policy), pos, neg, lat), ksample(m, pos, neg, lat))
    plain = ksample(windowed(m), pos, neg, lat)
    both = ksample(windowed(with_policy(m, policy)), pos, neg, lat)
    assert min(alone) > 0 and not torch.equal(both, plain)  # both skip: the rule compares two real errors
    ratios = [w / a for w, a in zip(per_frame(both, plain), alone)]
    assert max(ratios) <= RULE, [round(r, 2) for r in ratios]
    return ratios


@pytest.mark.parametrize("causal", [False, True], ids=["causal_fix_off", "causal_fix_on"])
def test_auto_checks_each_window_then_skips_within_the_rule(causal, wan, gcache_dir, caplog, monkeypatch):
    m, pos, neg, lat = wan
    model = windows(m, causal)
    replays = []
    real_replay = ResidualCache.replay
    monkeypatch.setattr(ResidualCache, "replay",
                        lambda self, nudge=0.0: (replays.append(nudge), real_replay(self, nudge))[1])

    def auto():
        return ksample(windows(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], causal),
                       pos, neg, lat)

    plain = ksample(model, pos, neg, lat)
    with caplog.at_level(logging.INFO, logger="gcache"):
        run1 = auto()
    assert torch.equal(run1, plain)  # run 1 computes every step
    # the self-check replayed every window, not the first call only, and nudged each (its own floor)
    assert replays.count(0.0) == WINDOWS and len(replays) == 2 * WINDOWS and all(replays[1::2]), replays
    assert any("self-check passed" in s for s in gcache_messages(caplog)), caplog.text
    # the profile: one history per window, every window at every step (no restart, no missed steps)
    assert not cache_trouble(caplog)
    profile = next(p for p in gcache_dir.iterdir() if p.name.endswith(".profile.safetensors"))
    assert Profile.load(str(profile)).count == WINDOWS
    policy_file = next(p for p in gcache_dir.iterdir() if p.name.endswith("_2x.json"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gcache"):
        run2 = auto()
    said = [s for s in gcache_messages(caplog) if s.startswith("GCache: computed")]
    assert len(said) == 1, caplog.text
    done = re.match(r"GCache: computed (\d+)/(\d+) steps, skipped (\d+), predicted ", said[0])
    assert done and int(done.group(2)) == N and int(done.group(3)) > 0, said[0]  # it skips and predicts
    assert not cache_trouble(caplog)  # no reset (auto may warn about its K: not the windows' business)
    policy = Policy.load(str(policy_file))
    assert int(done.group(1)) == sum(policy.mask)
    assert not torch.equal(run2, plain)
    assert_within_rule(wan, policy.mask, lambda mod: windows(mod, causal))


@pytest.mark.parametrize("causal", [False, True], ids=["causal_fix_off", "causal_fix_on"])
def test_a_policy_with_context_windows_stays_within_the_rule_frame_by_frame(causal, wan):
    assert_within_rule(wan, MASK, lambda mod: windows(mod, causal))


def test_wans_own_context_windows_node_skips_within_the_rule(wan, caplog):
    m, pos, neg, lat = wan
    with caplog.at_level(logging.INFO, logger="gcache"):
        ksample(wan_windows(with_policy(m, MASK)), pos, neg, lat)
    said = [s for s in gcache_messages(caplog) if s.startswith("GCache: computed")]
    assert said and said[0].startswith(f"GCache: computed {sum(MASK)}/{N} steps, skipped {MASK.count(0)}"), said
    assert not gcache_messages(caplog, logging.WARNING)
    assert_within_rule(wan, MASK, wan_windows)


def test_windows_that_move_every_step_compute_where_their_residual_is_older(wan, caplog):
    """standard_uniform moves its windows from step to step: a window that did not run at the last computed step
    computes at a skipped step (never an older δ), and such a step counts as computed."""
    m, pos, neg, lat = wan
    with caplog.at_level(logging.INFO, logger="gcache"):
        both = ksample(windows(with_policy(m, MASK), False, "standard_uniform"), pos, neg, lat)
    said = [s for s in gcache_messages(caplog) if s.startswith("GCache: computed")]
    done = re.match(r"GCache: computed (\d+)/(\d+) steps, skipped (\d+)", said[0])
    assert done and int(done.group(1)) >= sum(MASK) and int(done.group(3)) > 0, said
    assert "context windows, each with its own residual" in said[0] and "window call(s) of skipped steps computed" \
        in said[0], said
    plain = ksample(windows(m, False, "standard_uniform"), pos, neg, lat)
    alone = per_frame(ksample(with_policy(m, MASK), pos, neg, lat), ksample(m, pos, neg, lat))
    assert max(w / a for w, a in zip(per_frame(both, plain), alone)) <= RULE


def test_the_profile_under_context_windows_records_each_window(wan, tmp_path, caplog):
    m, pos, neg, lat = wan
    path = str(tmp_path / "w.profile.safetensors")
    with caplog.at_level(logging.INFO, logger="gcache"):
        ksample(windows(hooks.patch_model(m, profile_mode.profile_config(m, path, folder="")), HAS_CAUSAL_FIX), pos,
                neg, lat, cfg=3.0)
    assert not gcache_messages(caplog, logging.WARNING), gcache_messages(caplog, logging.WARNING)
    assert Profile.load(path).count == 2 * WINDOWS  # cond and uncond of each window


@pytest.mark.parametrize("schedule,added", [("standard_uniform", 2), ("looped_uniform", 0)])
def test_the_profile_leaves_out_windows_that_ran_on_some_steps_only_and_says_so(schedule, added, wan, tmp_path,
                                                                                 caplog):
    """Windows that move (uniform schedules) are not samples of every step: the ones at every step are added (at 8
    frames, standard_uniform keeps 0-3 and 4-7 at every step; looped_uniform keeps none), said once, never as a
    "missed steps (interrupted run?)" per window."""
    m, pos, neg, lat = wan
    path = tmp_path / "w.profile.safetensors"
    with caplog.at_level(logging.INFO, logger="gcache"):
        ksample(windows(hooks.patch_model(m, profile_mode.profile_config(m, str(path), folder="")), False, schedule),
                pos, neg, lat)
    said = gcache_messages(caplog)
    assert not any("interrupted run" in s for s in said), said
    assert sum("ran on some steps only" in s for s in said) == 1, said
    if added:
        assert Profile.load(str(path)).count == added and not gcache_messages(caplog, logging.WARNING)
    else:
        assert not path.exists()
        assert [s for s in gcache_messages(caplog, logging.WARNING) if "no context window ran at every step" in s
                and "standard_static" in s], said


def test_windows_that_do_not_name_themselves_turn_caching_off_loudly(wan, caplog):
    """A ComfyUI whose context windows stop putting the window in transformer_options (emulated by a CALC_COND_BATCH
    wrapper that takes it out): GCache can't keep the windows apart, says so and computes every step."""
    import comfy.patcher_extension as pe
    m, pos, neg, lat = wan

    def unnamed(executor, model, conds, x_in, timestep, model_options):
        topts = {k: v for k, v in model_options["transformer_options"].items() if k != "context_window"}
        return executor(model, conds, x_in, timestep, dict(model_options, transformer_options=topts))

    def without_names(model):
        model = model.clone()
        model.add_wrapper_with_key(pe.WrappersMP.CALC_COND_BATCH, "test", unnamed)
        return model

    plain = ksample(without_names(windows(m, False)), pos, neg, lat)
    with caplog.at_level(logging.INFO, logger="gcache"):
        out = ksample(without_names(windows(with_policy(m, MASK), False)), pos, neg, lat)
    assert torch.equal(out, plain)  # every step computed: the image of plain + windows
    errors = gcache_messages(caplog, logging.ERROR)
    assert len(errors) == 1 and "without naming the window" in errors[0], errors
    said = [s for s in gcache_messages(caplog) if s.startswith("GCache: computed")]
    assert said and ", skipped 0," in said[0], said  # (a disabled run's line counts the steps before it stopped)
