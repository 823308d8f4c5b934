"""SearchState owns its writes (search/state.py): whatever its accessors hand out, changing it changes neither the
state nor its file; the writes are SearchState's methods."""
import json

import pytest
from test_forecaster_l2p import profile_of, trajectories

from gcache.search.config import SearchConfig
from gcache.search.loop import run_search
from gcache.search.state import SearchState

CFG = dict(k=5, degree=2, budget=26, seed=1, objective="ssim", n_candidates=256, acq_polish=2, forecast="fitted")


class Evaluator:
    """Per-seed losses of two seeds; l2p better on the fresh seeds; raises at call `crash_at` (None: never)."""
    can_apply_forecaster = True
    can_sample_fresh = True

    def __init__(self, crash_at=None):
        self.n, self.crash_at = 0, crash_at

    def __call__(self, mask, forecast=None, fresh=False):
        self.n += 1
        if self.n == self.crash_at:
            raise RuntimeError("simulated crash")
        v = (1 + sum(i * m for i, m in enumerate(mask))) / 100.0 * {"l2p": 0.5 if fresh else 1.3}.get(forecast, 1.0)
        return [v, 1.1 * v]


def _mutate(value, depth=0):
    """Tries every way to change `value` and what it holds; returns how many changes were accepted."""
    done = 0
    if depth > 4:
        return 0
    for attempt in (lambda: value.append("x"), lambda: value.clear(), lambda: value.__setitem__("mask", "x"),
                    lambda: value.__setitem__(0, "x"), lambda: value.update({"loss": -1.0}),
                    lambda: value.pop(next(iter(value)))):
        inner = list(value.values()) if hasattr(value, "values") else list(value) if isinstance(value, (list, tuple)) \
            else []
        for v in inner:
            done += _mutate(v, depth + 1)
        try:
            attempt()
            done += 1
        except (AttributeError, TypeError, KeyError, IndexError, StopIteration, ValueError):
            pass
    return done


ACCESSORS = ("history", "masks", "pending", "final", "finals", "polish", "choices", "fresh", "config",
             "provenance", "profile_id", "starts_names", "theta")


@pytest.fixture(scope="module")
def prof():
    return profile_of(*trajectories())


@pytest.mark.parametrize("crash_at", [None, 12])
def test_what_the_accessors_hand_out_leaves_the_state_file_as_it_was(prof, tmp_path, crash_at):
    """A finished search (history, masks, the final entry, the polish climb, the forecaster check, the fresh seeds'
    losses) and one stopped by a crash (a pending proposal): every accessor's value mutated, then the state saved."""
    path = tmp_path / "s.json"
    try:
        run_search(prof, SearchConfig(**CFG), Evaluator(crash_at), state_path=str(path), provenance={"seeds": [1, 2]})
    except RuntimeError:
        pass
    before = path.read_text()
    data = json.loads(before)
    checked = [m for m in data["masks"].values() if m["kind"] == "check"]  # the forecaster check's, once
    assert data["history"] and (data["pending"] if crash_at else data["fresh"]["masks"] and checked)
    st = SearchState(json.loads(before), str(path))
    snapshot = {name: json.dumps(_plain(getattr(st, name)), sort_keys=True) for name in ACCESSORS}
    for name in ACCESSORS:
        _mutate(getattr(st, name))
    for entry in st.history:
        _mutate(entry)
    st.save()
    assert path.read_text() == before
    assert {name: json.dumps(_plain(getattr(st, name)), sort_keys=True) for name in ACCESSORS} == snapshot


def _plain(value):
    """A JSON-able copy of what an accessor returned (read-only mappings and tuples as dicts and lists)."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
