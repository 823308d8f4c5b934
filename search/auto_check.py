"""Auto's true-loss check: a few candidate (mask, forecaster) policies sampled on run 1's own inputs and judged
against run 1's own output, within one full sampling run of extra cost.

Why: the profile's predictions rank (mask, forecaster) pairs poorly on the trained models (bench/auto_ranking.py:
the held-out bound picks the profile-fitted forecaster where linear or reuse on the same mask scores decibels better,
because it judges each forecast from true residuals while a cached run feeds its own errors forward, through the
sampler's multistep history too). A sampled candidate carries all of that: its loss against the full run it repeats
is the loss the policy has, on one seed.

Candidates (`candidates`), in order, as many as the budget pays for:
  1. auto's instant policy (search/instant.py: the bound's forecaster on the reuse DP's theory mask): the fallback;
  2. each other candidate forecaster (auto_candidates) on that mask: the bound's forecaster lost by 1-8 dB to
     another one on the same mask on the trained models (bench/auto_ranking.py);
  3. the reuse DP's mask under w = 0 (local), under auto's forecaster and then the others: the theory weight leaves the
     early steps to step 0's residual at low K, which measured worst on the trained Wan-class model;
  4. auto's instant policy at K − 1 (fewer computed steps meet the target too), then the others on its mask: where the
     budget pays for it, the pick at K is never judged worse than K − 1's instant policy on the same inputs.
A candidate costs K + (N − K)·io_share steps (a skipped step still runs the model's input and output layers);
together they cost at most one full run (N steps). The check picks the lowest loss; a tie goes to the earlier one.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ..core.errors import GCacheError
from ..core.policy import Policy
from ..core.profile import Profile

BUDGET_RUNS = 1.0  # the check's whole cost, in full sampling runs beyond run 1


def cost_steps(policy: Policy, io_share: float) -> float:
    """What sampling `policy` costs, in full steps: K computed, N − K skipped at the io share each."""
    return policy.n_computed + (policy.n_steps - policy.n_computed) * io_share


def candidates(profile: Profile, k: int, first: Optional[Policy] = None, io_share: Optional[float] = None,
               budget_runs: Optional[float] = None) -> list[Policy]:
    """The policies the check samples for K computed steps, first = auto's instant policy, cut to what
    `budget_runs` full runs pay for (at least the first, which costs nothing extra when it is the only one: it is
    then not sampled at all, see `worth_checking`)."""
    from . import instant
    share = profile.io_share if io_share is None else io_share
    if first is None:
        first = instant.auto_policy(profile, k, instant.choose_forecaster(profile, k)[0])
    if k < 2:  # one computed step: every forecaster reuses it, so there is nothing to compare
        return [first]
    local = instant.forecast_dp(profile, instant.propagation_weights(profile, "local"), k, "reuse")[0]
    bases = [first, _on_mask(profile, Policy(mask=list(local), method="local",
                                             provenance={"mask_dp": "the reuse DP's mask under w = 0 (local)"}),
                             first.forecast, first)]
    if k > 2:  # auto's instant policy at K - 1 (its own forecaster): meets the target too
        bases.append(instant.auto_policy(profile, k - 1, instant.choose_forecaster(profile, k - 1)[0]))
    order = [first] + [_on_mask(profile, first, fc, first) for fc in _others(first.forecast)]
    for base in bases[1:]:  # then each further mask under auto's forecaster and the others
        order += [base] + [_on_mask(profile, base, fc, first) for fc in _others(base.forecast)]
    seen, unique = set(), []
    for pol in order:
        key = (tuple(pol.mask), pol.forecast)
        if key in seen or (not _forecasts(pol.mask) and any(m == key[0] for m, _ in seen)):
            continue  # (a mask whose skipped steps all follow one computed step: every forecaster reuses)
        seen.add(key)
        unique.append(pol)
    order = unique
    budget = (BUDGET_RUNS if budget_runs is None else budget_runs) * profile.n_steps
    out, spent = [order[0]], 0.0
    for pol in order:
        c = cost_steps(pol, share)
        if spent + c > budget + 1e-9:
            break
        spent += c
        if pol is not order[0]:
            out.append(pol)
    return out


def _others(forecast: str) -> list[str]:
    """The candidate forecasters other than `forecast`, those that forecast first (linear won on auto's mask on the
    trained models at 4 of the 6 (model, K) measured, reuse at 1: bench/auto_ranking.py)."""
    from ..core import forecasters
    from .instant import auto_candidates
    return sorted((f for f in auto_candidates() if f != forecast), key=lambda f: not forecasters.get(f).forecasts)


def _on_mask(profile: Profile, base: Policy, fc: str, first: Policy) -> Policy:
    """`base`'s mask applied with forecaster `fc` (its parameters fitted to the mask), named as auto names it."""
    from . import instant
    weight = "local" if base.method.startswith("local") else "theory"
    return Policy.for_mask(profile, base.mask, fc,
                           method=instant.instant_name(weight, fc, instant.auto_error_model(fc)),
                           provenance=dict(first.provenance, k=base.n_computed, instant=weight,
                                           mask_dp=base.provenance.get("mask_dp", "the reuse DP's mask")),
                           metrics=profile.io.metrics(len(base.mask), base.n_computed))


def _forecasts(mask: Sequence[int]) -> bool:
    """Some skipped step has two computed steps before it (else every forecaster reuses, the same output)."""
    computed = 0
    for m in mask:
        computed += int(m)
        if not m and computed >= 2:
            return True
    return False


def worth_checking(cands: Sequence[Policy]) -> bool:
    """Two or more candidates: one alone is applied as it is, unsampled."""
    return len(cands) >= 2


def choose(cands: Sequence[Policy], losses: Sequence[float]) -> tuple[int, str]:
    """The candidate with the lowest loss (a tie: the earlier one) and one line saying what was compared."""
    if len(cands) != len(losses) or not cands:
        raise GCacheError(f"The check needs one loss per candidate, got {len(losses)} for {len(cands)}.")
    best = min(range(len(cands)), key=lambda i: (losses[i], i))
    parts = [f"{p.forecast} K = {p.n_computed} {l:.4g}" for p, l in zip(cands, losses)]
    return best, "; ".join(parts)


def check(cands: Sequence[Policy], sample: Callable[[Policy], object], reference,
          loss: Callable[[object, object], float]) -> tuple[Policy, dict]:
    """Samples each candidate (`sample(policy)` -> output), judges it against `reference` by `loss`, and returns the
    best with the check's record (losses, the steps it spent) for the policy's provenance."""
    losses = [float(loss(sample(p), reference)) for p in cands]
    i, line = choose(cands, losses)
    pol = cands[i]
    pol.provenance["check"] = {"candidates": [{"forecast": p.forecast, "steps": p.compute_steps(),
                                               "loss": float(f"{l:.6g}")}
                                              for p, l in zip(cands, losses)],
                               "chosen": i, "what": line}
    return pol, pol.provenance["check"]


def mse(a, b) -> float:
    """The check's loss: the mean squared difference of two sampled outputs (latents)."""
    return float((a.double() - b.double()).pow(2).mean())
