"""ProfileRecorder and Profile against the brute-force oracle (stats_oracle.py): every statistic, every dtype, with
and without forecast recording, offloaded or not, chunked or not, sampled or not, one or two branches, merged or
recorded together, and driven through the engine as the profile mode drives it."""
import math

import numpy as np
import pytest
import stats_oracle as oracle
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_profile import SpyRecorder  # keeps what the engine hands the recorder: the oracle's input

import gcache.core.recorder as core_recorder
from gcache.core.engine import CacheStats, ResidualCache
from gcache.core.errors import GCacheError
from gcache.core.profile import MAX_SAMPLE_KEYS, Profile
from gcache.core.recorder import ProfileRecorder, sample_stride
from gcache.core.step_clock import StackClock

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# deterministic in CI: examples derived from the test's name, no example database
CI = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def histories(draw, dtype, max_steps=6):
    """N steps of (h, δ) per branch in a dtype, with the recorder's settings."""
    n = draw(st.integers(1, max_steps))
    b, tok, ch = draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 8))
    if b * tok * ch < 2:
        ch = 2
    numel = b * tok * ch
    gaps = draw(st.lists(st.floats(0.05, 1.0), min_size=n, max_size=n))
    total = sum(gaps)
    times = [1.0 - sum(gaps[:k]) / total for k in range(n)]   # 1 → >0, strictly decreasing, uneven
    top = 3 if dtype == torch.float16 else 5                   # float16 holds |x| < 65504
    scale = 10.0 ** draw(st.integers(-6, top))
    kind = draw(st.sampled_from(["random", "smooth", "repeats", "constant_h"]))
    n_branches = draw(st.integers(1, 2))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    runs = {}
    for key in ["cond", "uncond"][:n_branches]:
        base, drift, curve = (torch.randn(b, tok, ch, generator=g, dtype=torch.float64) for _ in range(3))
        hs, ds = [], []
        for k in range(n):
            if kind == "smooth":  # near-exact linear forecasts: the cancellation case
                d = base + times[k] * drift + 0.1 * times[k] ** 2 * curve + 1e-3 * torch.randn(
                    b, tok, ch, generator=g, dtype=torch.float64)
            else:
                d = torch.randn(b, tok, ch, generator=g, dtype=torch.float64)
            h = torch.ones(b, tok, ch, dtype=torch.float64) if kind == "constant_h" else \
                torch.randn(b, tok, ch, generator=g, dtype=torch.float64) * 3
            # "repeats": every second step repeats the one two before exactly (zero differences)
            ds.append(ds[k - 2].clone() if kind == "repeats" and k > 1 and k % 2 == 0 else (d * scale).to(dtype))
            hs.append((h * scale).to(dtype))
        runs[key] = (hs, ds)
    forecast = draw(st.booleans())
    max_elems = draw(st.one_of(st.none(), st.integers(2, numel)))
    m = len(range(0, numel, sample_stride(numel, ch, max_elems)))
    chunk = draw(st.sampled_from([1, "rows", 1 << 25]))
    chunk_elems = draw(st.integers(1, 3 * m)) if chunk == "rows" else chunk
    settings_ = dict(forecast=forecast, max_elems=max_elems, chunk_elems=chunk_elems,
                     history_device=draw(st.sampled_from([None, "cpu"])))
    return times, runs, settings_, kind


def record(times, runs, settings_, meta=None, twice=False):
    """Feed the recorder; returns it. `twice`: a second evaluation of each step (other values) is ignored."""
    rec = ProfileRecorder(times, meta=meta or {"model": "m"}, **settings_)
    for step in range(len(times)):
        for key, (hs, ds) in runs.items():
            before = (hs[step].clone(), ds[step].clone())
            rec.record(step, key, hs[step], ds[step])
            # the caller's tensors are never written (`.float()` of a float32 tensor is the same tensor)
            assert torch.equal(hs[step], before[0]) and torch.equal(ds[step], before[1]), "recorder wrote its input"
            if twice:
                rec.record(step, key, hs[step] * 2, ds[step] + 1)
    return rec


def oracle_for(times, runs, settings_):
    hs0 = next(iter(runs.values()))[1][0]
    s = oracle.stride_of(hs0.numel(), hs0.shape[-1], settings_["max_elems"])
    per_branch = [oracle.branch([oracle.sampled(h, s) for h in hs], [oracle.sampled(d, s) for d in ds], times,
                                settings_["forecast"]) for hs, ds in runs.values()]
    return s, oracle.profile_sums(per_branch)


def check_against_oracle(prof: Profile, want: dict, forecast: bool) -> None:
    oracle.assert_close("E", prof.e_sum, want["E"])
    oracle.assert_close("delta_norm", prof.delta_norm_sum, want["norms"])
    oracle.assert_close("rel_h", prof.rel_h_sum, want["rel_h"])
    oracle.assert_close("rel_delta", prof.rel_delta_sum, want["rel_delta"], rtol=4e-5)
    if not forecast:
        assert prof.e1_sum is None and prof.fit_sq_sum is None and prof.fit_cross_sum is None
        assert prof.gram_sum is None
        return
    n = prof.n_steps
    tri = np.zeros((n, n, n), dtype=bool)
    for p in range(n):
        for i in range(p + 1, n):
            tri[p, i, i + 1:] = True
    assert np.all(prof.e1_sum[~tri] == 0) and np.all(prof.fit_cross_sum[~tri] == 0)  # only p < i < j is defined
    oracle.assert_close("E1", prof.e1_sum, want["e1"], want["e1_scale"])
    oracle.assert_close("fit_sq", prof.fit_sq_sum, want["sq"])
    oracle.assert_close("fit_cross", prof.fit_cross_sum, want["cross"], want["cross_scale"])
    oracle.assert_close("gram", prof.gram_sum, want["gram"], want["gram_scale"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("convert_first", [True, False], ids=["convert-first", "promote-in-kernel"])
@CI
@given(data=st.data())
def test_recorder_equals_the_oracle(dtype, convert_first, data):
    """(convert_first: lower-precision history rows made float32 before the subtraction, as on the CPU, or by type
    promotion inside the kernel, as on other devices.)"""
    times, runs, settings_, kind = data.draw(histories(dtype))
    saved = set(core_recorder.CONVERT_FIRST)
    core_recorder.CONVERT_FIRST.clear()
    core_recorder.CONVERT_FIRST.update({"cpu"} if convert_first else set())
    try:
        check_recorder_against_oracle(times, runs, settings_, kind)
    finally:
        core_recorder.CONVERT_FIRST.clear()
        core_recorder.CONVERT_FIRST.update(saved)


def check_recorder_against_oracle(times, runs, settings_, kind):
    hs0 = next(iter(runs.values()))[1][0]
    s, want = oracle_for(times, runs, settings_)
    m = len(range(0, hs0.numel(), s))
    if settings_["forecast"] and m < 2:
        return  # no fold statistics from one element
    rec = record(times, runs, settings_, twice=kind == "repeats")
    b = next(iter(rec.branches.values()))
    assert b.stride == s and s * (settings_["max_elems"] or hs0.numel()) >= hs0.numel()
    assert math.gcd(s, hs0.shape[-1]) == 1 and m <= (settings_["max_elems"] or m)
    # memory model: per branch, the history (N rows of m in δ's dtype) and one previous h
    assert rec.peak_bytes == len(runs) * (len(times) + 1) * m * hs0.element_size()
    prof = rec.finish()
    assert prof.count == len(runs) and prof.meta["runs"] == 1 and prof.meta["model"] == "m"
    assert prof.meta.get("sample_stride") == (s if s > 1 else None)
    check_against_oracle(prof, want, settings_["forecast"])


@pytest.mark.parametrize("dtype", DTYPES)
@CI
@given(data=st.data())
def test_merged_profiles_equal_one_profile_of_the_same_runs(dtype, data):
    """Each branch recorded on its own and merged = both recorded together (sums, counts, runs, keys)."""
    times, runs, settings_, _ = data.draw(histories(dtype, max_steps=5))
    if len(runs) < 2:
        runs = dict(runs, other=(runs["cond"][0][::-1], runs["cond"][1][::-1]))
    hs0 = next(iter(runs.values()))[1][0]
    if settings_["forecast"] and len(range(0, hs0.numel(), sample_stride(hs0.numel(), hs0.shape[-1],
                                                                        settings_["max_elems"]))) < 2:
        return
    keys = list(runs)
    parts = []
    for n, key in enumerate(keys):
        p = record(times, {key: runs[key]}, settings_).finish()
        p.meta["sample_keys"] = [f"k{n}", "shared"]
        parts.append(p)
    together = record(times, runs, settings_).finish()
    merged = parts[0].merge(parts[1])
    assert merged.count == together.count == 2 and merged.meta["runs"] == 2
    assert merged.meta["sample_keys"] == ["k0", "shared", "k1"]
    for name in ("e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "e1_sum", "fit_sq_sum", "fit_cross_sum",
                 "gram_sum"):
        a, b = getattr(merged, name), getattr(together, name)
        assert (a is None) == (b is None) and (a is None or np.allclose(a, b, rtol=1e-12, atol=0)), name
    _, want = oracle_for(times, runs, settings_)
    check_against_oracle(merged, want, settings_["forecast"])
    back = Profile.from_bytes(merged.to_bytes())
    check_against_oracle(back, want, settings_["forecast"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_E_is_the_mean_absolute_difference_with_forecast_recording_on(dtype):
    """Hand-computed: |0 − 3| = 3 (the float32 path once squared it in place: 9) and |1 + 2⁻¹²| is not rounded
    to 1 (a bfloat16 or float16 difference would be: they have 8 and 11 significant bits)."""
    for forecast in (False, True):
        rec = ProfileRecorder([1.0, 0.5, 0.25], forecast=forecast)
        for i, v in enumerate((0.0, 3.0, 1.0)):
            rec.record(i, "c", torch.zeros(1, 2, 2, dtype=dtype), torch.full((1, 2, 2), v, dtype=dtype))
        assert rec.finish().E[0].tolist() == [0.0, 3.0, 1.0], (dtype, forecast)
    rec = ProfileRecorder([1.0, 0.5])
    for i, v in enumerate((1.0, -2.0 ** -12)):
        rec.record(i, "c", torch.zeros(1, 1, 2, dtype=dtype), torch.full((1, 1, 2), v, dtype=dtype))
    assert rec.finish().E[0, 1] == 1.0 + 2.0 ** -12


@pytest.mark.parametrize("dtype", DTYPES)
def test_rel_h_differences_are_not_rounded_to_the_input_dtype(dtype):
    rec = ProfileRecorder([1.0, 0.5])
    for i, v in enumerate((1.0, -2.0 ** -12)):
        rec.record(i, "c", torch.full((1, 1, 2), v, dtype=dtype), torch.zeros(1, 1, 2, dtype=dtype))
    assert rec.finish().rel_h[1] == 1.0 + 2.0 ** -12


# ------------------------------------------------------------------------------------------ the engine's path
@pytest.mark.parametrize("dtype", DTYPES)
@CI
@given(st.booleans(), st.integers(1, 2), st.integers(0, 2**31 - 1), st.sampled_from([None, "cpu"]))
def test_profile_mode_through_the_engine_equals_the_oracle(dtype, forecast, n_branches, seed, history_device):
    """ResidualCache(None, observers=(recorder, …)) as GCache Profile drives it: blocks that write into their input
    (LTXV), CFG branches batched in one call; the recorder sees h as it entered and δ = z − h, and its statistics are
    the oracle's on exactly those values."""
    n, times = 5, [1.0, 0.8, 0.55, 0.3, 0.1]
    g = torch.Generator().manual_seed(seed)
    branches = ["cond", "uncond"][:n_branches]
    rec = SpyRecorder(times, forecast=forecast, history_device=history_device, chunk_elems=40)
    entered = []
    with ResidualCache(None, observers=(rec,)) as cache:
        for step in range(n):
            h = (torch.randn(2 * n_branches, 6, 5, generator=g) * 4).to(dtype)
            w = torch.randn(6, 5, generator=g).to(dtype)
            entered.append((h.clone(), None))
            cache.set_step(step)

            def blocks(x):
                out = x.mul_(0.5).add_(w)  # in place, as some families' blocks do
                return out
            z = cache.run(h, branches, blocks)
            entered[-1] = (entered[-1][0], z.clone())
    for b, key in enumerate(branches):
        for step in range(n):
            h_in, z = entered[step]
            chunk = slice(b * 2, b * 2 + 2) if n_branches == 2 else slice(None)
            h_seen, d_seen = rec.seen[key][step]
            assert torch.equal(h_seen, h_in[chunk])  # h as it was on entry, not as the blocks left it
            assert torch.equal(d_seen, z[chunk] - h_in[chunk])
    prof = rec.finish()
    runs = {k: ([rec.seen[k][s][0] for s in range(n)], [rec.seen[k][s][1] for s in range(n)]) for k in branches}
    _, want = oracle_for(times, runs, {"max_elems": None, "forecast": forecast})
    assert prof.count == n_branches
    check_against_oracle(prof, want, forecast)


# ------------------------------------------------------------------------------------------ Profile.merge, io time
@st.composite
def timed_profiles(draw):
    n = 3
    prof = Profile.empty([1.0, 0.6, 0.2])
    prof.count = draw(st.integers(0, 3))
    if prof.count:
        prof.e_sum = np.array(draw(st.lists(st.floats(0, 10), min_size=9, max_size=9))).reshape(n, n)
        np.fill_diagonal(prof.e_sum, 0)
    meta = {"runs": draw(st.integers(0, 5)), "model": "m"}
    timing = draw(st.sampled_from(["none", "io_time", "io_runs"]))
    if timing == "io_time":  # a profile from before per-step timing: one timed total
        meta["io_time"] = {"stack": draw(st.floats(0, 50)), "call": draw(st.floats(0.001, 100))}
    elif timing == "io_runs":
        runs = []
        for _ in range(draw(st.integers(1, 20))):
            q = sorted(draw(st.lists(st.floats(0, 1), min_size=3, max_size=3)))
            runs.append({"median": q[1], "q1": q[0], "q3": q[2], "steps": draw(st.integers(1, 30))})
        meta["io_runs"] = runs
    if draw(st.booleans()):
        meta["io_share"] = draw(st.floats(0, 0.9))  # the parameter-count estimate
    if draw(st.booleans()):
        meta["sample_keys"] = draw(st.lists(st.sampled_from([f"k{i}" for i in range(8)]), max_size=6, unique=True))
    meta[draw(st.sampled_from(["only_a", "only_b"]))] = draw(st.integers(0, 9))
    prof.meta = meta
    return prof


def oracle_runs(meta: dict) -> list:
    """A profile's timed runs as the io-share docstring defines them: its io_runs, else its one timed total as one
    run without steps."""
    if "io_runs" in meta:
        return list(meta["io_runs"])
    t = meta.get("io_time")
    if t and t["call"] > 0:
        v = round(min(max(1 - t["stack"] / t["call"], 0.0), 0.99), 6)
        return [{"median": v, "q1": v, "q3": v, "steps": 0}]
    return []


def oracle_merge_meta(a: dict, b: dict) -> dict:
    out = dict(b)
    out.update(a)  # a's values win; b adds what a lacks
    out["runs"] = a.get("runs", 0) + b.get("runs", 0)
    keys = list(a.get("sample_keys", []))
    for k in b.get("sample_keys", []):
        if k not in keys:
            keys.append(k)
    if keys:
        out["sample_keys"] = keys[-MAX_SAMPLE_KEYS:]
    out.pop("io_time", None)  # a merged profile keeps runs, never a total
    out.pop("io_runs", None)
    runs = (oracle_runs(a) + oracle_runs(b))[-32:]
    if runs:
        out["io_runs"] = runs
    return out


def oracle_median(values) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def oracle_io_share(meta: dict) -> float:
    """The median of the runs' medians; else the parameter-count estimate; else 0."""
    runs = oracle_runs(meta)
    if runs:
        return oracle_median([r["median"] for r in runs])
    est = meta.get("io_share")
    return float(est) if est is not None and 0 <= est < 1 else 0.0


@CI
@given(timed_profiles(), timed_profiles())
def test_merge_of_meta_io_runs_and_keys_equals_the_oracle(a, b):
    merged = a.merge(b)
    want = oracle_merge_meta(a.meta, b.meta)
    assert merged.meta == want
    assert merged.count == a.count + b.count
    assert np.array_equal(merged.e_sum, a.e_sum + b.e_sum)
    assert merged.io_share == pytest.approx(oracle_io_share(want), abs=1e-12)


def test_sample_keys_keep_the_latest_when_there_are_too_many():
    a, b = Profile.empty([1.0, 0.5]), Profile.empty([1.0, 0.5])
    a.meta["sample_keys"] = [f"a{i}" for i in range(MAX_SAMPLE_KEYS)]
    b.meta["sample_keys"] = ["a3", "b0", "b1"]
    keys = a.merge(b).sample_keys
    assert len(keys) == MAX_SAMPLE_KEYS and keys[-2:] == ["b0", "b1"] and keys[0] == "a2"


def test_merge_of_optional_statistics():
    """Present in both: summed; one side without samples: the other's (a copy); both with samples and one
    without them: none (with a warning)."""
    times = [1.0, 0.6, 0.3]
    rec = ProfileRecorder(times, forecast=True)
    for i in range(3):
        rec.record(i, "c", torch.zeros(1, 2, 2), torch.full((1, 2, 2), float(i * i)))
    f = rec.finish()
    empty = Profile.empty(times)
    only = empty.merge(f)
    assert only.count == 1 and np.array_equal(only.e1_sum, f.e1_sum) and only.e1_sum is not f.e1_sum
    assert np.array_equal(f.merge(f).fit_cross_sum, 2 * f.fit_cross_sum)
    plain = Profile.empty(times)
    plain.count = 1
    assert f.merge(plain).e1_sum is None and f.merge(plain).fit_sq_sum is None


@CI
@given(st.lists(st.integers(1, 2), min_size=2, max_size=6), st.lists(st.floats(0.001, 1.0), min_size=60, max_size=60),
       st.sampled_from(["all", ("cond", "uncond")]))
def test_measured_io_shares_equal_the_clock(calls_per_step, durations, branches):
    """The engine's io bookkeeping against a scripted clock: for each step but the first and the last (when 3 or
    more), 1 − (seconds in the stack, entry to exit) / (the step's seconds less the profile's own snapshot, before
    entry, and recording, after exit)."""
    import gcache.core.step_clock as step_clock
    ticks = iter(np.cumsum([0.0] + durations * 3).tolist())

    def clock():
        return next(ticks)
    import types
    real = step_clock.time
    step_clock.time = types.SimpleNamespace(perf_counter=clock)  # the step clock's time only, not the time module's
    try:
        rec = ProfileRecorder([1.0 - k / len(calls_per_step) for k in range(len(calls_per_step))])
        h = torch.randn(2, 3, 2)
        clk = StackClock()  # its marks, taken inside enter/exit (and "end" at close): a raw timeline
        with ResidualCache(None, observers=(rec, clk)) as cache:
            for step, calls in enumerate(calls_per_step):
                cache.set_step(step)
                for _ in range(calls):
                    cache.run(h, [branches] if isinstance(branches, str) else list(branches), lambda x: x + 1)
        marks = list(clk.marks)
        stats = cache.stats
    finally:
        step_clock.time = real
    ends = [t for tag, _, t in marks if tag == "end"]
    assert len(ends) == 1
    starts = {step: t for tag, step, t in marks if tag == "step"}
    order = sorted(starts)
    kept = order[1:-1] if len(order) >= 3 else order
    want = []
    for n, step in enumerate(order):
        nxt = starts[order[n + 1]] if n + 1 < len(order) else ends[0]
        of = lambda tag: [t for tg, s, t in marks if tg == tag and s == step]  # noqa: E731
        snaps, ins, outs, recs = of("snap"), of("in"), of("out"), of("rec")
        assert len(snaps) == len(ins) == len(outs) == len(recs) == calls_per_step[step]
        stack = sum(o - i for i, o in zip(ins, outs))
        own = sum(i - s for s, i in zip(snaps, ins)) + sum(r - o for o, r in zip(outs, recs))
        if step in kept:
            want.append(min(max(1 - stack / ((nxt - starts[step]) - own), 0.0), 1.0))
    assert stats.io_step_shares() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_cache_stats_io_shares_are_empty_without_timed_steps():
    assert CacheStats().io_step_shares() == []


def test_nan_forecast_statistics_are_refused():
    rec = ProfileRecorder([1.0, 0.6, 0.3], forecast=True)
    for i in range(3):
        d = torch.ones(1, 2, 2)
        if i == 2:
            d[0, 0, 0] = float("inf")
        rec.record(i, "c", torch.ones(1, 2, 2), d)
    with pytest.raises(GCacheError, match="NaN/Inf"):
        rec.finish()
