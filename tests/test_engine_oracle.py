"""What ResidualCache adds to h on a skipped step, against the forecasters' formulas written out here from their
definitions (core/forecasters/*: reuse, Lagrange in normalized time, profile-fitted δ_i + α(δ_i − δ_p)), over
random masks, branches, dtypes, cache devices and block stacks that do or don't write into their input."""
import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gcache.core.engine import ResidualCache
from gcache.core.recorder import ProfileRecorder

CI = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
FORECASTERS = ["reuse", "linear", "quadratic", "fitted"]


def expected_delta(name: str, computed: list[int], deltas: dict, j: int, t: list[float], params: dict):
    """δ̂_j in float64 from the residuals of the computed steps before j (the latest last)."""
    i = computed[-1]
    if name == "reuse" or len(computed) == 1:
        return deltas[i]
    p = computed[-2]
    linear = deltas[i] + (t[j] - t[i]) / (t[i] - t[p]) * (deltas[i] - deltas[p])
    if name == "linear":
        return linear
    if name == "fitted":
        fit = params["alpha"].get(str(j))
        if fit is not None and (fit[0], fit[1]) == (p, i):
            return deltas[i] + fit[2] * (deltas[i] - deltas[p])
        return linear  # the policy's α was fitted for other computed steps
    if len(computed) == 2:
        return linear
    a, b, c = computed[-3:]  # quadratic through the last three, in normalized time
    la = (t[j] - t[b]) * (t[j] - t[c]) / ((t[a] - t[b]) * (t[a] - t[c]))
    lb = (t[j] - t[a]) * (t[j] - t[c]) / ((t[b] - t[a]) * (t[b] - t[c]))
    lc = (t[j] - t[a]) * (t[j] - t[b]) / ((t[c] - t[a]) * (t[c] - t[b]))
    return la * deltas[a] + lb * deltas[b] + lc * deltas[c]


def magnitude(name: str, computed: list[int], deltas: dict, j: int, t: list[float], params: dict):
    """Σ_k |w_k|·|δ_k| of the same forecast, the size of what the engine rounds in its dtype (the formula is linear
    in the δ's: w_k is the forecast made from δ_k = 1 and the others 0)."""
    total = 0.0
    for k in computed:
        w_k = expected_delta(name, computed, {m: float(m == k) for m in computed}, j, t, params)
        total = total + abs(w_k) * np.abs(deltas[k])
    return total


@st.composite
def runs(draw):
    n = draw(st.integers(2, 9))
    mask = [1] + draw(st.lists(st.integers(0, 1), min_size=n - 1, max_size=n - 1))
    gaps = draw(st.lists(st.floats(0.05, 1.0), min_size=n, max_size=n))
    times = [1.0 - sum(gaps[:k]) / sum(gaps) for k in range(n)]
    name = draw(st.sampled_from(FORECASTERS))
    params = {}
    if name == "fitted":  # α for some skipped steps, for the (p, i) the mask gives them or for other ones
        alpha, computed = {}, []
        for j, m in enumerate(mask):
            if m:
                computed.append(j)
            elif len(computed) >= 2 and draw(st.booleans()):
                p, i = computed[-2:] if draw(st.booleans()) else (max(0, computed[-2] - 1), computed[-1])
                alpha[str(j)] = [p, i, draw(st.floats(-3, 3))]
        params = {"alpha": alpha}
    return dict(mask=mask, times=times, name=name, params=params,
                dtype=draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16])),
                n_branches=draw(st.integers(1, 2)), cache_device=draw(st.sampled_from([None, "cpu"])),
                in_place=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)),
                recorder=draw(st.booleans()))


@CI
@given(runs())
def test_skipped_steps_add_the_forecasters_formula(run):
    mask, t, name, params, dtype = run["mask"], run["times"], run["name"], run["params"], run["dtype"]
    g = torch.Generator().manual_seed(run["seed"])
    branches = ["cond", "uncond"][:run["n_branches"]]
    nb = len(branches)
    eps = float(torch.finfo(dtype).eps)
    deltas = [{} for _ in branches]  # per branch: step -> δ (float64), from the block stack's own output
    computed = []
    # with a recorder too (the reference harness's path): δ is then a new tensor, not the snapshot of h
    rec = ProfileRecorder(t) if run["recorder"] else None
    with ResidualCache(mask, cache_device=run["cache_device"], forecast=name, times=t, forecast_params=params,
                       observers=() if rec is None else (rec,)) as cache:
        for j, m in enumerate(mask):
            h = (torch.randn(nb, 4, 3, generator=g) * 2).to(dtype)
            scale, shift = (torch.randn(nb, 4, 3, generator=g).to(dtype) for _ in range(2))
            h_entry = h.clone()

            def blocks(x):
                if run["in_place"]:  # LTXV / Chroma write into their input
                    return x.mul_(scale).add_(shift)
                return x * scale + shift
            cache.set_step(j)
            out = cache.run(h, branches, blocks)
            if m:
                assert torch.equal(out, h_entry * scale + shift)  # a computed step is the blocks' output
                for b in range(nb):
                    deltas[b][j] = out[b].double().numpy() - h_entry[b].double().numpy()
                computed.append(j)
                continue
            assert torch.equal(h, h_entry)  # a skipped step never writes into the caller's h
            assert out.dtype == dtype and out.shape == h.shape
            for b in range(nb):
                want = expected_delta(name, computed, deltas[b], j, t, params)
                got = out[b].double().numpy() - h_entry[b].double().numpy()
                size = np.abs(h_entry[b].double().numpy()) + magnitude(name, computed, deltas[b], j, t, params)
                err = np.abs(got - want)
                # the engine works in the model's dtype: δ = z − h, then h + Σ w_k·δ_k, each rounded once
                assert np.all(err <= 4 * eps * size + 1e-30), (name, j, computed, float(np.max(err / size)))
    assert cache.stats.computed_steps == sum(mask) and cache.stats.skipped_steps == len(mask) - sum(mask)
