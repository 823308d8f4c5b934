"""The engine's side of the self-check (core/replay.py): a held call replayed through the skip path returns h + δ
of the computed pass, exactly; statistics, stored residuals and observers never see the replay; a run with a
replay is bit-identical to one without; a replay that does not match the computed call is refused (headless)."""
import pytest
import torch

from gcache.core.engine import ResidualCache
from gcache.core.observer import EngineObserver
from gcache.core.recorder import ProfileRecorder
from gcache.core.replay import ReplayBroken


class Log(EngineObserver):
    """Every hook call, in order (reads h too: δ of computed steps)."""
    reads_h = True

    def __init__(self):
        self.events = []

    def on_enter(self, step, h):
        self.events.append(("enter", step))

    def on_blocks(self, step):
        self.events.append(("blocks", step))

    def on_blocks_done(self, step):
        self.events.append(("done", step))

    def on_residual(self, step, branch, h, delta):
        self.events.append(("residual", step, branch, delta.clone()))

    def on_exit(self, step):
        self.events.append(("exit", step))


def blocks_of(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, 8, generator=g) * 0.3
    return lambda h: h + torch.tanh(h @ w)


def pass_through(cache, h, branches, blocks):
    """One stack pass as the gate makes it: blocks only when the engine says compute."""
    compute = cache.enter(h, branches)
    return cache.exit(blocks(h) if compute else None)


def run(mask, replay_at=None, observers=(), branches=("c", "u"), n=6):
    """n steps of a toy stack (inputs fixed per step); at `replay_at` the call is held and replayed. Returns the
    outputs, the replayed outputs, the counts and the cache."""
    cache = ResidualCache(mask, observers=observers)
    outs, replays, counts = [], [], None
    for i in range(n):
        cache.set_step(i)
        h = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(100 + i))
        blocks = blocks_of(i)
        if i == replay_at:
            cache.hold()
            outs.append(pass_through(cache, h, branches, blocks))
            cache.replay()
            replays.append(pass_through(cache, h.clone(), branches, lambda _: pytest.fail("blocks ran in a replay")))
            counts = cache.release()
        else:
            outs.append(pass_through(cache, h, branches, blocks))
    return outs, replays, counts, cache


@pytest.mark.parametrize("mask", [None, [1] * 6, [1, 0, 1, 1, 0, 1]])
def test_a_replay_returns_h_plus_the_held_delta_and_the_run_is_bit_identical(mask):
    plain, _, _, c0 = run(mask, None, (Log(),))
    log = Log()
    outs, replays, counts, c1 = run(mask, 3, (log,))
    assert all(torch.equal(a, b) for a, b in zip(plain, outs))  # the run's outputs, bit for bit
    h = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(103))
    z = blocks_of(3)(h)
    assert torch.equal(replays[0], h + (z - h))  # h + δ by the skip path's own arithmetic, per branch chunk
    assert (counts.held_entries, counts.held, counts.entries, counts.exits) == (1, 1, 1, 1)
    assert counts.dtype == torch.float32
    stats0, stats1 = c0.close(), c1.close()
    for f in ("computed_steps", "skipped_steps", "block_runs", "stack_calls", "decided", "resets"):
        assert getattr(stats0, f) == getattr(stats1, f), f


def test_observers_see_nothing_of_the_replay_and_a_profile_records_the_same():
    plain_log, log = Log(), Log()
    run(None, None, (plain_log,))
    run(None, 2, (log,))
    assert [e[:3] for e in plain_log.events] == [e[:3] for e in log.events]
    assert all(torch.equal(a[3], b[3]) for a, b in zip(plain_log.events, log.events) if a[0] == "residual")
    profiles = []
    for replay_at in (None, 4):
        rec = ProfileRecorder([1 - i / 6 for i in range(6)], forecast=True)
        run(None, replay_at, (rec,))
        profiles.append(rec.finish())
    a, b = profiles
    assert a.count == b.count == 2
    for name in ("e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "e1_sum", "fit_sq_sum", "gram_sum"):
        assert (getattr(a, name) == getattr(b, name)).all(), name


def test_a_replay_leaves_the_stored_residuals_alone():
    """Under a skipping mask the replay reads the held δ, never the stored one, and stores nothing."""
    mask = [1, 1, 0, 0, 1, 0]
    plain, _, _, _ = run(mask, None)
    outs, _, _, cache = run(mask, 1)  # step 1's δ is stored (step 2 reuses it) and held
    assert all(torch.equal(a, b) for a, b in zip(plain, outs))
    assert cache.held_tensors() == 2  # the two branches' δ of step 4 (the last computed), nothing of the replay


def test_blocks_that_write_into_their_input_still_give_the_true_delta():
    cache = ResidualCache(None)
    cache.set_step(1)
    h = torch.randn(1, 4, 8)
    h0 = h.clone()

    def in_place(x):
        x += 1.0  # LTXV's `x +=`: the stack's input is gone after the blocks
        return x
    cache.hold()
    pass_through(cache, h, ["all"], in_place)
    cache.replay()
    out = pass_through(cache, h0.clone(), ["all"], lambda _: None)
    cache.release()
    assert torch.allclose(out, h0 + 1.0) and torch.equal(out, h0 + ((h0 + 1.0) - h0))


def test_a_replay_that_does_not_match_the_computed_call_is_refused():
    def held(n_passes=1, branches=("all",)):
        cache = ResidualCache(None)
        cache.set_step(1)
        cache.hold()
        for _ in range(n_passes):
            pass_through(cache, torch.ones(2, 3, 4), branches, lambda h: h * 2)
        cache.replay()
        return cache

    cache = held()
    with pytest.raises(ReplayBroken, match="without entering"):
        cache.exit(None)  # the first block's patch was not called in the replay
    cache = held()
    pass_through(cache, torch.ones(2, 3, 4), ["all"], None)
    with pytest.raises(ReplayBroken, match="2 times"):
        cache.enter(torch.ones(2, 3, 4), ["all"])  # entered more often than the computed call left
    cache = held(branches=("c", "u"))
    with pytest.raises(ReplayBroken, match="does not match"):
        cache.enter(torch.ones(2, 3, 5), ["c", "u"])  # another shape
    cache = held()
    cache.enter(torch.ones(2, 3, 4), ["all"])
    with pytest.raises(ReplayBroken, match="again before leaving"):
        cache.enter(torch.ones(2, 3, 4), ["all"])
    assert cache.release().entries == 2


def test_a_stack_entered_and_never_left_is_counted_and_holds_nothing():
    cache = ResidualCache(None)
    cache.set_step(1)
    cache.enter(torch.ones(1, 2, 3), ["all"])  # an earlier call whose last block's patch never ran
    cache.hold()
    cache.enter(torch.ones(1, 2, 3), ["all"])
    counts = cache.release()
    assert (counts.held_entries, counts.held) == (1, 0)
    assert cache.release().held_entries == 0  # released twice: an empty count
