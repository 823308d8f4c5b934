"""The real-ComfyUI suite imports only what `.ci/run` installs into ComfyUI's venvs.

A developer's own ComfyUI venv tends to hold more than CI's (hypothesis, once: tests/test_nodes_artifacts.py's
property test ran here and stopped the whole suite at collection in CI). This reads every import of the files the
suite runs (tests/comfyui/*.py, tests/test_nodes_*.py) and every package `.ci/run` installs with a ComfyUI venv's pip
(its own names, `-r` of GCache's and of the tree's requirements.txt, `-e` with extras), and checks one against the
other.
"""
import ast
import glob
import os
import re
import shlex
import sys

import pytest
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREES = sorted(glob.glob(os.path.join(ROOT, "..", "shared", "comfyui", "*", "requirements.txt")))
# import name -> the name pip installs it under, where they differ
PIP_NAME = {"PIL": "pillow", "sklearn": "scikit-learn", "skimage": "scikit-image", "yaml": "pyyaml"}
# packs the suite loads from folders (GCache itself, its test-only pack, city96's GGUF pack as a test host)
PACKS = {"gcache", "gcache_test_pack", "ComfyUI_GGUF"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _requirements(path: str) -> set[str]:
    with open(path) as f:
        return {_name(line) for line in f if line.strip() and not line.lstrip().startswith(("#", "-"))}


def ci_installs(ci_text: str, trees: list[str]) -> set[str]:
    """Every package `.ci/run` pip-installs into a ComfyUI venv ("$venv/bin/pip" lines)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    out = set()
    for line in ci_text.splitlines():
        if '"$venv/bin/pip" install' not in line:
            continue
        words = shlex.split(line.split("install", 1)[1].split("#", 1)[0])
        i = 0
        while i < len(words):
            w = words[i]
            if w == "-r":
                i += 1
                if words[i] == "requirements.txt":  # GCache's
                    out |= _requirements(os.path.join(ROOT, "requirements.txt"))
                else:  # the tree's requirements.txt, its torch lines left out (torch is a line of its own)
                    for tree in trees:
                        out |= _requirements(tree)
            elif w == "-e":
                i += 1
                extras = re.search(r"\[(.*)\]", words[i])
                out |= {"gcache"} | {_name(d) for d in project["dependencies"]}
                for extra in (extras.group(1).split(",") if extras else []):
                    out |= {_name(d) for d in project["optional-dependencies"][extra]}
            elif not w.startswith(("-", "$")):
                out.add(_name(w))
            i += 1
    return out


def suite_imports() -> dict[str, set[str]]:
    """Top-level module → the suite's files that import it (absolute imports only)."""
    files = glob.glob(os.path.join(ROOT, "tests", "comfyui", "*.py")) + \
        glob.glob(os.path.join(ROOT, "tests", "test_nodes_*.py"))
    out = {}
    for path in files:
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                out.setdefault(name.split(".")[0], set()).add(os.path.relpath(path, ROOT))
    return out


def comfyui_modules(trees: list[str]) -> set[str]:
    """What ComfyUI's own tree puts on sys.path (its top-level folders and .py files)."""
    out = set()
    for req in trees:
        for entry in os.listdir(os.path.dirname(req)):
            out.add(entry[:-3] if entry.endswith(".py") else entry)
    return out


def not_installed(ci_text: str, trees: list[str]) -> dict[str, list[str]]:
    local = {os.path.splitext(os.path.basename(p))[0]
             for p in glob.glob(os.path.join(ROOT, "tests", "*.py")) + glob.glob(os.path.join(ROOT, "tests", "comfyui",
                                                                                               "*.py"))}
    known = set(sys.stdlib_module_names) | local | PACKS | comfyui_modules(trees)
    installed = ci_installs(ci_text, trees)
    return {top: sorted(files) for top, files in suite_imports().items()
            if top not in known and _name(PIP_NAME.get(top, top)) not in installed}


@pytest.mark.skipif(not TREES, reason="no ComfyUI tree in ../shared/comfyui beside the clone (CI has them)")
def test_every_import_of_the_real_comfyui_suite_is_installed_by_ci():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert "hypothesis" in ci_installs(ci, TREES) and "aiohttp" in ci_installs(ci, TREES)
    assert not_installed(ci, TREES) == {}, \
        "imported by the real-ComfyUI suite, not installed by .ci/run's ComfyUI venvs"
    # the check itself: the line without hypothesis (as it was) is caught, naming the file that needs it
    without = ci.replace(" requests pytest hypothesis", " requests pytest")
    assert without != ci
    assert not_installed(without, TREES) == {"hypothesis": ["tests/test_nodes_artifacts.py"]}
