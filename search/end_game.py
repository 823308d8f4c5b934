"""The search's end game: once the budget is spent, which measured candidate becomes the policy. In the order it runs:

    1. the candidate   choice.choose: the lowest loss the search measured, never worse than its best start mask
    2. the forecaster check (`check`)
                       the candidate's mask under every other forecaster the search chooses among (`among`), judged
                       on the search's seeds
    3. the final choice on fresh seeds (`final_choice`)
                       the check's pick against each of those forecasters' best candidate, on seeds the search never
                       judged a mask on
    4. the policy      result.build, from what `run` returns (EndGame)

A candidate is a mask with the forecaster it is applied with (state.py key_of). What each step measured is kept in
the state file through SearchState's methods (the check's measurements among the measured candidates, under their
keys; the fresh seeds' losses in "fresh"), so a resumed search measures nothing twice. A state file of version 3 was
migrated to this format when it was read (state.py migrated).

The forecaster check. Why: which forecaster suits a mask depends on the mask. On the reference model
(bench/quality.py, 2026-11-27) GCache's l2p forecaster on the profile-fitted search's mask scored above the search
itself at K = 8 and 15 of 30 (+0.12 and +1.31 dB held-out), and the search had measured neither.
- Who (`chooses_among`, recorded in the state when the search starts): when the search's forecaster is
  profile-fitted, every other registered forecaster, the fixed rules (reuse, linear, quadratic) included, whose
  parameters this profile can fit (l2p needs the Gram statistics): the policy is the best the search can find, not
  one under the forecaster it searched with (on the Wan-class model at K = 8, issue 49, linear on a mask beat fitted
  on it by 12.6 dB). A search with a fixed rule keeps it: a search config can't tell a rule the user chose from the
  default, and a fixed-rule search is the cheap one (no check, no fresh seeds). A state file made before the choice
  was recorded chooses among the profile-fitted ones, as its search did. The candidate may already be another
  forecaster's (a start mask of l2p, or a GP mask after one won the start masks), so the search's own forecaster is
  checked on it too.
- Cost: one evaluation per other forecaster after the budget, on the search's seeds.
- Rule (paired.CHECK, measured by bench/forecaster_check.py): another forecaster takes over when it lowers the mean
  loss on both fixed halves of the seeds; without per-seed losses of 2+ seeds, when it lowers the mean loss. Of
  several, the lowest mean loss.
- Where the evaluation can't apply another forecaster (executor.py, can_apply_forecaster: Ray actors, ComfyUI
  workers) the check is skipped and the log and the policy's provenance say so.

The final choice on fresh seeds. Why: a search's pick is the lowest of some 60 losses on its own seeds, so its loss
there is the most flattered of them, and which forecaster suits a mask differs from seed to seed. On the reference
model (bench/quality.py, K = 15 of 30, budget 64) the search's 16 seeds ranked its fitted pick 0.33 dB above l2p on
auto's mask, while on each of four other seed sets (16 or 32 seeds) l2p on that mask was 0.31 to 0.98 dB better; no
rule on the search's own seeds could see that.
- Finalists (`finalists`): the check's pick, and for each forecaster the search chooses among the candidate of lowest
  loss the search measured under it (its start masks, the GP's masks, the check's variants). Only a search with a
  profile-fitted forecaster has more than one; a search with a fixed rule keeps its pick and samples nothing.
- Seeds (`fresh_seeds`): as many as the search's, the next ones after its largest (GCache Search: seed + n … seed +
  2n − 1), each with its full-compute image. Cost: their full-compute runs and one evaluation per finalist.
- Rule (paired.FRESH): a finalist replaces the pick when its paired gain over it on the fresh seeds is beyond FRESH_Z
  standard errors (without per-seed losses of 2+ seeds: a lower mean loss); of several, the lowest fresh loss.
- A state file made before this choice has no "fresh" entry and resumes without it, as it was searched. An evaluation
  that can't sample fresh seeds (executor.py, can_sample_fresh: Ray actors, ComfyUI workers, a plain function) keeps
  the pick, and the log says why.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..core import forecasters
from ..core.profile import Profile
from .choice import FRESH, Choice, choose
from .executor import Executor, evaluate_now
from .paired import CHECK, FRESH as FRESH_RULE, Rule, paired_difference
from .starts import can_fit, profile_fitted
from .state import SearchState, forecaster_of, key_of, loss_of, mask_of, split_key

log = logging.getLogger("gcache")

CANT_APPLY = ("it needs an evaluation that can apply another forecaster (evaluate(mask, forecast=…)), and this one "
              "can't")
CANT_SAMPLE = "the search's evaluation samples its own seeds only (it declares no can_sample_fresh)"

Measure = Callable[[list, Optional[str]], Any]  # measure(mask, forecaster name or None for the search's own)


@dataclass(frozen=True)
class Candidate:
    """A measured candidate: its key (a mask with its forecaster), the history entry it stands for (its own, or the
    entry of the candidate whose mask it shares), and the forecaster it applies."""
    key: str
    entry: Mapping
    forecaster: str


@dataclass(frozen=True)
class CheckOutcome:
    """What the forecaster check found: the candidate it checked, what it measured of that candidate's mask under the
    other forecasters (forecaster -> {"loss", "per_seed"?}), its pick (the checked candidate, or its mask under the
    forecaster that won) and why it did not run (None: it ran, or there was nothing to check)."""
    checked: Candidate
    results: Mapping
    pick: Candidate
    skipped: Optional[str]


@dataclass(frozen=True)
class FreshOutcome:
    """The final choice on fresh seeds: the finalists (the check's pick first), the fresh loss of each one measured,
    how many fresh seeds, the winner's key, and why it did not run (None: it ran)."""
    finalists: tuple
    losses: Mapping
    seeds: Optional[int]
    winner: str
    skipped: Optional[str]

    def provenance(self) -> dict:
        """What the policy's provenance records of it ({} when it had nothing to compare)."""
        if self.skipped:
            return {"skipped": self.skipped}
        if len(self.losses) < 2:
            return {}
        return {"seeds": self.seeds, "replaced": self.winner != self.finalists[0],
                "losses": {k: round(v, 9) for k, v in self.losses.items()}}


@dataclass(frozen=True)
class EndGame:
    """What the policy is made of: the choice, the check, the final choice on fresh seeds (None: the search has none)
    and the candidate the policy applies."""
    choice: Choice
    check: CheckOutcome
    fresh: Optional[FreshOutcome]
    final: Candidate

    @property
    def how(self) -> str:
        """How the final candidate was chosen (the policy's provenance "chosen")."""
        return FRESH if self.final.key != self.check.pick.key else self.choice.how


def run(state: SearchState, profile: Profile, forecast: str, executor: Executor,
        skip_check: Optional[str] = None) -> EndGame:
    """The end game of a finished search (module docstring), its evaluations through `executor` where it declares it
    can make them; `skip_check`: why neither the check nor the fresh seeds can run now (said in the log and policy)."""
    own = forecasters.get(forecast).name
    choice = choose(state)
    candidate = Candidate(choice.entry["mask"], choice.entry, forecaster_of(choice.entry["mask"], own))
    measure = None
    if not skip_check and executor.can_apply_forecaster:
        def measure(mask: list, name: Optional[str]) -> Any:
            return evaluate_now(executor, mask, forecast=name)
    checked = check(state, profile, own, candidate, measure, skip_check)
    measure_fresh = None
    if not skip_check and executor.can_sample_fresh and executor.can_apply_forecaster:
        def measure_fresh(mask: list, name: Optional[str]) -> Any:
            return evaluate_now(executor, mask, forecast=name, fresh=True)
    fresh = final_choice(state, profile, own, checked.pick, measure_fresh,
                         skip_check or (None if executor.can_sample_fresh else CANT_SAMPLE))
    final = checked.pick if fresh is None or fresh.winner == checked.pick.key else \
        Candidate(fresh.winner, entry_of(state, fresh.winner), forecaster_of(fresh.winner, own))
    return EndGame(choice, checked, fresh, final)


# ------------------------------------------------------------------------------------------------ the check
def chooses_among(forecast: str) -> list[str]:
    """The forecasters a new search of `forecast` chooses among after its budget (module docstring): for a profile-
    fitted one, its own and then every other registered forecaster, fixed rules included; for a fixed rule none (the
    rule is kept). Recorded in the state when the search starts (SearchState.choices)."""
    own = forecasters.get(forecast).name
    return [own] + [n for n in forecasters.names() if n != own] if profile_fitted(own) else []


def among(state: SearchState, profile: Profile, own: str) -> list[str]:
    """The forecasters this search's end game chooses among (SearchState.choices; a file made before they were
    recorded: the profile-fitted ones, as its search chose), its own first, less those whose parameters this profile
    can't fit (l2p needs the Gram statistics)."""
    names = state.choices if state.choices is not None else \
        [own] + [n for n in forecasters.names() if n != own and profile_fitted(n)] if profile_fitted(own) else []
    fits = can_fit(profile)
    return [n for n in names if n == own or fits(n)]


def pick(base: Mapping, results: Mapping, seed: int, rule: Optional[Rule] = CHECK) -> Optional[str]:
    """The forecaster that takes over a candidate (None: none does). `base`, results[name]: {"loss", "per_seed"} on
    the same mask; `seed`: the search seed (the halves' split); `rule`: paired.CHECK (None: never; others: for the
    bench that measured it)."""
    better = [(r["loss"], name) for name, r in sorted(results.items())
              if rule is not None and r["loss"] < base["loss"] and rule.decide(r, base, seed)]
    return min(better)[1] if better else None


def check(state: SearchState, profile: Profile, own: str, candidate: Candidate, measure: Optional[Measure],
          why_not: Optional[str] = None) -> CheckOutcome:
    """The forecaster check of `candidate` (module docstring): its mask under every other profile-fitted forecaster
    not measured yet, with `measure(mask, forecaster or None for the search's own)`. `measure` None: nothing is
    measured (`why_not`, else: the evaluation can't apply another forecaster); what was measured before still
    counts."""
    bits = split_key(candidate.key)[0]
    variants = {g: key_of(bits, None if g == own else g) for g in among(state, profile, own)
                if g != candidate.forecaster}
    todo = [(g, v) for g, v in variants.items() if v not in state.masks]
    skipped = None
    if todo and measure is None:
        skipped = (f"the forecaster check ({', '.join(sorted(g for g, _ in todo))} on the chosen mask) did not run: "
                   f"{why_not or CANT_APPLY}; the policy keeps {candidate.forecaster}")
        log.info("GCache Search: %s.", skipped)
        todo = []
    for g, v in todo:
        raw = measure(mask_of(v), None if g == own else g)
        if not math.isfinite(loss_of(raw)[0]):
            log.warning("GCache Search: the forecaster check of %s returned no finite loss; it is left out.", g)
            continue
        state.measure(v, raw, 0.0, first=len(state.history))
        state.save()
    results = {g: state.masks[v] for g, v in variants.items() if v in state.masks}
    if state.record_check(candidate.key, results):
        state.save()
    base = state.masks[candidate.key]
    winner = pick(base, results, state.seed) if results else None
    if results:
        log.info("GCache Search: forecaster check on the chosen mask: %s; %s.", ", ".join(
            f"{g} loss {r['loss']:.5g}" for g, r in results.items()) + f" ({candidate.forecaster}: {base['loss']:.5g})",
            f"{winner} replaces {candidate.forecaster} (lower "
            f"{'on both halves of the seeds' if base.get('per_seed') else 'loss'})" if winner else
            f"{candidate.forecaster} stays")
    chosen = candidate if winner is None else Candidate(variants[winner], candidate.entry, winner)
    return CheckOutcome(candidate, results, chosen, skipped)


def check_provenance(outcome: CheckOutcome, state: SearchState) -> dict:
    """What the policy's provenance records of the check (its "forecast" entry's "check"), {} when nothing ran."""
    if not (outcome.results or outcome.skipped):
        return {}
    base = state.masks[outcome.checked.key]
    return {"searched_with": outcome.checked.forecaster, "loss": base["loss"],
            **({"skipped": outcome.skipped} if outcome.skipped else {}),
            **{g: {"loss": r["loss"], "minus_searched": paired_difference(r.get("per_seed"), base.get("per_seed"))}
               for g, r in outcome.results.items()}}


# ------------------------------------------------------------------------------------------------ the fresh seeds
def fresh_seeds(seeds: Sequence[int]) -> list[int]:
    """The fresh seeds of a search on `seeds`: as many, the next ones after the largest."""
    seeds = [int(s) for s in seeds]
    top = max(seeds) if seeds else -1
    return list(range(top + 1, top + 1 + len(seeds)))


def finalists(state: SearchState, picked: str, names: Sequence[str], own: str) -> list[str]:
    """`picked` (the key the check returns), then each forecaster of `names`' lowest-loss measured key (module
    docstring), each key once."""
    keys = [picked]
    for name in names:
        mine = [k for k in state.masks if forecaster_of(k, own) == name]
        if mine:
            best = min(mine, key=lambda k: state.masks[k]["loss"])  # the first measured of equal losses
            if best not in keys:
                keys.append(best)
    return keys


def entry_of(state: SearchState, key: str) -> Mapping:
    """The history entry a measured key stands for: its own, or (a variant the forecaster check measured) the entry of
    the same mask under another forecaster, the lowest-loss one."""
    entries = list(state.history) + state.all_finals()
    own = [e for e in entries if e["mask"] == key]
    if own:
        return own[0]
    bits = split_key(key)[0]
    return min((e for e in entries if split_key(e["mask"])[0] == bits), key=lambda e: state.masks[e["mask"]]["loss"])


def final_choice(state: SearchState, profile: Profile, own: str, picked: Candidate, measure: Optional[Measure],
                 why_not: Optional[str] = None) -> Optional[FreshOutcome]:
    """The final choice on fresh seeds (module docstring) between `picked` (the check's pick) and the other
    finalists, each measured with `measure(mask, forecaster or None for the search's own)` unless measured before.
    None when the search has no such choice: a fixed rule, a state file made before it, or no other finalist.
    `measure` None: nothing new is measured (`why_not`); the pick stays."""
    names = among(state, profile, own)
    if state.fresh is None or not names:
        return None
    keys = finalists(state, picked.key, names, own)
    if len(keys) < 2:
        return None
    return on_fresh_seeds(state, keys, measure, own, why_not)


def fresh_winner(fresh: Mapping, keys: Sequence[str], seed: int, rule: Optional[Rule] = FRESH_RULE) -> str:
    """The winner among finalists `keys` (the pick first, measured on the fresh seeds: `fresh`, key -> {"loss",
    "per_seed"?}) by `rule`: paired.FRESH (None: the pick stays; others: for bench/fresh_choice.py). Of several
    finalists better than the pick, the lowest fresh loss."""
    better = [k for k in keys[1:] if k in fresh and rule is not None and rule.decide(fresh[k], fresh[keys[0]], seed)]
    return min(better, key=lambda k: (fresh[k]["loss"], list(keys).index(k))) if better else keys[0]


def on_fresh_seeds(state: SearchState, keys: Sequence[str], measure: Optional[Measure], own: str,
                   why_not: Optional[str] = None) -> FreshOutcome:
    """Finalists `keys` (the pick first) measured on the fresh seeds unless measured before, and the winner by
    paired.FRESH (module docstring)."""
    keys = list(keys)
    todo = [k for k in keys if k not in state.fresh]
    if todo and measure is None:
        skipped = (f"the final choice on fresh seeds ({len(keys)} finalists) did not run: {why_not or CANT_SAMPLE}; "
                   "the search's pick stays")
        log.info("GCache Search: %s.", skipped)
        return FreshOutcome(tuple(keys), {}, None, keys[0], skipped)
    for key in todo:
        bits, fc = split_key(key)
        loss, per_seed = loss_of(measure(mask_of(bits), fc))
        if not math.isfinite(loss):
            log.warning("GCache Search: %s on the fresh seeds returned no finite loss; it is left out.", key)
            continue
        state.measure_fresh(key, loss, per_seed)
        state.save()
    fresh = state.fresh
    measured = [k for k in keys if k in fresh]
    if keys[0] not in fresh:  # the pick has no fresh loss to compare with: it stays
        return FreshOutcome(tuple(keys), {}, None, keys[0], None)
    seeds = len(fresh[keys[0]].get("per_seed") or ()) or None
    winner = fresh_winner(fresh, keys, state.seed)
    log.info("GCache Search: final choice on %s: %s; %s.", f"{seeds} fresh seeds" if seeds else "the fresh seeds",
             ", ".join(f"{forecaster_of(k, own)} {'(the pick) ' if k == keys[0] else ''}loss {fresh[k]['loss']:.5g} "
                       f"(search seeds {state.masks[k]['loss']:.5g})" for k in measured),
             "the pick stays" if winner == keys[0] else
             f"{forecaster_of(winner, own)} on another mask replaces it" if split_key(winner)[0] !=
             split_key(keys[0])[0] else f"{forecaster_of(winner, own)} replaces it on the same mask")
    return FreshOutcome(tuple(keys), {k: fresh[k]["loss"] for k in measured}, seeds, winner, None)
