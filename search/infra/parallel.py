"""ThreadExecutor: a search's evaluations on threads of this process (executor.py's protocol), several in flight.

For tests, for an evaluate that releases the GIL, and for ComfyUIWorker.pool (one thread per ComfyUI server). The
search itself is loop.run_batch_search with q > 1.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..executor import applies_forecasters, call, check_asks, samples_fresh


class ThreadExecutor:
    """Evaluations on threads of this process. It can apply another forecaster, and sample the fresh seeds, when
    `evaluate` declares it can (executor.py)."""

    def __init__(self, evaluate: Callable[..., Any], workers: int = 2):
        from concurrent.futures import ThreadPoolExecutor
        self.evaluate, self.pool = evaluate, ThreadPoolExecutor(workers)
        self.can_apply_forecaster = applies_forecasters(evaluate)
        self.can_sample_fresh = samples_fresh(evaluate)

    def submit(self, mask: list, forecast: Optional[str] = None, fresh: bool = False):
        check_asks(self, forecast, fresh)
        return self.pool.submit(call, self.evaluate, list(mask), forecast, fresh)

    def wait(self, handles):
        from concurrent.futures import FIRST_COMPLETED, wait
        return list(wait(handles, return_when=FIRST_COMPLETED).done)

    def result(self, handle):
        return handle.result()

    def close(self):
        self.pool.shutdown(wait=True)
