"""ThreadExecutor: a search's evaluations on threads of this process (executor.py's protocol), several in flight.

For tests, for an evaluate that releases the GIL, and for ComfyUIWorker.pool (one thread per ComfyUI server). The
search itself is loop.run_batch_search with q > 1.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..executor import applies_forecasters, cant_apply


class ThreadExecutor:
    """Evaluations on threads of this process. It can apply another forecaster when `evaluate` declares it can
    (executor.py)."""

    def __init__(self, evaluate: Callable[..., Any], workers: int = 2):
        from concurrent.futures import ThreadPoolExecutor
        self.evaluate, self.pool = evaluate, ThreadPoolExecutor(workers)
        self.can_apply_forecaster = applies_forecasters(evaluate)

    def submit(self, mask: list, forecast: Optional[str] = None):
        if forecast is None:
            return self.pool.submit(self.evaluate, list(mask))
        if not self.can_apply_forecaster:
            cant_apply(forecast)
        return self.pool.submit(self.evaluate, list(mask), forecast=forecast)

    def wait(self, handles):
        from concurrent.futures import FIRST_COMPLETED, wait
        return list(wait(handles, return_when=FIRST_COMPLETED).done)

    def result(self, handle):
        return handle.result()

    def close(self):
        self.pool.shutdown(wait=True)
