"""The bilevel search with several evaluations in flight (batch GP-LCB, GP-BUCB style), same state file.

The proposals are bilevel.py's: the instant masks, the start grid, then GP-LCB; but up to `q` masks are out at
once. A GP proposal made while others are pending sees them as observed at the GP's posterior mean (GP-BUCB:
the mean does not move, the uncertainty around them shrinks), so the batch spreads out instead of proposing
one point q times. Each distinct mask is evaluated once (also across pending ones).

Evaluations run on an `Executor` (`submit(mask) -> handle`, `wait(handles) -> finished handles`,
`result(handle) -> loss or per-seed losses`): a thread pool for tests, Ray actors in cluster.py. The state file
is bilevel.py's (history, masks, GP hyperparameters, final) plus `pending`: what was dispatched and not back.
It is written atomically after every result, so a killed coordinator resumes, dispatching its pending masks
again (at most q evaluations are lost); a finished entry is never redone. Results come back out of order: a
history entry gets its index when it completes, and the κ schedule follows that index.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from ..core.errors import GCacheError
from ..core.files import atomic_write_text
from ..core.profile import Profile
from ..core.weights import bernstein_w
from .bilevel import (SearchConfig, SearchResult, _method_of, _observations, _result, mask_key, open_state,
                      search_plan)
from .dp import dp_mask
from .dp_forecast import dp_mask_forecast
from .gp import GPLCB, kappa_schedule

log = logging.getLogger("gcache")


class Executor(Protocol):
    def submit(self, mask: list) -> Any: ...
    def wait(self, handles: list) -> list: ...      # blocks until at least one is finished; returns those
    def result(self, handle: Any) -> Any: ...       # a loss, or the per-seed losses


class ThreadExecutor:
    """Evaluations on threads of this process (tests, or an evaluate that releases the GIL)."""

    def __init__(self, evaluate: Callable[[list], Any], workers: int = 2):
        from concurrent.futures import ThreadPoolExecutor
        self.evaluate, self.pool = evaluate, ThreadPoolExecutor(workers)

    def submit(self, mask):
        return self.pool.submit(self.evaluate, list(mask))

    def wait(self, handles):
        from concurrent.futures import FIRST_COMPLETED, wait
        return list(wait(handles, return_when=FIRST_COMPLETED).done)

    def result(self, handle):
        return handle.result()

    def close(self):
        self.pool.shutdown(wait=True)


def _loss(raw) -> tuple[float, Optional[list]]:
    if isinstance(raw, (list, tuple, np.ndarray)):
        per_seed = [float(v) for v in raw]
        return (float(np.mean(per_seed)) if per_seed else float("nan")), per_seed
    return float(raw), None


def run_search_parallel(profile: Profile, config: SearchConfig, executor: Executor, q: int = 2,
                        state_path: Optional[str] = None, provenance: Optional[dict] = None,
                        extra_masks: Sequence[tuple[str, Sequence[int]]] = (),
                        progress: Optional[Callable[[dict], None]] = None) -> SearchResult:
    """Like bilevel.run_search with up to q evaluations in flight on `executor`."""
    if not isinstance(profile, Profile):
        raise GCacheError("run_search_parallel needs a GCache Profile (profile the model first).")
    if not isinstance(q, int) or q < 1:
        raise GCacheError(f"q (evaluations in flight) must be a whole number ≥ 1, got {q!r}.")
    n = profile.n_steps
    config.validate(n)
    E, times = profile.E, np.asarray(profile.times, dtype=np.float64)
    E1 = profile.E1 if config.forecast else None
    provenance = json.loads(json.dumps(dict(provenance or {}), default=str))
    state = open_state(state_path, config, profile, provenance)
    pending: list[dict] = list(state.get("pending") or [])  # dispatched before a crash: dispatched again

    def save():
        state["pending"] = pending
        if state_path:
            atomic_write_text(state_path, json.dumps(state, indent=1, allow_nan=False))

    dim = config.degree + 1
    starts, grid, gp = search_plan(profile, config, extra_masks)
    n_gp = config.budget - len(starts) - len(grid)

    def mask_for(s) -> tuple[list, float]:
        w = bernstein_w(times, s)
        return dp_mask_forecast(E, E1, w, config.k) if E1 is not None else dp_mask(E, w, config.k)

    def proposed() -> int:  # proposals made so far: finished + pending
        return len(state["history"]) + len(pending)

    def next_proposal() -> dict:
        j = proposed()
        if j < len(starts):
            name, mask = starts[j]
            return {"kind": "instant", "s": None, "mask": mask_key(mask), "method": name, "bound": None}
        if j < len(starts) + len(grid):
            s = grid[j - len(starts)]
            mask, bound = mask_for(s)
            return {"kind": "grid", "s": [float(v) for v in s], "mask": mask_key(mask), "bound": bound}
        t0 = time.perf_counter()
        S, y = _observations(state, config)
        theta = gp.fit(S, y, state["gp"]["theta"])
        state["gp"]["theta"] = theta
        fant = [p for p in pending if p["s"] is not None]
        if fant:  # GP-BUCB: pending points enter at the posterior mean, with the fitted hyperparameters
            Sp = np.array([p["s"] for p in fant])
            mu = gp.gp.predict(gp.to_unit(Sp))
            frozen = GPLCB(dim, config.s_min, config.s_max, config.seed, config.n_candidates, config.n_polish,
                           config.warm_maxiter, cold_every=0, hyper_every=10**9, hyper_always_below=0)
            frozen.fit(np.vstack([S, Sp]), np.concatenate([y, mu]), theta)
            gp.gp = frozen.gp
        kappa = kappa_schedule(j - len(starts) - len(grid), n_gp)
        s = gp.minimize_acq(kappa, j)
        mask, bound = mask_for(s)
        return {"kind": "gp", "s": [float(v) for v in s], "mask": mask_key(mask), "bound": bound, "kappa": kappa,
                "gp_seconds": round(time.perf_counter() - t0, 4)}

    def record(p: dict, loss: float, per_seed, secs: float, reused: bool) -> dict:
        if not reused:
            state["masks"][p["mask"]] = {"loss": loss, "seconds": round(secs, 4), "first": len(state["history"])}
            if per_seed is not None:
                state["masks"][p["mask"]]["per_seed"] = per_seed
        entry = {"i": len(state["history"]), "kind": p["kind"], "s": p["s"], "mask": p["mask"], "loss": loss,
                 "reused": reused, "seconds": round(secs, 4), "bound": p.get("bound"), "kappa": p.get("kappa"),
                 "gp_seconds": p.get("gp_seconds")}
        if p.get("method"):
            entry["method"] = p["method"]
        state["history"].append(entry)
        return entry

    in_flight: dict = {}  # handle -> (proposal, start time)

    def dispatch(p: dict):
        in_flight[executor.submit([int(c) for c in p["mask"]])] = (p, time.perf_counter())

    def collect():
        for h in executor.wait(list(in_flight)):
            p, t0 = in_flight.pop(h)
            loss, per_seed = _loss(executor.result(h))
            if not np.isfinite(loss):
                raise GCacheError(f"The evaluation of mask {p['mask']} returned a non-finite loss; the state file keeps "
                                  f"the {len(state['history'])} evaluations before it.")
            entry = record(p, loss, per_seed, time.perf_counter() - t0, False)
            waiting = [o for o in pending if o is not p and o["mask"] == p["mask"]]
            pending[:] = [o for o in pending if o is not p and o["mask"] != p["mask"]]
            for other in waiting:  # proposals of the same mask made while it was out: they share its loss
                record(other, loss, per_seed, 0.0, True)
            save()
            if progress:
                progress({"iteration": len(state["history"]), "budget": config.budget, **entry})

    t_start = time.perf_counter()
    log.info("GCache Search (parallel): N = %d, K = %d, budget %d, %d in flight, %s seeds, objective %s; %s.", n,
             config.k, config.budget, q, len(provenance.get("seeds", [])) or "?", config.objective,
             f"resumed at evaluation {len(state['history'])} ({len(pending)} dispatched again)" if state["history"]
             or pending else "starting")
    for j, p in enumerate(pending):  # a resumed search: what was out when it stopped, each mask once
        if not any(o["mask"] == p["mask"] for o in pending[:j]):
            dispatch(p)
    while not state["done"]:
        while len(in_flight) < q and proposed() < config.budget:
            p = next_proposal()
            if p["mask"] in state["masks"]:  # measured before: recorded at once, nothing dispatched
                m = state["masks"][p["mask"]]
                record(p, m["loss"], m.get("per_seed"), 0.0, True)
                save()
                continue
            already_out = any(o["mask"] == p["mask"] for o in pending)  # it will share that result
            pending.append(p)
            if not already_out:
                dispatch(p)
            save()
        if in_flight:
            collect()
            continue
        # budget reached and nothing out: the final argmin μ mask, as in bilevel.py
        S, y = _observations(state, config)
        gp.fit(S, y, state["gp"]["theta"])
        s_mu = gp.minimize_acq(0.0, config.budget, extra_starts=S[[int(np.argmin(y))]])
        mask, bound = mask_for(s_mu)
        key = mask_key(mask)
        if key in state["masks"]:
            loss, secs, reused = state["masks"][key]["loss"], 0.0, True
        else:
            h = executor.submit(mask)
            t0 = time.perf_counter()
            executor.wait([h])
            loss, per_seed = _loss(executor.result(h))
            secs, reused = time.perf_counter() - t0, False
            state["masks"][key] = {"loss": loss, "seconds": round(secs, 4), "first": config.budget}
            if per_seed is not None:
                state["masks"][key]["per_seed"] = per_seed
        state["final"] = {"s": [float(v) for v in s_mu], "mask": key, "loss": loss, "reused": reused,
                          "seconds": round(secs, 4), "bound": bound, "gp_seconds": None}
        state["done"] = True
        save()
    result = _result(state, profile, config)
    best = min(state["history"], key=lambda h: (h["loss"], h["i"]))
    log.info("GCache Search (parallel): done in %.1f s: mask %s, won by %s, loss %.5g (best measured: %s).",
             time.perf_counter() - t_start, result.policy.describe(), result.policy.provenance["won"],
             result.policy.metrics["loss"], _method_of(best))
    return result
