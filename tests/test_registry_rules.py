"""The Comfy Registry's validator (`comfy node validate`, run by `comfy node publish` and by .ci/run) warns on
ruff's S102 (exec), S307 (eval) and E702 (two statements on one line joined by `;`), and CI fails on any warning.
The same rules, checked here with ast and tokenize, so that the headless suite catches them before CI's validator
(which needs comfy-cli) does."""
from __future__ import annotations

import ast
import io
import os
import subprocess
import tokenize

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_files(root: str) -> list[str]:
    """The files ruff checks: tracked and untracked-but-not-ignored .py files (ruff respects .gitignore)."""
    out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout: the registry rules are checked in the repository")
    return [os.path.join(root, f) for f in out.stdout.split() if os.path.exists(os.path.join(root, f))]


def violations(src: str, name: str = "<src>") -> list[str]:
    found = []
    for node in ast.walk(ast.parse(src, name)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval"):
            found.append(f"{name}:{node.lineno}: {node.func.id}() (ruff "
                         f"{'S102' if node.func.id == 'exec' else 'S307'})")
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.OP and tok.string == ";":
            found.append(f"{name}:{tok.start[0]}: two statements on one line (ruff E702)")
    return found


def test_the_checker_finds_each_rule():
    assert violations("x = 1\n") == []
    assert violations("s = ';'  # a; b\nnet = net.eval()\n") == []  # strings, comments and methods are fine
    assert len(violations("exec('1')\n")) == 1
    assert len(violations("eval('1')\n")) == 1
    assert len(violations("import os; import sys\n")) == 1


def test_no_file_breaks_the_registry_rules():
    found = []
    for path in python_files(REPO):
        with open(path, encoding="utf-8") as f:
            found += violations(f.read(), os.path.relpath(path, REPO))
    assert not found, "the Comfy Registry's validator would warn (and CI fail):\n" + "\n".join(found)
