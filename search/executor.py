"""Where a search's evaluations run, and what they can evaluate.

An evaluation samples the search seeds under a mask and returns the loss against their full-compute images (one per
seed for paired comparisons, paired.py). An executor runs evaluations and hands back their results:

    InProcessExecutor                 evaluate(mask) in this process, when the search waits for it (run_search)
    infra.parallel.ThreadExecutor     threads of this process (several in flight)
    infra.ray_executor.RayExecutor    Ray actors, one model each

Each declares what it can evaluate instead of the search guessing it: `can_apply_forecaster` says whether a mask can
be sampled under another forecaster than the search's (`submit(mask, forecast=name)`), which the forecaster check
needs. An evaluate function declares it the same way (an attribute `can_apply_forecaster = True` on the callable,
e.g. the reference model's SeedEvaluator, GCache Search's evaluation); a plain function declares nothing, so it
evaluates the search's own forecaster only.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol


class Evaluate(Protocol):
    """evaluate(mask) -> a loss, or one loss per seed; evaluate(mask, forecast=name) when can_apply_forecaster."""
    def __call__(self, mask: list, forecast: Optional[str] = None) -> Any: ...


class Executor(Protocol):
    can_apply_forecaster: bool  # submit(mask, forecast=name) samples under that forecaster
    def submit(self, mask: list, forecast: Optional[str] = None) -> Any: ...
    def wait(self, handles: list) -> list: ...      # blocks until at least one is finished; returns those
    def result(self, handle: Any) -> Any: ...       # a loss, or the per-seed losses


def applies_forecasters(evaluate: Callable) -> bool:
    """What an evaluate callable declares (module docstring)."""
    return getattr(evaluate, "can_apply_forecaster", False) is True


def cant_apply(forecast: Optional[str]) -> None:
    if forecast is not None:
        raise ValueError("this executor evaluates the search's own forecaster only (can_apply_forecaster is False)")


class InProcessExecutor:
    """evaluate(mask) in this process, called when the search waits for it (so its exceptions reach the caller after
    the state file says what was out)."""

    def __init__(self, evaluate: Callable[..., Any]):
        self.evaluate, self.submitted, self.jobs, self.results = evaluate, 0, {}, {}
        self.can_apply_forecaster = applies_forecasters(evaluate)

    def submit(self, mask: list, forecast: Optional[str] = None) -> int:
        if not self.can_apply_forecaster:
            cant_apply(forecast)
        self.submitted += 1
        self.jobs[self.submitted] = (list(mask), forecast)
        return self.submitted

    def wait(self, handles: list) -> list:
        h = handles[0]
        mask, forecast = self.jobs.pop(h)
        self.results[h] = self.evaluate(mask) if forecast is None else self.evaluate(mask, forecast=forecast)
        return [h]

    def result(self, handle: int) -> Any:
        return self.results.pop(handle)


def evaluate_now(executor: Executor, mask: list, forecast: Optional[str] = None) -> Any:
    """One evaluation, waited for (nothing else may be in flight on `executor`)."""
    h = executor.submit(list(mask), forecast=forecast)
    executor.wait([h])
    return executor.result(h)
