"""A forecaster that lives outside core/forecasters, defined in a temporary module and registered only for the test:
a profile → its instant policy (GCache Policy's path) → the engine adds exactly its weights' combination on skipped
steps → auto mode's choice sees it iff it says auto_candidate. Nothing in GCache names it: the seam is enough."""
import importlib
import sys
import textwrap

import pytest
import torch

from gcache.core import forecasters
from gcache.core.engine import ResidualCache
from gcache.core.policy import Policy
from gcache.core.recorder import ProfileRecorder
from gcache.search.instant import choose_forecaster, forecaster_scores, instant_policy

N, K = 12, 5
TOY = '''
import numpy as np
from gcache.core import forecasters


class Steps:
    """Linear extrapolation in the step index (not in time): δ_i + c·(δ_i − δ_p), c = (j − i)/(i − p)."""
    name, keeps, label, rank = "toy_steps", 2, "toy steps (test)", -1

    def weights(self, kept, j, times, params):
        p, i = kept[-2:]
        c = (j - i) / (i - p)
        return [-c, 1.0 + c]

    def two_step_c(self, profile, st, fold=None):
        n = profile.n_steps
        s = np.arange(n, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            c = (s[None, None, :] - s[None, :, None]) / (s[None, :, None] - s[:, None, None])
        return np.nan_to_num(c, nan=0.0, posinf=0.0, neginf=0.0)

    def dp_errors(self, profile):
        st = profile.fit_stats()
        return np.sqrt(np.maximum(st.sq_of(), 0.0)), st.rms(self.two_step_c(profile, st))

    def fit(self, profile, mask):
        return {}


forecasters.register(Steps())
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "gcache_toy_forecaster.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("gcache_toy_forecaster")
    try:
        yield forecasters.get("toy_steps")
    finally:
        forecasters.unregister("toy_steps")
        sys.modules.pop(module.__name__, None)
    assert "toy_steps" not in forecasters.names()


def _trajectory(seed=0):
    """Residuals linear in the step index plus a little noise, at times that are not linear in it: extrapolating
    in steps is right, in time (linear) is not, and a fitted α is estimated from few elements."""
    g = torch.Generator().manual_seed(seed)
    base, drift = torch.randn(40, generator=g), torch.randn(40, generator=g)
    deltas = [base + j * drift + 0.05 * torch.randn(40, generator=g) for j in range(N)]
    times = [1.0 - (j / N) ** 1.5 for j in range(N)]
    rec = ProfileRecorder(times, forecast=True)
    for j, d in enumerate(deltas):
        rec.record(j, "all", torch.zeros_like(d), d)
    return rec.finish(), deltas


def test_a_toy_forecaster_goes_from_a_profile_through_a_policy_to_the_engine(toy, tmp_path):
    profile, deltas = _trajectory()
    pol = instant_policy(profile, K, "theory", forecast="toy_steps")
    assert pol.forecast == "toy_steps" and pol.method == "theory_dp_toy_steps" and sum(pol.mask) == K
    assert pol.provenance["mask_dp"] == "toy_steps forecast DP"
    path = tmp_path / "toy.json"
    pol.save(str(path))
    pol = Policy.load(str(path))
    assert pol.forecast == "toy_steps"
    with pytest.raises(Exception, match="takes no parameters"):  # the default check_params of a fixed rule
        Policy(pol.mask, forecast="toy_steps", forecast_params={"alpha": {}})

    cache = ResidualCache(pol.mask, forecast=pol.forecast, times=pol.times, forecast_params=pol.forecast_params)
    computed, forecast_steps = [], 0
    for j in range(N):
        cache.set_step(j)
        h = torch.full((40,), 0.5 * j)
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


@pytest.mark.parametrize("candidate", [True, False])
def test_auto_sees_the_toy_forecaster_iff_it_is_a_candidate(toy, monkeypatch, candidate):
    monkeypatch.setattr(toy, "auto_candidate", candidate)
    profile, _ = _trajectory()
    scores = forecaster_scores(profile, K)
    assert ("toy_steps" in scores) == candidate
    assert {"reuse", "linear", "fitted"} <= set(scores)
    pick = choose_forecaster(profile, K)[0]
    if candidate:  # on this trajectory extrapolating in steps is right: the held-out bound says so
        assert pick == "toy_steps" and scores["toy_steps"] == min(scores.values())
    else:
        assert pick in ("reuse", "linear", "fitted")


def test_a_forecaster_object_travels_to_the_engine_as_it_is(toy):
    """The object a node resolved is the engine's forecaster: get() passes a forecaster through, it is not looked
    up by name again (an unregistered object works too)."""
    assert forecasters.get(toy) is toy
    loose = type("Loose", (), {"name": "loose", "keeps": 1, "weights": lambda self, kept, j, times, params: [1.0]})()
    cache = ResidualCache([1, 0, 1], forecast=loose)
    assert cache.forecaster is loose and "loose" not in forecasters.names()
