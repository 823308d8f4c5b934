"""The forecaster seam (core/forecasters): outside that folder GCache asks a forecaster what it is (label, forecasts,
needs_profile, dp_of, auto_candidate, check_params, two_step_c), never compares its name with a string."""
import ast
import pathlib

from gcache.core import forecasters

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ("core", "search", "nodes", "reference_model")
NAMES = {"reuse", "linear", "quadratic", "fitted", "l2p"}
# search/error_models.py's _two_step_c / rms still compare names: its owner moves them to fc.two_step_c / fc.forecasts
PENDING: set = set()


def _name_constants(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in _name_constants(e)]
    return []


def name_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, name) of every comparison (==, !=, in, not in, …) with a forecaster name as a string literal."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                out += [(node.lineno, n) for n in _name_constants(operand)]
    return out


def test_the_checker_finds_name_comparisons():
    src = 'a = fc == "fitted"\nb = name in ("reuse", "linear")\nc = "quadratic" != x\nd = fc.forecasts\ne = "reuse"\n'
    assert name_comparisons(src) == [(1, "fitted"), (2, "reuse"), (2, "linear"), (3, "quadratic")]


def test_no_forecaster_name_is_compared_outside_core_forecasters():
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("core/forecasters/") or rel in PENDING:
                continue
            found += [f"{rel}:{line} compares with {name!r}" for line, name in name_comparisons(path.read_text())]
    assert not found, "ask the forecaster (core/forecasters/__init__.py's attributes) instead:\n" + "\n".join(found)


def test_the_four_forecasters_keep_their_combo_labels_and_traits():
    fc = {n: forecasters.get(n) for n in ("reuse", "linear", "quadratic", "fitted")}
    assert [fc[n].label for n in fc] == ["reuse (0)", "linear (1)", "quadratic (2)", "fitted (profile)"]
    assert [n for n in forecasters.names() if n in fc] == ["reuse", "linear", "quadratic", "fitted"]
    assert [n for n in fc if fc[n].forecasts] == ["linear", "quadratic", "fitted"]
    assert [n for n in fc if fc[n].needs_profile] == ["fitted"]
    assert [n for n in fc if fc[n].auto_candidate] == ["reuse", "linear", "fitted"]
    assert {n: fc[n].dp_of for n in fc} == {"reuse": None, "linear": None, "quadratic": "linear", "fitted": None}
