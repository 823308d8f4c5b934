"""The rooms of search/ read from the source (ast): the algorithm (search/*.py) never imports the infrastructure
(search/infra/: executors beyond this process, workers, objectives, downloads, plots, command-line tools), neither
imports ComfyUI or nodes/, core/ imports neither, and no import goes round in a cycle."""
import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMFYUI = {"comfy", "comfy_api", "comfy_extras", "comfy_execution", "folder_paths", "server", "nodes", "execution"}


def modules(folder: str) -> dict[str, str]:
    """Dotted name relative to the package root ("search.infra.plots"; a package's __init__ is "search.infra")."""
    out = {}
    for root, _, files in os.walk(os.path.join(REPO, folder)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                out[os.path.relpath(path, REPO)[:-3].replace(os.sep, ".").removesuffix(".__init__")] = path
    return out


def imports(name: str, path: str, known=None) -> tuple[set[str], set[str]]:
    """(the package's modules this module imports, inside functions too; the top-level names of other packages).
    `from . import x` is module x when x is one of `known`, else the package itself."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    inside, outside = set(), set()
    package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            outside |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                outside.add((node.module or "").split(".")[0])
                continue
            base = package[:len(package) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            found = {f"{target}.{a.name}" for a in node.names if known is None or f"{target}.{a.name}" in known}
            inside |= found or {target}
    return inside, outside


def graph(folders=("search", "core")) -> dict[str, tuple[set[str], set[str]]]:
    known = {}
    for folder in folders:
        known.update(modules(folder))
    out = {}
    for name, path in known.items():
        inside, outside = imports(name, path, known)
        out[name] = ({m for m in inside if m in known and m != name}, outside)
    return out


def cycle(g: dict) -> list:
    done = set()

    def visit(m, path):
        if m in path:
            return path[path.index(m):] + [m]
        if m in done:
            return []
        for t in sorted(g[m][0]):
            found = visit(t, path + [m])
            if found:
                return found
        done.add(m)
        return []
    for m in sorted(g):
        found = visit(m, [])
        if found:
            return found
    return []


def test_the_algorithm_never_imports_the_infrastructure():
    g = graph()
    algorithm = [m for m in g if m.startswith("search.") and not m.startswith("search.infra")]
    assert {"search.loop", "search.paired", "search.state", "search.budget", "search.executor"} <= set(algorithm)
    assert {"search.infra.plots", "search.infra.ray_executor", "search.infra.cli"} <= set(g)
    for m in algorithm:
        assert not {t for t in g[m][0] if t.startswith("search.infra")}, m


def test_no_comfyui_no_nodes_and_core_below_search():
    g = graph()
    for m, (inside, outside) in g.items():
        assert not outside & COMFYUI, (m, outside & COMFYUI)
        assert not {t for t in inside if t.startswith("nodes")}, m
        if m.startswith("core"):
            assert not {t for t in inside if t.startswith("search")}, m


def test_no_import_cycle_in_search_and_core():
    assert cycle(graph()) == []


def test_the_checker_sees_lazy_imports_and_cycles():
    g = {"a": ({"b"}, set()), "b": ({"c"}, set()), "c": ({"a"}, set()), "d": ({"a"}, set())}
    assert cycle(g) == ["a", "b", "c", "a"]
    inside, outside = graph()["search.config"]
    assert "search.starts" in inside and "core.forecasters" in inside  # inside a method; a module from a package
    assert "dataclasses" in outside
