"""A finished search whose end game was stopped in its final choice on fresh seeds (a Cancel, an Interrupt, a crash:
the state says done) is not complete (end_game.complete): GCache Search's re-queue took it for finished and ran it
without reference images, so the choice was skipped for good ("did not run; the search's pick stays"). Run again with
its evaluation it measures the rest and ends as an uninterrupted search does."""
import pytest
import search_fixture as fx
from test_search_larger_budget import FreshEvaluator

from gcache.core.profile import Profile
from gcache.search import end_game
from gcache.search.config import SearchConfig
from gcache.search.loop import run_search
from gcache.search.state import SearchState

CONFIG = SearchConfig(**dict(fx.CONFIG, budget=26, seed=1))


class StopsOnFreshSeeds(FreshEvaluator):
    def __call__(self, mask, forecast=None, fresh=False):
        if fresh and self.fresh_calls:  # the second fresh evaluation: the prompt is interrupted
            raise RuntimeError("interrupted on the fresh seeds")
        return super().__call__(mask, forecast, fresh)


def test_an_end_game_stopped_on_its_fresh_seeds_is_not_complete(tmp_path):
    profile = Profile.load(fx.PROFILE)
    whole = run_search(profile, CONFIG, FreshEvaluator(), provenance=fx.PROVENANCE)
    assert len(whole.end.fresh.losses) >= 2  # the final choice measured two finalists or more (checked, not assumed)
    path = str(tmp_path / "s.search.json")
    with pytest.raises(RuntimeError, match="interrupted"):
        run_search(profile, CONFIG, StopsOnFreshSeeds(), state_path=path, provenance=fx.PROVENANCE)
    stopped = SearchState.peek(path)
    assert stopped.done and len(stopped.fresh) == 1
    assert not end_game.complete(stopped, profile, CONFIG.forecast)  # old code: no such question, taken as finished
    ev = FreshEvaluator()
    resumed = run_search(profile, CONFIG, ev, state_path=path, provenance=fx.PROVENANCE)
    assert ev.calls == [] and len(ev.fresh_calls) == len(whole.end.fresh.losses) - 1  # only what was left
    assert resumed.policy.to_dict() == whole.policy.to_dict()
    assert end_game.complete(SearchState.peek(path), profile, CONFIG.forecast)
