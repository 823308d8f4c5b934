"""The rooms of nodes/ and the floors they stand on, read from the source (ast): no ComfyUI needed.

Floors, lowest first: artifacts.py (file names in the gcache folder), patching/ (wiring GCache into a ModelPatcher,
step attribution), modes/ (what a run does: apply, profile, auto), search_jobs/ (GCache Search's work), and the top:
the node classes, the extension and comfy_common.py (what the node classes share inside ComfyUI). An import goes down
a floor, or sideways within one floor without a cycle; never up: patching never imports a mode, a search job or a
node class, and nothing below the top imports comfy_common or a node class.
"""
import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOORS = ("artifacts", "patching", "modes", "search_jobs", "top")  # lowest first
MOST_TOP_FILES = 10


def modules(root: str) -> dict[str, str]:
    """Dotted name relative to the package root ("nodes.modes.auto"; a package's __init__ is "nodes.modes") → path."""
    out = {}
    for folder, _, files in os.walk(os.path.join(root, "nodes")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def imported(name: str, path: str, node: ast.ImportFrom, known: dict) -> set[str]:
    """The modules of `known` that one `from … import …` in module `name` loads (a package stands for its __init__)."""
    if node.level == 0:
        mod = node.module or ""
        if not mod.startswith("gcache."):
            return set()
        target = mod[len("gcache."):]
    else:
        package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        target = ".".join(package + ([node.module] if node.module else []))
    found = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known}
    if not found and target in known:
        found.add(target)
    return found


def import_graph(root: str) -> tuple[dict[str, set[str]], list[str]]:
    """Arrows between the files of nodes/ (imports inside functions too), and absolute imports of the package."""
    known = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in known}
    absolute = []
    for name, path in known.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0 and (node.module or "").split(".")[0] == "gcache":
                    absolute.append(f"{name}: from {node.module} import …")
                graph[name] |= imported(name, path, node, known) - {name}
            elif isinstance(node, ast.Import):
                absolute += [f"{name}: import {a.name}" for a in node.names if a.name.split(".")[0] == "gcache"]
    return graph, absolute


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of files found by depth-first search (empty: none)."""
    found, done = [], set()

    def visit(m, path):
        if m in path:
            found.append(path[path.index(m):] + [m])
            return
        if m in done:
            return
        for t in sorted(graph[m]):
            visit(t, path + [m])
        done.add(m)
    for m in sorted(graph):
        visit(m, [])
    return found


def floor(name: str) -> int:
    parts = name.split(".")
    if parts[1:] == ["artifacts"]:
        return FLOORS.index("artifacts")
    if len(parts) > 1 and parts[1] in FLOORS:
        return FLOORS.index(parts[1])
    return FLOORS.index("top")


def upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} → {b}" for a in sorted(graph) for b in sorted(graph[a]) if floor(b) > floor(a)]


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    memo: dict[str, list[str]] = {}

    def chain(m):
        if m not in memo:
            memo[m] = [m] + max((chain(t) for t in graph[m]), key=len, default=[])
        return memo[m]
    return max((chain(m) for m in graph), key=len)


# ------------------------------------------------------------------------------------------------ this tree
def test_nodes_has_no_import_cycle_and_no_import_goes_up_a_floor():
    graph, absolute = import_graph(REPO)
    assert {"nodes.patching.hooks", "nodes.modes.base", "nodes.search_jobs.job", "nodes.extension"} <= set(graph)
    assert cycles(graph) == []
    assert upward(graph) == []
    assert absolute == [], "imports inside the package are relative"


def test_patching_knows_no_mode_and_nothing_below_the_top_imports_the_nodes_ui():
    graph, _ = import_graph(REPO)
    for a, targets in graph.items():
        for b in targets:
            if a.startswith("nodes.patching."):
                assert b.startswith("nodes.patching."), f"{a} → {b}"
            if floor(a) < FLOORS.index("top"):
                assert floor(b) < FLOORS.index("top"), f"{a} → {b}"


def test_nodes_top_holds_few_files_and_every_room_says_what_lives_there():
    top = sorted(f for f in os.listdir(os.path.join(REPO, "nodes")) if f.endswith(".py"))
    assert len(top) <= MOST_TOP_FILES, top
    rooms = [d for d in sorted(os.listdir(os.path.join(REPO, "nodes")))
             if os.path.isfile(os.path.join(REPO, "nodes", d, "__init__.py"))]
    assert set(rooms) == set(FLOORS) - {"artifacts", "top"}, "a new room needs its floor in FLOORS"
    for d in ["."] + rooms:
        with open(os.path.join(REPO, "nodes", d, "__init__.py"), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        doc = ast.get_docstring(tree)
        assert doc and len(doc) > 80, f"nodes/{d}/__init__.py says what lives there"
        assert all(isinstance(n, ast.Expr) for n in tree.body), f"nodes/{d}/__init__.py imports nothing"


# ------------------------------------------------------------------------------------------------ the checker
def _tree(tmp_path, files: dict) -> str:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize("files, arrows", [
    ({"nodes/__init__.py": "", "nodes/a.py": "from . import b\nfrom .patching.c import X\n", "nodes/b.py": "",
      "nodes/patching/__init__.py": "", "nodes/patching/c.py": "def f():\n    from .. import a\n"},
     {"nodes.a": {"nodes.b", "nodes.patching.c"}, "nodes.patching.c": {"nodes.a"}}),
    ({"nodes/__init__.py": "", "nodes/modes/__init__.py": "from .x import y\n", "nodes/modes/x.py": "y = 1\n",
      "nodes/modes/z.py": "from ..modes import x\nfrom ...core.errors import E\nfrom ..artifacts import P\n",
      "nodes/artifacts.py": "from gcache.nodes import modes\n"},
     {"nodes.modes": {"nodes.modes.x"}, "nodes.modes.z": {"nodes.modes.x", "nodes.artifacts"},
      "nodes.artifacts": {"nodes.modes"}}),
])
def test_the_graph_resolves_relative_imports_and_imports_inside_functions(tmp_path, files, arrows):
    graph, _ = import_graph(_tree(tmp_path, files))
    assert {a: b for a, b in graph.items() if b} == arrows


def test_the_checks_find_a_cycle_an_upward_import_and_an_absolute_one(tmp_path):
    root = _tree(tmp_path, {
        "nodes/__init__.py": "", "nodes/extension.py": "from .modes import m\n",
        "nodes/modes/__init__.py": "", "nodes/modes/m.py": "from ..patching import p\n",
        "nodes/patching/__init__.py": "", "nodes/patching/p.py": "from . import q\n",
        "nodes/patching/q.py": "def late():\n    from ..modes import m\n    import gcache.nodes.extension\n"})
    graph, absolute = import_graph(root)
    assert cycles(graph) == [["nodes.modes.m", "nodes.patching.p", "nodes.patching.q", "nodes.modes.m"]]
    assert upward(graph) == ["nodes.patching.q → nodes.modes.m"]
    assert absolute == ["nodes.patching.q: import gcache.nodes.extension"]
    assert longest_chain({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == ["a", "b", "c"]
