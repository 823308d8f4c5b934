"""The package as a whole, read from the source (ast): bench/ has no import cycle, and no file of nodes/, core/,
search/, bench/ or reference_model/ imports the package root (its __init__ is ComfyUI's entry point: everything
below it stands on core/ and search/, never on it). tests/test_search_layers.py and tests/test_nodes_layers.py hold
the rules inside search/, core/ and nodes/."""
import ast

from test_search_layers import cycle, graph, imports, modules

FOLDERS = ("nodes", "core", "search", "bench", "reference_model", "comfy_models")


def root_imports(folders=FOLDERS) -> list[str]:
    """`from ... import x` lines that reach the package root (`gcache` itself) from a file below it."""
    out = []
    known = {}
    for folder in folders:
        known.update(modules(folder))
    for name, path in known.items():
        inside, outside = imports(name, path, known)
        if "" in inside or any(t.startswith(".") for t in inside):
            out.append(name)
    return out


def test_bench_has_no_import_cycle():
    g = graph(("bench", "core", "search", "reference_model"))
    assert {"bench.render_docs", "bench.render_blocks", "bench.doc_text"} <= set(g)
    assert cycle(g) == []


def test_nothing_below_the_root_imports_it():
    assert root_imports() == []


def test_the_checkers_see_a_root_import_and_a_bench_cycle(tmp_path, monkeypatch):
    import test_search_layers
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "a.py").write_text("from . import b\nfrom .. import __version__\n")
    (tmp_path / "bench" / "b.py").write_text("def f():\n    from .a import g\n")
    monkeypatch.setattr(test_search_layers, "REPO", str(tmp_path))
    assert root_imports(("bench",)) == ["bench.a"]
    assert cycle(graph(("bench",))) in (["bench.a", "bench.b", "bench.a"], ["bench.b", "bench.a", "bench.b"])
    assert ast  # the checkers parse, they never import the files
