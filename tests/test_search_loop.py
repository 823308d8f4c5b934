"""SearchLoop's phases, each alone (search/loop.py), on a deterministic loss over masks: the start masks, the start
grid and GP proposals through the DP (checked against every mask), a polish move of the best mask, the final argmin-μ
entry, the forecaster check through an executor that declares what it can evaluate, and one final choice per search."""
import logging
from itertools import combinations

import numpy as np
import pytest
from test_forecaster_l2p import profile_of, trajectories
from test_search_bilevel import CFG, N, make_profile

from gcache.core.weights import bernstein_w
from gcache.search import end_game as end_game_module
from gcache.search.choice import choose
from gcache.search.config import SearchConfig
from gcache.search.dp import mask_cost
from gcache.search.executor import InProcessExecutor
from gcache.search.gp import KAPPA_START, start_grid
from gcache.search.infra.parallel import ThreadExecutor
from gcache.search.loop import SearchLoop, mask_key
from gcache.search.starts import instant_masks

FITTED = dict(k=5, degree=2, budget=26, seed=1, objective="ssim", n_candidates=256, acq_polish=2, forecast="fitted")


def loss(mask) -> list:
    """Two seeds' losses: the computed steps' distance from an uneven spread, the second seed 1.2 times the first."""
    target = [0, 2, 3, 7, 11]
    got = [i for i, m in enumerate(mask) if m]
    v = 0.01 + 0.01 * sum(abs(a - b) for a, b in zip(got, target))
    return [v, 1.2 * v]


class Declared:
    """An evaluate that applies any forecaster and says so (search/executor.py); records its calls."""
    can_apply_forecaster = True

    def __init__(self, factor=0.5):
        self.calls, self.factor = [], factor

    def __call__(self, mask, forecast=None):
        self.calls.append((mask_key(mask), forecast))
        return [v * (self.factor if forecast == "l2p" else 1.0) for v in loss(mask)]


def every_mask(n, k):
    for rest in combinations(range(1, n), k - 1):
        m = [0] * n
        for i in (0, *rest):
            m[i] = 1
        yield m


def dp_optimum(prof, s, k):
    """The lowest DP bound of any K-mask under w(t; s), by trying every one."""
    w = bernstein_w(prof.times, s)
    return min(mask_cost(prof.E, w, m) for m in every_mask(prof.n_steps, k))


def record(lp: SearchLoop, p: dict, ev=loss) -> dict:
    """Measure proposal p as the loop does when its result comes back (no dispatch)."""
    st = lp.state
    if p["mask"] not in st.masks:
        st.measure(p["mask"], ev([int(c) for c in p["mask"]]), 0.0, first=len(st.history))
    entry = st.record(p, 0.0, False)
    if entry["kind"] == "polish":
        lp.polisher.observe(entry)
    return st.history[entry["i"]]  # with the polish guard's verdict


@pytest.fixture
def prof():
    return make_profile()


def new_loop(prof, **change):
    return SearchLoop(prof, SearchConfig(**dict(CFG, **change)), InProcessExecutor(loss))


def test_the_budget_goes_to_the_phases_in_order(prof):
    lp = new_loop(prof, budget=24)
    phases = [lp.phase_of(j) for j in range(24)]
    n_starts, n_grid, n_gp, n_polish = lp.config.phases(len(lp.starts))
    assert phases == ["instant"] * n_starts + ["grid"] * n_grid + ["gp"] * n_gp + ["polish"] * n_polish
    assert (n_starts, n_grid) == (3, 8) and n_gp + n_polish == 13 and n_polish == 6


def test_start_j_is_the_jth_instant_mask(prof):
    lp = new_loop(prof)
    expected = instant_masks(prof, CFG["k"])  # made by the instant DP, not by the loop
    for j, (name, mask, fc) in enumerate(expected):
        p = lp.start(j)
        assert fc == "reuse"  # a reuse search: its own masks only
        assert p == {"kind": "instant", "s": None, "mask": mask_key(mask), "method": name, "bound": None}


def test_grid_j_is_the_dp_optimum_of_the_jth_grid_point(prof):
    lp = new_loop(prof)
    grid = start_grid(CFG["degree"] + 1, 0.0, 10.0)
    for j in range(len(grid)):
        p = lp.grid(j)
        assert p["kind"] == "grid" and p["s"] == pytest.approx(list(grid[j]))
        m = [int(c) for c in p["mask"]]
        assert sum(m) == CFG["k"] and m[0] == 1
        best = dp_optimum(prof, p["s"], CFG["k"])
        assert p["bound"] == pytest.approx(best) and mask_cost(prof.E, bernstein_w(prof.times, p["s"]), m) == \
            pytest.approx(best)


def test_gp_fits_what_was_measured_and_proposes_a_dp_optimum(prof):
    lp = new_loop(prof)
    for j in range(len(lp.starts)):
        record(lp, lp.start(j))
    for j in range(len(lp.grid_points)):
        record(lp, lp.grid(j))
    assert lp.state.theta is None
    p = lp.gp(0)
    assert p["kind"] == "gp" and p["kappa"] == KAPPA_START and lp.state.theta is not None  # the fit's warm start
    assert all(0.0 <= v <= 10.0 for v in p["s"]) and len(p["s"]) == CFG["degree"] + 1
    assert p["bound"] == pytest.approx(dp_optimum(prof, p["s"], CFG["k"]))
    S, y = lp.observations()  # the GP sees the grid's (s, log loss), not the start masks (they have no s)
    assert S.shape == (len(lp.grid_points), CFG["degree"] + 1)
    assert y == pytest.approx(np.log([np.mean(loss([int(c) for c in lp.grid(j)["mask"]]))
                                      for j in range(len(lp.grid_points))]))


def test_polish_moves_the_best_measured_mask_by_one_step_first(prof):
    lp = new_loop(prof)
    for j in range(len(lp.starts)):
        record(lp, lp.start(j))
    best = lp.state.best()["mask"]
    p = lp.polish()
    assert p["kind"] == "polish" and p["parent"] == best and lp.state.polish.incumbent == best
    diff = [i for i in range(N) if p["mask"][i] != best[i]]
    assert len(diff) == 2 and diff[1] - diff[0] == 1 and p["mask"].count("1") == CFG["k"]
    assert lp.state.polish.guard == "z"  # two seeds' losses: the configured guard
    entry = record(lp, p)
    new, old = np.array(loss([int(c) for c in p["mask"]])), np.array(loss([int(c) for c in best]))
    # two seeds with losses v and 1.2 v differ by d and 1.2 d: a gain is always 11 standard errors
    assert entry["accepted"] == bool((new < old).all())
    assert lp.state.polish.incumbent == (p["mask"] if entry["accepted"] else best)


def test_finish_measures_the_mask_of_argmin_mu_once(prof):
    calls = []

    def counted(mask):
        calls.append(mask_key(mask))
        return loss(mask)
    lp = SearchLoop(prof, SearchConfig(**CFG), InProcessExecutor(counted))
    while lp.state.proposed() < CFG["budget"]:
        p = lp.propose(lp.state.proposed())
        if p is None:
            break
        record(lp, p)
    measured = set(lp.state.masks)
    calls.clear()
    lp.finish()
    fin = lp.state.final
    assert lp.state.done and fin["reused"] == (fin["mask"] in measured) and calls == ([] if fin["reused"] else
                                                                                      [fin["mask"]])
    assert fin["loss"] == lp.state.masks[fin["mask"]]["loss"]
    assert fin["bound"] == pytest.approx(dp_optimum(prof, fin["s"], CFG["k"]))


@pytest.fixture(scope="module")
def fitted_prof():
    return profile_of(*trajectories())


def finished_loop(prof, executor, **kw):
    lp = SearchLoop(prof, SearchConfig(**FITTED), executor, **kw)
    while not lp.state.done:
        lp.fill()
        if lp.in_flight:
            lp.collect()
        else:
            lp.finish()
    return lp


def test_l2p_wins_the_start_masks_and_the_search_goes_on_with_it(fitted_prof):
    """l2p halves every loss: its start masks (applied with l2p) are the best, so the grid, the GP and the polish
    apply l2p too, and the check measures the candidates under fitted (the search's own), which stays behind."""
    ev = Declared(factor=0.5)
    lp = finished_loop(fitted_prof, InProcessExecutor(ev))
    n_own = len([s for s in lp.starts if s[2] == "fitted"]) - 1  # the TeaCache-like mask is the last
    assert [s[2] for s in lp.starts] == ["fitted"] * n_own + ["l2p"] * (len(lp.starts) - n_own - 1) + ["fitted"]
    later = [h for h in lp.state.history if h["kind"] != "instant"]
    assert later and all(h["mask"].endswith("@l2p") for h in later)  # grid, GP, polish: under l2p
    assert all(f == "l2p" for k, f in ev.calls[len(lp.starts):])
    ev.calls.clear()
    chosen = choose(lp.state).entry["mask"]
    bits = chosen.split("@")[0]
    measured_before = bits in lp.state.masks
    end = lp.end_game()
    assert chosen.endswith("@l2p") and end.choice.entry["mask"] == chosen and end.check.checked.key == chosen
    fixed = [(bits, name) for name in ("reuse", "linear", "quadratic")]  # and under each fixed rule, once
    assert ev.calls == ([] if measured_before else [(bits, None)]) + fixed  # the chosen mask under fitted, once
    assert bits in lp.state.masks
    assert end.check.pick.forecaster == "l2p" and end.check.pick.key == chosen and end.check.skipped is None
    assert end.final == end.check.pick and "can_sample_fresh" in end.fresh.skipped  # Declared samples no fresh seeds
    assert {m.of for m in lp.state.all_measured() if m.kind == "check"} == {chosen}  # the check's, kept once
    n = len(ev.calls)
    assert lp.end_game() == end and len(ev.calls) == n  # kept in the state: not measured again


def test_an_evaluate_that_declares_nothing_gets_no_check_even_with_a_forecast_argument(fitted_prof, caplog):
    calls = []

    def undeclared(mask, forecast=None):  # takes the argument, but does not say it applies other forecasters
        calls.append(forecast)
        return loss(mask)
    lp = finished_loop(fitted_prof, InProcessExecutor(undeclared))
    with caplog.at_level(logging.INFO, logger="gcache"):
        check = lp.end_game().check
    assert set(calls) == {None} and check.pick.forecaster == "fitted" and "and this one can't" in check.skipped
    threads = ThreadExecutor(Declared(), workers=1)
    try:
        assert threads.can_apply_forecaster and not ThreadExecutor(undeclared, workers=1).can_apply_forecaster
    finally:
        threads.close()
    with pytest.raises(ValueError):
        InProcessExecutor(undeclared).submit([1, 0], forecast="l2p")


def test_a_search_chooses_once_and_checks_and_returns_that_choice(fitted_prof, monkeypatch):
    chosen = []
    real = end_game_module.choose

    def counted(state, *a, **kw):
        chosen.append(real(state, *a, **kw))
        return chosen[-1]
    monkeypatch.setattr(end_game_module, "choose", counted)
    ev = Declared(factor=2.0)  # l2p is worse: the policy keeps the searched forecaster
    lp = SearchLoop(fitted_prof, SearchConfig(**FITTED), InProcessExecutor(ev))
    res = lp.run()
    assert len(chosen) == 1
    assert res.policy.mask == [int(c) for c in chosen[0].entry["mask"]] and res.policy.forecast == "fitted"
    assert res.policy.provenance["chosen"] == chosen[0].how
    # the check: the chosen candidate under l2p (measured then, or as an l2p start mask)
    assert chosen[0].entry["mask"] + "@l2p" in lp.state.masks
    l2p_calls = [c for c in ev.calls if c[1] == "l2p"]
    assert len(l2p_calls) == len(set(l2p_calls)) == sum(k.endswith("@l2p") for k in lp.state.masks)  # each once
