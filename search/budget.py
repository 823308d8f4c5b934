"""A search's budget (evaluations, SearchConfig.budget): how it splits into phases, and the least budget worth
searching with. The one place these numbers are computed: the search, its config's checks, the nodes' tooltips and
refusals, and the commands all ask here.

    start masks   starts.start_count: the instant DP masks of every error model the profile gives (theory and local
                  weights), the TeaCache-like mask, the caller's extra masks
    start grid    2^(degree+1) points of s
    GP-LCB        what is left, less the polish moves (at least one proposal: else the GP never proposes a mask)
    polish        polish_share of what is left after the start masks and the start grid (polish.py)

The start masks depend on the profile (the RMS error models need its forecast fit statistics), so a budget checked
before the profile exists (GCache Search before its reference runs) counts the start masks of the profile the
reference runs will record (`minimum_budget(…, has_fit_stats)`), and the search checks it again on the real profile.
"""
from __future__ import annotations

import math

from ..core import forecasters


def grid_size(degree: int) -> int:
    """The start grid of s: 2^(d+1) points."""
    return 2 ** (degree + 1)


def least_budget(n_starts: int, degree: int) -> int:
    """The start masks, the start grid and one GP proposal."""
    return n_starts + grid_size(degree) + 1


def phases(budget: int, n_starts: int, degree: int, polish_share: float) -> tuple[int, int, int, int]:
    """(start masks, start grid, GP-LCB proposals, polish moves) of this budget: they add up to it (for a budget of
    at least least_budget)."""
    grid = grid_size(degree)
    rest = max(budget - n_starts - grid, 0)
    polish = min(int(math.floor(polish_share * rest)), max(rest - 1, 0))
    return n_starts, grid, rest - polish, polish


def minimum_budget(forecast, degree: int, has_fit_stats: bool, n_extra: int = 0) -> int:
    """The least budget of a search of `forecast` on a profile with (or without) the forecast fit statistics."""
    from .starts import start_count  # the start masks need the instant DP; this module stays light
    return least_budget(start_count(forecast, has_fit_stats, n_extra), degree)


def start_range() -> tuple[int, int]:
    """(fewest, most) start masks of any search: over every forecaster, with and without the fit statistics."""
    from .starts import start_count
    counts = [start_count(name, stats) for name in forecasters.names() for stats in (False, True)]
    return min(counts), max(counts)


def minimum_budgets(degree: int = 3) -> dict[str, int]:
    """The least budgets a user meets at `degree`: "reuse" (a reuse search on a profile without fit statistics, as
    GCache Search records for it), and "forecasting" (the most any forecasting search needs: a profile with them)."""
    forecasting = [n for n in forecasters.names() if forecasters.get(n).forecasts]
    return {"reuse": minimum_budget("reuse", degree, False),
            "forecasting": max(minimum_budget(n, degree, True) for n in forecasting)}
