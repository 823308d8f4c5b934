"""Where a search's evaluations run, and what they can evaluate.

An evaluation samples the search seeds under a mask and returns the loss against their full-compute images (one per
seed for paired comparisons, paired.py). An executor runs evaluations and hands back their results:

    InProcessExecutor                 evaluate(mask) in this process, when the search waits for it (run_search)
    infra.parallel.ThreadExecutor     threads of this process (several in flight)
    infra.ray_executor.RayExecutor    Ray actors, one model each

Each declares what it can evaluate instead of the search guessing it: `can_apply_forecaster` says whether a mask can
be sampled under another forecaster than the search's (`submit(mask, forecast=name)`), which the forecaster check
needs. `can_sample_fresh` says whether a mask can be sampled on the fresh seeds instead of the search seeds
(`submit(mask, forecast=…, fresh=True)`: seeds the search never judged a mask on, with their own full-compute images),
which the final choice on fresh seeds needs (end_game.py). An evaluate function declares each the same way (an
attribute `can_apply_forecaster = True` / `can_sample_fresh = True` on the callable, e.g. the reference model's
SeedEvaluator, GCache Search's evaluation); a plain function declares nothing, so it evaluates the search's own
forecaster on the search seeds only.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol


class Evaluate(Protocol):
    """evaluate(mask) -> a loss, or one loss per seed; evaluate(mask, forecast=name) when can_apply_forecaster;
    evaluate(mask, forecast=…, fresh=True) on the fresh seeds when can_sample_fresh."""
    def __call__(self, mask: list, forecast: Optional[str] = None, fresh: bool = False) -> Any: ...


class Executor(Protocol):
    can_apply_forecaster: bool  # submit(mask, forecast=name) samples under that forecaster
    can_sample_fresh: bool      # submit(mask, fresh=True) samples the fresh seeds
    def submit(self, mask: list, forecast: Optional[str] = None, fresh: bool = False) -> Any: ...
    def wait(self, handles: list) -> list: ...      # blocks until at least one is finished; returns those
    def result(self, handle: Any) -> Any: ...       # a loss, or the per-seed losses


def applies_forecasters(evaluate: Callable) -> bool:
    """What an evaluate callable declares (module docstring)."""
    return getattr(evaluate, "can_apply_forecaster", False) is True


def samples_fresh(evaluate: Callable) -> bool:
    """What an evaluate callable declares (module docstring)."""
    return getattr(evaluate, "can_sample_fresh", False) is True


def cant_apply(forecast: Optional[str]) -> None:
    if forecast is not None:
        raise ValueError("this executor evaluates the search's own forecaster only (can_apply_forecaster is False)")


def call(evaluate: Callable, mask: list, forecast: Optional[str], fresh: bool) -> Any:
    """evaluate(mask) with only the keywords it was asked for (a plain function takes the mask alone)."""
    kw = {**({"forecast": forecast} if forecast is not None else {}), **({"fresh": True} if fresh else {})}
    return evaluate(list(mask), **kw)


def check_asks(executor, forecast: Optional[str], fresh: bool) -> None:
    """Refuses what `executor` declared it can't evaluate."""
    if not executor.can_apply_forecaster:
        cant_apply(forecast)
    if fresh and not executor.can_sample_fresh:
        raise ValueError("this executor samples the search seeds only (can_sample_fresh is False)")


class InProcessExecutor:
    """evaluate(mask) in this process, called when the search waits for it (so its exceptions reach the caller after
    the state file says what was out)."""

    def __init__(self, evaluate: Callable[..., Any]):
        self.evaluate, self.submitted, self.jobs, self.results = evaluate, 0, {}, {}
        self.can_apply_forecaster = applies_forecasters(evaluate)
        self.can_sample_fresh = samples_fresh(evaluate)

    def submit(self, mask: list, forecast: Optional[str] = None, fresh: bool = False) -> int:
        check_asks(self, forecast, fresh)
        self.submitted += 1
        self.jobs[self.submitted] = (list(mask), forecast, fresh)
        return self.submitted

    def wait(self, handles: list) -> list:
        h = handles[0]
        self.results[h] = call(self.evaluate, *self.jobs.pop(h))
        return [h]

    def result(self, handle: int) -> Any:
        return self.results.pop(handle)


def evaluate_now(executor: Executor, mask: list, forecast: Optional[str] = None, fresh: bool = False) -> Any:
    """One evaluation, waited for (nothing else may be in flight on `executor`)."""
    h = executor.submit(list(mask), forecast=forecast, fresh=True) if fresh else \
        executor.submit(list(mask), forecast=forecast)
    executor.wait([h])
    return executor.result(h)
