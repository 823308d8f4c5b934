"""Headless GCache search on the bundled reference model.

Profiles the model on the search seeds (with the forecast statistics when the search forecasts), runs the bilevel
search (GP-LCB over s, DP for the mask, polish) with `evaluate(mask)` = sampling the search seeds under the mask with
the --forecast forecaster against their full-compute images (a profile-fitted forecaster's chosen mask is also tried
under the other profile-fitted forecasters: the forecaster check), then reports PSNR/SSIM of the policy on *other*
seeds (held out). Writes into --out:
    policy_N{N}_K{K}.json        the policy (method "gcache", provenance, measured loss, held-out metrics)
    search_state_N{N}_K{K}.json  the resumable state (run the same command again to resume or reuse it)
    search_N{N}_K{K}.png         loss per iteration, learned w(t), the mask timeline

    python -m gcache.reference_model.search --steps 30 --k 15 --budget 64 --objective ssim --out runs/
    python -m gcache.reference_model.search --k 10 --forecast fitted --objective ssim --out runs/
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..core import forecasters
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
from ..search.infra.objectives import OBJECTIVES
from ..search.infra.requirements import require, search_modules

PROG = command_name(__spec__.name)


def main(argv=None, harness=None) -> int:
    ap = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="sampler steps N")
    ap.add_argument("--k", type=int, default=None, help="computed steps K (default N/2)")
    ap.add_argument("--budget", type=int, default=64, help="search iterations incl. the 2^(d+1) start grid")
    ap.add_argument("--degree", type=int, default=3)
    ap.add_argument("--objective", default="lpips_ssim", choices=OBJECTIVES, help="lpips_ssim (paper), ssim or psnr")
    ap.add_argument("--forecast", default="reuse", choices=forecast_choices(),
                    help="the forecaster masks are applied with (0/1/2: reuse/linear/quadratic); a profile-fitted one "
                         "is checked against the others on the chosen mask")
    ap.add_argument("--seed", type=int, default=0, help="search seed (GP candidates)")
    ap.add_argument("--search-seeds", default="1000-1015", help="sampling seeds used by the search and the profile")
    ap.add_argument("--eval-seeds", default="0-15", help="held-out sampling seeds for the report")
    ap.add_argument("--out", default="gcache_search_out")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    return run_command(PROG, lambda: _run(a, harness))


def check_arguments(a):
    """Every argument, then what the objective needs (packages, LPIPS' backbone: downloaded on first use), before
    the model loads. Returns (search config, search seeds, held-out seeds, objective)."""
    from ..search.config import SearchConfig, check_k
    from ..search.infra.objectives import make_objective
    from ..search.starts import start_count
    problems = Problems()
    k = a.k if a.k is not None else a.steps // 2
    forecast = forecaster_of(a.forecast)
    config = SearchConfig(k=k, degree=a.degree, budget=a.budget, seed=a.seed, objective=a.objective,
                          forecast=forecast)
    if check_steps(problems, a.steps):
        problems.check(check_k, k, a.steps)
    # the start masks of the profile this command records (forecast statistics when the search forecasts)
    problems.check(config.validate_settings, start_count(forecast, forecasters.get(forecast).forecasts))
    check_at_least(problems, "--seed", a.seed, 0, "the search seed")
    check_at_least(problems, "--threads", a.threads, 1, "the number of threads")
    search_seeds = problems.check(parse_seeds, a.search_seeds, "--search-seeds")
    eval_seeds = problems.check(parse_seeds, a.eval_seeds, "--eval-seeds")
    shared = sorted(set(search_seeds or ()) & set(eval_seeds or ()))
    problems.require(not shared, f"--search-seeds and --eval-seeds overlap (seeds {', '.join(map(str, shared[:5]))}"
                                 f"{', …' if len(shared) > 5 else ''}): held-out numbers need other seeds.")
    problems.check(check_out_folder, a.out)
    problems.raise_any()
    require(*search_modules(a.objective), "PIL", what=f"The search with objective {a.objective!r}", in_comfyui=False)
    return config, search_seeds, eval_seeds, make_objective(a.objective)


def _run(a, harness=None) -> int:
    config, search_seeds, eval_seeds, objective = check_arguments(a)
    make_out_folder(a.out)
    set_threads(a.threads)
    from ..search.infra.plots import plot_search
    from ..search.loop import run_search
    from ..search.result import predicted_speedup_text
    from .harness import ReferenceHarness
    k = config.k
    h = harness or ReferenceHarness(a.steps)
    t0 = time.time()
    profile = h.profile(search_seeds, forecast=forecasters.get(config.forecast).forecasts)
    tag = f"N{a.steps}_K{k}"
    state_path = os.path.join(a.out, f"search_state_{tag}.json")

    def progress(e):
        if e.get("kind") == "final" or e["iteration"] % 10 == 0:
            print(f"  iter {e['iteration']:4d}/{e['budget']}  {e.get('kind'):5s} loss {e['loss']:.5f}  "
                  f"best {e['best_loss']:.5f}  masks {e['evaluations']}", flush=True)

    res = run_search(profile, config, h.evaluator(search_seeds, objective, forecast=config.forecast, profile=profile),
                     state_path=state_path, progress=progress, provenance={"seeds": search_seeds, **h.meta})
    pol = res.policy  # with the profile's io share and its predicted speed-up (search/result.py)
    pol.provenance["eval_seeds"] = eval_seeds
    pol.metrics.update(h.held_out(pol, eval_seeds))
    pol_path = os.path.join(a.out, f"policy_{tag}.json")
    pol.save(pol_path)
    png = os.path.join(a.out, f"search_{tag}.png")
    plot_search(res).save(png)
    print(f"GCache search N={a.steps} K={k} objective={objective.name}: {res.evaluations} evaluations "
          f"({len(res.history)} iterations) in {time.time() - t0:.0f}s")
    s = "instant mask" if res.s_best is None else f"s={[round(v, 3) for v in res.s_best]}"
    print(f"  mask {pol.describe()}  {s} (won by {pol.provenance['won']}); forecaster {pol.forecast} "
          f"({pol.provenance['forecast']['chosen_by']})")
    print(f"  search loss {pol.metrics['loss']:.5f}; held-out PSNR {pol.metrics['eval_psnr']:.2f} dB, "
          f"SSIM {pol.metrics['eval_ssim']:.4f}")
    print(f"  {predicted_speedup_text(pol)} from the profile's {profile.io.describe()}")
    print(f"  wrote {pol_path}, {state_path}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
