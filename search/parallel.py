"""The search with several evaluations in flight: bilevel.run_batch_search on a thread pool or Ray actors.

The proposals, the state file and the result are bilevel.py's; up to `q` masks are out at once, and a GP proposal
made while others are out sees them at the GP's posterior mean (GP-BUCB). A killed coordinator resumes from the
state file, dispatching its pending masks again (at most q evaluations are lost); a finished entry is never redone.
Executors: ThreadExecutor here (tests, or an evaluate that releases the GIL; ComfyUIWorker.pool), RayExecutor in
ray_executor.py.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from ..core.profile import Profile
from .bilevel import Executor, SearchResult, run_batch_search
from .config import SearchConfig


class ThreadExecutor:
    """Evaluations on threads of this process."""

    def __init__(self, evaluate: Callable[[list], Any], workers: int = 2):
        from concurrent.futures import ThreadPoolExecutor
        self.evaluate, self.pool = evaluate, ThreadPoolExecutor(workers)

    def submit(self, mask):
        return self.pool.submit(self.evaluate, list(mask))

    def wait(self, handles):
        from concurrent.futures import FIRST_COMPLETED, wait
        return list(wait(handles, return_when=FIRST_COMPLETED).done)

    def result(self, handle):
        return handle.result()

    def close(self):
        self.pool.shutdown(wait=True)


def run_search_parallel(profile: Profile, config: SearchConfig, executor: Executor, q: int = 2,
                        state_path: Optional[str] = None, provenance: Optional[dict] = None,
                        extra_masks: Sequence[tuple[str, Sequence[int]]] = (),
                        progress: Optional[Callable[[dict], None]] = None) -> SearchResult:
    """Like bilevel.run_search with up to q evaluations in flight on `executor`."""
    return run_batch_search(profile, config, executor, q, state_path, provenance, extra_masks, progress)
