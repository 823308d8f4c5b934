"""A forecaster that needs a profile statistic GCache doesn't have, both declared in one module outside GCache
(written to a temporary folder and registered only for the test): a forecast-recording run records the new
statistic through the real recorder, the file keeps and checks it, the forecaster's DP picks its mask from it, and
the engine applies the forecaster. Nothing in core/profile.py or core/recorder.py names it. The statistic's values
are checked against a float64 brute force written from its definition (the style of stats_oracle.py)."""
import importlib
import json
import sys
import textwrap

import numpy as np
import pytest
import stats_oracle as oracle
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from gcache.core import forecasters, profile_stats
from gcache.core.engine import ResidualCache
from gcache.core.errors import GCacheError
from gcache.core.policy import Policy
from gcache.core.profile import Profile
from gcache.core.recorder import ProfileRecorder, forecast_statistics
from gcache.search.dp_forecast import brute_force, forecast_mask_cost
from gcache.search.instant import instant_policy, propagation_weights

N, K = 9, 4
TOY = '''
"""Linear extrapolation in the step index, judged by its own mean absolute error: a statistic and a forecaster."""
import torch

from gcache.core import forecasters, profile_stats


class StepErrors:
    """S[p, i, j] = mean |δ_j − (δ_i + (j − i)/(i − p)·(δ_i − δ_p))| for recorded p < i < j (0 elsewhere)."""
    name = "toy_step_errors"
    tensors = {"toy_step_err_sum": profile_stats.Tensor(lambda n: (n, n, n), profile_stats.nonnegative)}
    missing = "This profile has no step-extrapolation errors: profile again with the toy forecaster registered."

    def on_triples(self, acc, c):
        j, i = c.step.j, c.i
        coef = torch.tensor([(j - i) / (i - p) for p in range(c.lo, c.hi)], dtype=torch.float32,
                            device=c.step.device)[:, None]
        pred = c.take_block().mul_(-coef).add_(c.di * (1 + coef))
        acc["toy_step_err_sum"][c.lo:c.hi, i, j] = pred.sub_(c.step.dj).abs_().mean(dim=1).double()


class Steps:
    name, keeps, label, rank = "toy_steps_abs", 2, "toy steps abs (test)", -1
    needs = ("toy_step_errors",)

    def weights(self, kept, j, times, params):
        p, i = kept[-2:]
        c = (j - i) / (i - p)
        return [-c, 1.0 + c]

    def dp_errors(self, profile):
        return profile.E, profile.mean("toy_step_err_sum")

    def fit(self, profile, mask):
        return {}


profile_stats.register(StepErrors())
forecasters.register(Steps())
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "gcache_toy_statistic.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("gcache_toy_statistic")
    try:
        yield forecasters.get("toy_steps_abs")
    finally:
        forecasters.unregister("toy_steps_abs")
        profile_stats.unregister("toy_step_errors")
        sys.modules.pop(module.__name__, None)
    assert "toy_step_errors" not in [s.name for s in forecast_statistics()]


def _times():
    return [1.0 - (j / N) ** 1.5 for j in range(N)]  # not linear in the step index: E1 is not the toy's error


def _runs(dtype, seed=0, shape=(2, 5, 7)):
    """Two branches of N residuals, smooth in the step index plus noise."""
    g = torch.Generator().manual_seed(seed)
    runs = {}
    for key in ("cond", "uncond"):
        base, drift = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
        ds = [(base + j * drift + 0.3 * torch.randn(shape, generator=g)).to(dtype) for j in range(N)]
        hs = [torch.randn(shape, generator=g).to(dtype) for _ in range(N)]
        runs[key] = (hs, ds)
    return runs


def _record(runs, **settings):
    rec = ProfileRecorder(_times(), meta={"model": "toy"}, forecast=True, **settings)
    for step in range(N):
        for key, (hs, ds) in runs.items():
            rec.record(step, key, hs[step], ds[step])
    return rec.finish()


def oracle_step_errors(ds: list) -> tuple:
    """The toy statistic by its definition, float64 loops over the sampled residuals; and the magnitude of the
    rounded terms (the float32 tolerance's scale)."""
    n = len(ds)
    want, scale = np.zeros((n, n, n)), np.zeros((n, n, n))
    for p in range(n):
        for i in range(p + 1, n):
            for j in range(i + 1, n):
                c = (j - i) / (i - p)
                want[p, i, j] = np.mean(np.abs(ds[i] + c * (ds[i] - ds[p]) - ds[j]))
                scale[p, i, j] = np.mean(np.abs((1 + c) * ds[i]) + np.abs(c * ds[p]) + np.abs(ds[j]))
    return want, scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("settings", [{}, {"chunk_elems": 40, "history_device": "cpu"}, {"max_elems": 31}],
                         ids=["whole", "chunked-offloaded", "sampled"])
def test_the_recorder_records_the_new_statistic_as_its_definition_says(toy, dtype, settings):
    runs = _runs(dtype)
    prof = _record(runs, **settings)
    numel = runs["cond"][1][0].numel()
    s = oracle.stride_of(numel, runs["cond"][1][0].shape[-1], settings.get("max_elems"))
    assert (s > 1) == ("max_elems" in settings)
    want, scale = np.zeros((N, N, N)), np.zeros((N, N, N))
    for _, ds in runs.values():
        w, sc = oracle_step_errors([oracle.sampled(d, s) for d in ds])
        want, scale = want + w, scale + sc
    assert prof.count == 2 and prof.has("toy_step_errors")
    oracle.assert_close("toy_step_err", prof.toy_step_err_sum, want, scale)
    # the built-in statistics are recorded beside it, unchanged (their own oracle tests check them)
    assert prof.has("e1") and prof.has("fit") and prof.has("gram")


def test_the_new_statistic_goes_from_a_profile_file_through_the_dp_to_the_engine(toy, tmp_path):
    runs = _runs(torch.float32, seed=1)
    path = str(tmp_path / "toy.profile.safetensors")
    _record(runs).save(path)
    prof = Profile.load(path)
    assert "toy_step_err_sum" in st_load(open(path, "rb").read())
    steps_err = prof.mean("toy_step_err_sum")
    assert np.allclose(steps_err * prof.count, prof.toy_step_err_sum) and not np.allclose(steps_err, prof.E1)

    pol = instant_policy(prof, K, "theory", forecast="toy_steps_abs")
    assert pol.forecast == "toy_steps_abs" and sum(pol.mask) == K
    # the DP minimized the bound over the new statistic: every mask's bound, by brute force
    w = propagation_weights(prof, "theory")
    best_mask, best = brute_force(prof.E, steps_err, w, K)
    assert pol.provenance["bound"] == pytest.approx(best, rel=1e-12)
    assert forecast_mask_cost(prof.E, steps_err, w, pol.mask) == pytest.approx(best, rel=1e-12)
    pol_path = str(tmp_path / "toy.json")
    pol.save(pol_path)
    pol = Policy.load(pol_path)

    deltas = runs["cond"][1]
    cache = ResidualCache(pol.mask, forecast=pol.forecast, times=pol.times, forecast_params=pol.forecast_params)
    computed, forecast_steps = [], 0
    for j in range(N):
        cache.set_step(j)
        h = torch.full(deltas[0].shape, 0.25 * j)
        out = cache.run(h, ["all"], lambda x, j=j: x + deltas[j])
        if pol.mask[j]:
            computed.append(j)
            continue
        d = {k: deltas[k].double() for k in computed}
        if len(computed) == 1:
            expect = h.double() + d[computed[0]]
        else:  # written out from the definition: δ_i + (j − i)/(i − p)·(δ_i − δ_p)
            p, i = computed[-2:]
            expect = h.double() + d[i] + (j - i) / (i - p) * (d[i] - d[p])
            forecast_steps += 1
        assert torch.allclose(out.double(), expect, rtol=1e-5, atol=1e-4), j
    assert forecast_steps > 0


def test_the_new_statistic_merges_and_is_checked_on_load(toy):
    a, b = _record(_runs(torch.float32, seed=2)), _record(_runs(torch.float32, seed=3))
    merged = Profile.from_bytes(a.merge(b).to_bytes())
    assert merged.count == 4
    assert np.allclose(merged.toy_step_err_sum, a.toy_step_err_sum + b.toy_step_err_sum, rtol=1e-15, atol=0)
    data = a.to_bytes()
    tensors = st_load(data)
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    for bad in (tensors["toy_step_err_sum"][:, :, :3].contiguous(), -tensors["toy_step_err_sum"] - 1):
        with pytest.raises(GCacheError, match="inconsistent"):  # its declared shape, then its declared check
            Profile.from_bytes(st_save(dict(tensors, toy_step_err_sum=bad), metadata=header))
    plain = _record(_runs(torch.float32, seed=4))
    plain.toy_step_err_sum = None  # a profile recorded before the toy forecaster was registered
    assert not plain.has("toy_step_errors") and plain.has("e1")
    assert a.merge(plain).toy_step_err_sum is None and a.merge(plain).has("e1")
    with pytest.raises(GCacheError, match="no step-extrapolation errors"):
        instant_policy(plain, K, "theory", forecast="toy_steps_abs")


def test_without_the_toy_its_tensor_is_not_read_and_nothing_records_it(toy):
    with_toy = _record(_runs(torch.float32, seed=5)).to_bytes()
    forecasters.unregister("toy_steps_abs")
    profile_stats.unregister("toy_step_errors")
    loaded = Profile.from_bytes(with_toy)  # a file from a GCache with more statistics: the rest still loads
    assert "toy_step_err_sum" not in loaded.sums and loaded.has("e1") and loaded.has("gram")
    assert "toy_step_err_sum" not in _record(_runs(torch.float32, seed=5)).sums


def test_statistic_names_and_needs_are_checked(toy):
    taken = type("Taken", (), {"name": "again", "tensors": {"e1_sum": profile_stats.Tensor(lambda n: (n,))}})()
    base = type("Base", (), {"name": "base", "tensors": {"e_sum": profile_stats.Tensor(lambda n: (n, n))}})()
    for stat, holder in ((taken, "e1"), (base, "the profile itself")):
        with pytest.raises(GCacheError, match=f"which '{holder}' holds"):
            profile_stats.register(stat)
    assert [s.name for s in profile_stats.registered()][:3] == ["e1", "fit", "gram"]
    toy.needs = ("no_such_statistic",)
    with pytest.raises(GCacheError, match="toy_steps_abs forecaster needs the profile statistic 'no_such_statistic'"):
        ProfileRecorder(_times(), forecast=True)
    assert ProfileRecorder(_times()).statistics == []  # without forecast recording: E and the indicators only
