"""The search's budget (search/budget.py): the least useful budget against a brute count of the start masks a profile
gives, the numbers the node's tooltip and the docs quote, and K = N refused like K > N."""
import os
import re

import pytest
from test_forecaster_l2p import profile_of, trajectories
from test_search_bilevel import CFG, Evaluator, N, make_profile

from gcache.core import forecasters
from gcache.core.errors import GCacheError
from gcache.search import budget
from gcache.search.config import SearchConfig
from gcache.search.loop import run_search
from gcache.search.starts import start_masks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = [n for n in forecasters.names()  # not the rivals bench/rivals.py registers for its rows
           if type(forecasters.get(n)).__module__.startswith(forecasters.__name__ + ".")]


@pytest.fixture(scope="module")
def profiles():
    """A profile with the forecast fit statistics (and E1), and one with neither (what a reuse search records)."""
    return {True: profile_of(*trajectories()), False: make_profile()}


def brute_least(profile, forecast, degree, k=3):
    """The start masks the search would measure on this profile, the start grid (2^(d+1) points, counted) and one
    GP proposal."""
    import itertools
    grid = len(list(itertools.product((0.25, 0.75), repeat=degree + 1)))
    return len(start_masks(profile, k, forecast)) + grid + 1


@pytest.mark.parametrize("degree", [1, 3])
def test_the_least_budget_is_the_start_masks_the_grid_and_one_proposal(profiles, degree):
    for stats, prof in profiles.items():
        for name in SHIPPED:
            if forecasters.get(name).forecasts and not stats:
                continue  # a forecasting search records the fit statistics: such a profile never meets it
            assert budget.minimum_budget(name, degree, stats) == brute_least(prof, name, degree), (name, stats)


def test_the_numbers_users_read_are_the_brute_counts(profiles):
    counts = [len(start_masks(profiles[stats], 3, name)) for name in SHIPPED for stats in (False, True)
              if stats or not forecasters.get(name).forecasts]
    # fitted: 4 error models, l2p's 3, theory and local; the TeaCache-like mask
    assert budget.start_range() == (min(counts), max(counts)) == (3, 8 + 6 + 1)
    forecasting = [n for n in SHIPPED if forecasters.get(n).forecasts]
    assert budget.minimum_budgets(3) == {"reuse": brute_least(profiles[False], "reuse", 3),
                                         "forecasting": max(brute_least(profiles[True], n, 3) for n in forecasting)}


def test_the_phases_add_up_and_the_polish_gets_its_share():
    for b in range(20, 80):
        s, g, gp, pol = budget.phases(b, 3, 3, 0.5)
        assert (s, g) == (3, 16) and s + g + gp + pol == b and gp >= 1 and pol == min((b - 19) // 2, b - 20)


def test_the_docs_quote_the_numbers_the_code_computes():
    least = budget.minimum_budgets(3)
    with open(os.path.join(REPO, "docs", "nodes.md"), encoding="utf-8") as f:
        nodes = f.read()
    with open(os.path.join(REPO, "docs", "search.md"), encoding="utf-8") as f:
        search = f.read()
    assert f"so at least {least['reuse']} at degree 3 ({least['forecasting']} for a forecasting search" in nodes
    assert (f"minimum useful budget: {least['reuse']} for a reuse search at degree 3, {least['forecasting']} for a "
            "forecasting one") in re.sub(r"\s+", " ", search)
    fewest, most = budget.start_range()
    assert f"{fewest} to {most} start masks" in re.sub(r"\s+", " ", search)


def test_the_search_nodes_tooltip_takes_its_numbers_from_the_code():
    """The node's budget tooltip is built by budget_tooltip() from search/budget.py (checked from the source: the node
    imports ComfyUI; tests/comfyui/test_inprocess.py checks the text itself)."""
    import ast
    path = os.path.join(REPO, "nodes", "search_node.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    budget_input = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and c.args
                    and isinstance(c.args[0], ast.Constant) and c.args[0].value == "budget"]
    assert len(budget_input) == 1
    tip = [kw.value for kw in budget_input[0].keywords if kw.arg == "tooltip"][0]
    assert isinstance(tip, ast.Call) and tip.func.id == "budget_tooltip"
    fn = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "budget_tooltip")
    literals = [c.value for c in ast.walk(fn) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    assert not any(re.search(r"\d\d", s.replace("500", "")) for s in literals)  # no number but the paper's 500
    called = {c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    assert {"start_range", "minimum_budgets"} <= called


def test_k_equal_to_n_is_refused_like_k_above_n():
    for k in (N, N + 1):
        with pytest.raises(GCacheError, match=f"K = {k}"):
            SearchConfig(**dict(CFG, k=k)).validate(N)
        with pytest.raises(GCacheError, match=f"K = {k}"):
            run_search(make_profile(), SearchConfig(**dict(CFG, k=k)), Evaluator(make_profile()))
    with pytest.raises(GCacheError, match="nothing to choose"):
        SearchConfig(**dict(CFG, k=N)).validate(N)
    SearchConfig(**dict(CFG, k=N - 1)).validate(N)
