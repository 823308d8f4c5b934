"""Which measured mask a search returns (once at its end, and as its best policy so far while it runs).

The rule, on the search's own loss (the mean over its seeds):
- The fallback is the best start mask (kind "instant": the instant DP masks, the TeaCache-like one, the caller's
  extra masks). The search never returns a mask whose loss is above it.
- The lowest loss the search measured is returned (paired.CHOICE_Z = 0: a searched mask replaces the fallback on any
  lower mean loss), the earliest of equal ones. A polish move that was not accepted is no candidate: the polish
  guard found it no better than its parent (measured, under the halves guard: choosing such moves when they beat the
  fallback by the noise margin lost 1.3 dB held-out at K = 10 of 30 on the reference model).
- Why no margin over the seed noise (2 standard errors until 2026-11-27): paired.py, bench/choice_regret.py. A margin
  threw away searched masks that were better held out more often than it kept a lucky one. With CHOICE_Z = 0 the
  paired test says what the means say, so this module applies no test at all; the stricter rules the bench compares
  live in bench/choice_regret.py (`choose_under`).
- The candidates: the history's entries, every end's argmin-μ mask (an earlier budget's too, when a larger budget
  continued a finished search) and the policies earlier budgets returned (state.kept), so a larger budget's pick is
  never worse on the search's own loss than the smaller one's.
- Without per-seed losses of 2+ seeds the rules that do test over the seeds (the polish guard, the forecaster check,
  the final choice on fresh seeds) fall back to the mean: a searched winner is then "unchecked" (the log says so).

Why the fallback is the best start on the search's own samples and not a fixed one (say the theory DP policy): a
search must not return a mask that its own measurements call worse than one it was given. The rules and the
measurements behind them: paired.py.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple, Optional

from .paired import per_seed
from .state import POLISH, START, Measured, SearchState

# How the chosen entry was chosen (the policy's provenance "chosen"; policies saved before 2026-11-29 may also say
# "beyond_noise" or "instant_within_noise", the verdicts of the noise margin retired then)
BEST, ARGMIN_MU = "best_evaluated", "argmin_mu"
FRESH = "fresh_seeds"  # another forecaster's best candidate won on the fresh seeds (end_game.py)


class Choice(NamedTuple):
    entry: Optional[Mapping]  # a history entry or an end's argmin-μ one (None: nothing measured)
    how: str                  # BEST | ARGMIN_MU
    unchecked: bool           # a searched mask won on a search without per-seed losses of 2+ seeds
    measured: Optional[Measured] = None  # the entry's measured candidate (state.py): what the end game carries


def candidates(state: SearchState) -> list:
    """What the choice may return, lowest loss first (of equal ones the best start mask, then the earliest; the ends'
    entries last): every history entry but the polish moves the polish guard rejected, every end's argmin-μ entry and
    the policies earlier budgets returned (state.kept)."""
    fallback = state.best(kinds=(START,))
    pool = [e for e in state.history if not (e["kind"] == POLISH and not e.get("accepted"))] + \
        list(state.all_finals()) + list(state.kept_entries())
    return sorted(pool, key=lambda e: (e["loss"], fallback is None or e["mask"] != fallback["mask"],
                                       e.get("i", math.inf)))


def choose(state: SearchState) -> Choice:
    """The mask the search returns: the lowest-loss candidate (module docstring)."""
    pool, fallback = candidates(state), state.best(kinds=(START,))
    if not pool:
        return Choice(None, BEST, False)
    e = pool[0]
    how = ARGMIN_MU if any(e is f for f in state.all_finals()) else BEST
    seeds = per_seed(state.masks.get(e["mask"]))
    searched = fallback is not None and e["mask"] != fallback["mask"]
    return Choice(e, how, searched and (seeds is None or seeds.size < 2), state.measured(e["mask"]))
