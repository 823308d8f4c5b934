"""The bilevel search (paper §3.3, Algorithm 2): GP-LCB over s outside, the exact DP for the mask inside, and a
polish stage of local moves on the true loss.

    s ──DP(E, w(t; s), K)──► mask ──evaluate(mask)──► loss        (evaluate: sampling + decode vs. full run)

- The budget is spent in four phases (SearchConfig.phases): the start masks (starts.py: the instant DP masks of
  every error model, the TeaCache-like mask, the caller's extra masks), the 2^{d+1} start grid, GP-LCB proposals,
  then polish moves (polish.py: first-improvement hill climbing of the best mask so far, a move kept only when its
  paired gain over the seeds passes the polish guard). Then the GP is refit on every (s, loss) and s_μ = argmin μ(s)
  gives one more mask (evaluated if new). Last, the forecaster check (forecaster_check.py): the chosen mask under
  the other profile-fitted forecasters, one evaluation each; one that is better on both halves of the seeds is the
  policy's.
- The result (choice.py) is never worse on the search's own loss than its best start mask; a searched mask replaces
  that one only when its gain is beyond NOISE_Z paired standard errors over the seeds or it ends a chain of polish
  moves that each passed the polish guard. The Policy says which method won and, when `evaluate`
  returns per-seed losses, the paired difference to the theory-DP instant policy (mean ± s.e. over seeds).
- One loop, `run_batch_search`, keeps up to q evaluations in flight on an Executor (parallel.ThreadExecutor,
  ray_executor.RayExecutor). A GP proposal made while others are out sees them as observed at the GP's posterior
  mean (GP-BUCB: the mean does not move, the uncertainty around them shrinks), so a batch spreads out instead of
  proposing one point q times; the polish stage has q moves of its incumbent out. Results come back out of order: a
  history entry gets its index when it completes, and the κ schedule follows that index. `run_search` is this loop
  with q = 1 and evaluate() called in this process: the sequential search.
- Every distinct mask is evaluated once (also across masks still out); another s that gives a known mask reuses
  its loss (recorded as `reused` in the history; the GP still sees the new (s, loss) point).
- The state file (state.py) is written atomically after every result and before every dispatch. A search started
  again with the same config, profile and provenance resumes from it, dispatching again what was out (at most q
  evaluations lost); with q = 1 and the same seed it ends with the same policy as an uninterrupted run.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.policy import Policy
from ..core.profile import Profile
from ..core.weights import bernstein_w
from . import forecaster_check
from .choice import choose, paired_difference
from .config import SearchConfig
from .gp import GPLCB, kappa_schedule, start_grid
from .instant import bound_on, dp_on, instant_name, propagation_weights
from .polish import POLISH_Z, Polish
from .starts import start_masks
from .state import SearchState

log = logging.getLogger("gcache")


class SearchInterrupted(Exception):
    """should_stop() said stop; the state file holds every evaluation so far (resume by running again)."""


@dataclass
class SearchResult:
    policy: Policy
    best_mask: list
    best_loss: float
    mu_mask: list
    mu_loss: float
    s_best: list           # s of the chosen policy
    s_mu: list
    history: list
    state: dict
    evaluations: int       # calls of evaluate() (distinct masks), the final one included


def mask_key(mask: Sequence[int]) -> str:
    return "".join("1" if m else "0" for m in mask)


def gp_targets(losses, log_loss: bool) -> np.ndarray:
    """What the GP fits. Losses of good and bad masks differ by decades (1 − SSIM: 2e-4 … 4e-2), so on the raw
    scale the few bad masks set the GP's scale and the region that matters looks flat; log fixes that.
    −PSNR (negative) is already a log scale and is used as it is."""
    y = np.asarray(losses, dtype=np.float64)
    return np.log(np.maximum(y, 1e-12)) if log_loss and y.min() >= 0 else y


class Executor(Protocol):
    """Where evaluations run: InProcessExecutor, parallel.ThreadExecutor, ray_executor.RayExecutor."""
    def submit(self, mask: list) -> Any: ...
    def wait(self, handles: list) -> list: ...      # blocks until at least one is finished; returns those
    def result(self, handle: Any) -> Any: ...       # a loss, or the per-seed losses


class InProcessExecutor:
    """evaluate(mask) in this process, called when the search waits for it (so its exceptions reach the caller
    after the state file says what was out)."""

    def __init__(self, evaluate: Callable[[list], Any]):
        self.evaluate, self.submitted, self.masks, self.results = evaluate, 0, {}, {}

    def submit(self, mask: list) -> int:
        self.submitted += 1
        self.masks[self.submitted] = list(mask)
        return self.submitted

    def wait(self, handles: list) -> list:
        h = handles[0]
        self.results[h] = self.evaluate(self.masks.pop(h))
        return [h]

    def result(self, handle: int) -> Any:
        return self.results.pop(handle)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# ---------------------------------------------------------------------------------------------- search
def run_search(profile: Profile, config: SearchConfig, evaluate: Callable[[list], Any],
               state_path: Optional[str] = None, progress: Optional[Callable[[dict], None]] = None,
               should_stop: Optional[Callable[[], bool]] = None, provenance: Optional[dict] = None,
               extra_masks: Sequence[tuple[str, Sequence[int]]] = (), skip_check: Optional[str] = None
               ) -> SearchResult:
    """The sequential search: `evaluate(mask) -> loss` (or per-seed losses) samples under the mask, one at a time
    (`evaluate(mask, forecast=name)` under another forecaster: the forecaster check). `extra_masks` (name, mask) are
    measured first too, after the instant ones (e.g. the reuse search's result for a forecast search). `skip_check`:
    why the forecaster check can't run now (said in the log and the policy). See the module docstring."""
    return run_batch_search(profile, config, InProcessExecutor(evaluate), 1, state_path, provenance, extra_masks,
                            progress, should_stop, skip_check)


def run_batch_search(profile: Profile, config: SearchConfig, executor: Executor, q: int = 1,
                     state_path: Optional[str] = None, provenance: Optional[dict] = None,
                     extra_masks: Sequence[tuple[str, Sequence[int]]] = (),
                     progress: Optional[Callable[[dict], None]] = None,
                     should_stop: Optional[Callable[[], bool]] = None, skip_check: Optional[str] = None
                     ) -> SearchResult:
    """The search with up to q evaluations in flight on `executor`. See the module docstring."""
    if not isinstance(profile, Profile):
        raise GCacheError("The search needs a GCache Profile (profile the model first).")
    profile.require_clean("The search")
    if not isinstance(q, int) or q < 1:
        raise GCacheError(f"q (evaluations in flight) must be a whole number ≥ 1, got {q!r}.")
    n = profile.n_steps
    config.validate(n, 0)  # K first: the start masks need a valid K
    E, times = profile.E, np.asarray(profile.times, dtype=np.float64)
    if E.shape != (n, n) or times.shape != (n,):
        raise GCacheError(f"The profile is inconsistent: E is {E.shape} and has {times.size} times for {n} steps.")
    # the forecaster's error tensors: a profile without forecast errors stops here, with the fix
    fc = forecasters.get(config.forecast)
    errors = fc.dp_errors(profile)
    starts = start_masks(profile, config.k, config.forecast, extra_masks)
    config.validate(n, len(starts))
    provenance = json.loads(json.dumps(dict(provenance or {}), default=str))
    state = SearchState.open(state_path, config, profile, provenance, [name for name, _ in starts])
    grid = start_grid(config.degree + 1, config.s_min, config.s_max)
    gp = GPLCB(config.degree + 1, config.s_min, config.s_max, config.seed, config.n_candidates, config.acq_polish,
               config.warm_maxiter, config.cold_every)
    _, _, n_gp, n_local = config.phases(len(starts))
    started = state.data["polish"]["guard"]
    if started in ("halves", "z") and started != config.polish_guard:
        log.info("GCache Search: this search started polishing with the %r guard and keeps it (polish_guard %r is "
                 "for new searches).", started, config.polish_guard)
    w_theory = propagation_weights(profile, "theory")
    polish = Polish(state, config.seed, None if config.polish_order == "seeded" else
                    lambda key: bound_on(errors, w_theory, [int(c) for c in key]), config.polish_guard)

    def mask_for(s) -> tuple[list, float]:
        return dp_on(errors, bernstein_w(times, s), config.k)

    def propose(j: int) -> Optional[dict]:
        """Proposal j: a start mask, a start grid point, GP-LCB's next s or a polish move (None: wait for a result)."""
        if j < len(starts):
            name, mask = starts[j]
            return {"kind": "instant", "s": None, "mask": mask_key(mask), "method": name, "bound": None}
        if j < len(starts) + len(grid):
            s = grid[j - len(starts)]
            mask, bound = mask_for(s)
            return {"kind": "grid", "s": [float(v) for v in s], "mask": mask_key(mask), "bound": bound}
        if j >= len(starts) + len(grid) + n_gp:
            return polish.propose()
        t0 = time.perf_counter()
        S, y = _observations(state, config)
        state.theta = gp.fit(S, y, state.theta)
        out = [p["s"] for p in state.pending if p["s"] is not None]
        if out:
            gp.add_pending(np.array(out))
        kappa = kappa_schedule(j - len(starts) - len(grid), n_gp)
        s = gp.minimize_acq(kappa, j)
        mask, bound = mask_for(s)
        return {"kind": "gp", "s": [float(v) for v in s], "mask": mask_key(mask), "bound": bound, "kappa": kappa,
                "gp_seconds": round(time.perf_counter() - t0, 4)}

    every = max(1, config.budget // 10)

    def report(entry: dict, iteration: int) -> None:
        best = state.best(upto=iteration)
        if progress:
            progress({"iteration": iteration, "budget": config.budget, "evaluations": len(state.masks),
                      "best_loss": best["loss"], **entry})
        if entry["kind"] != "final" and (iteration % every == 0 or iteration == config.budget):
            log.info("GCache Search: evaluation %d/%d, best loss so far %.5g (%s).", iteration, config.budget,
                     best["loss"], _method_of(best))

    def announce(entry: dict) -> None:  # once the state file holds it
        report(entry, entry["i"] + 1)

    in_flight: dict = {}  # executor handle -> (proposal, start time)

    def dispatch(p: dict) -> None:
        in_flight[executor.submit([int(c) for c in p["mask"]])] = (p, time.perf_counter())

    def collect() -> None:
        for h in executor.wait(list(in_flight)):
            p, t0 = in_flight.pop(h)
            raw, secs = executor.result(h), time.perf_counter() - t0
            state.measure(p["mask"], raw, secs, first=len(state.history))
            others = [o for o in state.pending if o["mask"] == p["mask"] and o is not p]  # proposed while it was out
            state.pending[:] = [o for o in state.pending if o["mask"] != p["mask"]]
            entries = [state.record(p, secs, False)] + [state.record(o, 0.0, True) for o in others]
            for entry in entries:
                if entry["kind"] == "polish":
                    polish.observe(entry)
            state.save()
            for entry in entries:
                announce(entry)

    def finish() -> None:
        """The budget is spent and nothing is out: the mask of argmin μ(s) over everything measured."""
        t0 = time.perf_counter()
        S, y = _observations(state, config)
        gp.fit(S, y, state.theta)
        s_mu = gp.minimize_acq(0.0, config.budget, extra_starts=S[[int(np.argmin(y))]])
        gp_secs = time.perf_counter() - t0
        mask, bound = mask_for(s_mu)
        key, secs = mask_key(mask), 0.0
        reused = key in state.masks
        if not reused:
            h = executor.submit(list(mask))
            t0 = time.perf_counter()
            executor.wait([h])
            secs = time.perf_counter() - t0
            state.measure(key, executor.result(h), secs, first=config.budget)
        state.finish({"s": [float(v) for v in s_mu], "mask": key, "loss": state.masks[key]["loss"], "reused": reused,
                      "seconds": round(secs, 4), "bound": bound, "gp_seconds": round(gp_secs, 4)})
        report({"kind": "final", **state.data["final"]}, len(state.history))

    t_start = time.perf_counter()
    seeds = len(provenance.get("seeds", []))
    resumed = state.history or state.pending
    log.info("GCache Search: N = %d, K = %d, budget %d (%d start masks, %d start grid, %d GP, %d polish), %s, "
             "objective %s%s; %s.", n, config.k, config.budget, len(starts), len(grid), max(n_gp, 0), n_local,
             _count(seeds, "seed") if seeds else "? seeds", config.objective, f", {q} in flight" if q > 1 else "",
             f"resumed at evaluation {len(state.history)}" + (
                 f" ({_count(len(state.pending), 'evaluation')} dispatched again)" if state.pending else "")
             if resumed else "starting")
    for j, p in enumerate(state.pending):  # a resumed search: what was out when it stopped, each mask once
        if not any(o["mask"] == p["mask"] for o in state.pending[:j]):
            dispatch(p)
    while not state.done:
        while len(in_flight) < q and state.proposed() < config.budget:
            if should_stop and should_stop():
                state.save()
                raise SearchInterrupted(f"Search stopped after {len(state.history)} of {config.budget} iterations; "
                                        "run it again with the same settings to resume.")
            first_move = state.data["polish"]["guard"] is None
            p = propose(state.proposed())
            if p is None:  # polish: every move of the incumbent is out (or nothing is left to climb from)
                break
            if p["kind"] == "polish" and first_move:
                _log_polish_start(state, n_local)
            if p["mask"] in state.masks:  # measured before: recorded at once, nothing dispatched
                entry = state.record(p, 0.0, True)
                state.save()
                announce(entry)
                continue
            already_out = state.is_pending(p["mask"])  # it will share that result
            state.pending.append(p)
            state.save()
            if not already_out:
                dispatch(p)
        if in_flight:
            collect()
        else:
            finish()
    chosen_key = choose(state)[0]["mask"]
    check = forecaster_check.run(state, profile, config.forecast, config.seed, chosen_key,
                                 None if skip_check else forecaster_check.evaluate_with(executor), skip_check)
    result, searched_unchecked = _result(state, profile, config, check)
    log.info("GCache Search: done in %.1f s: mask %s, won by %s (%s), loss %.5g.", time.perf_counter() - t_start,
             result.policy.describe(), result.policy.provenance["won"], result.policy.provenance["chosen"],
             result.policy.metrics["loss"])
    if searched_unchecked:
        log.info("GCache Search: no per-seed losses for two or more seeds, so the searched mask was kept without "
                 "checking its gain against the seed noise (use 2+ seeds for that check).")
    return result


def _log_polish_start(state: SearchState, n_local: int) -> None:
    pol = state.data["polish"]
    if pol["guard"] == "halves":
        log.info("GCache Search: polish: %d local moves from %s; a move is kept only when both halves of the seeds "
                 "improve.", n_local, pol["incumbent"])
    elif pol["guard"] == "z":
        log.info("GCache Search: polish: %d local moves from %s; a move is kept only when its gain over the seeds is "
                 "beyond %.3g paired standard errors.", n_local, pol["incumbent"], POLISH_Z)
    else:
        log.info("GCache Search: polish: %d local moves from %s; no per-seed losses for two or more seeds, so a move "
                 "is kept whenever the loss falls (no check against overfitting the search's seeds: use 2+ seeds "
                 "for it).", n_local, pol["incumbent"])


def _observations(state: SearchState, config: SearchConfig) -> tuple[np.ndarray, np.ndarray]:
    """What the GP sees: the (s, loss) pairs (start masks and polish moves have no s)."""
    hist = [h for h in state.history if h["s"] is not None]
    return np.array([h["s"] for h in hist]), gp_targets([h["loss"] for h in hist], config.log_loss)


def _method_of(entry: dict) -> str:
    return entry.get("method") or {"grid": "gcache start grid", "gp": "gcache GP-LCB",
                                   "polish": "gcache polish"}.get(entry.get("kind"), "gcache argmin mu")


def _result(state: SearchState, profile: Profile, config: SearchConfig, check: Optional[dict] = None
            ) -> tuple[SearchResult, bool]:
    """The result (with the forecaster `check` chose for its mask), and whether a searched mask won without a check of
    its gain against the seed noise."""
    hist, fin, masks = state.history, state.data["final"], state.masks
    best = state.best()
    chosen, how, unchecked = choose(state)
    won = _method_of(chosen)
    own = instant_name("theory", config.forecast)  # the instant policy of the same forecaster
    theory = next((h for h in hist if h.get("method") == own), None)
    fc_name = check["forecaster"] if check else config.forecast
    measured = check["results"][fc_name] if fc_name != config.forecast else masks[chosen["mask"]]
    vs = paired_difference(measured.get("per_seed"), masks[theory["mask"]].get("per_seed")) \
        if theory is not None else None
    to_mask = lambda key: [int(c) for c in key]  # noqa: E731
    prov = dict(state.data.get("provenance") or {})
    prov.update({"s": chosen["s"], "degree": config.degree, "objective": config.objective, "chosen": how, "won": won,
                 "iterations": len(hist), "evaluations": len(masks), "search_seed": config.seed,
                 "s_range": [config.s_min, config.s_max], "profile": state.data["profile"], "state": state.search_id,
                 "polish": {"moves": sum(h["kind"] == "polish" for h in hist),
                            "accepted": sum(bool(h.get("accepted")) for h in hist), "guard": state.data["polish"]["guard"]}})
    metrics = {"loss": measured["loss"], "objective": config.objective, "mu_loss": fin["loss"], "best_loss": best["loss"]}
    if theory is not None:
        metrics["instant_loss"] = theory["loss"]
    if vs is not None:
        metrics["loss_minus_instant"] = vs  # paired over seeds: < 0 means the search beat the instant policy
    prov["forecast"] = {"forecaster": fc_name,
                        "chosen_by": "forecaster check" if fc_name != config.forecast else "search config"}
    if check and (check["results"] or check["skipped"]):
        prov["forecast"]["check"] = {"searched_with": config.forecast, "loss": masks[chosen["mask"]]["loss"],
                                     **({"skipped": check["skipped"]} if check["skipped"] else {}),
                                     **{n: {"loss": r["loss"], "minus_searched": paired_difference(
                                         r.get("per_seed"), masks[chosen["mask"]].get("per_seed"))}
                                        for n, r in check["results"].items()}}
    policy = Policy.for_mask(profile, to_mask(chosen["mask"]), fc_name, method="gcache", provenance=prov,
                             metrics=metrics)
    return SearchResult(policy=policy, best_mask=to_mask(best["mask"]), best_loss=best["loss"],
                        mu_mask=to_mask(fin["mask"]), mu_loss=fin["loss"], s_best=chosen["s"], s_mu=fin["s"],
                        history=hist, state=state.data, evaluations=len(masks)), unchecked
