"""Paired statistics over the search seeds: when one measured mask is better than another, and the rules a search
applies with them.

Every mask a search measures is sampled on the same seeds, so two masks compare seed by seed: the paired differences
d_s = loss_s(new) − loss_s(old) have a mean and a standard error se = sd(d)/√n (`paired_difference`). A rule (`Rule`)
says from them whether `new` is better; with per-seed losses of fewer than 2 seeds there is nothing to check with,
and the caller falls back to the mean loss (`Rule.decide`). The measured masks are {"loss", "per_seed"} entries (the
state file's "masks").

The rules of one search, each with the stored measurement behind it (bench/results/, rendered into the docs):

    polish guard (GUARDS, SearchConfig.polish_guard)  which polish moves are kept over their parent
        "z"      the paired gain beyond POLISH_Z = 0.674 standard errors (the normal's 75 % point: a move that changes
                 nothing passes 1 time in 4, as often as under "halves"). bench/polish_guard.py on the reference
                 model, 30 searches at budgets 48 and 64 against "halves": better in 4, worse in 2 of 30 (held-out
                 PSNR), bench/results/polish_guard_48.json and polish_guard_64.json, rendered in docs/search.md.
        "halves" both fixed halves of the seeds (split at random by the search seed) improve: the earlier guard.
        "mean"   what either becomes without per-seed losses of 2+ seeds: a lower mean loss.
    final choice (CHOICE, choice.py)  when a searched mask may replace the best start mask
        a paired gain beyond CHOICE_Z = 0 standard errors: any lower mean loss (polish moves the guard rejected are no
        candidates). bench/choice_regret.py against z = 0.5, 1, 1.5, 2 (the earlier margin), 3, halves and the lowest
        loss: median held-out regret 0.36 dB at z = 0, 0.41 at z = 2, bench/results/choice_regret.json (and
        choice_regret_gp_seeds.json), rendered in docs/search.md.
    forecaster check (CHECK, end_game.py)  when another forecaster takes over the chosen candidate
        both halves of the seeds improve (HALVES): bench/forecaster_check.py, 15 searches, against a lower mean, a gain
        beyond 2 standard errors and never switching: switched in 2 of 15, bench/results/forecaster_check.json,
        rendered in docs/search.md.
    final choice on fresh seeds (FRESH, end_game.py)  when another finalist replaces the check's pick
        a paired gain on the fresh seeds beyond FRESH_Z = 1 standard error: bench/fresh_choice.py over 30 searches
        (2 seed sets, K = 6 to 20, GP seeds 0-2) against z = 0, 0.5, 2 and never replacing, by held-out regret
        against the best finalist: mean held-out regret 0.09 dB at z = 1, bench/results/fresh_choice.json, rendered
        in docs/search.md.

Gone: the polish chain (the end of a chain of accepted polish moves replaced the best start mask when it beat it by
CHAIN_Z = 0 standard errors): with CHOICE_Z = 0 it could never change the choice (its test was the choice's own,
reached only when that one had said no; on 20 000 random states it changed none). The check window (the forecaster
check on every candidate within CHECK_Z = 2 standard errors of the chosen one): no measurement stood behind it, so
the check looks at the chosen candidate only.

Guard names are stored in state files ("polish": {"guard": …}): SAVED_GUARDS is their registry (state.py checks a
file's name against it, polish.py looks its rule up there).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

HALVES_SALT = 0x6A1F  # the halves' random split is seeded by (search seed, this), apart from the polish's move orders

POLISH_Z = 0.674  # the normal's 75 % point: a null move's paired gain is beyond it 1 time in 4, as both halves are
# A searched mask replaces the best start mask when its paired gain is beyond this many standard errors: 0, any lower
# mean loss. bench/choice_regret.py on the reference model (bench/results/choice_regret.json, 2026-11-27; N = 30,
# K = 6/8/10/15/20, budgets 64 and 128, three sets of 16 search seeds, 32 held-out seeds): the held-out regret against
# the best mask each search evaluated had the lowest median, worst case and mean at z = 0 (docs/search.md renders them).
CHOICE_Z = 0.0
# The final choice on fresh seeds (end_game.py): a finalist replaces the search's pick when its paired gain on the
# fresh seeds is beyond this many standard errors (a finalist no better passes 1 time in 6). On the reference model
# (bench/quality.py --budget 64, K = 8 / 15 / 20 of 30, 16 fresh seeds; 2026-11-28) the lowest fresh loss alone
# replaced the pick three times: at z = 2.04 (K = 15: +0.93 dB held-out, +0.23 on 32 more seeds), at 0.50 (K = 8:
# −0.12 and −0.10 dB) and at 0.55 (K = 20: −0.68 and −1.17 dB). Of these runs bench/results/quality_64.json stores the
# one at FRESH_Z = 1 (it replaced the pick at K = 15 only). Over 30 searches (bench/results/fresh_choice.json) z = 1
# had the lowest mean and worst held-out regret of the rules compared (z = 2 the same; never replacing the highest).
FRESH_Z = 1.0


# The fewest search seeds with which the rules above test over the seeds (the halves need two): GCache Search's
# default (nodes/search_node.py). With one seed each falls back to a lower mean loss (`Rule.decide`); the final
# choice, a lower mean loss under CHOICE_Z = 0 anyway, loses nothing.
LEAST_SEEDS = 2


def one_seed_fallbacks(profile_fitted: bool) -> str:
    """What a one-seed search's log says (search/loop.py): the rules that then decide by a lower mean loss alone (the
    forecaster check and the final choice on fresh seeds run in a search with a profile-fitted forecaster only)."""
    rules = ["the polish guard"] + (["the forecaster check", "the final choice on fresh seeds"] if profile_fitted
                                     else [])
    return (f"1 seed: {', '.join(rules[:-1]) + ' and ' if len(rules) > 1 else ''}{rules[-1]} "
            f"{'decide' if len(rules) > 1 else 'decides'} by a lower mean loss alone, with no test against the seed "
            f"noise (each was measured with many more seeds: search/paired.py); use {LEAST_SEEDS} or more seeds")


def per_seed(entry: Optional[dict]) -> Optional[np.ndarray]:
    """The per-seed losses of a measured mask as an array, None without them."""
    v = (entry or {}).get("per_seed")
    return np.asarray(v, dtype=np.float64) if v else None


def paired_difference(a: Optional[Sequence[float]], b: Optional[Sequence[float]]) -> Optional[dict]:
    """{"mean", "se", "seeds"} over seeds of a − b (per-seed losses of two masks; se None for one seed), or None
    without per-seed losses of the same seeds."""
    if not a or not b or len(a) != len(b):
        return None
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else float("nan")
    return {"mean": float(d.mean()), "se": se if math.isfinite(se) else None, "seeds": int(d.size)}


def halves(n_seeds: int, seed: int) -> tuple[list[int], list[int]]:
    """Two fixed halves of the seeds' indices (sizes ⌊n/2⌋ and ⌈n/2⌉), split at random by the search seed."""
    perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, HALVES_SALT]).permutation(n_seeds)
    return sorted(int(v) for v in perm[:n_seeds // 2]), sorted(int(v) for v in perm[n_seeds // 2:])


def _beyond(z: float) -> Callable[[np.ndarray, np.ndarray, int], bool]:
    def test(a: np.ndarray, b: np.ndarray, seed: int) -> bool:
        d = a - b
        se = float(d.std(ddof=1) / np.sqrt(d.size))
        return bool(d.mean() < 0 and (se == 0.0 or -d.mean() / se > z))
    return test


def _on_halves(a: np.ndarray, b: np.ndarray, seed: int) -> bool:
    return all(a[h].mean() < b[h].mean() for h in halves(a.size, seed))


@dataclass(frozen=True)
class Rule:
    """When a measured mask `new` is better than `old`, judged over the seeds they share."""
    name: str        # as state files and the benches name it
    says: str        # in words: "a move is kept only when <says>"
    test: Optional[Callable[[np.ndarray, np.ndarray, int], bool]]  # on 2+ per-seed losses; None: the mean decides

    def better(self, new: dict, old: dict, seed: int = 0) -> Optional[bool]:
        """Whether `new` is better (`seed`: the search seed, for the halves' split); None when there is nothing to
        check with (no per-seed losses of the same 2+ seeds)."""
        a, b = per_seed(new), per_seed(old)
        if self.test is None or a is None or b is None or a.size != b.size or a.size < 2:
            return None
        return self.test(a, b, seed)

    def decide(self, new: dict, old: dict, seed: int = 0) -> bool:
        """better(), or a lower mean loss where there is nothing to check with."""
        verdict = self.better(new, old, seed)
        return new["loss"] < old["loss"] if verdict is None else verdict


def beyond_z(z: float, name: Optional[str] = None) -> Rule:
    """The paired gain beyond z standard errors (a lower loss on every seed when they differ by the same amount)."""
    return Rule(name or f"z={z:g}", f"its gain over the seeds is beyond {z:.3g} paired standard errors", _beyond(z))


HALVES = Rule("halves", "both halves of the seeds improve", _on_halves)
MEAN = Rule("mean", "the loss falls", None)  # no per-seed losses of 2+ seeds: nothing to check with
POLISH = beyond_z(POLISH_Z, "z")
CHOICE = beyond_z(CHOICE_Z, "choice")
CHECK = HALVES  # the forecaster check (bench/results/forecaster_check.json)
FRESH = beyond_z(FRESH_Z, "fresh")

# The polish guards a search may ask for (SearchConfig.polish_guard), and what a state file may hold.
GUARDS = {"halves": HALVES, "z": POLISH}
SAVED_GUARDS = {**GUARDS, "mean": MEAN}
GUARD = "z"  # bench/polish_guard.py: see POLISH_Z


def guard(name: str) -> Rule:
    """The polish guard a state file names (KeyError on an unknown name)."""
    return SAVED_GUARDS[name]
