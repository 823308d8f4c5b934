"""An executor (executor.py) on Ray actors: the search's evaluations on a Ray cluster, one model per actor.

Optional: the `cluster` extra of the distribution comfyui-gcache brings Ray (in a clone, into README's venv:
`.venv/bin/pip install -e ".[cluster]"`); nothing else in GCache imports it. Each worker is an actor
that loads its model once and evaluates masks on the search seeds (the reference model's ReferenceWorker,
comfyui_worker.ComfyUIWorker); Ray places the actors (one CPU or GPU each), restarts one whose process died and
retries the evaluation it was running (max_restarts / max_task_retries): no queue of our own. The command that
runs a search this way lives with the reference model it runs by default (its cluster.py).
"""
from __future__ import annotations

import sys
from typing import Any, Optional

from ...core.errors import GCacheError
from ..executor import check_asks

RESTARTS = 3  # a worker process that dies is restarted this often, and its evaluation retried


def require_ray():
    """The ray module, or a GCacheError that says how to install it (a command checks this before its work)."""
    try:
        import ray
    except ImportError as e:
        raise GCacheError(f"The cluster search needs Ray, which does not import in this Python ({sys.executable}: "
                          f"{e}). Install it into this Python with: \"{sys.executable}\" -m pip install ray==2.60.0 "
                          "(the cluster extra of comfyui-gcache; in a clone: .venv/bin/pip install -e "
                          "\".[cluster]\").") from None
    return ray


class RayExecutor:
    """A mask goes to a free actor; Ray retries it if the actor dies. A worker class has run(mask) and pid(). The
    actors sample under the search's own forecaster on the search seeds only (the forecaster check and the final
    choice on fresh seeds are skipped, and say so)."""

    can_apply_forecaster = False
    can_sample_fresh = False

    def __init__(self, actors: list):
        self.ray = require_ray()
        self.actors, self.busy = list(actors), {}

    @classmethod
    def start(cls, worker_cls, workers: int, *args, num_gpus: float = 0, **kwargs) -> "RayExecutor":
        """`workers` actors of worker_cls(*args, **kwargs), one CPU (and num_gpus GPUs) each."""
        return cls.start_each(worker_cls, [(args, kwargs)] * workers, num_gpus=num_gpus)

    @classmethod
    def start_each(cls, worker_cls, arguments: list, num_gpus: float = 0) -> "RayExecutor":
        """One actor per (args, kwargs): e.g. one ComfyUIWorker per server address."""
        ray = require_ray()
        remote = ray.remote(num_cpus=1, num_gpus=num_gpus, max_restarts=RESTARTS, max_task_retries=RESTARTS)(worker_cls)
        return cls([remote.remote(*a, **k) for a, k in arguments])

    def submit(self, mask: list, forecast: Optional[str] = None, fresh: bool = False) -> Any:
        check_asks(self, forecast, fresh)
        free = [a for a in self.actors if a not in self.busy.values()]
        actor = free[0] if free else self.actors[len(self.busy) % len(self.actors)]
        ref = actor.run.remote(list(mask))
        self.busy[ref] = actor
        return ref

    def wait(self, handles: list) -> list:
        done, _ = self.ray.wait(list(handles), num_returns=1)
        return done

    def result(self, handle: Any) -> Any:
        self.busy.pop(handle, None)
        return self.ray.get(handle)

    def pids(self, timeout_s: Optional[float] = None) -> list[int]:
        """Each worker's process id (or server): returns once every worker has started and loaded its model."""
        refs = [a.pid.remote() for a in self.actors]
        try:
            return self.ray.get(refs, timeout=timeout_s)
        except self.ray.exceptions.RayActorError as e:  # its constructor raised: the last line says why
            raise GCacheError(f"A search worker could not start: {_last_line(e)}") from None
        except self.ray.exceptions.GetTimeoutError:
            started = len(self.ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            raise GCacheError(f"Only {started} of {len(refs)} search workers started within {timeout_s:.0f} s. Each "
                              "asks Ray for one CPU (and its GPUs): add machines to the cluster (ray status shows "
                              "what it has) or start fewer workers.") from None

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)


def _last_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


def message(e: BaseException) -> str:
    """What a user should read of an error: a worker's own exception, not Ray's wrapper with its remote traceback."""
    return str(getattr(e, "cause", None) or e)
