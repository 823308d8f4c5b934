"""The search's end game: once the budget is spent, which measured candidate becomes the policy. In the order it runs:

    1. the candidate   choice.choose: the lowest loss the search measured, never worse than its best start mask
    2. the forecaster check (`check`)
                       the candidate's mask under every other forecaster the search chooses among (`among`), judged
                       on the search's seeds
    3. the final choice on fresh seeds (`final_choice`)
                       the check's pick against each of those forecasters' best candidate, on seeds the search never
                       judged a mask on
    4. the policy      result.build, from what `run` returns (EndGame)

A candidate (Candidate) is a measured mask with the forecaster it is applied with (keys.py), carrying its measurement
(state.py Measured: its loss, per-seed losses and how it was measured) and what found its mask (the policy's "s" and
"won"), so no step looks anything up by key. What each step measured is kept in the state file through SearchState's
methods (the check's measurements among the measured candidates, kind "check"; the fresh seeds' losses in "fresh"),
so a resumed search measures nothing twice. A state file of an older version was migrated to this format when it was
read (state_file.py migrated).

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
- A state file made before this choice resumes without it, as it was searched ("fresh": "chooses" false). An evaluation
  that can't sample fresh seeds (executor.py, can_sample_fresh: Ray actors, ComfyUI workers, a plain function) keeps
  the pick, and the log says why.
"""
from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from ..core import forecasters
from ..core.profile import Profile
from .choice import FRESH, Choice, choose
from .executor import Executor, evaluate_now
from .keys import CHECK as CHECKED
from .keys import key_of
from .paired import CHECK, Rule, paired_difference
from .paired import FRESH as FRESH_RULE
from .starts import can_fit, profile_fitted
from .state import Measured, SearchState, loss_of

log = logging.getLogger("gcache")

CANT_APPLY = ("it needs an evaluation that can apply another forecaster (evaluate(mask, forecast=…)), and this one "
              "can't")
CANT_SAMPLE = "the search's evaluation samples its own seeds only (it declares no can_sample_fresh)"

Measure = Callable[[list, Optional[str]], Any]  # measure(mask, forecaster name or None for the search's own)


@dataclass(frozen=True)
class Candidate:
    """A measured candidate: its measurement (Measured: the key, the loss and per-seed losses on the search seeds,
    how it was measured), the forecaster it applies, and what found its mask (`s`, `method`: the policy's provenance
    "s" and "won"; a check's variant keeps those of the candidate it checked)."""
    measured: Measured
    forecaster: str
    s: Optional[tuple]
    method: str

    @classmethod
    def of(cls, measured: Measured, own: str) -> "Candidate":
        """The candidate a measurement stands for (its own `s` and method; a check's are the checked candidate's)."""
        return cls(measured, measured.forecaster(own), measured.s, measured.method)

    @property
    def key(self) -> str:
        return self.measured.key

    @property
    def mask(self) -> list:
        return self.measured.mask

    @property
    def loss(self) -> float:
        return self.measured.loss


@dataclass(frozen=True)
class CheckOutcome:
    """What the forecaster check found: the candidate it checked, what it measured of that candidate's mask under the
    other forecasters (forecaster -> Measured), its pick (the checked candidate, or its mask under the forecaster
    that won) and why it did not run (None: it ran, or there was nothing to check)."""
    checked: Candidate
    results: Mapping
    pick: Candidate
    skipped: Optional[str]


@dataclass(frozen=True)
class FreshOutcome:
    """The final choice on fresh seeds: the finalists (Candidates, the check's pick first), the fresh loss of each one
    measured (key -> loss), how many fresh seeds, the winner and why it did not run (None: it ran)."""
    finalists: tuple
    losses: Mapping
    seeds: Optional[int]
    winner: Candidate
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
    candidate = Candidate.of(choice.measured, own)
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
                         skip_check or (CANT_APPLY if executor.can_sample_fresh else CANT_SAMPLE))
    return EndGame(choice, checked, fresh, checked.pick if fresh is None else fresh.winner)


class _Nothing:
    """An executor that evaluates nothing: the end game of a finished search again, from what it measured."""
    can_apply_forecaster = can_sample_fresh = False


def returned(state: SearchState, profile: Profile, forecast: str, skip_check: Optional[str] = None) -> str:
    """The key of the candidate a finished search's end game returned, found again from its state (a copy: nothing
    is measured or written; its log lines are left out)."""
    quiet = logging.Filter()
    quiet.filter = lambda record: record.thread != threading.get_ident()
    log.addFilter(quiet)
    try:
        return run(state, profile, forecast, _Nothing(), skip_check).final.key
    finally:
        log.removeFilter(quiet)


class _Owes(Exception):
    """The end game of a finished search still has an evaluation to make (complete)."""


class _Probe:
    """An executor that can make every evaluation and stops at the first one asked for (complete)."""
    can_apply_forecaster = can_sample_fresh = True

    def submit(self, *args, **kwargs):
        raise _Owes()


def complete(state: SearchState, profile: Profile, forecast: str) -> bool:
    """Whether a finished search's end game has measured all it measures (False: stopped in its forecaster check or
    its final choice on fresh seeds, by a Cancel, an Interrupt or a crash; run again with its evaluation it measures
    the rest, while a run that samples nothing would skip them for good). Nothing is measured or written."""
    quiet = logging.Filter()
    quiet.filter = lambda record: record.thread != threading.get_ident()
    log.addFilter(quiet)
    try:
        run(state, profile, forecast, _Probe())
    except _Owes:
        return False
    finally:
        log.removeFilter(quiet)
    return True


# ------------------------------------------------------------------------------------------------ the check
def chooses_among(forecast: str) -> list[str]:
    """The forecasters a new search of `forecast` chooses among after its budget (module docstring): for a profile-
    fitted one, its own and then every other registered forecaster, fixed rules included; for a fixed rule none (the
    rule is kept). Recorded in the state when the search starts (SearchState.choices)."""
    own = forecasters.get(forecast).name
    return [own] + [n for n in gcache_forecasters() if n != own] if profile_fitted(own) else []


def gcache_forecasters() -> list[str]:
    """GCache's own registered forecasters (core/forecasters/), by rank: not the rivals bench/rivals.py registers for
    its rows, nor a test's toy ones."""
    return [n for n in forecasters.names()
            if type(forecasters.get(n)).__module__.startswith(forecasters.__name__ + ".")]


def among(state: SearchState, profile: Profile, own: str) -> list[str]:
    """The forecasters this search's end game chooses among (SearchState.choices), its own first, less those whose
    parameters this profile can't fit (l2p needs the Gram statistics)."""
    fits = can_fit(profile)  # a fixed rule (reuse, linear, quadratic) fits nothing: it applies on any profile
    return [n for n in state.choices if n == own or not forecasters.get(n).needs_profile or fits(n)]


def _losses(m: Union[Measured, Mapping]) -> Mapping:
    return m.losses() if isinstance(m, Measured) else m


def pick(base: Union[Measured, Mapping], results: Mapping, seed: int, rule: Optional[Rule] = CHECK
         ) -> Optional[str]:
    """The forecaster that takes over a candidate (None: none does). `base`, results[name]: Measured (or {"loss",
    "per_seed"}) on the same mask; `seed`: the search seed (the halves' split); `rule`: paired.CHECK (None: never;
    others: for the bench that measured it)."""
    b = _losses(base)
    better = [(r["loss"], name) for name, r in sorted((n, _losses(m)) for n, m in results.items())
              if rule is not None and r["loss"] < b["loss"] and rule.decide(r, b, seed)]
    return min(better)[1] if better else None


def check(state: SearchState, profile: Profile, own: str, candidate: Candidate, measure: Optional[Measure],
          why_not: Optional[str] = None) -> CheckOutcome:
    """The forecaster check of `candidate` (module docstring): its mask under every other forecaster of `among` not
    measured yet, with `measure(mask, forecaster or None for the search's own)`. `measure` None: nothing is measured
    (`why_not`, else: the evaluation can't apply another forecaster); what was measured before still counts."""
    bits = candidate.measured.bits
    variants = {g: key_of(bits, None if g == own else g) for g in among(state, profile, own)
                if g != candidate.forecaster}
    measured = {m.key: m for m in state.all_measured() if m.bits == bits}
    todo = [(g, v) for g, v in variants.items() if v not in measured]
    skipped = None
    if todo and measure is None:
        skipped = (f"the forecaster check ({', '.join(sorted(g for g, _ in todo))} on the chosen mask) did not run: "
                   f"{why_not or CANT_APPLY}; the policy keeps {candidate.forecaster}")
        log.info("GCache Search: %s.", skipped)
        todo = []
    for g, v in todo:
        raw = measure(candidate.mask, None if g == own else g)
        if not math.isfinite(loss_of(raw)[0]):
            log.warning("GCache Search: the forecaster check of %s returned no finite loss; it is left out.", g)
            continue
        measured[v] = state.measure(v, raw, 0.0, first=len(state.history), how={
            "kind": CHECKED, "s": None if candidate.s is None else list(candidate.s), "method": candidate.method,
            "of": candidate.key})
        state.save()
    results = {g: measured[v] for g, v in variants.items() if v in measured}
    base = candidate.measured
    winner = pick(base, results, state.seed) if results else None
    if results:
        log.info("GCache Search: forecaster check on the chosen mask: %s; %s.", ", ".join(
            f"{g} loss {r.loss:.5g}" for g, r in results.items()) + f" ({candidate.forecaster}: {base.loss:.5g})",
            f"{winner} replaces {candidate.forecaster} (lower "
            f"{'on both halves of the seeds' if base.per_seed else 'loss'})" if winner else
            f"{candidate.forecaster} stays")
    chosen = candidate if winner is None else Candidate(results[winner], winner, candidate.s, candidate.method)
    return CheckOutcome(candidate, results, chosen, skipped)


def check_provenance(outcome: CheckOutcome) -> dict:
    """What the policy's provenance records of the check (its "forecast" entry's "check"), {} when nothing ran."""
    if not (outcome.results or outcome.skipped):
        return {}
    base = outcome.checked.measured
    return {"searched_with": outcome.checked.forecaster, "loss": base.loss,
            **({"skipped": outcome.skipped} if outcome.skipped else {}),
            **{g: {"loss": r.loss, "minus_searched": paired_difference(r.losses().get("per_seed"),
                                                                       base.losses().get("per_seed"))}
               for g, r in outcome.results.items()}}


# ------------------------------------------------------------------------------------------------ the fresh seeds
def fresh_seeds(seeds: Sequence[int]) -> list[int]:
    """The fresh seeds of a search on `seeds`: as many, the next ones after the largest."""
    seeds = [int(s) for s in seeds]
    top = max(seeds) if seeds else -1
    return list(range(top + 1, top + 1 + len(seeds)))


def finalists(state: SearchState, picked: Candidate, names: Sequence[str], own: str) -> list[Candidate]:
    """`picked` (the check's pick), then for each forecaster of `names` the candidate of lowest loss measured under it
    (module docstring; the first measured of equal losses), each key once."""
    out, keys = [picked], {picked.key}
    ranked = sorted(state.all_measured(), key=lambda m: (m.loss, m.first))  # sorted() keeps the measuring order
    for name in names:
        best = next((m for m in ranked if m.forecaster(own) == name), None)
        if best is not None and best.key not in keys:
            out.append(Candidate.of(best, own))
            keys.add(best.key)
    return out


def final_choice(state: SearchState, profile: Profile, own: str, picked: Candidate, measure: Optional[Measure],
                 why_not: Optional[str] = None) -> Optional[FreshOutcome]:
    """The final choice on fresh seeds (module docstring) between `picked` (the check's pick) and the other
    finalists, each measured with `measure(mask, forecaster or None for the search's own)` unless measured before.
    None when the search has no such choice: a fixed rule, a state file made before it, or no other finalist.
    `measure` None: nothing new is measured (`why_not`); the pick stays."""
    names = among(state, profile, own)
    if not state.chooses_on_fresh_seeds or not names:
        return None
    candidates = finalists(state, picked, names, own)
    if len(candidates) < 2:
        return None
    return on_fresh_seeds(state, candidates, measure, own, why_not)


def fresh_winner(fresh: Mapping, keys: Sequence[str], seed: int, rule: Optional[Rule] = FRESH_RULE) -> str:
    """The winner among finalists `keys` (the pick first, measured on the fresh seeds: `fresh`, key -> {"loss",
    "per_seed"?}) by `rule`: paired.FRESH (None: the pick stays; others: for bench/fresh_choice.py). Of several
    finalists better than the pick, the lowest fresh loss."""
    better = [k for k in keys[1:] if k in fresh and rule is not None and rule.decide(fresh[k], fresh[keys[0]], seed)]
    return min(better, key=lambda k: (fresh[k]["loss"], list(keys).index(k))) if better else keys[0]


def on_fresh_seeds(state: SearchState, candidates: Sequence[Candidate], measure: Optional[Measure], own: str,
                   why_not: Optional[str] = None) -> FreshOutcome:
    """Finalists `candidates` (the pick first) measured on the fresh seeds unless measured before, and the winner by
    paired.FRESH (module docstring)."""
    candidates = tuple(candidates)
    pick_ = candidates[0]
    todo = [c for c in candidates if c.key not in state.fresh]
    if todo and measure is None:
        skipped = (f"the final choice on fresh seeds ({len(candidates)} finalists) did not run: "
                   f"{why_not or CANT_SAMPLE}; the search's pick stays")
        log.info("GCache Search: %s.", skipped)
        return FreshOutcome(candidates, {}, None, pick_, skipped)
    for c in todo:
        loss, per_seed = loss_of(measure(c.mask, None if c.forecaster == own else c.forecaster))
        if not math.isfinite(loss):
            log.warning("GCache Search: %s on the fresh seeds returned no finite loss; it is left out.", c.key)
            continue
        state.measure_fresh(c.key, loss, per_seed)
        state.save()
    fresh = state.fresh
    measured = [c for c in candidates if c.key in fresh]
    if pick_.key not in fresh:  # the pick has no fresh loss to compare with: it stays
        return FreshOutcome(candidates, {}, None, pick_, None)
    seeds = len(fresh[pick_.key].get("per_seed") or ()) or None
    won = fresh_winner(fresh, [c.key for c in candidates], state.seed)
    winner = next(c for c in candidates if c.key == won)
    log.info("GCache Search: final choice on %s: %s; %s.", f"{seeds} fresh seeds" if seeds else "the fresh seeds",
             ", ".join(f"{c.forecaster} {'(the pick) ' if c is pick_ else ''}loss {fresh[c.key]['loss']:.5g} "
                       f"(search seeds {c.loss:.5g})" for c in measured),
             "the pick stays" if winner is pick_ else
             f"{winner.forecaster} on another mask replaces it" if winner.measured.bits != pick_.measured.bits else
             f"{winner.forecaster} replaces it on the same mask")
    return FreshOutcome(candidates, {c.key: fresh[c.key]["loss"] for c in measured}, seeds, winner, None)
