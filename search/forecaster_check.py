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
- It takes the mask to check and a way to measure it (`measure(mask, forecaster)`): a search of state-file version 3
  runs it on its chosen mask (`run`).
- A search of version 4 (`run_on_candidates`) checks every candidate the final choice could return
  (`could_return`: the chosen key and the next ones the choice accepts that its seeds can't tell from it, paired.py
  CHECK_NEAR, at most CHECK_MOST), each under every other profile-fitted forecaster: a candidate is a mask with its
  forecaster (state.py key_of), which may already be another forecaster's (a start mask of l2p, or a GP mask after
  one won the start masks), so the search's own forecaster is a candidate for it too. What it measures goes into the
  state's masks under its keys (a resumed search measures nothing twice); each candidate takes the forecaster the
  rule picks for it, and the lowest loss of them is the search's result.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Optional

from ..core import forecasters
from ..core.profile import Profile
from .starts import can_fit, other_forecasters
from .paired import CHECK_NEAR, HALVES, MEAN, Rule, beyond_z, paired_difference
from .state import SearchState, key_of, loss_of, mask_of, split_key

log = logging.getLogger("gcache")

# bench/forecaster_check.py compares them ("noise": a gain beyond 2 paired standard errors, the final choice's margin
# when that bench ran; "never": keep the search's forecaster)
RULES: dict[str, Optional[Rule]] = {"halves": HALVES, "mean": MEAN, "noise": beyond_z(2.0, "noise"), "never": None}
RULE = "halves"
CHECK_MOST = 4  # candidates checked at most (each costs an evaluation per other forecaster, after the budget)
CANT_APPLY = ("it needs an evaluation that can apply another forecaster (evaluate(mask, forecast=…)), and this one "
              "can't")


def fitted_forecasters(profile: Profile, forecast: str) -> list[str]:
    """The search's forecaster and the other profile-fitted ones this profile can fit, when the search's own is
    profile-fitted (else none: a fixed rule is the user's choice)."""
    own = forecasters.get(forecast)
    return [own.name] + candidates(profile, forecast) if own.needs_profile else []


def could_return(state: SearchState, ranked: list) -> list[str]:
    """The keys the final choice could return (module docstring): `ranked` is choice.ranking's list."""
    chosen = ranked[0].entry
    keys = [chosen["mask"]]
    for c in ranked[1:]:
        key = c.entry["mask"]
        if len(keys) >= CHECK_MOST:
            break
        if key in keys or CHECK_NEAR.better(state.masks[chosen["mask"]], state.masks[key], state.seed) is not False:
            continue  # the same key, or clearly worse than the chosen one (or nothing to tell it with)
        keys.append(key)
    return keys


def run_on_candidates(state: SearchState, profile: Profile, forecast: str, keys: list,
                      measure: Optional[Callable[[list, str], Any]], why_not: Optional[str] = None) -> dict:
    """The check of a version-4 search (module docstring) on candidate keys `keys` (the chosen one first): measures
    each under every other profile-fitted forecaster not measured yet, and returns the result's check: {"key" (the
    winning candidate's key under the forecaster that won it), "mask" (the candidate it came from), "results" (that
    candidate under the other forecasters), "forecaster", "skipped", "candidates" (the keys checked)}. `measure`
    None: nothing is measured (`why_not`), what was measured before still counts."""
    own = forecasters.get(forecast).name
    names = fitted_forecasters(profile, own)
    skipped = None
    variants = {}  # candidate key -> {forecaster: its key}
    for key in keys:
        bits, fc = split_key(key)
        fc = fc or own
        variants[key] = {g: key_of(bits, None if g == own else g) for g in names if g != fc}
    todo = [(key, g, v) for key, vs in variants.items() for g, v in vs.items() if v not in state.masks]
    if todo and measure is None:
        which = "the chosen mask" if len(keys) == 1 else f"the search's {len(keys)} best masks"
        skipped = (f"the forecaster check ({', '.join(sorted({g for _, g, _ in todo}))} on {which}) did not run: "
                   f"{why_not or CANT_APPLY}; the policy keeps {split_key(keys[0])[1] or own}")
        log.info("GCache Search: %s.", skipped)
        todo = []
    for key, g, v in todo:
        raw = measure(mask_of(v), g)
        loss, _ = loss_of(raw)
        if not math.isfinite(loss):
            log.warning("GCache Search: the forecaster check of %s returned no finite loss; it is left out.", g)
            continue
        state.measure(v, raw, 0.0, first=len(state.history))
        state.save()
    best = None  # (loss, order, candidate key, winning key, forecaster)
    for order, key in enumerate(keys):
        fc = split_key(key)[1] or own
        results = {g: state.masks[v] for g, v in variants[key].items() if v in state.masks}
        winner = pick(state.masks[key], results, state.seed) if results else None
        won = variants[key][winner] if winner else key
        cand = (state.masks[won]["loss"], order, key, won, winner or fc)
        if best is None or cand[:2] < best[:2]:
            best = cand
    _, _, base, won, fc_name = best
    results = {g: state.masks[v] for g, v in variants[base].items() if v in state.masks}
    record = state.check_results(base)
    record.clear()
    record.update({g: {k: r[k] for k in ("loss", "per_seed") if k in r} for g, r in results.items()})
    state.save()
    if len(keys) > 1 or results:
        log.info("GCache Search: forecaster check on %d of the search's best masks (%s): %s.", len(keys),
                 ", ".join(f"{state.masks[k]['loss']:.5g}" for k in keys),
                 f"{fc_name} on the mask of loss {state.masks[base]['loss']:.5g} wins, loss "
                 f"{state.masks[won]['loss']:.5g}" if won != keys[0] else "the chosen mask and forecaster stay")
    return {"key": won, "mask": base, "results": results, "forecaster": fc_name, "skipped": skipped,
            "candidates": list(keys)}


def candidates(profile: Profile, forecast: str) -> list[str]:
    """The other profile-fitted forecasters this profile can fit, when the search's own one is profile-fitted."""
    return other_forecasters(forecast, can_fit(profile))


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
