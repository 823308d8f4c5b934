"""The polish stage: after the GP-LCB phase, local moves of the best mask so far, judged on the true loss
(first-improvement hill climbing), within the same budget and state file.

Why: GP-LCB only varies the DP's weight function, so every mask it measures is a DP optimum of one error model;
masks a step or two away can be better on the image (on a held-out benchmark, a hill climb from the searched mask
gained 1.2 dB at K = 10 of 30 within 40 evaluations).

- A move takes a computed step (never step 0) to a skipped one, so K is kept: first by ±1, then by ±2, then every
  other swap; within each of these three rings the move whose mask has the lowest DP bound (the search's own error
  tensors under the theory weight) first, ties in an order seeded by the search seed and the mask. The bound is a
  poor judge of masks (that is why the polish measures them), but a fair guide to which move to measure first:
  measured against a seeded random order within rings (bench/RESULTS.md, 2026-11-27), the median held-out gain of
  polish over the GP-only search rose from +0.40/+1.35/−0.21 to +0.41/+1.99/+0.31 dB at K = 6/8/10 of 30, budget 48.
- A climb starts from the best measured mask (its root), under the forecaster it was measured with (a candidate key,
  state.py): its moves keep that forecaster. Moves of the incumbent are proposed until one is accepted;
  its moves are proposed next. When every move of the incumbent is measured and none was accepted (a local
  optimum), the climb starts again from the best measured mask that was neither a root nor an incumbent yet.
- Overfitting guard (SearchConfig.polish_guard, a rule of paired.GUARDS). On a held-out benchmark a plain hill climb
  cut the train loss by 18 % while held-out PSNR fell 1.1 dB (K = 15). "halves" accepts a move only when it lowers
  the mean loss of both fixed halves of the seeds; it gave +0.16 dB there and the same +1.2 dB at K = 10. "z" (the
  default) accepts a move when its paired gain over the incumbent is beyond paired.POLISH_Z standard errors: a move
  that changes nothing passes as often as under "halves" (1 in 4), but the verdict no longer depends on how the seeds
  were split (paired.py has the measurement). A search keeps the guard it started polishing with. Without per-seed
  losses of 2+ seeds the mean loss decides (the guard is "mean", and the search's log says so).
- With q evaluations in flight q moves of the incumbent are out at once; a result whose parent is no longer the
  incumbent (another move was accepted meanwhile) stays in the history, not accepted.
- The climb's state (incumbent, roots, guard) lives in the state file (SearchState.polish) and is written with
  every result; proposals depend only on it, the measured masks, the pending ones and the seed, so a resumed search
  proposes exactly what an uninterrupted one would.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Callable, Optional

import numpy as np

from . import paired
from .state import POLISH, SearchState, key_of, split_key

log = logging.getLogger("gcache")
RINGS = 3  # moves by 1, by 2, and by more


def _digest(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


def swap(key: str, computed: int, skipped: int) -> str:
    m = list(key)
    m[computed], m[skipped] = "0", "1"
    return "".join(m)


def moves(key: str, seed: int, score: Optional[Callable[[str], float]] = None) -> list[str]:
    """Every candidate one move from `key` (a computed step other than 0 to a skipped step, the same forecaster):
    moves by ±1 first, then ±2, then the rest; within each, the lowest `score` first (None: no preference), ties in
    an order seeded by (seed, key)."""
    bits, forecast = split_key(key)
    comp = [i for i in range(1, len(bits)) if bits[i] == "1"]
    skip = [i for i in range(1, len(bits)) if bits[i] == "0"]
    pairs = [(c, s) for c in comp for s in skip]
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, _digest(key)])
    cands = [(min(abs(c - s), RINGS), key_of(swap(bits, c, s), forecast))
             for c, s in (pairs[o] for o in rng.permutation(len(pairs)))]
    cands.sort(key=lambda t: (t[0], score(t[1]) if score else 0.0))  # stable: ties keep the seeded order
    return [m for _, m in cands]


class Polish:
    """Proposes the polish moves of one search and accepts or rejects their results."""

    def __init__(self, state: SearchState, seed: int, score: Optional[Callable[[str], float]] = None,
                 guard: str = paired.GUARD):
        """`score(mask key)`: which moves of a ring to measure first (lowest first); None: the seeded order. `guard`:
        a name of paired.GUARDS (a state file that holds one already keeps it, and the log says so)."""
        self.state, self.seed, self.score, self.guard = state, seed, score, guard
        started = state.polish.guard
        if started in paired.GUARDS and paired.guard(started) is not paired.GUARDS[guard]:
            log.info("GCache Search: this search started polishing with the %r guard and keeps it (polish_guard %r is "
                     "for new searches).", started, guard)

    @property
    def climb(self):
        """The climb as the state keeps it (a copy)."""
        return self.state.polish

    def _new_root(self) -> Optional[str]:
        """The best measured mask not yet a root or an accepted move (None: every measured mask was climbed from)."""
        used = set(self.climb.roots) | {h["mask"] for h in self.state.history if h.get("accepted")}
        for h in sorted(self.state.history, key=lambda e: (e["loss"], e["i"])):
            if h["mask"] not in used:
                root = h["mask"]
                per_seed = self.state.masks[root].get("per_seed")
                self.state.start_climb(root, self.guard if per_seed and len(per_seed) >= 2 else paired.MEAN.name)
                return root
        return None

    def propose(self) -> Optional[dict]:
        """The next move to measure; None while every move left of the incumbent is out (wait for a result), or when
        no mask is left to climb from."""
        pending = {p["mask"] for p in self.state.pending}
        while True:
            inc = self.climb.incumbent or self._new_root()
            if inc is None:
                return None
            waiting = False
            for m in moves(inc, self.seed, self.score):
                if m in pending:
                    waiting = True
                elif m not in self.state.masks:
                    return {"kind": POLISH, "s": None, "mask": m, "parent": inc,
                            "bound": self.score(m) if self.score else None}
            if waiting:
                return None
            self.state.end_climb()  # a local optimum: the next climb starts from another root

    def observe(self, entry) -> None:
        """Accept or reject the polish move just recorded (`entry`, a history entry)."""
        climb = self.climb
        new, old = self.state.masks[entry["mask"]], self.state.masks[climb.incumbent]
        ok = entry["parent"] == climb.incumbent and paired.guard(climb.guard).decide(new, old, self.seed)
        self.state.judge_move(entry["i"], ok)
