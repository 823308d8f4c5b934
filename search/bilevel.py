"""The bilevel search (paper §3.3, Algorithm 2): GP-LCB over s outside, the exact DP for the mask inside.

    s ──DP(E, w(t; s), K)──► mask ──evaluate(mask)──► loss        (evaluate: sampling + decode vs. full run)

- The first evaluations are the instant masks (theory DP, local DP) and the TeaCache-like mask for the same K,
  then the 2^{d+1} start grid, then GP-LCB. The result keeps the best measured mask, so the search never returns
  something it measured worse than an instant policy (and, with per-seed losses, replaces the best instant mask
  only when the gain exceeds NOISE_Z paired standard errors: the winner of many noisy comparisons overfits); the Policy says which method won and, when `evaluate`
  returns per-seed losses, the paired difference to the theory-DP instant policy (mean ± s.e. over seeds).
- Every distinct mask is evaluated once; another s that gives a known mask reuses its loss (recorded as
  `reused` in the history; the GP still sees the new (s, loss) point).
- After every evaluation the whole state is written atomically to `state_path` (JSON). A search started
  again with the same config, profile and provenance resumes from it, losing at most the evaluation that
  was running; with the same seed it ends with the same policy as an uninterrupted run.
- `budget` counts evaluations in the history (instant masks and start grid included). At the end the GP is refit on all of
  them, s_μ = argmin μ(s) gives one more mask (evaluated if new); the result keeps the better measured of
  that mask and the best evaluated one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ..core.errors import GCacheError
from ..core.files import atomic_write_text
from ..core.policy import Policy, check_budget
from ..core.profile import Profile
from ..core.weights import bernstein_w
from .dp import dp_mask
from .dp_forecast import dp_mask_forecast
from .gp import GPLCB, kappa_schedule, start_grid

log = logging.getLogger("gcache")
STATE_FORMAT = "gcache.search_state"
STATE_VERSION = 2  # 2: instant masks first (history entries without s); version-1 states are refused
SEARCH_MAX_DEGREE = 4  # GP dimension d + 1 ≤ 5 and a 2^(d+1) start grid (core.weights allows 8)


N_INSTANT = 3  # theory DP, local DP, TeaCache-like: evaluated first
NOISE_Z = 2.0  # a searched mask must beat the best instant one by this many paired standard errors over seeds


def instant_masks(profile: Profile, k: int, forecast: int = 0) -> list[tuple[str, list]]:
    """The masks the search measures first (method name, mask): the instant DP masks for the order the search
    applies, and (for forecasting) the reuse-optimal theory mask too, then the TeaCache-like one."""
    from .baselines import teacache_mask
    from .instant import instant_policy
    if forecast:
        return [("theory_dp_forecast", instant_policy(profile, k, "theory", forecast=1).mask),
                ("local_dp_forecast", instant_policy(profile, k, "local", forecast=1).mask),
                ("theory_dp", instant_policy(profile, k, "theory").mask),
                ("teacache", teacache_mask(profile.rel_h, k)[0])]
    return [("theory_dp", instant_policy(profile, k, "theory").mask),
            ("local_dp", instant_policy(profile, k, "local").mask),
            ("teacache", teacache_mask(profile.rel_h, k)[0])]


def start_masks(profile: Profile, config: SearchConfig,
                extra_masks: Sequence[tuple[str, Sequence[int]]] = ()) -> list[tuple[str, list]]:
    """The instant masks, then the caller's extra masks, each checked to be a K-mask over the profile's steps."""
    n = profile.n_steps
    masks = instant_masks(profile, config.k, config.forecast) + [(str(nm), [int(v) for v in m]) for nm, m in extra_masks]
    for nm, m in masks:
        if len(m) != n or sum(m) != config.k or m[0] != 1:
            raise GCacheError(f"The start mask {nm!r} is not a K = {config.k} mask over {n} steps with step 0 computed.")
    return masks


class SearchInterrupted(Exception):
    """should_stop() said stop; the state file holds every evaluation so far (resume by running again)."""


@dataclass
class SearchConfig:
    k: int
    degree: int = 3
    budget: int = 64
    seed: int = 0
    objective: str = "lpips_ssim"
    s_min: float = 0.0
    s_max: float = 10.0
    n_candidates: int = 2048
    n_polish: int = 3
    warm_maxiter: int = 30
    cold_every: int = 50
    log_loss: bool = True   # the GP models log(loss) when losses are ≥ 0 (they span decades; see gp_targets)
    forecast: int = 0       # the order masks are applied with (evaluate must apply it); 1 and 2 use the order-1 DP

    def validate(self, n_steps: int) -> None:
        check_budget(self.k, n_steps)
        if not isinstance(self.degree, int) or not 1 <= self.degree <= SEARCH_MAX_DEGREE:
            raise GCacheError(f"degree must be a whole number in 1..{SEARCH_MAX_DEGREE} (the paper uses 3), got {self.degree!r}.")
        if self.forecast not in (0, 1, 2):
            raise GCacheError(f"forecast must be 0 (reuse), 1 or 2, got {self.forecast!r}.")
        grid = 2 ** (self.degree + 1)
        n_instant = N_INSTANT + (1 if self.forecast else 0)
        least = n_instant + grid + 1
        if not isinstance(self.budget, int) or self.budget < least:
            raise GCacheError(f"budget = {self.budget!r} evaluations covers at most the {n_instant} instant masks and the "
                              f"{grid}-point start grid of degree {self.degree}, so the GP would never propose a mask: "
                              f"the minimum useful budget is {least} (the paper uses 500). For no search at all, use "
                              "GCache Policy's instant policy.")
        if not (math.isfinite(self.s_min) and math.isfinite(self.s_max) and self.s_min < self.s_max):
            raise GCacheError(f"The search box needs finite s_min < s_max, got [{self.s_min}, {self.s_max}].")
        if not isinstance(self.objective, str) or not self.objective:
            raise GCacheError("The objective needs a name (e.g. 'lpips_ssim', 'ssim', 'psnr').")

    def identity(self) -> dict:
        """What makes two searches the same search: everything but the budget (a larger budget continues it)."""
        d = asdict(self)
        d.pop("budget")
        return d


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


def profile_identity(profile: Profile) -> dict:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(profile.E, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(profile.times, dtype=np.float64).tobytes())
    return {"n_steps": int(profile.n_steps), "sha256": h.hexdigest()[:16], "count": int(profile.count)}


def _state_key(config: SearchConfig, prof_id: dict, provenance: dict) -> str:
    blob = json.dumps({"config": config.identity(), "profile": prof_id, "provenance": provenance},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- state file
def load_state(path: str) -> dict:
    """Read and check a state file; never modifies it."""
    name = os.path.basename(path)
    try:
        with open(path, "r", encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise GCacheError(f"The search state {path} is unreadable or damaged ({e}). It was left as it is: delete it "
                          "to start the search over, or choose another state file name.") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise GCacheError(f"{name} is not a GCache search state (no 'format': '{STATE_FORMAT}'). It was left "
                          "untouched: choose another state file name.")
    if state.get("version") != STATE_VERSION:
        raise GCacheError(f"{name} has search-state version {state.get('version')!r}; this GCache reads "
                          f"{STATE_VERSION}. Delete it to search again, or use the GCache version that wrote it.")
    try:
        dim = int(state["config"]["degree"]) + 1
        n = int(state["profile"]["n_steps"])

        def number(v) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        def mask_ok(m) -> bool:
            return isinstance(m, str) and len(m) == n and not set(m) - {"0", "1"} and m[0] == "1"

        if not isinstance(state["history"], list) or not isinstance(state["masks"], dict):
            raise ValueError("bad history or masks")
        for j, h in enumerate(state["history"]):
            s_ok = (h.get("kind") == "instant" and h["s"] is None and isinstance(h.get("method"), str)) or (
                isinstance(h["s"], list) and len(h["s"]) == dim and all(number(v) for v in h["s"]))
            if not (isinstance(h, dict) and h.get("i") == j and s_ok and mask_ok(h["mask"]) and number(h["loss"])):
                raise ValueError(f"bad history entry {j}")
        for key, m in state["masks"].items():
            if not (mask_ok(key) and isinstance(m, dict) and number(m["loss"])):
                raise ValueError("bad mask entry")
        theta = state["gp"]["theta"]
        if theta is not None and not (isinstance(theta, list) and len(theta) == dim + 2 and all(number(v) for v in theta)):
            raise ValueError("bad GP hyperparameters")
        if not isinstance(state["done"], bool) or (state["done"] and not (
                isinstance(state["final"], dict) and mask_ok(state["final"].get("mask"))
                and number(state["final"].get("loss")))):
            raise ValueError("bad final entry")
        if not isinstance(state["fingerprint"], str):
            raise ValueError("bad fingerprint")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise GCacheError(f"{name} is damaged ({e!r}). It was left untouched: delete it to start the search over.") from None
    return state


def _differences(state: dict, config: SearchConfig, prof_id: dict, provenance: dict) -> str:
    """What differs between a state file's search and this one, in words."""
    old_cfg, new_cfg = dict(state.get("config") or {}), config.identity()
    diffs = [f"{k}: file {old_cfg.get(k)!r}, now {v!r}" for k, v in new_cfg.items() if old_cfg.get(k) != v]
    old_prof = state.get("profile") or {}
    if old_prof.get("n_steps") != prof_id["n_steps"]:
        diffs.append(f"profile steps N: file {old_prof.get('n_steps')}, now {prof_id['n_steps']}")
    elif old_prof.get("sha256") != prof_id["sha256"]:
        diffs.append(f"profile: file {old_prof.get('sha256')}, now {prof_id['sha256']} (another profile of the same N)")
    old_prov = state.get("provenance") or {}
    if old_prov != provenance:
        keys = sorted(k for k in set(old_prov) | set(provenance) if old_prov.get(k) != provenance.get(k))
        diffs.append("provenance differs in " + ", ".join(keys)
                     + (" (another ComfyUI workflow)" if "workflow_sha256" in keys else ""))
    return "; ".join(diffs) or "its fingerprint differs"


def _new_state(config: SearchConfig, fp: str, prof_id: dict, provenance: dict) -> dict:
    return {"format": STATE_FORMAT, "version": STATE_VERSION, "fingerprint": fp, "config": asdict(config),
            "profile": prof_id, "provenance": provenance, "history": [], "masks": {}, "gp": {"theta": None},
            "final": None, "done": False}


def open_state(state_path: Optional[str], config: SearchConfig, profile: Profile, provenance: dict) -> dict:
    """The search's state: the one in `state_path` when it belongs to this search (a larger budget continues it),
    else a new one. A state file of another search is refused and left untouched."""
    prof_id = profile_identity(profile)
    fp = _state_key(config, prof_id, provenance)
    if not (state_path and os.path.exists(state_path)):
        return _new_state(config, fp, prof_id, provenance)
    state = load_state(state_path)
    if state["fingerprint"] != fp:
        raise GCacheError(
            f"{os.path.basename(state_path)} belongs to another search ({_differences(state, config, prof_id, provenance)}). "
            "It was left untouched: use another state file name, or delete it to start over.")
    state["config"]["budget"] = config.budget
    if len(state["history"]) < config.budget:
        state["done"], state["final"] = False, None  # a larger budget continues the search
    return state


def search_plan(profile: Profile, config: SearchConfig, extra_masks: Sequence[tuple[str, Sequence[int]]] = ()
                ) -> tuple[list, np.ndarray, GPLCB]:
    """What a search evaluates before the GP proposes (start masks, start grid) and its GP; the budget must leave
    at least one GP proposal."""
    grid = start_grid(config.degree + 1, config.s_min, config.s_max)
    gp = GPLCB(config.degree + 1, config.s_min, config.s_max, config.seed, config.n_candidates, config.n_polish,
               config.warm_maxiter, config.cold_every)
    starts = start_masks(profile, config, extra_masks)
    if config.budget < len(starts) + len(grid) + 1:
        raise GCacheError(f"budget = {config.budget} covers only the {len(starts)} start masks and the {len(grid)}-point "
                          f"start grid: the minimum useful budget is {len(starts) + len(grid) + 1}.")
    return starts, grid, gp


# ---------------------------------------------------------------------------------------------- search
def run_search(profile: Profile, config: SearchConfig, evaluate: Callable[[list], float],
               state_path: Optional[str] = None, progress: Optional[Callable[[dict], None]] = None,
               should_stop: Optional[Callable[[], bool]] = None, provenance: Optional[dict] = None,
               extra_masks: Sequence[tuple[str, Sequence[int]]] = ()) -> SearchResult:
    """Search s; `evaluate(mask) -> loss` (or per-seed losses) samples under the mask. `extra_masks` (name, mask)
    are measured first too, after the instant ones (e.g. the reuse search's result for a forecast search).
    See the module docstring."""
    if not isinstance(profile, Profile):
        raise GCacheError("run_search needs a GCache Profile (profile the model first).")
    n = profile.n_steps
    config.validate(n)
    E, times = profile.E, np.asarray(profile.times, dtype=np.float64)
    if E.shape != (n, n) or times.shape != (n,):
        raise GCacheError(f"The profile is inconsistent: E is {E.shape} and has {times.size} times for {n} steps.")
    provenance = json.loads(json.dumps(dict(provenance or {}), default=str))
    state = open_state(state_path, config, profile, provenance)

    def save():
        if state_path:
            atomic_write_text(state_path, json.dumps(state, indent=1, allow_nan=False))

    instant, grid, gp = search_plan(profile, config, extra_masks)
    n_gp_iters = config.budget - len(instant) - len(grid)
    t_start = time.perf_counter()
    log.info("GCache Search: N = %d, K = %d, budget %d (%d instant masks, %d start grid, %d GP), %s seeds, "
             "objective %s; %s.", n, config.k, config.budget, len(instant), len(grid), max(n_gp_iters, 0),
             len(provenance.get("seeds", [])) or "?", config.objective,
             f"resumed at evaluation {len(state['history'])}" if state["history"] else "starting")
    every = max(1, config.budget // 10)

    E1 = profile.E1 if config.forecast else None  # a profile without forecast errors stops here, with the fix

    def mask_for(s) -> tuple[list, float]:
        if E1 is not None:
            return dp_mask_forecast(E, E1, bernstein_w(times, s), config.k)
        return dp_mask(E, bernstein_w(times, s), config.k)

    def measure(mask: list, i: int) -> tuple[float, float, bool]:
        key = mask_key(mask)
        if key in state["masks"]:
            return state["masks"][key]["loss"], 0.0, True
        t0 = time.perf_counter()
        raw = evaluate(list(mask))
        secs = time.perf_counter() - t0
        per_seed = None
        try:
            if isinstance(raw, (list, tuple, np.ndarray)):  # one loss per seed: kept for paired comparisons
                per_seed = [float(v) for v in raw]
                loss = float(np.mean(per_seed)) if per_seed and all(map(math.isfinite, per_seed)) else float("nan")
            else:
                loss = float(raw)
        except (TypeError, ValueError):
            loss = float("nan")
        if not math.isfinite(loss):
            raise GCacheError(f"The evaluation of mask {key} returned {loss!r}, not a finite loss (the run diverged or "
                              f"the objective failed). The state file keeps the {len(state['history'])} evaluations "
                              "before it; fix the evaluation and run the search again to resume.")
        state["masks"][key] = {"loss": loss, "seconds": round(secs, 4), "first": i}
        if per_seed is not None:
            state["masks"][key]["per_seed"] = per_seed
        return loss, secs, False

    def report(entry: dict):
        if progress:
            progress({"iteration": len(state["history"]), "budget": config.budget, "evaluations": len(state["masks"]),
                      "best_loss": min(h["loss"] for h in state["history"]), **entry})

    while len(state["history"]) < config.budget and not state["done"]:
        if should_stop and should_stop():
            save()
            raise SearchInterrupted(f"Search stopped after {len(state['history'])} of {config.budget} iterations; "
                                    "run it again with the same settings to resume.")
        i = len(state["history"])
        gp_secs, kappa, theta, method = None, None, state["gp"]["theta"], None
        if i < len(instant):
            (method, mask), s, kind, bound = instant[i], None, "instant", None
        else:
            if i < len(instant) + len(grid):
                s, kind = grid[i - len(instant)], "grid"
            else:
                t0 = time.perf_counter()
                S, y = _observations(state, config)
                theta = gp.fit(S, y, theta)
                kappa = kappa_schedule(i - len(instant) - len(grid), n_gp_iters)
                s, kind = gp.minimize_acq(kappa, i), "gp"
                gp_secs = time.perf_counter() - t0
            mask, bound = mask_for(s)
        loss, secs, reused = measure(mask, i)
        entry = {"i": i, "kind": kind, "s": None if s is None else [float(v) for v in s], "mask": mask_key(mask),
                 "loss": loss, "reused": reused, "seconds": round(secs, 4), "bound": bound, "kappa": kappa,
                 "gp_seconds": None if gp_secs is None else round(gp_secs, 4)}
        if method is not None:
            entry["method"] = method
        state["history"].append(entry)
        state["gp"]["theta"] = theta
        save()
        report(entry)
        if (i + 1) % every == 0 or i + 1 == config.budget:
            best = min(state["history"], key=lambda h: (h["loss"], h["i"]))
            log.info("GCache Search: evaluation %d/%d, best loss so far %.5g (%s).", i + 1, config.budget,
                     best["loss"], _method_of(best))

    if not state["done"]:
        S, y = _observations(state, config)
        t0 = time.perf_counter()
        gp.fit(S, y, state["gp"]["theta"])
        best_i = int(np.argmin(y))
        s_mu = gp.minimize_acq(0.0, config.budget, extra_starts=S[[best_i]])
        gp_secs = time.perf_counter() - t0
        mask, bound = mask_for(s_mu)
        loss, secs, reused = measure(mask, config.budget)
        state["final"] = {"s": [float(v) for v in s_mu], "mask": mask_key(mask), "loss": loss, "reused": reused,
                          "seconds": round(secs, 4), "bound": bound, "gp_seconds": round(gp_secs, 4)}
        state["done"] = True
        save()
        report({"kind": "final", **state["final"]})
    result = _result(state, profile, config)
    log.info("GCache Search: done in %.1f s: mask %s, won by %s (%s), loss %.5g.", time.perf_counter() - t_start,
             result.policy.describe(), result.policy.provenance["won"], result.policy.provenance["chosen"],
             result.policy.metrics["loss"])
    if (result.policy.metrics.get("loss_minus_instant") or {}).get("se") is None:
        log.info("GCache Search: no per-seed losses for two or more seeds, so a searched mask was kept without "
                 "checking its gain against the seed noise (use 2+ seeds for that check).")
    return result


def _observations(state: dict, config: SearchConfig) -> tuple[np.ndarray, np.ndarray]:
    """What the GP sees: the (s, loss) pairs (instant masks have no s)."""
    hist = [h for h in state["history"] if h["s"] is not None]
    return np.array([h["s"] for h in hist]), gp_targets([h["loss"] for h in hist], config.log_loss)


def _method_of(entry: dict) -> str:
    return entry.get("method") or {"grid": "gcache start grid", "gp": "gcache GP-LCB"}.get(entry["kind"], entry["kind"])


def paired_difference(a: Optional[list], b: Optional[list]) -> Optional[dict]:
    """mean ± s.e. over seeds of a − b (per-seed losses of two masks), or None without per-seed losses."""
    if not a or not b or len(a) != len(b):
        return None
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else float("nan")
    return {"mean": float(d.mean()), "se": se if math.isfinite(se) else None, "seeds": int(d.size)}


def _result(state: dict, profile: Profile, config: SearchConfig) -> SearchResult:
    hist, fin = state["history"], state["final"]
    best = min(hist, key=lambda h: (h["loss"], h["i"]))  # ties: the earliest, so an instant mask is kept
    chosen, how = (fin, "argmin_mu") if fin["loss"] < best["loss"] else (best, "best_evaluated")
    won = "gcache argmin mu" if chosen is fin else _method_of(best)
    masks = state["masks"]
    # A searched mask replaces the best instant one only when its gain is beyond the seeds' noise: it was
    # selected as the minimum of many noisy means, so a gain within NOISE_Z standard errors is likely luck.
    instant = min((h for h in hist if h["kind"] == "instant"), key=lambda h: (h["loss"], h["i"]), default=None)
    if instant is not None and chosen.get("kind") != "instant":
        gain = paired_difference(masks[chosen["mask"]].get("per_seed"), masks[instant["mask"]].get("per_seed"))
        if gain is not None and gain["se"] is not None and gain["mean"] + NOISE_Z * gain["se"] >= 0:
            chosen, how, won = instant, "instant_within_noise", instant["method"]
    own = "theory_dp_forecast" if config.forecast else "theory_dp"  # the instant policy of the same order
    theory = next((h for h in hist if h.get("method") == own), None)
    vs = paired_difference(masks[chosen["mask"]].get("per_seed"), masks[theory["mask"]].get("per_seed")) \
        if theory is not None else None
    to_mask = lambda key: [int(c) for c in key]  # noqa: E731
    prov = dict(state.get("provenance") or {})
    prov.update({"s": chosen["s"], "degree": config.degree, "objective": config.objective, "chosen": how, "won": won,
                 "iterations": len(hist), "evaluations": len(state["masks"]), "search_seed": config.seed,
                 "s_range": [config.s_min, config.s_max], "profile": state["profile"], "state": state["fingerprint"]})
    metrics = {"loss": chosen["loss"], "objective": config.objective, "mu_loss": fin["loss"], "best_loss": best["loss"]}
    if theory is not None:
        metrics["instant_loss"] = theory["loss"]
    if vs is not None:
        metrics["loss_minus_instant"] = vs  # paired over seeds: < 0 means the search beat the instant policy
    prov["forecast"] = {"order": config.forecast, "chosen_by": "search config"}
    policy = Policy(mask=to_mask(chosen["mask"]), times=[float(t) for t in profile.times],
                    sigmas=[float(v) for v in profile.sigmas], method="gcache", provenance=prov, metrics=metrics,
                    forecast=config.forecast)
    return SearchResult(policy=policy, best_mask=to_mask(best["mask"]), best_loss=best["loss"],
                        mu_mask=to_mask(fin["mask"]), mu_loss=fin["loss"], s_best=chosen["s"], s_mu=fin["s"],
                        history=hist, state=state, evaluations=len(state["masks"]))
