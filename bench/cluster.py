"""Scale-out of the search: wall clock with 1 and 2 Ray workers at equal budget, and the held-out quality of the
2-worker result against the sequential search at the same budget (reference model, one process per worker).

    python -m gcache.bench.cluster                 # N = 30, K = 10, budget 48: a few minutes on 2 CPU cores

Needs the optional Ray extra (pip install -e '.[cluster]'). Ends with one JSON line:
{"speedup_2_workers", "quality_diff_db", ...}.
"""
from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--budget", type=int, default=48)
    ap.add_argument("--objective", default="ssim")
    ap.add_argument("--search-seeds", default="1000-1015")
    ap.add_argument("--eval-seeds", default="0-15")
    a = ap.parse_args(argv)
    import ray
    import torch
    from ..reference_model.harness import ReferenceHarness
    from ..reference_model.search import parse_seeds
    from ..search.bilevel import SearchConfig, run_search
    from ..search.cluster import RayExecutor, ReferenceWorker
    from ..search.objectives import make_objective, psnr
    from ..search.parallel import run_search_parallel
    torch.set_num_threads(1)
    seeds, held = parse_seeds(a.search_seeds), parse_seeds(a.eval_seeds)
    h = ReferenceHarness(a.steps)
    profile = h.profile(seeds)
    cfg = SearchConfig(k=a.k, budget=a.budget, objective=a.objective)

    def held_out(mask):
        img, _ = h.run(held, list(mask))
        return psnr(img, h.full(held))

    t0 = time.perf_counter()
    seq = run_search(profile, cfg, h.evaluator(seeds, make_objective(a.objective)))
    t_seq = time.perf_counter() - t0
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    wall, results = {}, {}
    for w in (1, 2):
        ex = RayExecutor.start(ReferenceWorker, w, a.steps, seeds, a.objective)
        ex.pids()  # the workers have loaded their models: time the search, not the start-up
        t0 = time.perf_counter()
        results[w] = run_search_parallel(profile, cfg, ex, q=w)
        wall[w] = time.perf_counter() - t0
        ex.close()
    ray.shutdown()
    q_seq, q_par = held_out(seq.policy.mask), held_out(results[2].policy.mask)
    out = {"speedup_2_workers": round(wall[1] / wall[2], 3), "quality_diff_db": round(q_par - q_seq, 3),
           "wall_s": {"sequential_in_process": round(t_seq, 1), "1_worker": round(wall[1], 1),
                      "2_workers": round(wall[2], 1)},
           "held_out_psnr": {"sequential": round(q_seq, 3), "2_workers": round(q_par, 3)},
           "evaluations": {"sequential": seq.evaluations, "1_worker": results[1].evaluations,
                           "2_workers": results[2].evaluations},
           "N": a.steps, "K": a.k, "budget": a.budget, "date": time.strftime("%Y-%m-%d")}
    print(f"budget {a.budget}, N = {a.steps}, K = {a.k}: 1 worker {wall[1]:.1f} s, 2 workers {wall[2]:.1f} s "
          f"({out['speedup_2_workers']:.2f}x); held-out PSNR sequential {q_seq:.2f} dB, 2 workers {q_par:.2f} dB")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
