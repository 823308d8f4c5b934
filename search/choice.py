"""Which measured mask a search returns (once at its end, and as its best policy so far while it runs).

The rule, on the search's own loss (the mean over its seeds):
- The fallback is the best start mask (kind "instant": the instant DP masks, the TeaCache-like one, the caller's
  extra masks). The search never returns a mask whose loss is above it.
- A searched mask with a lower loss replaces it when its gain is believable by `rule` (paired.CHOICE: a paired gain
  beyond CHOICE_Z standard errors over the seeds). The lowest-loss believable one is returned. A polish move that was
  not accepted is no candidate: the polish guard found it no better than its parent (measured, under the halves
  guard: choosing such moves when they beat the fallback by the noise margin lost 1.3 dB held-out at K = 10 of 30 on
  the reference model).
- CHOICE_Z is 0, measured (paired.py, bench/choice_regret.py): so the search returns the lowest loss it measured,
  polish moves its guard rejected left out. A margin over the seed noise (2 standard errors until then) threw away
  searched masks that were better held out more often than it kept a lucky one; the rule stays a parameter for the
  bench that compares stricter ones. (Under stricter rules a chain of accepted polish moves used to earn what a lone
  searched mask could not; under CHOICE_Z = 0 that chain could never change the choice, and it is gone.)
- The candidates: the history's entries, every end's argmin-μ mask (an earlier budget's too, when a larger budget
  continued a finished search) and the policies earlier budgets returned (state.kept), so a larger budget's pick is
  never worse on the search's own loss than the smaller one's.
- Without per-seed losses of 2+ seeds nothing can be checked: the lowest loss wins ("unchecked", and the log says so).

Why the fallback is the best start on the search's own samples and not a fixed one (say the theory DP policy): a
search must not return a mask that its own measurements call worse than one it was given. The rule works on the
other side (which searched mask may replace it). The rules and the measurements behind them: paired.py.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple, Optional

from .paired import CHOICE, Rule
from .state import POLISH, START, Measured, SearchState

# How the chosen entry was chosen (the policy's provenance "chosen")
BEST, ARGMIN_MU, BEYOND_NOISE, WITHIN_NOISE = "best_evaluated", "argmin_mu", "beyond_noise", "instant_within_noise"
FRESH = "fresh_seeds"  # another forecaster's best candidate won on the fresh seeds (end_game.py)


class Choice(NamedTuple):
    entry: Optional[Mapping]  # a history entry or an end's argmin-μ one (None: nothing measured)
    how: str                  # BEST | ARGMIN_MU | BEYOND_NOISE (believable, not the lowest loss) | WITHIN_NOISE (the
    #                           fallback: the lower-loss searched masks were not believable)
    unchecked: bool           # a searched mask won without a check against the seed noise (no per-seed losses)
    measured: Optional[Measured] = None  # the entry's measured candidate (state.py): what the end game carries


def choose(state: SearchState, rule: Rule = CHOICE) -> Choice:
    """The mask the search returns. `rule`: paired.CHOICE (others: for the benches)."""
    masks, finals = state.masks, state.all_finals()
    best = state.best(with_final=True)
    fallback = state.best(kinds=(START,))
    if best is None:
        return Choice(None, BEST, False)
    if fallback is None:  # no start mask measured yet
        how = ARGMIN_MU if any(best is f for f in finals) else BEST
        return Choice(best, how, False, state.measured(best["mask"]))
    # a polish move that was not accepted failed the polish guard against its parent: never a candidate
    pool = [e for e in state.history if not (e["kind"] == POLISH and not e.get("accepted"))] + finals + \
        list(state.kept_entries())
    better = sorted((e for e in pool if e["loss"] < fallback["loss"]), key=lambda e: (e["loss"], e.get("i", math.inf)))
    for e in better:
        verdict = rule.better(masks[e["mask"]], masks[fallback["mask"]], state.seed)
        if e["mask"] == fallback["mask"] or verdict is None or verdict:
            how = ARGMIN_MU if any(e is f for f in finals) else (BEST if e is best else BEYOND_NOISE)
            return Choice(e, how, verdict is None and e["mask"] != fallback["mask"], state.measured(e["mask"]))
    return Choice(fallback, WITHIN_NOISE if better else BEST, False, state.measured(fallback["mask"]))
