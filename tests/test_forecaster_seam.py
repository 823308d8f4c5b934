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


def _profiles() -> dict:
    """Profiles as the recorder makes them: without forecast statistics, with them, and with them but no Gram
    statistics (a file recorded before they existed: its tensors left out)."""
    import copy

    import torch

    from gcache.core import profile_stats
    from gcache.core.recorder import ProfileRecorder
    out = {}
    for forecast in (False, True):
        g = torch.Generator().manual_seed(7)
        times = [1.0, 0.8, 0.55, 0.3, 0.1]
        rec = ProfileRecorder(times, forecast=forecast)
        for j, t in enumerate(times):
            rec.record(j, "all", torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g) + t)
        out[forecast] = rec.finish()
    out["no gram"] = copy.copy(out[True])
    out["no gram"].sums = {k: v for k, v in out[True].sums.items() if k not in profile_stats.get("gram").tensors}
    return out


def test_a_forecaster_says_whether_it_can_fit_from_a_profile_as_its_fit_finds():
    """The search asks a forecaster whether a profile has what it needs (search/starts.py can_fit); the oracle is the
    fit itself, which says so with a GCacheError (the probe the search used before)."""
    from gcache.core.errors import GCacheError
    from gcache.search.starts import can_fit

    def fit_runs(fc, prof) -> bool:
        try:
            fc.dp_errors(prof), fc.fit(prof, [1, 0, 1, 0, 1])
        except GCacheError:
            return False
        return True
    answers = {}
    for kind, prof in _profiles().items():
        for name in sorted(NAMES):  # GCache's own (a bench's rivals, registered by other tests, have no DP)
            fc = forecasters.get(name)
            assert fc.can_fit(prof) == fit_runs(fc, prof) == can_fit(prof)(name), (kind, name)
            answers[kind, name] = fc.can_fit(prof)
    assert answers[False, "reuse"] and not answers[False, "fitted"] and not answers[False, "l2p"]
    assert answers[True, "fitted"] and answers[True, "l2p"] and answers["no gram", "fitted"]
    assert not answers["no gram", "l2p"]


def test_the_search_asks_the_forecaster_and_never_probes_its_fit():
    """A forecaster whose fit fails for a reason other than a missing statistic (a bug) is not taken for one that
    can't fit: the search no longer calls fit to find out."""
    from gcache.search.starts import can_fit

    class Toy:
        name, keeps, needs, needs_profile = "toy_can_fit", 1, (), True

        def weights(self, kept, j, times, params):
            return [1.0]

        def dp_errors(self, profile):
            return profile.E, None

        def fit(self, profile, mask):
            raise AssertionError("fit called to probe the profile")
    forecasters.register(Toy())
    try:
        prof = _profiles()[False]
        assert can_fit(prof)("toy_can_fit")
    finally:
        forecasters.unregister("toy_can_fit")
