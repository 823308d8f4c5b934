"""Why the final choice on fresh seeds did not run, said right: an evaluation that can sample fresh seeds but can't
apply another forecaster was logged as one that "declares no can_sample_fresh" (issue 48)."""
import logging

from gcache.search import end_game
from gcache.search.config import SearchConfig
from gcache.search.executor import InProcessExecutor
from gcache.search.loop import run_search
from gcache.search.state import SearchState
import search_fixture as fx


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
