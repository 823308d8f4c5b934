"""Scale-out of the search: wall clock with 1 and 2 Ray workers at equal budget, and the held-out quality of the
2-worker result against the sequential search at the same budget (reference model, one process per worker).

    python -m gcache.bench.cluster                  # N = 30, K = 10, budget 64, GP seeds 0-15: about 15 min on 2 cores
    python -m gcache.bench.cluster --budget 48      # a smaller budget: about 12 min

A single search is a draw: the best mask occupies a small region of s, and the sequential search itself misses it
for some GP seeds. So the search runs once per GP seed (`--gp-seeds`), sequentially
(loop.run_search, in process), on 1 Ray worker (q = 1, the same search) and on 2 Ray workers (q = 2), and the
quality figure is the mean held-out PSNR over GP seeds. Needs the optional Ray extra, in README's venv:
.venv/bin/pip install -e ".[cluster]" (from the repository root).
Ends with one JSON line: {"speedup_2_workers", "quality_diff_db", ...}.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from .cli import BenchParser, Progress, require_module, run_main, seed_text, whole


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.cluster", __doc__)
    ap.add_argument("--steps", type=whole(4), default=30)
    ap.add_argument("--k", type=whole(2), default=10)
    ap.add_argument("--budget", type=whole(1), default=64)  # SearchConfig's default
    ap.add_argument("--objective", default="ssim", choices=("ssim", "psnr", "lpips_ssim"))
    ap.add_argument("--gp-seeds", type=seed_text, default="0-15", help="SearchConfig.seed of each repetition")
    ap.add_argument("--search-seeds", type=seed_text, default="1000-1015",
                    help="the sample seeds the search scores masks on")
    ap.add_argument("--eval-seeds", type=seed_text, default="0-15", help="held-out sample seeds for the final quality")
    a = ap.parse_args(argv)
    if a.k >= a.steps:
        ap.error(f"--k {a.k}: K must be below --steps {a.steps}")
    from ..core.errors import GCacheError
    from ..search.config import SearchConfig as _Config
    try:  # the arguments first: a bad one is said whether or not Ray is installed
        _Config(k=a.k, budget=a.budget, objective=a.objective).validate_settings()
    except GCacheError as e:  # a budget below the minimum useful one
        ap.error(str(e))
    require_module(ap, "ray", "The cluster bench", 'install the cluster extra into this Python (README\'s venv: '
                   '.venv/bin/pip install -e ".[cluster]" from the repository root)')
    import ray
    import torch

    from ..reference_model.cluster import ReferenceWorker
    from ..reference_model.harness import ReferenceHarness
    from ..search.config import SearchConfig
    from ..search.infra.cli import parse_seeds
    from ..search.infra.objectives import make_objective, psnr
    from ..search.infra.ray_executor import RayExecutor
    from ..search.loop import run_batch_search, run_search
    torch.set_num_threads(1)
    seeds, held, gp_seeds = parse_seeds(a.search_seeds), parse_seeds(a.eval_seeds), parse_seeds(a.gp_seeds)
    h = ReferenceHarness(a.steps)
    profile = h.profile(seeds)
    memo: dict = {}

    def held_out(mask) -> float:
        key = tuple(mask)
        if key not in memo:
            img, _ = h.run(held, list(mask))
            memo[key] = psnr(img, h.full(held))
        return memo[key]

    def cfg(seed: int) -> SearchConfig:
        return SearchConfig(k=a.k, budget=a.budget, objective=a.objective, seed=seed)

    runs = {g: {} for g in gp_seeds}
    evaluate = h.evaluator(seeds, make_objective(a.objective))
    progress = Progress(2 * len(gp_seeds), "cluster: sequential searches, then 1- and 2-worker pairs",
                        expected_s=(900 if a.budget >= 64 else 720) * len(gp_seeds) / 16)
    for g in gp_seeds:
        t0 = time.perf_counter()
        runs[g]["sequential"] = (run_search(profile, cfg(g), evaluate), time.perf_counter() - t0)
        progress.step(f"GP seed {g}: sequential search {runs[g]['sequential'][1]:.1f} s")
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    executors = {w: RayExecutor.start(ReferenceWorker, w, a.steps, seeds, a.objective) for w in (1, 2)}
    for ex in executors.values():
        ex.pids()  # the workers have loaded their models: time the searches, not the start-up
    for n, g in enumerate(gp_seeds):  # 1 and 2 workers alternate, so a change in the machine's load hits both
        for w in ((1, 2) if n % 2 == 0 else (2, 1)):
            t0 = time.perf_counter()
            runs[g][w] = (run_batch_search(profile, cfg(g), executors[w], q=w), time.perf_counter() - t0)
        progress.step(f"GP seed {g}: 1 worker {runs[g][1][1]:.1f} s, 2 workers {runs[g][2][1]:.1f} s")
    for ex in executors.values():
        ex.close()
    ray.shutdown()

    per_seed = []
    for g in gp_seeds:
        r = runs[g]
        per_seed.append({"gp_seed": g, "held_out_psnr_sequential": round(held_out(r["sequential"][0].policy.mask), 3),
                         "held_out_psnr_2_workers": round(held_out(r[2][0].policy.mask), 3),
                         "one_worker_is_sequential": r[1][0].policy.mask == r["sequential"][0].policy.mask,
                         "wall_s": {"sequential": round(r["sequential"][1], 2), "1_worker": round(r[1][1], 2),
                                    "2_workers": round(r[2][1], 2)},
                         "evaluations": {"1_worker": r[1][0].evaluations, "2_workers": r[2][0].evaluations}})
    ratios = [runs[g][1][1] / runs[g][2][1] for g in gp_seeds]
    q_seq = statistics.mean(p["held_out_psnr_sequential"] for p in per_seed)
    q_par = statistics.mean(p["held_out_psnr_2_workers"] for p in per_seed)
    diffs = [p["held_out_psnr_2_workers"] - p["held_out_psnr_sequential"] for p in per_seed]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    out = {"speedup_2_workers": round(statistics.median(ratios), 3),
           "quality_diff_db": round(q_par - q_seq, 3), "quality_diff_se_db": None if se is None else round(se, 3),
           "speedup_per_gp_seed": [round(x, 3) for x in ratios],
           "held_out_psnr_mean": {"sequential": round(q_seq, 3), "2_workers": round(q_par, 3)},
           "best_mask_psnr": round(max(max(p["held_out_psnr_sequential"], p["held_out_psnr_2_workers"])
                                       for p in per_seed), 3),
           "per_gp_seed": per_seed, "N": a.steps, "K": a.k, "budget": a.budget, "gp_seeds": gp_seeds,
           "date": time.strftime("%Y-%m-%d %H:%M")}
    for p in per_seed:
        print(f"GP seed {p['gp_seed']}: sequential {p['held_out_psnr_sequential']:.2f} dB, 2 workers "
              f"{p['held_out_psnr_2_workers']:.2f} dB; 1 worker {p['wall_s']['1_worker']:.1f} s, 2 workers "
              f"{p['wall_s']['2_workers']:.1f} s")
    print(f"budget {a.budget}, N = {a.steps}, K = {a.k}, {len(gp_seeds)} GP seeds: 2 workers "
          f"{out['speedup_2_workers']:.2f}x faster (median); held-out PSNR mean sequential {q_seq:.2f} dB, 2 workers "
          f"{q_par:.2f} dB (difference {q_par - q_seq:+.2f} ± {se or 0:.2f} dB)")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.cluster"))
