"""A finished forecasting search run again without references (GCache Search's re-queue of a finished search: its
evaluation can apply every forecaster, but nothing can be measured now, skip_check) resumes as the search it was:
its file holds every profile-fitted forecaster's start masks, and the re-run once built the list without the others'
and refused the file ("belongs to another search (start masks …)")."""
import search_fixture as fx

from gcache.search.config import SearchConfig
from gcache.search.loop import run_search
from gcache.search.state import load_state


class Fresh(fx.Evaluator):
    """The fixture's evaluation, on the fresh seeds too (as GCache Search's: another draw of the seeds' noise)."""
    can_sample_fresh = True

    def __call__(self, mask, forecast=None, fresh=False):
        return [v * (0.8 if fresh else 1.0) for v in super().__call__(mask, forecast)]


def test_a_finished_search_run_again_without_references_gives_its_policy(tmp_path):
    prof, path = fx.make_profile(), str(tmp_path / "s.search.json")
    config = SearchConfig(**{**fx.CONFIG, "budget": 26})
    first = run_search(prof, config, Fresh(), state_path=path, provenance=fx.PROVENANCE)
    assert any(name.endswith("l2p") for name in load_state(path)["starts"])  # the other forecaster's start masks
    before = open(path, encoding="utf-8").read()
    again = Fresh()
    res = run_search(prof, config, again, state_path=path, provenance=fx.PROVENANCE,
                     skip_check="the search had finished and this prompt sampled no reference images for it")
    assert again.calls == [] and res.policy.to_dict() == first.policy.to_dict()
    assert open(path, encoding="utf-8").read() == before  # nothing measured or written
