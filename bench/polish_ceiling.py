"""How much any polish could gain from the search's mask: the whole one-move neighbourhood, measured.

On the reference model (N = 30, the profile-fitted forecaster, objective 1 − SSIM on the search seeds), for each K the
search runs without polish (polish_share 0, the given budget and GP seed). Then every mask one polish move away from
its result (a computed step other than 0 swapped with a skipped one, K kept: (K − 1)(N − K) masks) is measured twice:
the search's own loss on the search seeds and PSNR on held-out seeds against full compute. Prints, per K:

- the held-out PSNR of the search's mask;
- the best held-out gain of any neighbour (what an oracle that sees the held-out seeds would get in one move: the
  ceiling of one polish step);
- the held-out gain of the neighbour with the lowest search loss, and of the best neighbour that both halves of the
  seeds accept (paired.HALVES: the move the polish would keep first under that guard if it measured every move);
- with --climb B, a long polish (the search again at budget B with polish) and its held-out gain: how far chains of
  moves get.

    python -m gcache.bench.polish_ceiling                      # K = 8, 10; budget 48; about 6 min on one CPU core
    python -m gcache.bench.polish_ceiling --ks 10 --climb 160

Ends with one JSON line.
"""
from __future__ import annotations

import json
import sys

from .cli import BenchParser, Progress, run_main, whole
from .search_setup import FittedSetup, add_arguments, check_ks


def main(argv=None, harness_factory=None) -> dict:
    ap = BenchParser("gcache.bench.polish_ceiling", __doc__)
    add_arguments(ap, ks=(8, 10), gp_seeds=None)
    ap.add_argument("--climb", type=whole(0), default=0, help="also run the search with polish at this budget")
    ap.add_argument("--seed", type=whole(0), default=0, help="the search's GP seed")
    a = ap.parse_args(argv)
    check_ks(ap, a)
    import numpy as np

    from ..core import forecasters
    from ..search.config import SearchConfig
    from ..search.loop import run_search
    from ..search.paired import HALVES
    from ..search.polish import moves
    setup = FittedSetup(a, harness_factory)
    profile, evaluate, held_out = setup.profile, setup.evaluate, setup.held_out
    fc = forecasters.get("fitted")

    def measured(key: str) -> dict:
        per_seed = [float(v) for v in evaluate([int(c) for c in key])]
        return {"loss": float(np.mean(per_seed)), "per_seed": per_seed}

    out = {"budget": a.budget, "gp_seed": a.seed, "per_k": {}}
    progress = Progress(len(a.ks), "polish ceiling: K (a search and every one-move neighbour)",
                        expected_s=180.0 * len(a.ks))
    for k in a.ks:
        cfg = dict(k=k, budget=a.budget, seed=a.seed, objective="ssim", forecast=fc.name)
        base = run_search(profile, SearchConfig(**cfg, polish_share=0.0), evaluate)
        root = "".join(map(str, base.policy.mask))
        root_m, root_psnr = measured(root), held_out(root)
        rows = []
        for key in moves(root, a.seed):
            m = measured(key)
            rows.append({"mask": key, "loss": m["loss"], "accepted": HALVES.decide(m, root_m, a.seed),
                         "gain_db": round(held_out(key) - root_psnr, 3)})
        best = max(rows, key=lambda r: r["gain_db"])
        lowest = min(rows, key=lambda r: r["loss"])
        kept = [r for r in rows if r["accepted"]]
        first = min(kept, key=lambda r: r["loss"]) if kept else None
        res = {"search_psnr": root_psnr, "search_won": base.policy.provenance["won"], "neighbours": len(rows),
               "best_neighbour_gain_db": best["gain_db"],
               "neighbours_gaining_0.5db": sum(r["gain_db"] >= 0.5 for r in rows),
               "lowest_loss_neighbour_gain_db": lowest["gain_db"],
               "lowest_loss_minus_search_loss": round(lowest["loss"] - root_m["loss"], 6),
               "accepted_neighbours": len(kept), "best_accepted_gain_db": first["gain_db"] if first else None}
        progress.step(f"K = {k}: search (no polish, {base.policy.provenance['won']}) {root_psnr:.2f} dB held-out; "
              f"{len(rows)} one-move neighbours: best held-out gain {best['gain_db']:+.2f} dB "
              f"({res['neighbours_gaining_0.5db']} gain ≥ 0.5 dB); lowest-loss neighbour {lowest['gain_db']:+.2f} dB "
              f"(loss {res['lowest_loss_minus_search_loss']:+.2e}); {len(kept)} accepted by both halves"
              + (f", the lowest-loss of them {first['gain_db']:+.2f} dB" if first else ""))
        if a.climb:
            long = run_search(profile, SearchConfig(**{**cfg, "budget": a.climb}), evaluate)
            key = "".join(map(str, long.policy.mask))
            res["climb"] = {"budget": a.climb, "gain_db": round(held_out(key) - root_psnr, 3),
                            "won": long.policy.provenance["won"], "moves": long.policy.provenance["polish"]["moves"],
                            "accepted": long.policy.provenance["polish"]["accepted"]}
            print(f"  search at budget {a.climb} with polish: {res['climb']['gain_db']:+.2f} dB held-out "
                  f"({res['climb']['won']}, {res['climb']['accepted']} of {res['climb']['moves']} moves kept)",
                  flush=True)
        out["per_k"][str(k)] = res
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.polish_ceiling"))
