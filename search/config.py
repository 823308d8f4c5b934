"""SearchConfig: what one search is (K, the GP's settings, the forecaster masks are judged with, the polish share).

Everything here but the budget is the search's identity (state.search_id): a state file of another config is refused,
a larger budget continues the search it belongs to.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.policy import check_budget

SEARCH_MAX_DEGREE = 4  # GP dimension d + 1 ≤ 5 and a 2^(d+1) start grid (core.weights allows 8)
# Of the evaluations after the start masks and the start grid, the share the polish stage gets (the GP-LCB phase
# gets the rest). Measured on the reference model (bench/polish_split.py, bench/RESULTS.md 2026-11-27).
POLISH_SHARE = 0.5
POLISH_ORDERS = ("bound", "seeded")
POLISH_GUARDS = ("halves", "z")  # polish.py GUARDS (config stays importable without numpy's search modules)
# Which polish moves are kept: measured on the reference model (bench/polish_guard.py, bench/RESULTS.md 2026-11-27),
# "z" was better than "halves" in 11 and worse in 2 of 30 searches. A search keeps the guard it started polishing with
# (state.data["polish"]["guard"]), so the guard is no part of a search's identity: state files made before it resume.
POLISH_GUARD = "z"


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
    acq_polish: int = 3     # L-BFGS-B runs from the best LCB candidates (gp.GPLCB's n_polish)
    warm_maxiter: int = 30
    cold_every: int = 50
    log_loss: bool = True   # the GP models log(loss) when losses are ≥ 0 (they span decades; see bilevel.gp_targets)
    forecast: str = "reuse"  # the forecaster masks are applied with (evaluate must apply it); its DP picks them
    polish_share: float = POLISH_SHARE  # of the evaluations after the starts and the grid: local moves (polish.py)
    polish_order: str = "bound"  # which moves of a ring first: the lowest DP bound ("bound") or a seeded order
    polish_guard: str = POLISH_GUARD  # which polish moves are kept (polish.py GUARDS); not part of the identity

    def __post_init__(self):
        self.forecast = forecasters.canonical(self.forecast)  # old callers pass an order 0/1/2

    def validate(self, n_steps: int, n_starts: Optional[int] = None) -> None:
        """Raises on a config that can't search N = n_steps with `n_starts` start masks (None: the fewest a search
        of this forecaster has, so that a budget refused later can only be one the start masks of the profile fill)."""
        check_budget(self.k, n_steps)
        self.validate_settings(n_starts)

    def validate_settings(self, n_starts: Optional[int] = None) -> None:
        """What `validate` checks besides K against N (degree, budget, search box, objective, polish): a command
        checks these even where K is wrong, and names every problem at once."""
        from .starts import start_count  # starts.py needs the instant DP; config stays importable without it
        if not isinstance(self.degree, int) or not 1 <= self.degree <= SEARCH_MAX_DEGREE:
            raise GCacheError(f"degree must be a whole number in 1..{SEARCH_MAX_DEGREE} (the paper uses 3), got {self.degree!r}.")
        starts = start_count(self.forecast, False) if n_starts is None else n_starts
        least = self.least_budget(starts)
        if not isinstance(self.budget, int) or isinstance(self.budget, bool) or self.budget < least:
            raise GCacheError(f"budget = {self.budget!r} evaluations covers at most the {starts} start masks and the "
                              f"{2 ** (self.degree + 1)}-point start grid of degree {self.degree}, so the GP would never "
                              f"propose a mask: the minimum useful budget is {least} (the paper uses 500). For no "
                              "search at all, use GCache Policy's instant policy.")
        if not (math.isfinite(self.s_min) and math.isfinite(self.s_max) and self.s_min < self.s_max):
            raise GCacheError(f"The search box needs finite s_min < s_max, got [{self.s_min}, {self.s_max}].")
        if not isinstance(self.objective, str) or not self.objective:
            raise GCacheError("The objective needs a name (e.g. 'lpips_ssim', 'ssim', 'psnr').")
        if self.polish_order not in POLISH_ORDERS:
            raise GCacheError(f"polish_order must be one of {', '.join(map(repr, POLISH_ORDERS))}, got "
                              f"{self.polish_order!r}.")
        if self.polish_guard not in POLISH_GUARDS:
            raise GCacheError(f"polish_guard must be one of {', '.join(map(repr, POLISH_GUARDS))}, got "
                              f"{self.polish_guard!r}.")
        if not (isinstance(self.polish_share, (int, float)) and 0.0 <= self.polish_share < 1.0):
            raise GCacheError(f"polish_share is the part of the budget after the start masks and the start grid that "
                              f"goes to local moves, in [0, 1) (the GP needs at least one proposal), got "
                              f"{self.polish_share!r}.")

    def least_budget(self, n_starts: int) -> int:
        """The start masks, the start grid and one GP proposal."""
        return n_starts + 2 ** (self.degree + 1) + 1

    def phases(self, n_starts: int) -> tuple[int, int, int, int]:
        """(start masks, start grid, GP-LCB proposals, polish moves) of this budget: they add up to it."""
        grid = 2 ** (self.degree + 1)
        rest = max(self.budget - n_starts - grid, 0)
        polish = min(int(math.floor(self.polish_share * rest)), max(rest - 1, 0))
        return n_starts, grid, rest - polish, polish

    def identity(self) -> dict:
        """What makes two searches the same search: everything but the budget (a larger budget continues it)."""
        d = asdict(self)
        d.pop("budget")
        d.pop("polish_guard")  # a resumed search keeps the guard it polishes with (state.data["polish"]["guard"])
        return d
