"""The forecaster check: once the search has chosen its mask, the same mask under the other profile-fitted
forecasters, judged on the search's own loss.

Why: which forecaster suits a mask depends on the mask. On the reference model (bench/quality.py, 2026-11-27) GCache's
l2p forecaster on the profile-fitted search's mask scored above the search itself at K = 8 and 15 of 30 (+0.12 and
+1.31 dB held-out), and the search had measured neither.

- Candidates: when the search's forecaster is profile-fitted (needs_profile), every other registered forecaster that
  forecasts and is profile-fitted, whose parameters this profile can fit (l2p needs the Gram statistics). A search
  with a fixed rule (reuse, linear) keeps it: that is the rule the user asked for.
- Cost: one evaluation per candidate after the budget (as the final argmin-μ mask is), on the search's seeds. The
  results are kept in the state file (data["forecasters"], with the mask they were measured on), so a resumed search
  does not measure them again.
- Rule (RULE, a rule of paired.py): a candidate replaces the search's forecaster when it lowers the mean loss on both
  fixed halves of the seeds (paired.HALVES, the polish's "halves" guard); without per-seed losses of 2+ seeds, when it
  lowers the mean loss. Of several, the lowest mean loss. Measured against the other rules by
  bench/forecaster_check.py.
- Where the evaluation can't apply another forecaster (its executor says so: executor.py, can_apply_forecaster; Ray
  actors, ComfyUI workers) the check is skipped and the log says so.
- It takes the mask to check and a way to measure it (`measure(mask, forecaster)`): the loop runs it on its chosen
  mask (loop.py, SearchLoop.check); a search that chooses among several candidates runs it on each.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Optional

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.profile import Profile
from .paired import HALVES, MEAN, Rule, beyond_z, paired_difference
from .state import SearchState, loss_of

log = logging.getLogger("gcache")

# bench/forecaster_check.py compares them ("noise": a gain beyond 2 paired standard errors, the final choice's margin
# when that bench ran; "never": keep the search's forecaster)
RULES: dict[str, Optional[Rule]] = {"halves": HALVES, "mean": MEAN, "noise": beyond_z(2.0, "noise"), "never": None}
RULE = "halves"
CANT_APPLY = ("it needs an evaluation that can apply another forecaster (evaluate(mask, forecast=…)), and this one "
              "can't")


def candidates(profile: Profile, forecast: str) -> list[str]:
    """The other profile-fitted forecasters this profile can fit, when the search's own one is profile-fitted."""
    own = forecasters.get(forecast)
    if not own.needs_profile:
        return []
    out = []
    for name in forecasters.names():
        fc = forecasters.get(name)
        if name == own.name or not (fc.forecasts and fc.needs_profile):
            continue
        try:
            fc.fit(profile, [1] * profile.n_steps)  # what it needs from the profile (statistics), checked on any mask
        except GCacheError:
            continue
        out.append(name)
    return out


def pick(base: dict, results: dict, seed: int, rule: str = RULE) -> Optional[str]:
    """The forecaster that replaces the search's own on its mask (None: none does). `base`, results[name]: {"loss",
    "per_seed"} on the same mask; `seed`: the search seed (the halves' split)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {tuple(RULES)}, got {rule!r}")
    judge = RULES[rule]
    better = [(r["loss"], name) for name, r in sorted(results.items())
              if judge is not None and r["loss"] < base["loss"] and judge.decide(r, base, seed)]
    return min(better)[1] if better else None


def run(state: SearchState, profile: Profile, forecast: str, key: str,
        measure: Optional[Callable[[list, str], Any]], why_not: Optional[str] = None) -> dict:
    """Measures the mask `key` (the search's choice) under every candidate not measured yet on it with
    `measure(mask, forecaster name)`, records them in the state file, and returns {"mask", "results", "forecaster"
    (the winner, or `forecast`), "skipped" (why not)}. `measure` None: the check can't run (`why_not`, else: the
    evaluation can't apply another forecaster)."""
    names = candidates(profile, forecast)
    measured = state.check_results(key)
    todo = [n for n in names if n not in measured]
    own = forecasters.get(forecast).name
    skipped = None
    if todo and measure is None:
        skipped = (f"the forecaster check ({', '.join(todo)} on the chosen mask) did not run: {why_not or CANT_APPLY}; "
                   f"the policy keeps {own}")
        log.info("GCache Search: %s.", skipped)
        todo = []
    for name in todo:
        loss, per_seed = loss_of(measure([int(c) for c in key], name))
        if not math.isfinite(loss):
            log.warning("GCache Search: the forecaster check of %s returned no finite loss; it is left out.", name)
            continue
        measured[name] = {"loss": loss, **({"per_seed": per_seed} if per_seed is not None else {})}
        state.save()
    results = {n: r for n, r in measured.items() if n in names}
    base = state.masks[key]
    winner = pick(base, results, state.seed) if results else None
    if results:
        log.info("GCache Search: forecaster check on the chosen mask: %s; %s.", ", ".join(
            f"{n} loss {r['loss']:.5g}" for n, r in results.items()) + f" ({own}: {base['loss']:.5g})",
            f"{winner} replaces {own} (lower "
            f"{'on both halves of the seeds' if base.get('per_seed') else 'loss'})" if winner else f"{own} stays")
    return {"mask": key, "results": results, "forecaster": winner or own, "skipped": skipped}


def provenance(check: dict, searched_with: str, base: dict) -> dict:
    """What the policy's provenance records of the check (its "forecast" entry's "check"), {} when nothing ran."""
    if not (check["results"] or check["skipped"]):
        return {}
    return {"searched_with": searched_with, "loss": base["loss"],
            **({"skipped": check["skipped"]} if check["skipped"] else {}),
            **{n: {"loss": r["loss"], "minus_searched": paired_difference(r.get("per_seed"), base.get("per_seed"))}
               for n, r in check["results"].items()}}
