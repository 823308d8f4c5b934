"""The views the recorder hands profile statistics (core/profile_stats): shared temporaries give every statistic the
values of its definition whatever the order the statistics run in. Probe statistics read rows, |δ_i − δ_j|, δ_i and
the triple pass's block before and after others take or consume them (one even overwrites what it takes), and the
recorder's own E and the built-in statistics stay equal to the brute-force oracle (stats_oracle.py)."""
import numpy as np
import pytest
import stats_oracle as oracle
import torch

from gcache.core import forecasters, profile_stats
from gcache.core.recorder import ProfileRecorder

TIMES = [1.0, 0.8, 0.55, 0.35, 0.2, 0.05]
N = len(TIMES)


class EarlyTaker:
    """Takes |δ_i − δ_j| and the block before anyone else and overwrites them (ruins them for everyone after)."""
    name = "probe_early"
    tensors = {"probe_early_sum": profile_stats.Tensor(lambda n: (n, n))}
    order = 1

    def on_pairs(self, acc, c):
        acc["probe_early_sum"][c.step.j, c.lo:c.hi] = c.take_absdiff().square_().mean(dim=1).double()
        c.take_absdiff().fill_(7.0)  # a second take gets a fresh one: also ours to ruin

    def on_triples(self, acc, c):
        c.take_block().fill_(-3.0)


class LateReader:
    """Reads every view after E, the fit statistics and E1 have read, taken or consumed them."""
    name = "probe_late"
    tensors = {"probe_rows_sum": profile_stats.Tensor(lambda n: (n, n)),
               "probe_absdiff_sum": profile_stats.Tensor(lambda n: (n, n)),
               "probe_block_sum": profile_stats.Tensor(lambda n: (n, n, n)),
               "probe_di_sum": profile_stats.Tensor(lambda n: (n, n))}
    order = 90

    def on_pairs(self, acc, c):
        acc["probe_rows_sum"][c.step.j, c.lo:c.hi] = c.rows.float().mean(dim=1).double()
        acc["probe_absdiff_sum"][c.step.j, c.lo:c.hi] = c.absdiff.mean(dim=1).double()

    def on_triples(self, acc, c):
        acc["probe_block_sum"][c.lo:c.hi, c.i, c.step.j] = c.block.mean(dim=1).double()
        acc["probe_di_sum"][c.i, c.step.j] = c.di.mean().double()


class Probe:
    name, keeps, label, rank = "probe", 1, "probe (test)", -1
    needs = ("probe_early", "probe_late")

    def weights(self, kept, j, times, params):
        return [1.0]

    def dp_errors(self, profile):
        return profile.E, None

    def fit(self, profile, mask):
        return {}


@pytest.fixture
def probes():
    for stat in (EarlyTaker(), LateReader()):
        profile_stats.register(stat)
    forecasters.register(Probe())
    try:
        yield
    finally:
        forecasters.unregister("probe")
        for name in ("probe_early", "probe_late"):
            profile_stats.unregister(name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("chunk_elems", [1 << 25, 30])
def test_every_statistic_sees_its_definition_whatever_the_order(probes, dtype, chunk_elems):
    g = torch.Generator().manual_seed(11)
    hs = [torch.randn(2, 3, 5, generator=g).to(dtype) for _ in TIMES]
    ds = [torch.randn(2, 3, 5, generator=g).to(dtype) for _ in TIMES]
    rec = ProfileRecorder(TIMES, forecast=True, chunk_elems=chunk_elems)
    assert [s.name for s in rec.statistics] == ["e1", "fit", "gram", "probe_early", "probe_late"]
    for j in range(N):
        rec.record(j, "c", hs[j], ds[j])
    prof = rec.finish()
    x = [oracle.sampled(d, 1) for d in ds]
    want = oracle.branch([oracle.sampled(h, 1) for h in hs], x, TIMES, forecast=True)
    oracle.assert_close("E", prof.e_sum, want["E"])
    oracle.assert_close("E1", prof.e1_sum, want["e1"], want["e1_scale"])
    oracle.assert_close("fit_sq", prof.fit_sq_sum, want["sq"])
    oracle.assert_close("fit_cross", prof.fit_cross_sum, want["cross"], want["cross_scale"])
    oracle.assert_close("gram", prof.gram_sum, want["gram"], want["gram_scale"])
    rows, absdiff, sq = np.zeros((N, N)), np.zeros((N, N)), np.zeros((N, N))
    block, di = np.zeros((N, N, N)), np.zeros((N, N))
    scale = np.mean(np.abs(np.stack(x)))
    for j in range(N):
        for i in range(j):
            rows[j, i], absdiff[j, i] = np.mean(x[i]), np.mean(np.abs(x[i] - x[j]))
            sq[j, i] = np.mean((x[i] - x[j]) ** 2)
            for p in range(i):
                block[p, i, j] = np.mean(x[p])
            if i > 0:
                di[i, j] = np.mean(x[i])
    oracle.assert_close("early taker", prof.probe_early_sum, sq, rtol=1e-5)
    oracle.assert_close("late rows", prof.probe_rows_sum, rows, scale)
    oracle.assert_close("late absdiff", prof.probe_absdiff_sum, absdiff, rtol=1e-5)
    oracle.assert_close("late block", prof.probe_block_sum, block, scale)
    oracle.assert_close("late δ_i", prof.probe_di_sum, di, scale)
