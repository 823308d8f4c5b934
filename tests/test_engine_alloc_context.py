"""The engine's allocation context (headless): every tensor the engine or its observers keep past a stack entry is
made inside it, which is what a host whose allocator records each block (ComfyUI's memory compiler) needs.

The oracle watches allocations from outside the engine: a torch dispatch mode notes, for each operation that makes
new storage, whether the context was open; a tensor the engine keeps afterwards must have been made while it was."""
import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gcache.core.engine import ResidualCache
from gcache.core.recorder import ProfileRecorder

torch.set_num_threads(1)


class Allocations(TorchDispatchMode):
    """storage address -> whether the allocation context was open when that storage was last made."""

    def __init__(self):
        super().__init__()
        self.inside = 0
        self.made: dict = {}

    def context(self):
        @contextlib.contextmanager
        def paused():
            self.inside += 1
            try:
                yield
            finally:
                self.inside -= 1
        return paused()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if torch.is_tensor(t)}
        for t in tree_leaves(out):
            if torch.is_tensor(t) and t.numel():
                ptr = t.untyped_storage().data_ptr()
                if ptr not in given:  # new storage (not a view of an input, not an out= argument)
                    self.made[ptr] = self.inside > 0
        return out

    def made_inside(self, t: torch.Tensor) -> bool:
        return self.made[t.untyped_storage().data_ptr()]


def blocks(h):
    return torch.tanh(h * 1.5) + 0.1  # a new tensor, like a block stack's output


def run(cache, steps, branches=("c", "u")):
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        cache.set_step(step)
        h = torch.randn(len(branches), 5, 4, generator=g)
        cache.run(h, list(branches), blocks)


@pytest.mark.parametrize("with_context", [True, False])
def test_kept_residuals_are_made_inside_the_context(with_context):
    mode = Allocations()
    cache = ResidualCache([1, 0, 1, 1, 0], forecast="linear", times=[1, .8, .6, .4, .2],
                          alloc_context=mode.context if with_context else None)
    with mode:
        run(cache, 5)
    kept = [d for v in cache._deltas.values() for _, d in v]
    assert len(kept) == 4  # two branches, the linear forecast keeps two residuals each
    assert all(mode.made_inside(d) for d in kept) == with_context  # without it the check fails: it can


def test_the_profile_history_is_made_inside_the_context():
    mode = Allocations()
    rec = ProfileRecorder([1.0, 0.75, 0.5, 0.25], forecast=True)
    cache = ResidualCache(None, observers=(rec,), alloc_context=mode.context)
    with mode:
        run(cache, 4)
    kept = [t for b in rec.branches.values()
            for t in (b.hist, b.rows, b.norms, b.rel_h, b.prev_h, *(t for acc in b.acc.values() for t in acc.values()))]
    assert len(rec.branches) == 2 and all(mode.made_inside(t) for t in kept)
    assert {"e1", "fit", "gram"} <= {name for b in rec.branches.values() for name in b.acc}  # every statistic's tensors
    assert rec.finish().count == 2


def test_the_context_is_not_entered_on_steps_that_keep_nothing():
    """All-ones and skipped steps make nothing to keep: no context (a host's pause costs nothing there)."""
    entered = []

    @contextlib.contextmanager
    def ctx():
        entered.append(1)
        yield

    cache = ResidualCache([1, 1, 1, 1], alloc_context=ctx)
    run(cache, 4)
    assert entered == []
    cache = ResidualCache([1, 0, 0, 1], alloc_context=ctx)
    run(cache, 4)
    assert len(entered) == 2  # step 0 only: snapshot and store (step 3's δ is never read)
