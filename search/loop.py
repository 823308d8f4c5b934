"""The bilevel search (paper §3.3, Algorithm 2): GP-LCB over s outside, the exact DP for the mask inside, and a
polish stage of local moves on the true loss.

    s ──DP(E, w(t; s), K)──► mask ──evaluate(mask)──► loss        (evaluate: sampling + decode vs. full run)

SearchLoop is one search, one method per phase, in the order they run:

    start(j)   start mask j (starts.py: the instant DP masks of every error model, those of the other
               profile-fitted forecasters (each applied with its own), the TeaCache-like mask, the caller's extra
               masks)
    grid(j)    point j of the 2^(d+1) start grid of s, through the DP of the working forecaster: the forecaster of
               the best start mask (the grid waits until every start mask is back)
    gp(j)      GP-LCB's next s (κ from 2.576 down to 1.0), through the same DP
    polish()   a move of the best candidate so far, under its forecaster (polish.py; kept when the polish guard says
               its gain is real)
    finish()   the GP refit on every (s, loss); the mask of s_μ = argmin μ(s), measured if new
    end_game() the candidate the search returns, the forecaster check and the final choice on fresh seeds
               (end_game.py), then the policy (result.py)

A candidate is a mask with the forecaster it is applied with (keys.py key_of): the search's own, or another
profile-fitted one's. A state file made with its own forecaster's start masks only (of version 3, made before the
others were measured) resumes with them; a file made before the final choice on fresh seeds resumes without it. A
finished search continued with a larger budget keeps its earlier argmin-μ mask as a candidate.

The budget splits into the first four phases (budget.py); `propose(j)` says which phase proposal j belongs to.
`run()` drives them: up to q proposals in flight on an Executor (executor.py), each result recorded in the state
file (state.py) when it comes back (out of order: a history entry gets its index when it completes, and the κ
schedule follows that index). A GP proposal made while others are out sees them at the GP's posterior mean (GP-BUCB),
so a batch spreads out; the polish stage has q moves of its incumbent out. Every distinct mask is evaluated once (also
across masks still out); another proposal of a known mask reuses its loss (`reused` in the history; the GP still sees
the new (s, loss) point).

The state file is written atomically after every result and before every dispatch. A search started again with the
same config, profile and provenance resumes from it, dispatching again what was out (at most q evaluations lost);
with q = 1 and the same seed it ends with the same policy as an uninterrupted run. `run_search` is the sequential
search (q = 1, evaluate() in this process), `run_batch_search` the same loop on any executor.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.profile import Profile
from ..core.weights import bernstein_w
from . import end_game, paired
from . import result as results
from .config import SearchConfig, check_k
from .end_game import EndGame
from .executor import Executor, InProcessExecutor, evaluate_now
from .gp import GPLCB, kappa_schedule, start_grid
from .instant import bound_on, dp_on, propagation_weights
from .keys import FINAL, GP, GRID, POLISH, START, forecaster_of, key_of, mask_of, method_of, split_key
from .polish import Polish
from .result import SearchResult
from .starts import start_masks
from .state import SearchState

log = logging.getLogger("gcache")


class SearchInterrupted(Exception):
    """should_stop() said stop; the state file holds every evaluation so far (resume by running again)."""


def mask_key(mask: Sequence[int]) -> str:
    """The key of `mask` under the search's own forecaster (state.py key_of)."""
    return key_of(mask)


def gp_targets(losses, log_loss: bool) -> np.ndarray:
    """What the GP fits. Losses of good and bad masks differ by decades (1 − SSIM: 2e-4 … 4e-2), so on the raw
    scale the few bad masks set the GP's scale and the region that matters looks flat; log fixes that.
    −PSNR (negative) is already a log scale and is used as it is."""
    y = np.asarray(losses, dtype=np.float64)
    return np.log(np.maximum(y, 1e-12)) if log_loss and y.min() >= 0 else y


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class SearchLoop:
    """One search (module docstring). Made ready by the constructor: the profile and the config checked, the start
    masks made, the state file opened (or resumed); `run()` runs it to the end."""

    def __init__(self, profile: Profile, config: SearchConfig, executor: Executor, q: int = 1,
                 state_path: Optional[str] = None, provenance: Optional[dict] = None,
                 extra_masks: Sequence[tuple[str, Sequence[int]]] = (),
                 progress: Optional[Callable[[dict], None]] = None, should_stop: Optional[Callable[[], bool]] = None,
                 skip_check: Optional[str] = None):
        """`extra_masks` (name, mask): measured after the instant start masks (e.g. the reuse search's result for a
        forecast search). `progress(info)`: after every result. `should_stop()`: asked before every dispatch
        (SearchInterrupted). `skip_check`: why the forecaster check can't run now (said in the log and the policy)."""
        if not isinstance(profile, Profile):
            raise GCacheError("The search needs a GCache Profile (profile the model first).")
        profile.require_clean("The search")
        if not isinstance(q, int) or q < 1:
            raise GCacheError(f"q (evaluations in flight) must be a whole number ≥ 1, got {q!r}.")
        n = profile.n_steps
        check_k(config.k, n)  # the start masks need a valid K
        self.times = np.asarray(profile.times, dtype=np.float64)
        if profile.E.shape != (n, n) or self.times.shape != (n,):
            raise GCacheError(f"The profile is inconsistent: E is {profile.E.shape} and has {self.times.size} times "
                              f"for {n} steps.")
        # the forecaster's error tensors: a profile without forecast errors stops here, with the fix
        self.own = forecasters.get(config.forecast).name
        self._errors = {self.own: forecasters.get(self.own).dp_errors(profile)}
        # the other profile-fitted forecasters' start masks need an evaluation that can apply them
        others = executor.can_apply_forecaster
        starts = start_masks(profile, config.k, config.forecast, extra_masks, others=others)
        own_starts = start_masks(profile, config.k, config.forecast, extra_masks, others=False) if others else starts
        # a run that can't measure now (skip_check: a finished search queued again) resumes a file of either list (the
        # file says which its search had); only a new search starts from the list this run can measure
        first, other = (own_starts, starts) if skip_check else (starts, own_starts)
        self.profile, self.config, self.executor, self.q = profile, config, executor, q
        self.progress, self.should_stop, self.skip_check = progress, should_stop, skip_check
        self.provenance = json.loads(json.dumps(dict(provenance or {}), default=str))
        self.state = SearchState.open(state_path, config, profile, self.provenance, [nm for nm, _, _ in first],
                                      [nm for nm, _, _ in other], end_game.chooses_among(config.forecast))
        self.starts = first if self.state.starts_names == [nm for nm, _, _ in first] else other
        if self.state.earlier is not None:  # a larger budget: the finished search's policy stays a candidate
            self.state.keep(end_game.returned(self.state.earlier, profile, config.forecast, skip_check))
        config.validate(n, len(self.starts))
        self.grid_points = start_grid(config.degree + 1, config.s_min, config.s_max)
        self.surrogate = GPLCB(config.degree + 1, config.s_min, config.s_max, config.seed, config.n_candidates,
                               config.acq_polish, config.warm_maxiter, config.cold_every)
        _, _, self.n_gp, self.n_polish = config.phases(len(self.starts))
        w_theory = propagation_weights(profile, "theory")
        self.polisher = Polish(self.state, config.seed, None if config.polish_order == "seeded" else
                               lambda key: bound_on(self.errors_of(key), w_theory, mask_of(key)),
                               config.polish_guard)
        self.in_flight: dict = {}  # executor handle -> (proposal, start time)
        self.every = max(1, config.budget // 10)

    # ------------------------------------------------------------------------------------------ the forecasters
    def errors_of(self, key: Optional[str] = None) -> tuple:
        """The DP's error tensors of the forecaster of candidate `key` (None: of the working forecaster)."""
        name = self.working() if key is None else forecaster_of(key, self.own)
        if name not in self._errors:
            self._errors[name] = forecasters.get(name).dp_errors(self.profile)
        return self._errors[name]

    def working(self) -> str:
        """The forecaster the start grid, GP-LCB and argmin μ apply: the one of the best start mask (the search's own
        while no start mask is measured). Fixed once every start mask is back, as the grid waits for that."""
        best = self.state.best(kinds=(START,))
        return self.own if best is None else forecaster_of(best["mask"], self.own)

    def key(self, mask) -> str:
        """The candidate key of `mask` under the working forecaster."""
        name = self.working()
        return key_of(mask, None if name == self.own else name)

    # ------------------------------------------------------------------------------------------ the phases
    def phase_of(self, j: int) -> str:
        """Which phase proposal j belongs to (START, GRID, GP or POLISH)."""
        n_starts, n_grid = len(self.starts), len(self.grid_points)
        if j < n_starts:
            return START
        if j < n_starts + n_grid:
            return GRID
        return POLISH if j >= n_starts + n_grid + self.n_gp else GP

    def propose(self, j: int) -> Optional[dict]:
        """Proposal j of the search (None: a polish move must wait for a result, or nothing is left to climb from)."""
        phase = self.phase_of(j)
        if phase == START:
            return self.start(j)
        if any(p["kind"] == START for p in self.state.pending):
            return None  # the working forecaster is the best start mask's: every start mask must be back
        if phase == GRID:
            return self.grid(j - len(self.starts))
        if phase == GP:
            return self.gp(j - len(self.starts) - len(self.grid_points))
        return self.polish()

    def start(self, j: int) -> dict:
        """Start mask j."""
        name, mask, fc = self.starts[j]
        return {"kind": START, "s": None, "mask": key_of(mask, None if fc == self.own else fc), "method": name,
                "bound": None}

    def mask_for(self, s) -> tuple[list, float]:
        """The working forecaster's DP K-mask (and its bound) under the weight w(t; s)."""
        return dp_on(self.errors_of(), bernstein_w(self.times, s), self.config.k)

    def grid(self, j: int) -> dict:
        """Point j of the start grid."""
        s = self.grid_points[j]
        mask, bound = self.mask_for(s)
        return {"kind": GRID, "s": [float(v) for v in s], "mask": self.key(mask), "bound": bound}

    def gp(self, j: int) -> dict:
        """GP-LCB proposal j (0-based within the phase): the GP fitted on every (s, loss) so far, the proposals
        still out at its posterior mean, and the argmin of μ − κ_j σ."""
        t0 = time.perf_counter()
        S, y = self.observations()
        self.state.theta = self.surrogate.fit(S, y, self.state.theta)
        out = [p["s"] for p in self.state.pending if p["s"] is not None]
        if out:
            self.surrogate.add_pending(np.array(out))
        kappa = kappa_schedule(j, self.n_gp)
        s = self.surrogate.minimize_acq(kappa, j + len(self.starts) + len(self.grid_points))
        mask, bound = self.mask_for(s)
        return {"kind": GP, "s": [float(v) for v in s], "mask": self.key(mask), "bound": bound, "kappa": kappa,
                "gp_seconds": round(time.perf_counter() - t0, 4)}

    def polish(self) -> Optional[dict]:
        """The next polish move (polish.py), None while every move of the incumbent is out."""
        first_move = self.state.polish.guard is None
        p = self.polisher.propose()
        if p is not None and first_move:
            climb = self.state.polish
            rule = paired.guard(climb.guard)
            log.info("GCache Search: polish: %d local moves from %s; %s.", self.n_polish, climb.incumbent,
                     f"a move is kept only when {rule.says}" if rule.test is not None else
                     "no per-seed losses for two or more seeds, so a move is kept whenever the loss falls (no check "
                     "against overfitting the search's seeds: use 2+ seeds for it)")
        return p

    def finish(self) -> None:
        """The budget is spent and nothing is out: the mask of argmin μ(s) over everything measured, measured if it
        is new, recorded as the state's final entry."""
        config, state = self.config, self.state
        t0 = time.perf_counter()
        S, y = self.observations()
        self.surrogate.fit(S, y, state.theta)
        s_mu = self.surrogate.minimize_acq(0.0, config.budget, extra_starts=S[[int(np.argmin(y))]])
        gp_secs = time.perf_counter() - t0
        mask, bound = self.mask_for(s_mu)
        key, secs = self.key(mask), 0.0
        reused = key in state.masks
        if not reused:
            t0 = time.perf_counter()
            raw = evaluate_now(self.executor, list(mask), forecast=split_key(key)[1])
            secs = time.perf_counter() - t0
            state.measure(key, raw, secs, first=config.budget,
                          how={"kind": FINAL, "s": [float(v) for v in s_mu], "method": method_of({})})
        state.finish({"s": [float(v) for v in s_mu], "mask": key, "loss": state.masks[key]["loss"], "reused": reused,
                      "seconds": round(secs, 4), "bound": bound, "gp_seconds": round(gp_secs, 4)})
        self.report({"kind": FINAL, **state.final}, len(state.history))

    def end_game(self) -> EndGame:
        """After the budget: the candidate, the forecaster check and the final choice on fresh seeds (end_game.py),
        through the executor where it declares it can make their evaluations."""
        return end_game.run(self.state, self.profile, self.config.forecast, self.executor, self.skip_check)

    # ------------------------------------------------------------------------------------------ the loop
    def observations(self) -> tuple[np.ndarray, np.ndarray]:
        """What the GP sees: the (s, loss) pairs (start masks and polish moves have no s)."""
        hist = [h for h in self.state.history if h["s"] is not None]
        return np.array([h["s"] for h in hist]), gp_targets([h["loss"] for h in hist], self.config.log_loss)

    def report(self, entry: dict, iteration: int) -> None:
        best = self.state.best(upto=iteration)
        if self.progress:
            self.progress({"iteration": iteration, "budget": self.config.budget, "evaluations": len(self.state.masks),
                           "best_loss": best["loss"], **entry})
        if entry["kind"] != FINAL and (iteration % self.every == 0 or iteration == self.config.budget):
            log.info("GCache Search: evaluation %d/%d, best loss so far %.5g (%s).", iteration, self.config.budget,
                     best["loss"], results.method_of(best))

    def dispatch(self, p: dict) -> None:
        fc = split_key(p["mask"])[1]
        mask = mask_of(p["mask"])
        handle = self.executor.submit(mask) if fc is None else self.executor.submit(mask, forecast=fc)
        self.in_flight[handle] = (p, time.perf_counter())

    def collect(self) -> None:
        """Records the results that are back (and the proposals of the same masks made while they were out)."""
        state = self.state
        for h in self.executor.wait(list(self.in_flight)):
            p, t0 = self.in_flight.pop(h)
            raw, secs = self.executor.result(h), time.perf_counter() - t0
            state.measure(p["mask"], raw, secs, first=len(state.history))
            first, *others = state.returned(p["mask"])  # `first` is p: the one proposal of its mask dispatched
            entries = [state.record(first, secs, False)] + [state.record(o, 0.0, True) for o in others]
            for entry in entries:
                if entry["kind"] == POLISH:
                    self.polisher.observe(entry)
            state.save()
            for entry in entries:
                self.report(state.history[entry["i"]], entry["i"] + 1)  # with the polish guard's verdict

    def fill(self) -> None:
        """Proposes and dispatches until q are out, the budget is proposed, or a polish move must wait."""
        state, config = self.state, self.config
        while len(self.in_flight) < self.q and state.proposed() < config.budget:
            if self.should_stop and self.should_stop():
                state.save()
                raise SearchInterrupted(f"Search stopped after {len(state.history)} of {config.budget} iterations; "
                                        "run it again with the same settings to resume.")
            p = self.propose(state.proposed())
            if p is None:  # polish: every move of the incumbent is out (or nothing is left to climb from)
                return
            if p["mask"] in state.masks:  # measured before: recorded at once, nothing dispatched
                entry = state.record(p, 0.0, True)
                state.save()
                self.report(entry, entry["i"] + 1)
                continue
            already_out = state.is_pending(p["mask"])  # it will share that result
            state.dispatch(p)
            state.save()
            if not already_out:
                self.dispatch(p)

    def run(self) -> SearchResult:
        state, config = self.state, self.config
        t_start = time.perf_counter()
        seeds = len(self.provenance.get("seeds", []))
        resumed = state.history or state.pending
        log.info("GCache Search: N = %d, K = %d, budget %d (%d start masks, %d start grid, %d GP, %d polish), %s, "
                 "objective %s%s; %s.", self.profile.n_steps, config.k, config.budget, len(self.starts),
                 len(self.grid_points), max(self.n_gp, 0), self.n_polish,
                 _count(seeds, "seed") if seeds else "? seeds", config.objective,
                 f", {self.q} in flight" if self.q > 1 else "",
                 f"resumed at evaluation {len(state.history)}" + (
                     f" ({_count(len(state.pending), 'evaluation')} dispatched again)" if state.pending else "")
                 if resumed else "starting")
        if seeds == 1:
            log.info("GCache Search: %s.", paired.one_seed_fallbacks(forecasters.get(config.forecast).needs_profile))
        for j, p in enumerate(state.pending):  # a resumed search: what was out when it stopped, each mask once
            if not any(o["mask"] == p["mask"] for o in state.pending[:j]):
                self.dispatch(p)
        while not state.done:
            self.fill()
            if self.in_flight:
                self.collect()
            else:
                self.finish()
        result = results.build(self.state, self.profile, self.config, self.end_game())
        log.info("GCache Search: done in %.1f s: mask %s, won by %s (%s), loss %.5g.", time.perf_counter() - t_start,
                 result.policy.describe(), result.policy.provenance["won"], result.policy.provenance["chosen"],
                 result.policy.metrics["loss"])
        if result.unchecked:
            log.info("GCache Search: no per-seed losses for two or more seeds, so the searched mask was kept without "
                     "checking its gain against the seed noise (use 2+ seeds: the polish guard then checks each move).")
        return result


def run_search(profile: Profile, config: SearchConfig, evaluate: Callable[..., Any],
               state_path: Optional[str] = None, progress: Optional[Callable[[dict], None]] = None,
               should_stop: Optional[Callable[[], bool]] = None, provenance: Optional[dict] = None,
               extra_masks: Sequence[tuple[str, Sequence[int]]] = (), skip_check: Optional[str] = None
               ) -> SearchResult:
    """The sequential search: `evaluate(mask) -> loss` (or per-seed losses) samples under the mask, one at a time;
    an evaluate that declares can_apply_forecaster (executor.py) also takes `evaluate(mask, forecast=name)` (the
    forecaster check). See SearchLoop for the rest."""
    return SearchLoop(profile, config, InProcessExecutor(evaluate), 1, state_path, provenance, extra_masks, progress,
                      should_stop, skip_check).run()


def run_batch_search(profile: Profile, config: SearchConfig, executor: Executor, q: int = 1,
                     state_path: Optional[str] = None, provenance: Optional[dict] = None,
                     extra_masks: Sequence[tuple[str, Sequence[int]]] = (),
                     progress: Optional[Callable[[dict], None]] = None,
                     should_stop: Optional[Callable[[], bool]] = None, skip_check: Optional[str] = None
                     ) -> SearchResult:
    """The search with up to q evaluations in flight on `executor`. See SearchLoop."""
    return SearchLoop(profile, config, executor, q, state_path, provenance, extra_masks, progress, should_stop,
                      skip_check).run()
