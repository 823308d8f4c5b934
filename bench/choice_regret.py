"""Which rule the search's final choice should follow (search/paired.py CHOICE_Z, applied in search/choice.py),
measured by its held-out regret.

On the reference model (N = 30, the profile-fitted forecaster, objective 1 − SSIM on the search seeds), the search runs
once per (set of search seeds, budget, K, GP seed), keeping every mask it evaluated with its per-seed losses (its state
file). Each set of search seeds is profiled on its own. Each mask is then sampled on held-out seeds under the same
forecaster (PSNR dB against full compute). The final choice is recomputed offline from each state under every
candidate rule:

    best_measured   the lowest loss the search measured
    z=<z>           a searched mask replaces the best start mask when its paired gain over the seeds is beyond z
                    standard errors (z = 2 until this bench; when this bench ran, also when it ended a chain of
                    accepted polish moves, a rule gone since: under z = 0 it could never change the choice);
                    never a polish move the polish guard rejected
    halves          ... when both fixed halves of the seeds improve (the polish's other guard)
    start_only      the best start mask, always

A rule's regret in one search is the held-out PSNR of the best mask the search evaluated (best on the held-out seeds,
which no rule can see) minus that of the mask the rule chooses (≥ 0). Also printed, signed: the rule's held-out PSNR
below that of the lowest-loss mask (below 0: better than taking the lowest loss). Prints per rule the median, mean and
worst regret, per budget, per set of search seeds and per K; the rule with the lowest median, then the lowest worst
case, then the lowest mean regret wins (differences under TIE_DB count as ties).

    python -m gcache.bench.choice_regret                  # budgets 64 128, K 6 8 10 15 20, GP seeds 0-2
    python -m gcache.bench.choice_regret --search-seeds 1000-1015 2000-2015 3000-3015

Runs about an hour per set of search seeds (30 searches) on one core of a busy 2-core CPU; --out keeps each search's
state file and the held-out PSNRs (out/s<first search seed>/), so a second run (or an interrupted one) resumes and
only reprints. Writes bench/results/choice_regret.json (--results): the command, date, git commit and rows.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

PROG = "python -m gcache.bench.choice_regret"
Z_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
TIE_DB = 0.01  # held-out PSNRs are kept to 3 decimals; a hundredth of a dB is no difference
HERE = os.path.dirname(os.path.abspath(__file__))


def choose_under(state, rule) -> dict:
    """The entry the search's final choice returns under `rule` (a paired.Rule) instead of its own lower mean loss
    (search/choice.py): of the candidates below the best start mask, lowest loss first, the first whose paired gain
    over it the rule believes (or that has nothing to check with); else the best start mask."""
    from ..search.choice import candidates
    from ..search.state import START
    pool, fallback = candidates(state), state.best(kinds=(START,))
    if fallback is None:
        return pool[0]
    for e in (e for e in pool if e["loss"] < fallback["loss"]):
        if rule.better(state.masks[e["mask"]], state.masks[fallback["mask"]], state.seed) is not False:
            return e
    return fallback


def rules() -> dict:
    """name -> choose(state) -> the chosen entry's mask key."""
    from ..search import paired
    from ..search.state import START
    out = {"best_measured": lambda st: st.best(with_final=True)["mask"]}
    for z in Z_VALUES:
        out[f"z={z:g}"] = (lambda rule: lambda st: choose_under(st, rule)["mask"])(paired.beyond_z(z))
    out["halves"] = lambda st: choose_under(st, paired.HALVES)["mask"]
    out["start_only"] = lambda st: st.best(kinds=(START,))["mask"]
    return out


def summary(values: list) -> dict:
    return {"median": round(statistics.median(values), 3), "mean": round(statistics.fmean(values), 3),
            "worst": round(max(values), 3), "n": len(values), "better": sum(v < 0 for v in values),
            "worse": sum(v > 0 for v in values)}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def check_arguments(a):
    """Every argument at once, before the model loads; returns (gp seeds, search seeds, eval seeds)."""
    from ..search.budget import minimum_budget
    from ..search.config import check_k
    from ..search.infra.cli import Problems, check_at_least, check_out_folder, check_steps, parse_seeds
    problems = Problems()
    if check_steps(problems, a.steps):
        for k in a.ks:
            problems.check(check_k, k, a.steps)
    least = minimum_budget("fitted", 3, True)
    for b in a.budgets:
        problems.require(b >= least, f"--budgets {b}: a fitted search at degree 3 needs a budget of at least {least}.")
    gp_seeds = problems.check(parse_seeds, a.gp_seeds, "--gp-seeds")
    sets = [problems.check(parse_seeds, text, "--search-seeds") for text in a.search_seeds]
    eval_seeds = problems.check(parse_seeds, a.eval_seeds, "--eval-seeds")
    for text, seeds in zip(a.search_seeds, sets):
        problems.require(not set(seeds or ()) & set(eval_seeds or ()),
                         f"--search-seeds {text} and --eval-seeds overlap: held-out numbers need other seeds.")
    check_at_least(problems, "--threads", a.threads, 1, "the number of threads")
    problems.check(check_out_folder, a.out)
    problems.check(check_out_folder, os.path.dirname(os.path.abspath(a.results)), "--results")
    problems.raise_any()
    return gp_seeds, sets, eval_seeds


def main(argv=None, harness_factory=None) -> int:
    from ..search.infra.cli import ArgumentParser, run_command
    ap = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--ks", type=int, nargs="+", default=[6, 8, 10, 15, 20])
    ap.add_argument("--budgets", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--gp-seeds", default="0-2", help="SearchConfig.seed of each repetition")
    ap.add_argument("--search-seeds", nargs="+", default=["1000-1015"],
                    help="one or more sets of search seeds, each profiled on its own")
    ap.add_argument("--eval-seeds", default="0-31")
    ap.add_argument("--out", default="choice_regret_runs", help="state files and held-out PSNRs (a rerun resumes)")
    ap.add_argument("--results", default=os.path.join(HERE, "results", "choice_regret.json"))
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    return run_command(PROG, lambda: _run(a, argv, harness_factory))


def _run(a, argv, harness_factory) -> int:
    gp_seeds, sets, _ = check_arguments(a)
    from ..search.infra.cli import make_out_folder
    make_out_folder(a.out)
    make_out_folder(os.path.dirname(os.path.abspath(a.results)), "--results")
    t_start = time.time()
    rows = []
    for text, seeds in zip(a.search_seeds, sets):
        rows += _one_set(a, text, seeds, gp_seeds, harness_factory)
    _report(a, argv, rows, gp_seeds, time.time() - t_start)
    return 0


def _one_set(a, text: str, seeds: list, gp_seeds: list, harness_factory) -> list:
    """The grid's searches on one set of search seeds (in out/s<first seed>/), with every mask held out."""
    from ..search.config import SearchConfig
    from ..search.loop import run_search
    from .search_setup import FittedSetup
    folder = os.path.join(a.out, f"s{seeds[0]}")
    os.makedirs(folder, exist_ok=True)
    setup = FittedSetup(argparse.Namespace(**{**vars(a), "search_seeds": text}), harness_factory)
    cache_path = os.path.join(folder, "held_out_psnr.json")  # the fitted forecaster's parameters: this set's profile
    held = json.load(open(cache_path, encoding="utf-8")) if os.path.exists(cache_path) else {}
    judge = rules()
    rows, grid = [], [(b, k, g) for b in a.budgets for k in a.ks for g in gp_seeds]
    for n, (budget, k, g) in enumerate(grid, 1):
        t0 = time.time()
        res = run_search(setup.profile, SearchConfig(k=k, budget=budget, seed=g, objective="ssim", forecast="fitted"),
                         setup.evaluate, state_path=os.path.join(folder, f"state_B{budget}_K{k}_g{g}.json"),
                         provenance={"seeds": setup.search_seeds})
        t_search, state = time.time() - t0, res.state
        new = [key for key in state.masks if key not in held]
        for key in new:
            held[key] = setup.held_out(key)
        with open(cache_path, "w", encoding="utf-8") as f:
            json.dump(held, f)
        psnr = {name: held[pick(state)] for name, pick in judge.items()}
        lowest, best = psnr["best_measured"], max(held[key] for key in state.masks)
        rows.append({"search_seeds": text, "budget": budget, "K": k, "gp_seed": g, "masks": len(state.masks),
                     "psnr": psnr, "best_psnr": best, "regret": {r: round(best - v, 3) for r, v in psnr.items()},
                     "vs_lowest_loss": {r: round(lowest - v, 3) for r, v in psnr.items()}})
        print(f"[{n}/{len(grid)}] seeds {text}, budget {budget}, K = {k}, GP seed {g}: {len(state.masks)} masks, "
              f"search {t_search:.0f} s, {len(new)} held out in {time.time() - t0 - t_search:.0f} s; held-out PSNR: "
              f"best evaluated {best:.2f} dB, lowest loss {lowest:.2f}, z=0 {psnr['z=0']:.2f}, z=2 {psnr['z=2']:.2f}, "
              f"halves {psnr['halves']:.2f}, start only {psnr['start_only']:.2f}", flush=True)
    return rows


def _report(a, argv, rows: list, gp_seeds: list, wall: float) -> None:
    judge = rules()
    out = {"command": " ".join([PROG] + list(sys.argv[1:] if argv is None else argv)),
           "date": datetime.date.today().isoformat(), "git_commit": git_commit(), "wall_s": round(wall),
           "N": a.steps, "forecast": "fitted", "objective": "ssim", "search_seeds": a.search_seeds,
           "eval_seeds": a.eval_seeds, "gp_seeds": gp_seeds, "rows": rows, "rules": {}}
    print("\nregret = held-out PSNR of the best mask the search evaluated − of the chosen one (dB); vs lowest loss: "
          "of the lowest-loss mask − of the chosen one (below 0: better than it)")
    for name in judge:
        r = {"regret": summary([row["regret"][name] for row in rows]),
             "vs_lowest_loss": summary([row["vs_lowest_loss"][name] for row in rows]),
             "per_budget": {str(b): summary([row["regret"][name] for row in rows if row["budget"] == b])
                            for b in a.budgets},
             "per_search_seeds": {t: summary([row["regret"][name] for row in rows if row["search_seeds"] == t])
                                  for t in a.search_seeds},
             "per_k_median": {str(k): round(statistics.median(row["regret"][name] for row in rows if row["K"] == k), 3)
                              for k in a.ks}}
        out["rules"][name] = r
        g, v = r["regret"], r["vs_lowest_loss"]
        print(f"  {name:13s} regret median {g['median']:.3f}, mean {g['mean']:.3f}, worst {g['worst']:.3f} | vs lowest "
              f"loss mean {v['mean']:+.3f}, better/worse in {v['better']}/{v['worse']} of {v['n']} | per set "
              + ", ".join(f"{t}: {x['median']:.2f}/{x['mean']:.2f}/{x['worst']:.2f}"
                          for t, x in r["per_search_seeds"].items())
              + " | per K " + ", ".join(f"{k}: {x:.2f}" for k, x in r["per_k_median"].items()), flush=True)
    pool = list(out["rules"])
    for stat in ("median", "worst", "mean"):  # the lowest, ties within TIE_DB kept for the next statistic
        least = min(out["rules"][n]["regret"][stat] for n in pool)
        pool = [n for n in pool if out["rules"][n]["regret"][stat] <= least + TIE_DB]
    best_rule = min(pool, key=lambda n: out["rules"][n]["regret"]["mean"])
    out["lowest_regret_rule"], out["tied_with_it"] = best_rule, [n for n in pool if n != best_rule]
    print(f"lowest regret (median, then worst, then mean; within {TIE_DB} dB a tie): {best_rule}"
          + (f" (tied: {', '.join(out['tied_with_it'])})" if out["tied_with_it"] else ""))
    with open(a.results, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({"results": a.results, "lowest_regret_rule": best_rule, "wall_s": out["wall_s"]}))


if __name__ == "__main__":
    from .cli import run_main
    sys.exit(run_main(main, "gcache.bench.choice_regret"))
