"""Profile recording and the Profile artifact."""
import numpy as np
import pytest
import torch

from gcache.core.engine import ResidualCache
from gcache.core.errors import GCacheError
from gcache.core.profile import Profile
from gcache.core.recorder import ProfileRecorder
from gcache.reference_model.sampler import flow_sigmas, sample

N = 7


def times():
    return flow_sigmas(N)[:-1].tolist()


class SpyRecorder(ProfileRecorder):
    """Keeps a copy of every recorded residual so E can be recomputed by brute force."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen = {}

    def record(self, step, branch, h, delta):
        self.seen.setdefault(branch, {}).setdefault(step, (h.clone(), delta.clone()))
        super().record(step, branch, h, delta)


def profile_run(model, seeds, cfg=3.0, recorder_cls=ProfileRecorder, **kw):
    rec = recorder_cls(times(), meta={"model": "tiny"}, **kw)
    with ResidualCache(None, observers=(rec,)) as cache:
        sample(model, [s % 10 for s in seeds], seeds, n_steps=N, cfg_scale=cfg, cache=cache)
    return rec


def test_E_matches_brute_force_and_is_symmetric(tiny_model):
    rec = profile_run(tiny_model, [1, 2], recorder_cls=SpyRecorder)
    seen = rec.seen
    prof = rec.finish()
    assert prof.count == 2  # cond + uncond branches
    E = prof.E
    assert np.allclose(E, E.T) and np.all(np.diag(E) == 0)
    brute = np.zeros((N, N))
    norms, rel_h, rel_d = np.zeros(N), np.zeros(N), np.zeros(N)
    for branch in seen.values():
        for i in range(N):
            norms[i] += branch[i][1].abs().mean().item()
            if i:
                hp, dp = branch[i - 1]
                rel_h[i] += ((branch[i][0] - hp).abs().mean() / hp.abs().mean()).item()
                rel_d[i] += ((branch[i][1] - dp).abs().mean() / dp.abs().mean()).item()
            for j in range(N):
                brute[i, j] += (branch[i][1] - branch[j][1]).abs().double().mean().item()
    assert np.allclose(E, brute / 2, rtol=1e-5, atol=1e-7)
    assert np.allclose(prof.delta_norm, norms / 2, rtol=1e-5)
    assert np.allclose(prof.rel_h, rel_h / 2, rtol=1e-4)
    assert np.allclose(prof.rel_delta, rel_d / 2, rtol=1e-4)


def test_merge_equals_profiling_both_runs_together(tiny_model):
    a = profile_run(tiny_model, [5]).finish()
    b = profile_run(tiny_model, [6]).finish()
    both = profile_run(tiny_model, [5, 6]).finish()  # one batch: each branch's mean covers both images
    merged = a.merge(b)
    assert merged.count == a.count + b.count and merged.meta["runs"] == 2
    assert np.allclose(merged.e_sum, a.e_sum + b.e_sum)
    assert np.allclose(merged.E, both.E, rtol=1e-4, atol=1e-6)
    assert np.allclose(merged.delta_norm, both.delta_norm, rtol=1e-4)


def test_cpu_history_gives_same_E(tiny_model):
    a = profile_run(tiny_model, [9]).finish()
    b = profile_run(tiny_model, [9], history_device="cpu", chunk_elems=1).finish()  # row by row, streamed
    assert np.allclose(a.E, b.E, rtol=1e-6, atol=1e-9)


def test_recorder_memory_model(tiny_model):
    rec = profile_run(tiny_model, [1], cfg=1.0)
    tokens, width = tiny_model.tokens, tiny_model.cfg.width
    per_residual = tokens * width * 4  # fp32, batch 1
    assert rec.peak_bytes == N * per_residual + per_residual  # history + one previous h
    rec.finish()
    assert rec.branches == {}


def test_round_trip(tmp_path, tiny_model):
    p = profile_run(tiny_model, [1]).finish()
    path = str(tmp_path / "p.safetensors")
    p.save(path)
    q = Profile.load(path)
    assert q.n_steps == N and q.count == p.count and q.meta == p.meta
    for k in ("e_sum", "delta_norm_sum", "rel_delta_sum", "rel_h_sum", "times", "sigmas"):
        assert np.array_equal(getattr(p, k), getattr(q, k))


def test_nan_residuals_raise_and_keep_saved_profile(tmp_path):
    path = tmp_path / "p.safetensors"
    rec = ProfileRecorder([1.0, 0.5, 0.25])
    for i in range(3):
        rec.record(i, "c", torch.ones(1, 4, 2), torch.ones(1, 4, 2) * i)
    rec.finish().save(str(path))
    before = path.read_bytes()
    rec = ProfileRecorder([1.0, 0.5, 0.25])
    for i in range(3):
        d = torch.ones(1, 4, 2)
        if i == 1:
            d[0, 0, 0] = float("nan")
        rec.record(i, "c", torch.ones(1, 4, 2), d)
    with pytest.raises(GCacheError, match="NaN/Inf .*step 1"):
        rec.finish()
    assert path.read_bytes() == before and Profile.load(str(path)).count == 1


def test_incomplete_run_adds_nothing():
    rec = ProfileRecorder([1.0, 0.5, 0.25])
    rec.record(0, "c", torch.ones(1, 2, 2), torch.ones(1, 2, 2))
    assert rec.finish().count == 0


def test_corrupt_foreign_and_versioned_files(tmp_path):
    rec = ProfileRecorder([1.0, 0.5])
    for i in range(2):
        rec.record(i, "c", torch.ones(1, 2, 2), torch.full((1, 2, 2), float(i)))
    p = rec.finish()
    good = p.to_bytes()
    with pytest.raises(GCacheError, match="truncated or damaged"):
        Profile.from_bytes(good[: len(good) // 2])
    with pytest.raises(GCacheError, match="truncated or damaged"):
        Profile.from_bytes(b"not a file at all")
    from safetensors.torch import save
    with pytest.raises(GCacheError, match="not a GCache profile"):
        Profile.from_bytes(save({"w": torch.zeros(2)}, metadata={"format": "lora"}))
    data = p.to_bytes().replace(b'"version":"2"', b'"version":"7"')
    with pytest.raises(GCacheError, match="version '7'"):
        Profile.from_bytes(data)


def test_merge_refuses_other_step_count_schedule_or_model():
    a = Profile.empty([1.0, 0.5, 0.2], meta={"model": "flux"})
    with pytest.raises(GCacheError, match="3 and 4 steps"):
        a.merge(Profile.empty([1.0, 0.7, 0.5, 0.2]))
    with pytest.raises(GCacheError, match="different schedules"):
        a.merge(Profile.empty([1.0, 0.6, 0.2]))
    with pytest.raises(GCacheError, match="model 'wan'"):
        a.merge(Profile.empty([1.0, 0.5, 0.2], meta={"model": "wan"}))
    with pytest.raises(GCacheError, match="no complete run"):
        _ = a.E


def test_edited_metadata_and_values_are_refused():
    import json as _json

    from safetensors.torch import load, save
    rec = ProfileRecorder([1.0, 0.5])
    for i in range(2):
        rec.record(i, "c", torch.ones(1, 2, 2), torch.full((1, 2, 2), float(i)))
    good = rec.finish().to_bytes()
    tensors = load(good)
    header = _json.loads(good[8:8 + int.from_bytes(good[:8], "little")])["__metadata__"]

    def variant(meta=None, **arrays):
        t = dict(tensors, **arrays)
        return save(t, metadata=dict(header, **(meta or {})))
    for bad in (variant({"meta": "[1, 2]"}), variant({"meta": "null"}), variant({"meta": '{"runs": "abc"}'}),
                variant(e_sum=-tensors["e_sum"]), variant(e_sum=tensors["e_sum"] + 1.0),
                variant({"count": "0"})):
        with pytest.raises(GCacheError, match="inconsistent"):
            Profile.from_bytes(bad)


def test_large_residuals_are_sampled_and_E_stays_close(tiny_model):
    """Above max_elems the recorder keeps every s-th element (s coprime with the width): memory shrinks by s,
    E is the same mean on the sample, close to the exact one."""
    from gcache.core.recorder import sample_stride
    assert sample_stride(100, 8, None) == 1 and sample_stride(100, 8, 100) == 1
    assert sample_stride(1000, 8, 300) == 5          # ⌈1000/300⌉ = 4 shares a factor with 8 → 5
    exact = profile_run(tiny_model, [3], max_elems=None)
    sampled = profile_run(tiny_model, [3], max_elems=700)
    numel = tiny_model.tokens * tiny_model.cfg.width  # batch 1 per branch
    s = sample_stride(numel, tiny_model.cfg.width, 700)
    assert s > 1 and sampled.peak_bytes * s <= exact.peak_bytes * 1.01
    a, b = exact.finish(), sampled.finish()
    assert b.meta["sample_stride"] == s and "sample_stride" not in a.meta
    off = ~np.eye(N, dtype=bool)
    assert np.allclose(a.E[off], b.E[off], rtol=0.15)
    assert np.corrcoef(a.E[off], b.E[off])[0, 1] > 0.97


class HostGatherFlag(torch.Tensor):
    """A history tensor that fails on row gathers (hist[[0, 2]]): on an offloaded, pinned history those read
    the host copy before the asynchronous device-to-host copies of recent rows have landed."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and isinstance(args[1], (list, torch.Tensor)):
            raise AssertionError("the offloaded history was read by a host-side gather")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_history_with_gaps_is_read_in_stream_ordered_slices():
    rec = ProfileRecorder([1.0, 0.75, 0.5, 0.25], history_device="cpu", chunk_elems=1 << 20)
    g = torch.Generator().manual_seed(0)
    hs = [torch.randn(1, 3, 4, generator=g) for _ in range(4)]
    ds = [torch.randn(1, 3, 4, generator=g) for _ in range(4)]
    rec.record(0, "all", hs[0], ds[0])
    rec.branches["all"].hist = rec.branches["all"].hist.as_subclass(HostGatherFlag)
    for step in (2, 3):  # step 1 is never recorded (a gap): step 3 reads rows 0 and 2
        rec.record(step, "all", hs[step], ds[step])
    b = rec.branches["all"]
    for i in (0, 2, 3):
        for j in (0, 2, 3):
            assert b.rows[i, j].item() == pytest.approx((ds[i] - ds[j]).abs().mean().item(), rel=1e-5)


def test_forecast_errors_match_brute_force_and_survive_the_file(tiny_model, tmp_path):
    rec = profile_run(tiny_model, [1, 2], recorder_cls=SpyRecorder, forecast=True)
    seen, t = rec.seen, times()
    prof = rec.finish()
    E1 = prof.E1
    for p in range(N):
        for i in range(p + 1, N):
            for j in range(i + 1, N):
                c = (t[j] - t[i]) / (t[i] - t[p])
                want = np.mean([((1 + c) * br[i][1] - c * br[p][1] - br[j][1]).abs().mean().item()
                                for br in seen.values()])
                assert E1[p, i, j] == pytest.approx(want, rel=1e-4, abs=1e-7)
    assert E1[3, 1, 5] == 0 and E1[1, 2, 2] == 0  # only p < i < j is defined
    path = str(tmp_path / "f.profile.safetensors")
    prof.save(path)
    assert np.allclose(Profile.load(path).E1, E1)
    merged = Profile.load(path).merge(Profile.load(path))
    assert np.allclose(merged.E1, E1)
    with pytest.raises(GCacheError, match="forecast"):
        profile_run(tiny_model, [1]).finish().E1  # recorded without forecast errors
