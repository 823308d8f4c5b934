"""The search on a Ray cluster: one coordinator (search/loop.py run_batch_search, one JSON state), evaluations on Ray
actors (search/infra/ray_executor.py). The reference model runs headless (and its policy is then measured on held-out
seeds, as the search command does), or ComfyUI servers evaluate (one per GPU):

    python -m gcache.reference_model.cluster --workers 2 --steps 30 --k 10 --budget 64 --objective ssim \
        --out cluster_out
    # an existing cluster (`ray start --head` / `--address`):
    python -m gcache.reference_model.cluster --address auto ...
    python -m gcache.reference_model.cluster --comfyui http://gpu1:8188,http://gpu2:8188 --workflow wf_api.json \
        --profile models/gcache/flux.profile.safetensors --k 10 --budget 64   # ComfyUI servers, one per GPU
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional, Sequence

from ..core import forecasters
from ..core.errors import GCacheError
from ..search.infra.cli import (
    ArgumentParser,
    Problems,
    check_at_least,
    check_out_folder,
    check_steps,
    command_name,
    forecast_choices,
    forecaster_of,
    make_out_folder,
    parse_seeds,
    run_command,
    set_threads,
)
from ..search.infra.objectives import OBJECTIVES, ensure_backbone
from ..search.infra.ray_executor import RayExecutor, require_ray
from ..search.infra.requirements import require, search_modules

PROG = command_name(__spec__.name)


class ReferenceWorker:
    """Evaluates masks on the bundled reference model (one instance per Ray actor), under its own forecaster."""

    can_apply_forecaster = False  # run(mask) only: RayExecutor sends no other forecaster

    def __init__(self, n_steps: int, seeds: Sequence[int], objective: str, forecast="reuse", threads: int = 1,
                 profile=None):
        set_threads(threads)
        from ..search.infra.objectives import make_objective
        from .harness import ReferenceHarness
        self.h = ReferenceHarness(n_steps)
        self.seeds, self.forecast = list(seeds), forecast
        self.evaluate = self.h.evaluator(self.seeds, make_objective(objective), forecast=forecast, profile=profile)

    def run(self, mask: list) -> list:
        return self.evaluate(mask)

    def pid(self) -> int:
        return os.getpid()


def main(argv: Optional[list] = None) -> int:
    ap = ArgumentParser(prog=PROG, description="GCache search on a Ray cluster (reference model).")
    ap.add_argument("--workers", type=int, default=2, help="Ray actors, one model each (one CPU each)")
    ap.add_argument("--q", type=int, default=None, help="evaluations in flight (default: workers)")
    ap.add_argument("--address", default=None, help="an existing Ray cluster ('auto' or host:port); default: local")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--budget", type=int, default=64)  # SearchConfig's default
    ap.add_argument("--degree", type=int, default=3)
    ap.add_argument("--objective", default="ssim", choices=OBJECTIVES)
    ap.add_argument("--forecast", default="reuse", choices=forecast_choices(),
                    help="the forecaster masks are applied with (0/1/2: reuse/linear/quadratic)")
    ap.add_argument("--search-seeds", default="1000-1015")
    ap.add_argument("--eval-seeds", default="0-15", help="held-out sampling seeds for the report (reference model)")
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
    # bad input, a state file of another search, a failed evaluation: one line that says what to do
    return run_command(PROG, lambda: _run(a))


def _read_workflow(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GCacheError(f"Can't read the workflow {path} ({e}): export it from ComfyUI with 'Save (API)'.") from None


def _read_profile(path: str):
    from ..core.profile import Profile
    try:
        return Profile.load(path)
    except OSError as e:
        raise GCacheError(f"Can't read the profile {path} ({e}).") from None


def check_arguments(a):
    """Every argument (the ComfyUI mode's workflow and profile files included), then what the run needs installed,
    before Ray starts anything: a GCacheError names each problem. Sets a.steps and a.workers in the ComfyUI mode
    (the profile's steps, one worker per server); returns (search config, seeds, urls, workflow, profile,
    provenance)."""
    from ..search.config import SearchConfig, check_k
    from ..search.infra.comfyui_worker import ComfyUIWorker
    from ..search.starts import start_count
    problems = Problems()
    seeds = problems.check(parse_seeds, a.search_seeds, "--search-seeds")
    provenance: dict = {"seeds": seeds}
    urls = [u.strip() for u in (a.comfyui or "").split(",") if u.strip()]
    a.forecast = forecaster_of(a.forecast)
    workflow = profile = None
    if a.comfyui:
        problems.require(bool(urls), f"--comfyui {a.comfyui!r} names no server: give their URLs, comma-separated.")
        workflow = problems.check(_read_workflow, a.workflow)
        if workflow is not None:
            # the state file belongs to this workflow: another one (model, prompt, size, sampler) is another search
            provenance["workflow_sha256"] = problems.check(ComfyUIWorker.workflow_identity, workflow)
        profile = problems.check(_read_profile, a.profile)
        a.workers = len(urls)  # one actor per server
        if profile is not None:
            a.steps = profile.n_steps
            problems.check(check_k, a.k, a.steps)
        problems.require(not forecasters.get(a.forecast).needs_profile,
                         f"The ComfyUI workers apply the forecasters without profile-fitted parameters "
                         f"({', '.join(forecasters.profile_free())}); {a.forecast} needs the profile in every worker: "
                         "use --forecast linear here, or GCache Search in ComfyUI.")
    else:
        check_at_least(problems, "--workers", a.workers, 1, "the number of workers")
        if check_steps(problems, a.steps):
            problems.check(check_k, a.k, a.steps)
        a.eval_seeds = problems.check(parse_seeds, a.eval_seeds, "--eval-seeds")
        shared = sorted(set(seeds or ()) & set(a.eval_seeds or ()))
        problems.require(not shared, f"--search-seeds and --eval-seeds overlap (seeds "
                                     f"{', '.join(map(str, shared[:5]))}{', …' if len(shared) > 5 else ''}): "
                                     "held-out numbers need other seeds.")
    if a.q is not None:
        check_at_least(problems, "--q", a.q, 1, "the number of evaluations in flight")
    problems.require(a.start_timeout > 0, f"--start-timeout {a.start_timeout}: give the workers some seconds to start.")
    check_at_least(problems, "--seed", a.seed, 0, "the search seed")
    config = SearchConfig(k=a.k, degree=a.degree, budget=a.budget, seed=a.seed, objective=a.objective,
                          forecast=a.forecast)
    # the start masks of the profile searched with: the given one, or the one this command records
    has_stats = profile.has_fit_stats() if profile is not None else forecasters.get(a.forecast).forecasts
    problems.check(config.validate_settings, start_count(a.forecast, has_stats))
    problems.check(check_out_folder, a.out)
    problems.raise_any()

    needs = Problems()
    needs.check(require_ray)
    if a.address:  # the coordinator runs the GP; the workers check their own machines when they start
        needs.check(require, "sklearn", what="The cluster search", in_comfyui=False)
    else:  # a local cluster: its workers evaluate the objective here
        before = len(needs.messages)
        needs.check(require, *search_modules(a.objective), what=f"The cluster search with objective {a.objective!r}",
                    in_comfyui=False)
        if a.objective == "lpips_ssim" and len(needs.messages) == before:  # lpips imports: is its backbone here?
            needs.check(ensure_backbone)
    needs.raise_any()
    return config, seeds, urls, workflow, profile, provenance


PROGRESS_S = 10.0  # seconds between the search's progress lines


def _run(a) -> int:
    from ..search.infra.comfyui_worker import ComfyUIWorker
    from ..search.loop import run_batch_search
    from ..search.result import predicted_speedup_text
    from .harness import ReferenceHarness
    config, seeds, urls, workflow, profile, provenance = check_arguments(a)
    make_out_folder(a.out)
    ray = require_ray()
    # a local Ray gets a CPU per worker (+ one): an actor without one would never be placed
    ray.init(address=a.address, num_cpus=None if a.address else a.workers + 1, include_dashboard=False,
             log_to_driver=False, ignore_reinit_error=True)
    if a.comfyui:
        ex = RayExecutor.start_each(ComfyUIWorker, [((u, workflow, seeds, a.objective, a.forecast), {}) for u in urls])
    else:
        harness = ReferenceHarness(a.steps)
        profile = harness.profile(seeds, forecast=forecasters.get(a.forecast).forecasts)
        ex = RayExecutor.start(ReferenceWorker, a.workers, a.steps, seeds, a.objective, a.forecast, 1,
                               profile if forecasters.get(a.forecast).needs_profile else None)
    try:
        ex.pids(timeout_s=a.start_timeout)
        state = os.path.join(a.out, f"search_state_N{a.steps}_K{a.k}.json")
        t0 = shown = time.time()

        def progress(e):  # a line every ~10 s (a cluster's results come in bursts), and the last one
            nonlocal shown
            if e.get("kind") == "final" or time.time() - shown >= PROGRESS_S:
                shown = time.time()
                print(f"  iter {e['iteration']:4d}/{e['budget']}  {e.get('kind'):5s} loss {e['loss']:.5f}  "
                      f"best {e['best_loss']:.5f}  masks {e['evaluations']}  {shown - t0:.0f}s", flush=True)
        print(f"GCache cluster search N={a.steps} K={a.k}: {a.workers if not a.comfyui else len(urls)} workers "
              f"started, searching (budget {config.budget})", flush=True)
        res = run_batch_search(profile, config, ex, q=a.q or a.workers, state_path=state, provenance=provenance,
                               progress=progress)
    finally:
        ex.close()
    pol = res.policy
    wall = time.time() - t0
    if not a.comfyui:  # the reference model: the policy on held-out seeds, as the search command reports it
        pol.provenance["eval_seeds"] = a.eval_seeds
        pol.metrics.update(harness.held_out(pol, a.eval_seeds))
    path = os.path.join(a.out, f"policy_N{a.steps}_K{a.k}.json")
    pol.save(path)
    print(f"GCache cluster search N={a.steps} K={a.k} on {a.workers} workers: {res.evaluations} evaluations "
          f"({len(res.history)} iterations) in {wall:.0f}s")
    print(f"  mask {pol.describe()}  (won by {pol.provenance['won']}); search loss {pol.metrics['loss']:.5g}")
    if "eval_psnr" in pol.metrics:
        print(f"  held-out PSNR {pol.metrics['eval_psnr']:.2f} dB, SSIM {pol.metrics['eval_ssim']:.4f} "
              f"({len(a.eval_seeds)} seeds)")
    print(f"  {predicted_speedup_text(pol)} from the profile's {profile.io.describe()}")
    print(json.dumps({"policy": path, "state": state, "evaluations": res.evaluations, "wall_s": round(wall, 1),
                      **({"eval_psnr": round(pol.metrics["eval_psnr"], 3)} if "eval_psnr" in pol.metrics else {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
