"""What the end of a search reports (issue 48): why the final choice on fresh seeds did not run (an evaluation that
can sample fresh seeds but can't apply another forecaster was logged as one that "declares no can_sample_fresh"), and
which point the search plot rings (the pick, not the final policy, after a fresh-seed replacement)."""
import logging

import search_fixture as fx

from gcache.search import end_game
from gcache.search.config import SearchConfig
from gcache.search.executor import InProcessExecutor
from gcache.search.loop import run_search
from gcache.search.state import SearchState


def test_an_evaluation_that_samples_fresh_seeds_but_cant_apply_forecasters_is_named_for_that(tmp_path, caplog):
    prof, path = fx.make_profile(), str(tmp_path / "s.search.json")
    config = SearchConfig(**{**fx.CONFIG, "budget": 26})
    run_search(prof, config, fx.Evaluator(), state_path=path, provenance=fx.PROVENANCE)  # no fresh seeds there
    state = SearchState.peek(path)
    assert state.done and state.fresh == {}

    def fresh_only(mask, forecast=None, fresh=False):  # the search's own forecaster, on any seeds
        return fx.Evaluator()(mask)
    fresh_only.can_sample_fresh = True
    with caplog.at_level(logging.INFO, logger="gcache"):
        end = end_game.run(state, prof, config.forecast, InProcessExecutor(fresh_only))
    assert len(end.fresh.finalists) >= 2  # a choice there was to make (the other forecaster's candidates)
    assert end.fresh.skipped.endswith(f"did not run: {end_game.CANT_APPLY}; the search's pick stays")
    assert "can_sample_fresh" not in caplog.text


class Opposed:
    """Per-seed losses of two seeds: the search's forecaster prefers early computed steps, l2p late ones and is 1.3×
    worse on the search seeds, 0.3× on the fresh ones: l2p's best candidate, another mask, wins on the fresh seeds."""
    can_apply_forecaster = True
    can_sample_fresh = True

    def __call__(self, mask, forecast=None, fresh=False):
        n = len(mask)
        if forecast == "l2p":
            v = (1 + sum((n - 1 - i) * m for i, m in enumerate(mask))) / 100.0 * (0.3 if fresh else 1.3)
        else:
            v = (1 + sum(i * m for i, m in enumerate(mask))) / 100.0
        return [v, 1.1 * v]


def test_the_search_plot_rings_the_final_policy_after_a_fresh_seed_replacement(monkeypatch):
    """The plot ringed the pick (choice.choose) even when another finalist won on the fresh seeds."""
    from test_search_fresh_choice import CFG, profile_of, trajectories

    from gcache.search.infra import plots
    from gcache.search.state import split_key
    res = run_search(profile_of(*trajectories()), SearchConfig(**CFG), Opposed(), provenance={"seeds": [1, 2]})
    assert res.policy.provenance["fresh_seeds"]["replaced"] is True  # the fresh seeds replaced the pick
    final = next(h for h in res.history if h["mask"] == res.end.final.key)  # an l2p start mask: a point of its own
    assert split_key(final["mask"]) == ("".join(map(str, res.policy.mask)), res.policy.forecast)
    assert res.end.check.pick.key != final["mask"]
    rings, dot = [], plots._Panel.dot

    def noted(panel, x, y, color, r=3, hollow=False):
        if r == 8 and hollow:  # the ring (plot_search)
            rings.append(x)
        return dot(panel, x, y, color, r=r, hollow=hollow)
    monkeypatch.setattr(plots._Panel, "dot", noted)
    plots.plot_search(res)
    assert rings == [final["i"]]
