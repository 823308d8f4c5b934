"""ComfyUI's context windows through GCache's run state, headless (nodes/patching/runtime.py Windowed, core/engine.py).

A toy of comfy/context_windows.py: each step calls the model once per window of latent frames, with the same conds,
the window named in transformer_options["context_window"] (index_list, and the causal fix's anchor frame fed before
them). The oracle is independent of GCache's keys: one ResidualCache per window, called directly.
"""
import logging
from types import SimpleNamespace

import pytest
import torch

from gcache.core.engine import ResidualCache, last_computed_before
from gcache.nodes.patching.runtime import RunState, Windowed, window_of
from gcache.nodes.patching.steps import StepTracker

torch.set_num_threads(1)

FRAMES, TOKENS, DIM = 8, 3, 4             # latent frames, tokens per frame, width
STATIC = [[0, 1, 2, 3], [3, 4, 5, 6], [4, 5, 6, 7]]  # ComfyUI's standard_static: 8 frames, windows of 4, overlap 1
MASK = [1, 1, 0, 1, 0, 0, 1, 0]


def sigmas(n: int) -> list:
    return [1 - i / n for i in range(n + 1)]


def stack(h: torch.Tensor) -> torch.Tensor:
    """A block stack whose residual depends on every token of the window (attention-like): δ is the window's own."""
    w = torch.linspace(-1, 1, DIM * DIM).reshape(DIM, DIM)
    return h + torch.tanh(h @ w + h.mean(dim=1, keepdim=True))


def window(frames, causal: bool):
    anchor = frames[0] - 1 if causal and frames[0] > 0 else None
    return SimpleNamespace(index_list=list(frames), causal_anchor_index=anchor)


def fed(win) -> list:
    return ([win.causal_anchor_index] if win.causal_anchor_index is not None else []) + list(win.index_list)


def tokens(x: torch.Tensor, frames: list) -> torch.Tensor:
    return torch.cat([x[:, f * TOKENS:(f + 1) * TOKENS] for f in frames], dim=1)


def sample(call, schedule, causal: bool, n: int = len(MASK)):
    """Euler-like steps over a [1, FRAMES·TOKENS, DIM] latent; call(step, sigma, win, h) -> the stack's output."""
    x = torch.sin(torch.arange(FRAMES * TOKENS * DIM, dtype=torch.float32)).reshape(1, FRAMES * TOKENS, DIM)
    outs = []
    for step in range(n):
        acc, count = torch.zeros_like(x), torch.zeros(1, FRAMES * TOKENS, 1)
        for frames in schedule(step):
            win = window(frames, causal)
            z = call(step, sigmas(n)[step], win, tokens(x, fed(win)))
            z = z[:, TOKENS:] if win.causal_anchor_index is not None else z  # the anchor frame is stripped
            for i, f in enumerate(frames):
                acc[:, f * TOKENS:(f + 1) * TOKENS] += z[:, i * TOKENS:(i + 1) * TOKENS]
                count[:, f * TOKENS:(f + 1) * TOKENS] += 1
        x = x + (acc / count - x) * 0.3
        outs.append(x)
    return outs


def through_run(mask, schedule, causal):
    """The windows through one RunState, as GCache's APPLY_MODEL wrapper and block patches run them."""
    run = RunState(lambda: ResidualCache(mask), StepTracker(sigmas(len(mask))), "owner")

    def call(step, sigma, win, h):
        run.tracker.done = step  # the sampler's callback of the step before
        run.tracker.saw_callback = True
        run.begin_call(sigma, {"context_window": win, "cond_or_uncond": [0], "uuids": ["u"]})
        out = run.gate(h, stack, first=True, last=True)
        run.end_call()
        return out
    return sample(call, schedule, causal, len(mask)), run


def oracle(mask, schedule, causal):
    """One engine per window of frames fed: a skipped step adds that window's δ, of the last computed step only
    (a window that did not run there computes), by hand."""
    kept, last = {}, last_computed_before(mask)

    def call(step, sigma, win, h):
        key = tuple(fed(win))
        if mask[step] or key not in kept or kept[key][0] < last[step]:
            z = stack(h)
            kept[key] = (step, z - h)
            return z
        return h + kept[key][1]
    return sample(call, schedule, causal, len(mask))


@pytest.mark.parametrize("causal", [False, True])
def test_each_window_skips_with_its_own_residual(causal, caplog):
    with caplog.at_level(logging.WARNING, logger="gcache"):
        got, run = through_run(MASK, lambda s: STATIC, causal)
    want = oracle(MASK, lambda s: STATIC, causal)
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.allclose(a, b, atol=1e-6), step
    stats = run.close()
    # the causal fix makes the windows after the first one frame longer: their own caches, never a reset
    assert stats.resets == 0 and not caplog.records
    assert stats.skipped_steps == MASK.count(0) and stats.computed_steps == MASK.count(1)
    assert stats.forced_calls == 0
    windows = {tuple(w) for w in STATIC}
    assert {k.frames for k in stats.block_runs} == windows  # one branch per window, each run on the computed steps
    assert all(n == MASK.count(1) for n in stats.block_runs.values())
    plain = sample(lambda step, sigma, win, h: stack(h), lambda s: STATIC, causal)
    assert not torch.equal(got[-1], plain[-1])  # skipping changed something


def test_a_shared_residual_would_differ_from_the_oracle():
    """The bug this fixes: every window under one key reuses the last window's δ (the test's own power)."""
    run = RunState(lambda: ResidualCache(MASK), StepTracker(sigmas(len(MASK))), "owner")

    def call(step, sigma, win, h):
        run.tracker.done, run.tracker.saw_callback = step, True
        run.begin_call(sigma, {"cond_or_uncond": [0], "uuids": ["u"]})  # no window named: one branch
        return run.gate(h, stack, first=True, last=True)
    shared = sample(call, lambda s: STATIC, False)
    want = oracle(MASK, lambda s: STATIC, False)
    assert not torch.allclose(shared[-1], want[-1], atol=1e-3)


def moving(step):
    """Like standard_uniform: the windows move from step to step (two stay, one comes and goes)."""
    third = [[3, 4, 5, 6], [2, 3, 4, 5], [1, 2, 3, 4]][step % 3]
    return [[0, 1, 2, 3], [4, 5, 6, 7], third]


def test_a_window_new_at_a_skipped_step_computes_and_the_step_counts_as_computed():
    got, run = through_run(MASK, moving, False)
    want = oracle(MASK, moving, False)
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.allclose(a, b, atol=1e-6), step
    stats = run.close()
    # by hand: at a skipped step the third window is fresh only if it ran at the last computed step
    forced = [s for s in range(len(MASK)) if not MASK[s] and moving(s)[2] != moving(last_computed_before(MASK)[s])[2]]
    assert forced and stats.forced_calls == len(forced)
    assert stats.skipped_steps == MASK.count(0) - len(forced)
    assert all(stats.decided[s] for s in forced)


def test_an_older_residual_of_a_window_is_never_reused():
    """A window that ran at step 0 and comes back at a skipped step after a computed step without it computes: its
    δ of step 0 is stale (and is dropped once no step can use it)."""
    mask = [1, 1, 0]
    def sched(step):
        return [[0, 1, 2, 3], [4, 5, 6, 7]] if step != 1 else [[0, 1, 2, 3], [3, 4, 5, 6], [5, 6, 7, 0]]
    got, run = through_run(mask, sched, False)
    want = oracle(mask, sched, False)
    assert torch.allclose(got[-1], want[-1], atol=1e-6)
    stats = run.close()
    assert stats.forced_calls == 1 and stats.decided[2] is True


def test_window_of_reads_the_frames_and_the_anchor():
    assert window_of(None) is None and window_of({}) is None
    assert window_of({"context_window": window([3, 4, 5, 6], True)}) == ((3, 4, 5, 6), 2)
    assert window_of({"context_window": window([0, 1, 2, 3], True)}) == ((0, 1, 2, 3), None)
    key = Windowed((0, 0), (3, 4), 2)
    assert key != Windowed((0, 0), (3, 4)) and key.base == (0, 0)


def test_a_window_that_does_not_say_its_frames_turns_caching_off_loudly(caplog):
    run = RunState(lambda: ResidualCache([1, 0]), StepTracker([1, .5, 0]), "owner")
    with caplog.at_level(logging.ERROR, logger="gcache"):
        run.begin_call(1.0, {"context_window": object()})
    assert run.disabled and "which frames" in run.disabled
    assert any("computes every step" in r.getMessage() for r in caplog.records)


def test_windows_that_do_not_name_themselves_stop_the_caching_before_anything_skips(caplog):
    """A ComfyUI whose context windows stop naming the window: two calls of the same conds at one sigma between two
    callbacks. Caching stops on the first step (which computes), loudly; never a shared residual."""
    run = RunState(lambda: ResidualCache(MASK), StepTracker(sigmas(len(MASK))), "owner")
    run.context_handler = True
    topts = {"cond_or_uncond": [0], "uuids": ["u"]}
    with caplog.at_level(logging.ERROR, logger="gcache"):
        run.begin_call(1.0, topts)
        assert run.disabled is None
        run.begin_call(1.0, topts)
    assert run.disabled and "naming the window" in run.disabled
    assert any("computes every step" in r.getMessage() for r in caplog.records)


def test_heuns_second_call_at_a_sigma_is_not_taken_for_a_window():
    """Heun evaluates σ_1 as the correction of step 0 (before its callback) and again as step 1 (after it)."""
    run = RunState(lambda: ResidualCache(MASK), StepTracker(sigmas(len(MASK))), "owner")
    run.context_handler = True  # the node is there, but the video fits one window: calls name no window
    topts = {"cond_or_uncond": [0], "uuids": ["u"]}
    s = sigmas(len(MASK))
    run.begin_call(s[0], topts)
    run.begin_call(s[1], topts)  # the correction
    run.tracker.completed(0)
    run.begin_call(s[1], topts)  # step 1
    assert run.disabled is None


def test_a_call_with_other_block_patches_at_the_same_sigma_is_not_taken_for_a_window():
    """Skip Layer Guidance calls the model again for the cond at the same sigma, with its block patches (a Variant
    branch, whose residual is its own): under a context handler whose video fits one window, that is no unnamed
    window and caching must go on."""
    run = RunState(lambda: ResidualCache(MASK), StepTracker(sigmas(len(MASK))), "owner")
    run.context_handler = True
    topts = {"cond_or_uncond": [0], "uuids": ["u"]}
    s = sigmas(len(MASK))[0]
    run.begin_call(s, topts)
    run.begin_call(s, topts, patches="slg-skip")
    assert run.disabled is None
    run.begin_call(s, topts)  # the same plain call again: still caught
    assert run.disabled and "naming the window" in run.disabled
