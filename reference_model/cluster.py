"""The search on a Ray cluster: one coordinator (bilevel.run_batch_search, one JSON state), evaluations on Ray
actors (search/ray_executor.py). The reference model runs headless, or ComfyUI servers evaluate (one per GPU):

    python -m gcache.reference_model.cluster --workers 2 --steps 30 --k 10 --budget 64 --objective ssim --out cluster_out
    python -m gcache.reference_model.cluster --address auto ...   # an existing cluster (`ray start --head` / `--address`)
    python -m gcache.reference_model.cluster --comfyui http://gpu1:8188,http://gpu2:8188 --workflow wf_api.json \
        --profile models/gcache/flux.profile.safetensors --k 10 --budget 64   # ComfyUI servers, one per GPU
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional, Sequence

from ..core import forecasters
from ..core.errors import GCacheError
from ..search.cli import parse_seeds, set_threads
from ..search.objectives import OBJECTIVES
from ..search.ray_executor import RayExecutor, message, require_ray


class ReferenceWorker:
    """Evaluates masks on the bundled reference model (one instance per Ray actor)."""

    def __init__(self, n_steps: int, seeds: Sequence[int], objective: str, forecast="reuse", threads: int = 1,
                 profile=None):
        set_threads(threads)
        from ..search.objectives import make_objective
        from .harness import ReferenceHarness
        self.h = ReferenceHarness(n_steps)
        self.seeds, self.forecast = list(seeds), forecast
        self.evaluate = self.h.evaluator(self.seeds, make_objective(objective), forecast=forecast, profile=profile)

    def run(self, mask: list) -> list:
        return self.evaluate(mask)

    def pid(self) -> int:
        return os.getpid()


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description="GCache search on a Ray cluster (reference model).")
    ap.add_argument("--workers", type=int, default=2, help="Ray actors, one model each (one CPU each)")
    ap.add_argument("--q", type=int, default=None, help="evaluations in flight (default: workers)")
    ap.add_argument("--address", default=None, help="an existing Ray cluster ('auto' or host:port); default: local")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--budget", type=int, default=64)  # SearchConfig's default
    ap.add_argument("--degree", type=int, default=3)
    ap.add_argument("--objective", default="ssim", choices=OBJECTIVES)
    ap.add_argument("--forecast", default="reuse", choices=("reuse", "linear", "quadratic", "fitted", "0", "1", "2"),
                    help="the forecaster masks are applied with (0/1/2: reuse/linear/quadratic)")
    ap.add_argument("--search-seeds", default="1000-1015")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="cluster_out")
    ap.add_argument("--start-timeout", type=float, default=600.0,
                    help="seconds to wait for every worker to start (Ray places it, it loads its model)")
    ap.add_argument("--comfyui", default=None,
                    help="ComfyUI models instead of the reference model: comma-separated server URLs, one worker "
                         "each (each server on its own GPU), with --workflow and --profile")
    ap.add_argument("--workflow", default=None, help="the workflow in ComfyUI's API format, with a GCache Apply node")
    ap.add_argument("--profile", default=None, help="the model's profile (GCache Profile's .profile.safetensors)")
    a = ap.parse_args(argv)
    if a.comfyui and not (a.workflow and a.profile):
        ap.error("--comfyui needs --workflow (API format) and --profile")
    try:
        return _run(a)
    except GCacheError as e:  # bad input, a state file of another search, a failed evaluation: it says what to do
        print(f"GCache cluster search: {message(e)}", file=sys.stderr)
        return 2


def _run(a) -> int:
    from ..core.profile import Profile
    from ..search.config import SearchConfig
    from ..search.comfyui_worker import ComfyUIWorker
    from ..search.parallel import run_search_parallel
    from .harness import ReferenceHarness
    seeds = parse_seeds(a.search_seeds)
    provenance: dict = {"seeds": seeds}
    urls = [u.strip() for u in (a.comfyui or "").split(",") if u.strip()]
    if a.comfyui:  # everything checkable is checked before Ray starts anything
        try:
            with open(a.workflow, encoding="utf-8") as f:
                workflow = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise GCacheError(f"Can't read the workflow {a.workflow} ({e}): export it from ComfyUI with 'Save (API)'.") \
                from None
        # the state file belongs to this workflow: another one (model, prompt, size, sampler) is another search
        provenance["workflow_sha256"] = ComfyUIWorker.workflow_identity(workflow)
        try:
            profile = Profile.load(a.profile)
        except OSError as e:
            raise GCacheError(f"Can't read the profile {a.profile} ({e}).") from None
        a.steps, a.workers = profile.n_steps, len(urls)  # one actor per server
    a.forecast = forecasters.canonical(int(a.forecast) if a.forecast.isdigit() else a.forecast)
    if a.comfyui and a.forecast == "fitted":
        raise GCacheError("The ComfyUI workers apply reuse, linear or quadratic forecasts; the profile-fitted one "
                          "needs the profile in every worker: use --forecast linear here, or GCache Search in ComfyUI.")
    config = SearchConfig(k=a.k, degree=a.degree, budget=a.budget, seed=a.seed, objective=a.objective,
                          forecast=a.forecast)
    config.validate(a.steps)
    ray = require_ray()
    # a local Ray gets a CPU per worker (+ one): an actor without one would never be placed
    ray.init(address=a.address, num_cpus=None if a.address else a.workers + 1, include_dashboard=False,
             log_to_driver=False, ignore_reinit_error=True)
    if a.comfyui:
        ex = RayExecutor.start_each(ComfyUIWorker, [((u, workflow, seeds, a.objective, a.forecast), {}) for u in urls])
    else:
        profile = ReferenceHarness(a.steps).profile(seeds, forecast=a.forecast != "reuse")
        ex = RayExecutor.start(ReferenceWorker, a.workers, a.steps, seeds, a.objective, a.forecast, 1,
                               profile if a.forecast == "fitted" else None)
    try:
        ex.pids(timeout_s=a.start_timeout)
        os.makedirs(a.out, exist_ok=True)
        state = os.path.join(a.out, f"search_state_N{a.steps}_K{a.k}.json")
        t0 = time.time()
        res = run_search_parallel(profile, config, ex, q=a.q or a.workers, state_path=state, provenance=provenance)
    finally:
        ex.close()
    pol = res.policy
    path = os.path.join(a.out, f"policy_N{a.steps}_K{a.k}.json")
    pol.save(path)
    print(f"GCache cluster search N={a.steps} K={a.k} on {a.workers} workers: {res.evaluations} evaluations "
          f"({len(res.history)} iterations) in {time.time() - t0:.0f}s")
    print(f"  mask {pol.describe()}  (won by {pol.provenance['won']}); search loss {pol.metrics['loss']:.5g}")
    print(json.dumps({"policy": path, "state": state, "evaluations": res.evaluations,
                      "wall_s": round(time.time() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
