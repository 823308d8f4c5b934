"""Which measured mask a search returns (at the end, and as its best policy so far while it runs).

The rule, on the search's own loss (the mean over its seeds):
- The fallback is the best start mask (kind "instant": the instant DP masks, the TeaCache-like one, the caller's
  extra masks). The search never returns a mask whose loss is above it.
- A searched mask with a lower loss replaces it only when its gain is believable: beyond NOISE_Z paired standard
  errors over the seeds (it was the minimum of many noisy means, so a gain within the noise is likely luck), or
  because it ends a chain of accepted polish moves (each kept by the polish guard, a paired gain over the seeds,
  polish.py) that starts at the fallback or at a mask that is itself believable, and beats the fallback
  by CHAIN_Z paired standard errors (0: any lower loss). The lowest-loss believable one is returned. (Measured on the
  reference model, bench/polish_choice.py in bench/RESULTS.md: with the start masks of four error models, CHAIN_Z = 0
  chose as well as 1 in all 30 searches at budgets 48 and 64 and better in 4, by +0.35 to +1.12 dB held-out at K = 10
  and 15 of 30, from chains 0.59-0.99 standard errors ahead; the earlier 1, set when such chains lost 0.99 dB at
  K = 20 with the older start masks, threw those away.) A polish move that was not accepted is no candidate: the
  polish guard found it no better than its parent (measured, under the halves guard: choosing such moves when they
  beat the fallback by the noise margin lost 1.3 dB held-out at K = 10 of 30 on the reference model).
- Without per-seed losses of 2+ seeds nothing can be checked: the lowest loss wins ("unchecked", and the log says so).

Why the fallback is the best start on the search's own samples and not a fixed one (say the theory DP policy): a
search must not return a mask that its own measurements call worse than one it was given. The guard works on the
other side (which searched mask may replace it); the polish chain is how a searched mask earns that on held-out
seeds rather than on a larger margin.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from .state import SearchState

NOISE_Z = 2.0  # a searched mask must beat the fallback by this many paired standard errors over seeds
CHAIN_Z = 0.0  # ... the end of a chain of accepted polish moves by this many (0: a lower loss is enough)


def paired_difference(a: Optional[list], b: Optional[list]) -> Optional[dict]:
    """mean ± s.e. over seeds of a − b (per-seed losses of two masks), or None without per-seed losses."""
    if not a or not b or len(a) != len(b):
        return None
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else float("nan")
    return {"mean": float(d.mean()), "se": se if math.isfinite(se) else None, "seeds": int(d.size)}


def choose(state: SearchState, chain_z: float = CHAIN_Z) -> tuple[Optional[dict], str, bool]:
    """(the chosen entry — a history entry or the final argmin-μ one —, how it was chosen, whether a searched mask won
    without a check against the seed noise). How: best_evaluated | argmin_mu | beyond_noise (a believable searched
    mask that is not the lowest loss) | instant_within_noise (the fallback, lower-loss searched masks were not
    believable). `chain_z`: CHAIN_Z (other values: for bench/polish_choice.py)."""
    masks, fin = state.masks, state.data.get("final")
    best = state.best(with_final=True)
    fallback = state.best(kinds=("instant",))
    if best is None:
        return None, "best_evaluated", False
    if fallback is None:  # no start mask measured yet
        return best, ("argmin_mu" if best is fin else "best_evaluated"), False
    per_seed = lambda e: masks[e["mask"]].get("per_seed")  # noqa: E731
    by_key = {h["mask"]: h for h in state.history}
    by_key.update({h["mask"]: h for h in state.history if h.get("accepted")})  # a mask's polish entry, if it has one

    def believable(e: dict, depth: int = 0) -> Optional[bool]:
        """True / False, or None when there is nothing to check with (no per-seed losses of 2+ seeds)."""
        if e["mask"] == fallback["mask"]:
            return True
        gain = paired_difference(per_seed(e), per_seed(fallback))
        if gain is None or gain["se"] is None:
            return None
        if gain["mean"] + NOISE_Z * gain["se"] < 0:
            return True
        if gain["mean"] + chain_z * gain["se"] < 0 and e.get("kind") == "polish" and e.get("accepted") and \
                depth < len(state.history):
            parent = by_key.get(e["parent"])
            return parent is not None and parent["loss"] <= fallback["loss"] and bool(believable(parent, depth + 1))
        return False

    # a polish move that was not accepted failed the polish guard against its parent: never a candidate
    pool = [e for e in state.history if not (e["kind"] == "polish" and not e.get("accepted"))] + ([fin] if fin else [])
    better = sorted((e for e in pool if e["loss"] < fallback["loss"]), key=lambda e: (e["loss"], e.get("i", math.inf)))
    for e in better:
        ok = believable(e)
        if ok is None or ok:
            how = "argmin_mu" if e is fin else ("best_evaluated" if e is best else "beyond_noise")
            return e, how, ok is None
    return fallback, ("instant_within_noise" if better else "best_evaluated"), False
