"""SearchConfig: what one search is (K, the GP's settings, the forecaster masks are judged with, the polish share).

Its identity (`identity`, state.search_id) is everything but the budget and the polish guard: a state file of another
identity is refused, a larger budget continues the search it belongs to, and a resumed search keeps the guard it
started polishing with.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.policy import check_budget
from . import budget as budgets
from . import gp, paired

SEARCH_MAX_DEGREE = 4  # GP dimension d + 1 ≤ 5 and a 2^(d+1) start grid (core.weights allows 8)
# Of the evaluations after the start masks and the start grid, the share the polish stage gets (the GP-LCB phase
# gets the rest). Measured on the reference model (bench/polish_split.py, bench/RESULTS.md 2026-11-27).
POLISH_SHARE = 0.5
POLISH_ORDERS = ("bound", "seeded")
NOT_IDENTITY = ("budget", "polish_guard")  # a larger budget continues a search; a resumed one keeps its guard


def check_k(k, n_steps: int) -> None:
    """K computed steps of N for a search: 1 ≤ K < N (K = N computes every step: there is nothing to choose)."""
    check_budget(k, n_steps)
    if k == n_steps:
        raise GCacheError(f"K = {k} computes every one of the {n_steps} steps: a search has nothing to choose (no "
                          f"step is skipped). Choose K below {n_steps} (the speed-up is about steps / K).")


def identity_of(config: dict) -> dict:
    """The identity of a config as a state file keeps it (a dict): NOT_IDENTITY left out."""
    return {k: v for k, v in config.items() if k not in NOT_IDENTITY}


@dataclass
class SearchConfig:
    k: int
    degree: int = 3
    budget: int = 64
    seed: int = 0
    objective: str = "lpips_ssim"
    s_min: float = 0.0
    s_max: float = 10.0
    n_candidates: int = gp.N_CANDIDATES
    acq_polish: int = gp.N_POLISH      # L-BFGS-B runs from the best LCB candidates (gp.GPLCB's n_polish)
    warm_maxiter: int = gp.WARM_MAXITER
    cold_every: int = gp.COLD_EVERY
    log_loss: bool = True   # the GP models log(loss) when losses are ≥ 0 (they span decades; see loop.gp_targets)
    forecast: str = "reuse"  # the forecaster masks are applied with (evaluate must apply it); its DP picks them
    polish_share: float = POLISH_SHARE  # of the evaluations after the starts and the grid: local moves (polish.py)
    polish_order: str = "bound"  # which moves of a ring first: the lowest DP bound ("bound") or a seeded order
    polish_guard: str = paired.GUARD  # which polish moves are kept (paired.GUARDS); not part of the identity

    def __post_init__(self):
        self.forecast = forecasters.canonical(self.forecast)  # old callers pass an order 0/1/2

    def validate(self, n_steps: int, n_starts: Optional[int] = None) -> None:
        """Raises on a config that can't search N = n_steps with `n_starts` start masks (None: the fewest a search
        of this forecaster has, so that a budget refused later can only be one the start masks of the profile fill)."""
        check_k(self.k, n_steps)
        self.validate_settings(n_starts)

    def validate_settings(self, n_starts: Optional[int] = None) -> None:
        """What `validate` checks besides K against N (degree, budget, search box, objective, polish): a command
        checks these even where K is wrong, and names every problem at once."""
        if not isinstance(self.degree, int) or not 1 <= self.degree <= SEARCH_MAX_DEGREE:
            raise GCacheError(f"degree must be a whole number in 1..{SEARCH_MAX_DEGREE} (the paper uses 3), got "
                              f"{self.degree!r}.")
        if n_starts is None:
            from .starts import start_count  # starts.py needs the instant DP; config stays light
            n_starts = start_count(self.forecast, False)
        least = budgets.least_budget(n_starts, self.degree)
        if not isinstance(self.budget, int) or isinstance(self.budget, bool) or self.budget < least:
            raise GCacheError(f"budget = {self.budget!r} evaluations covers at most the {n_starts} start masks and the "
                              f"{budgets.grid_size(self.degree)}-point start grid of degree {self.degree}, so the GP "
                              f"would never propose a mask: the minimum useful budget is {least} (the paper uses "
                              "500). For no search at all, use GCache Policy's instant policy.")
        if not (math.isfinite(self.s_min) and math.isfinite(self.s_max) and self.s_min < self.s_max):
            raise GCacheError(f"The search box needs finite s_min < s_max, got [{self.s_min}, {self.s_max}].")
        if not isinstance(self.objective, str) or not self.objective:
            raise GCacheError("The objective needs a name (e.g. 'lpips_ssim', 'ssim', 'psnr').")
        if self.polish_order not in POLISH_ORDERS:
            raise GCacheError(f"polish_order must be one of {', '.join(map(repr, POLISH_ORDERS))}, got "
                              f"{self.polish_order!r}.")
        if self.polish_guard not in paired.GUARDS:
            raise GCacheError(f"polish_guard must be one of {', '.join(map(repr, paired.GUARDS))}, got "
                              f"{self.polish_guard!r}.")
        if not (isinstance(self.polish_share, (int, float)) and 0.0 <= self.polish_share < 1.0):
            raise GCacheError(f"polish_share is the part of the budget after the start masks and the start grid that "
                              f"goes to local moves, in [0, 1) (the GP needs at least one proposal), got "
                              f"{self.polish_share!r}.")

    def phases(self, n_starts: int) -> tuple[int, int, int, int]:
        """(start masks, start grid, GP-LCB proposals, polish moves) of this budget: they add up to it."""
        return budgets.phases(self.budget, n_starts, self.degree, self.polish_share)

    def identity(self) -> dict:
        """What makes two searches the same search: everything but NOT_IDENTITY (the budget: a larger one continues
        the search; the polish guard: a resumed search keeps the one it started polishing with)."""
        return identity_of(asdict(self))
