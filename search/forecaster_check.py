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
- Rule (RULE): a candidate replaces the search's forecaster when it lowers the mean loss on both fixed halves of the
  seeds (polish.improves, the polish's "halves" guard); without per-seed losses of 2+ seeds, when it lowers the mean
  loss. Of several, the lowest mean loss. Measured against the other rules by bench/forecaster_check.py.
- Where the evaluation can't apply another forecaster (its evaluate has no `forecast` argument: Ray actors, ComfyUI
  workers) the check is skipped and the log says so.
"""
from __future__ import annotations

import inspect
import logging
import math
from typing import Any, Callable, Optional

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.profile import Profile
from .choice import NOISE_Z, paired_difference
from .polish import halves, improves
from .state import SearchState, loss_of

log = logging.getLogger("gcache")

RULES = ("halves", "mean", "noise", "never")  # bench/forecaster_check.py compares them
RULE = "halves"


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


def evaluate_with(executor: Any) -> Optional[Callable[[list, str], Any]]:
    """evaluate(mask, forecaster name) through the executor's own evaluate, when it takes a `forecast` argument."""
    ev = getattr(executor, "evaluate", None)
    try:
        takes = ev is not None and "forecast" in inspect.signature(ev).parameters
    except (TypeError, ValueError):
        takes = False
    return (lambda mask, name: ev(list(mask), forecast=name)) if takes else None


def pick(base: dict, results: dict, seed: int, rule: str = RULE) -> Optional[str]:
    """The forecaster that replaces the search's own on its mask (None: none does). `base`, results[name]: {"loss",
    "per_seed"} on the same mask; `seed`: the search seed (the halves' split)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    n = len(base.get("per_seed") or [])
    split = halves(n, seed) if n >= 2 else None

    def wins(r: dict) -> bool:
        if rule == "never" or not r["loss"] < base["loss"]:
            return False
        if rule == "halves":
            return improves(r, base, split)
        if rule == "noise":
            gain = paired_difference(r.get("per_seed"), base.get("per_seed"))
            return gain is None or gain["se"] is None or gain["mean"] + NOISE_Z * gain["se"] < 0
        return True

    better = [(r["loss"], name) for name, r in sorted(results.items()) if wins(r)]
    return min(better)[1] if better else None


def run(state: SearchState, profile: Profile, forecast: str, seed: int, key: str,
        evaluate: Optional[Callable[[list, str], Any]], why_not: Optional[str] = None) -> dict:
    """Measures the mask `key` (the search's choice) under every candidate not measured yet on it, records them in the
    state file, and returns {"mask", "results", "forecaster" (the winner, or `forecast`), "skipped" (why not)}.
    `evaluate` None: the check can't run (`why_not`, else: the evaluation can't apply another forecaster)."""
    names = candidates(profile, forecast)
    data = state.data.get("forecasters")
    if not data or data.get("mask") != key:
        data = state.data["forecasters"] = {"mask": key, "results": {}}
    todo = [n for n in names if n not in data["results"]]
    skipped = None
    if todo and evaluate is None:
        why_not = why_not or ("it needs an evaluation that can apply another forecaster (evaluate(mask, "
                              "forecast=…)), and this one can't")
        skipped = (f"the forecaster check ({', '.join(todo)} on the chosen mask) did not run: {why_not}; the policy "
                   f"keeps {forecasters.get(forecast).name}")
        log.info("GCache Search: %s.", skipped)
        todo = []
    for name in todo:
        loss, per_seed = loss_of(evaluate([int(c) for c in key], name))
        if not math.isfinite(loss):
            log.warning("GCache Search: the forecaster check of %s returned no finite loss; it is left out.", name)
            continue
        data["results"][name] = {"loss": loss, **({"per_seed": per_seed} if per_seed is not None else {})}
        state.save()
    results = {n: r for n, r in data["results"].items() if n in names}
    winner = pick(state.masks[key], results, seed) if results else None
    if results:
        own = forecasters.get(forecast).name
        log.info("GCache Search: forecaster check on the chosen mask: %s; %s.", ", ".join(
            f"{n} loss {r['loss']:.5g}" for n, r in results.items()) + f" ({own}: {state.masks[key]['loss']:.5g})",
            f"{winner} replaces {own} (lower "
            f"{'on both halves of the seeds' if state.masks[key].get('per_seed') else 'loss'})" if winner else
            f"{own} stays")
    return {"mask": key, "results": results, "forecaster": winner or forecasters.get(forecast).name,
            "skipped": skipped}
