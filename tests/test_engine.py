"""Residual-reuse engine on the reference DiT: exactness, block counts, branches, resets, memory release."""
import gc
import logging

import pytest
import torch

from gcache.core.engine import ResidualCache
from gcache.core.errors import GCacheError
from gcache.core.step_clock import StepClock
from gcache.reference_model.sampler import sample

SEEDS = [3, 4]
LABELS = [3, 4]


class CountingBlocks:
    """Wraps the model's block stack to count how often it runs, per call."""

    def __init__(self, model):
        self.model, self.calls = model, 0
        self.orig = model.run_blocks

    def __enter__(self):
        def counted(h, cond):
            self.calls += 1
            return self.orig(h, cond)
        self.model.run_blocks = counted
        return self

    def __exit__(self, *exc):
        del self.model.run_blocks  # back to the class method


def test_all_ones_is_bit_identical(tiny_model):
    plain = sample(tiny_model, LABELS, SEEDS, n_steps=8, cfg_scale=3.0)
    with ResidualCache([1] * 8) as cache:
        cached = sample(tiny_model, LABELS, SEEDS, n_steps=8, cfg_scale=3.0, cache=cache)
    assert torch.equal(plain, cached)
    assert cache.stats.skipped_steps == 0 and cache.stats.computed_steps == 8


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_k_computed_steps_run_blocks_k_times_per_branch(tiny_model, cfg):
    mask = [1, 0, 0, 1, 0, 1, 1, 0, 0, 0]
    with CountingBlocks(tiny_model) as counter, ResidualCache(mask) as cache:
        out = sample(tiny_model, LABELS, SEEDS, n_steps=10, cfg_scale=cfg, cache=cache)
    assert counter.calls == sum(mask)  # CFG branches are batched: one stack call per computed step
    expected = {"cond": 4, "uncond": 4} if cfg != 1.0 else {"cond": 4}
    assert cache.stats.block_runs == expected
    assert cache.stats.computed_steps == 4 and cache.stats.skipped_steps == 6
    assert torch.isfinite(out).all()
    plain = sample(tiny_model, LABELS, SEEDS, n_steps=10, cfg_scale=cfg)
    assert not torch.equal(out, plain)  # skipping really changed something


def test_skip_reuses_last_delta_exactly():
    """z = h + δ of the last computed step, per branch."""
    blocks = lambda h: h * 2 + 1  # noqa: E731  δ = h + 1
    cache = ResidualCache([1, 0, 0])
    h0 = torch.arange(8.0).reshape(2, 2, 2)
    cache.set_step(0)
    z0 = cache.run(h0, ["cond", "uncond"], blocks)
    assert torch.equal(z0, blocks(h0))
    h1 = torch.full((2, 2, 2), 10.0)
    cache.set_step(1)
    z1 = cache.run(h1, ["cond", "uncond"], lambda h: pytest.fail("blocks ran on a skipped step"))
    assert torch.equal(z1, h1 + (h0 + 1))


def _in_place_blocks(h):
    """Like LTXV (`x += …`) and Chroma (`addcmul_`): the stack adds into its input and returns that tensor."""
    h += torch.tanh(h) + 1
    return h


@pytest.mark.parametrize("branches", [["all"], ["uncond", "cond"]])
def test_in_place_blocks_keep_the_true_delta(branches):
    """δ is z − h as h was on entry: a reference to h that the blocks overwrote would give δ = 0."""
    cache = ResidualCache([1, 0, 0, 1])
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(2, 3, 4, generator=g)
    true_delta = _in_place_blocks(h0.clone()) - h0
    cache.set_step(0)
    cache.run(h0.clone(), branches, _in_place_blocks)
    for step in (1, 2):
        h = torch.randn(2, 3, 4, generator=g)
        cache.set_step(step)
        assert torch.allclose(cache.run(h, branches, lambda h: pytest.fail("ran")), h + true_delta)


def test_in_place_blocks_are_profiled_with_the_true_delta():
    from gcache.core.recorder import ProfileRecorder
    rec = ProfileRecorder([1.0, 0.5], [1.0, 0.5])
    cache = ResidualCache(None, observers=(rec,))
    g = torch.Generator().manual_seed(1)
    hs = [torch.randn(1, 3, 4, generator=g) for _ in range(2)]
    deltas = [_in_place_blocks(h.clone()) - h for h in hs]
    for step, h in enumerate(hs):
        cache.set_step(step)
        cache.run(h.clone(), ["all"], _in_place_blocks)
    prof = rec.finish()
    assert prof.E[0, 1] == pytest.approx((deltas[0] - deltas[1]).abs().mean().item(), rel=1e-5)
    assert prof.delta_norm[1] == pytest.approx(deltas[1].abs().mean().item(), rel=1e-5)


def test_cfg_branches_keep_separate_caches():
    """Cond and uncond chunks get their own δ, also when they arrive in separate calls and swapped order."""
    cache = ResidualCache([1, 0])
    cache.set_step(0)
    hc, hu = torch.zeros(1, 3, 2), torch.ones(1, 3, 2)
    cache.run(hc, ["cond"], lambda h: h + 5)
    cache.run(hu, ["uncond"], lambda h: h - 7)
    cache.set_step(1)
    both = cache.run(torch.cat([hu, hc]), ["uncond", "cond"], lambda h: pytest.fail("ran"))
    assert torch.equal(both[0], hu[0] - 7) and torch.equal(both[1], hc[0] + 5)


def test_resolution_change_resets_with_warning(caplog):
    cache = ResidualCache([1, 0, 0])
    cache.set_step(0)
    cache.run(torch.zeros(2, 4, 3), ["c", "u"], lambda h: h + 1)
    cache.set_step(1)
    runs = []
    with caplog.at_level(logging.WARNING, logger="gcache"):
        out = cache.run(torch.zeros(2, 9, 3), ["c", "u"], lambda h: runs.append(1) or h + 2)
    assert runs == [1] and torch.equal(out, torch.full((2, 9, 3), 2.0))  # computed, not crashed
    assert "reset" in caplog.text and cache.stats.resets == 1
    cache.set_step(2)
    out = cache.run(torch.zeros(2, 9, 3), ["c", "u"], lambda h: pytest.fail("should reuse the new δ"))
    assert torch.equal(out, torch.full((2, 9, 3), 2.0))


def test_batch_size_change_resets(caplog):
    cache = ResidualCache([1, 0])
    cache.set_step(0)
    cache.run(torch.zeros(2, 4, 3), ["c", "u"], lambda h: h + 1)
    cache.set_step(1)
    with caplog.at_level(logging.WARNING, logger="gcache"):
        out = cache.run(torch.zeros(4, 4, 3), ["c", "u"], lambda h: h + 3)
    assert torch.equal(out, torch.full((4, 4, 3), 3.0)) and cache.stats.resets == 1


def test_policy_for_other_step_count_is_refused(tiny_model):
    with ResidualCache([1, 0, 1]) as cache, pytest.raises(GCacheError, match="remap"):
        sample(tiny_model, LABELS, SEEDS, n_steps=5, cache=cache)


def test_bad_masks_are_refused():
    for bad in ([0, 1, 1], [], [1, 2]):
        with pytest.raises(GCacheError):
            ResidualCache(bad)


def test_nothing_held_after_run_and_after_exception(tiny_model):
    mask = [1, 0, 1, 0, 0, 1]
    with ResidualCache(mask) as cache:
        sample(tiny_model, LABELS, SEEDS, n_steps=6, cache=cache)
        assert cache.stats.bytes_held > 0
    assert cache.held_tensors() == 0 and cache.stats.bytes_held == 0 and cache.stats.peak_bytes > 0

    class Boom(RuntimeError):
        pass

    calls = {"n": 0}

    def failing(h, cond):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Boom("out of memory in block 3")
        return type(tiny_model).run_blocks(tiny_model, h, cond)

    tiny_model.run_blocks = failing
    try:
        with pytest.raises(Boom), ResidualCache(mask) as cache2:
            sample(tiny_model, LABELS, SEEDS, n_steps=6, cache=cache2)
    finally:
        del tiny_model.run_blocks
    assert cache2.closed and cache2.held_tensors() == 0 and cache2.stats.bytes_held == 0
    gc.collect()


def test_cpu_offload_gives_same_result(tiny_model):
    mask = [1, 0, 1, 0, 0, 1, 0, 0]
    with ResidualCache(mask) as a:
        out_a = sample(tiny_model, LABELS, SEEDS, n_steps=8, cache=a)
    with ResidualCache(mask, cache_device="cpu") as b:
        out_b = sample(tiny_model, LABELS, SEEDS, n_steps=8, cache=b)
    assert torch.equal(out_a, out_b)


def test_delta_not_stored_between_computed_steps():
    """All-ones needs no δ at all: the engine must not pay for a subtraction nobody reads."""
    cache = ResidualCache([1, 1, 1])
    for i in range(3):
        cache.set_step(i)
        cache.run(torch.ones(1, 2, 2), ["c"], lambda h: h * 3)
    assert cache.stats.peak_bytes == 0


def test_summary_reports_counts_and_speedup():
    cache = ResidualCache([1, 0, 1, 0, 0, 1], observers=(StepClock(),))
    for i in range(6):
        cache.set_step(i)
        cache.run(torch.ones(1, 2, 2), ["c"], lambda h: h * 3)
    cache.close()
    line = cache.summary(io_share=0.1)  # 6 / (3 + 3 · 0.1) = 1.818…
    assert "computed 3/6 steps" in line and "skipped 3" in line
    assert "predicted 1.82× (no range: io share given without a range)" in line
    t = cache.stats.step_seconds  # this run's own steps between the first and the last: step 2 computed, 1, 3, 4 not
    assert sorted(t) == list(range(6))
    ts = sorted([t[1], t[3], t[4]])[1]
    assert f"measured {6 / (3 + 3 * ts / t[2]):.2f}× (this run's steps: medians of 1 computed and 3 skipped, first " \
           "and last left out)" in line
    # hand-made timings: a slow first step (warm-up) and the last one do not count; medians of the rest
    cache.stats.step_seconds = {0: 9.0, 1: 0.2, 2: 1.0, 3: 0.3, 4: 0.2, 5: 0.4}
    assert cache.stats.measured_speedup() == pytest.approx(6 / (3 + 3 * 0.2))  # = 1.666…
    cache.stats.step_seconds[0] = 0.5
    assert cache.stats.measured_speedup() == pytest.approx(6 / 3.6)
    cache.stats.decided = {0: True, 1: False, 2: True, 3: False, 4: False, 5: True}
    cache.stats.step_seconds = {0: 1.0, 1: 0.1, 2: 1.0, 3: 0.3, 4: 0.1, 5: 1.0}
    assert cache.stats.step_medians() == (1.0, 0.1, 1, 3)
    # no computed step between the first and the last (K = 2): no figure. The last step (no next model call in it)
    # is shorter than the others: as the only computed one, it once made the measured speed-up low.
    short = ResidualCache([1, 0, 0, 1], observers=(StepClock(),))
    for i in range(4):
        short.set_step(i)
        short.run(torch.ones(1, 2, 2), ["c"], lambda h: h * 3)
    short.close()
    short.stats.step_seconds = {0: 7.0, 1: 0.2, 2: 0.3, 3: 0.8}
    assert short.stats.step_medians() is None and short.stats.measured_speedup() is None
    assert "measured: too few steps timed (a computed and a skipped one between the first and the last)" in \
        short.summary(0.1)
    # a skipped step only after the first: nothing to compare it with
    alone = ResidualCache([1, 0], observers=(StepClock(),))
    for i in range(2):
        alone.set_step(i)
        alone.run(torch.ones(1, 2, 2), ["c"], lambda h: h * 3)
    alone.close()
    assert alone.stats.measured_speedup() is None and "measured: too few steps timed" in alone.summary(0.1)
    every = ResidualCache([1, 1, 1], observers=(StepClock(),))
    for i in range(3):
        every.set_step(i)
        every.run(torch.ones(1, 2, 2), ["c"], lambda h: h * 3)
    every.close()
    assert every.stats.measured_speedup() == 1.0 and "measured 1.00× (every step computed)" in every.summary()


def test_small_caches_are_reported_in_a_readable_unit():
    from gcache.core.engine import format_bytes
    assert format_bytes(64) == "64 B" and format_bytes(3 * 1024) == "3.0 KiB"
    assert format_bytes(25 * 2**20) == "25.0 MiB" and format_bytes(3 * 2**30) == "3.0 GiB"
    cache = ResidualCache([1, 0])
    cache.set_step(0)
    cache.run(torch.zeros(1, 4, 4), ["all"], lambda h: h + 1)
    cache.close()
    assert "cache peak 64 B" in cache.summary(0.1)  # not "0.0 MiB"


@pytest.mark.parametrize("order", [1, 2])
def test_forecast_extrapolates_the_residual_in_time(order):
    """δ linear (order 1) or quadratic (order 2) in t: the forecast is exact, where reuse is not."""
    times = [1.0, 0.8, 0.6, 0.4, 0.2]
    mask = [1, 1, 1, 0, 0]
    true = (lambda t: 3 * t - 1) if order == 1 else (lambda t: 2 * t * t - t + 0.5)
    cache = ResidualCache(mask, forecast=order, times=times)
    outs = []
    for step, t in enumerate(times):
        cache.set_step(step)
        h = torch.full((1, 2, 2), float(step))
        outs.append(cache.run(h, ["all"], lambda x, t=t: x + true(t)))
    for step in (3, 4):
        assert torch.allclose(outs[step], torch.full((1, 2, 2), step + true(times[step])), atol=1e-5)
    assert cache.held_tensors() == order + 1  # the last order + 1 computed residuals per branch, no more


def test_forecast_falls_back_to_lower_orders_and_order_0_is_reuse():
    times = [1.0, 0.75, 0.5, 0.25]
    cache = ResidualCache([1, 0, 1, 0], forecast=2, times=times)
    h = torch.zeros(1, 1, 1)
    cache.set_step(0)
    cache.run(h, ["all"], lambda x: x + 1.0)                  # δ_0 = 1
    cache.set_step(1)
    assert cache.run(h, ["all"], None).item() == 1.0           # one computed step: reuse
    cache.set_step(2)
    cache.run(h, ["all"], lambda x: x + 2.0)                  # δ_2 = 2
    cache.set_step(3)
    assert cache.run(h, ["all"], None).item() == pytest.approx(2.5)  # two: linear in t
    reuse = ResidualCache([1, 0], forecast=0, times=[1.0, 0.5])
    reuse.set_step(0)
    reuse.run(h, ["all"], lambda x: x + 1.0)
    reuse.set_step(1)
    assert reuse.run(h, ["all"], None).item() == 1.0


def test_forecast_all_ones_is_bit_identical(tiny_model):
    plain = sample(tiny_model, LABELS, SEEDS, n_steps=8, cfg_scale=3.0)
    with ResidualCache([1] * 8, forecast=1, times=[1 - i / 8 for i in range(8)]) as cache:
        assert torch.equal(plain, sample(tiny_model, LABELS, SEEDS, n_steps=8, cfg_scale=3.0, cache=cache))
    assert cache.stats.peak_bytes == 0  # nothing kept: no step is skipped


def test_forecast_needs_times():
    with pytest.raises(GCacheError, match="normalized time"):
        ResidualCache([1, 0], forecast=1)


def test_snapshot_reuses_the_storage_of_the_delta_it_replaces():
    """Peak memory: the snapshot of h on a storing step is written into the δ that step evicts."""
    cache = ResidualCache([1, 0, 1, 0])
    ptrs = []
    for step in range(4):
        cache.set_step(step)
        cache.run(torch.full((1, 3, 4), float(step)), ["all"], lambda x: x * 2 + 1)
        if step in (0, 2):
            ptrs.append(cache._deltas["all"][-1][1].data_ptr())
    assert ptrs[0] == ptrs[1]
    cache.set_step(3)
    assert torch.equal(cache.run(torch.zeros(1, 3, 4), ["all"], None), torch.full((1, 3, 4), 3.0))  # δ_2 = 2 + 1
