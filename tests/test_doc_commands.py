"""Every command in a fenced shell block of README.md and docs/*.md runs as written in README's venv, or the line above
its block says what else it needs (`*Needs …*`, naming the command or the section that provides it).

Each command is sorted into one of:
- set-up: a clone, a venv, a pip install, `cd` (they need the network; CI runs the same from the project's files);
- long: the whole test suite, and bench commands whose run lasts minutes (bench/runs.py: their figures are stored
  results, checked by tests/test_bench_results.py; tests/test_docs.py parses their arguments);
- needs: its block has a `*Needs …*` line above it;
- run: the rest, which must be cheap (under a minute): this test runs each as written, with this test's own Python
  as README's `.venv/bin/python`, in a temporary folder (or the repository, for commands that name its files), with a
  temporary folder of its own that must be empty afterwards, and the repository's files as they were.
A command that fits none fails the test. The runs of the commands that are bench/runs.py's fast runs are compared
with their stored results (marked bench_rerun: CI's comparison of the fast deterministic benches).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from test_docs import doc_files, shell_lines, simple_commands, split_markdown

from gcache.bench import runs, store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEEDS = re.compile(r"^\s*\*Needs (?P<what>.+)\*\s*$")
MARKER_LINE = re.compile(r"^\s*<!--/?gc[:>].*$")
SETUP_TOOLS = {"git", "cd", "grep", "mkdir", "cp", "comfy"}
RUN_LIMIT_S = 180  # a cheap command takes under a minute; the limit leaves room for a loaded machine


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str
    words: tuple
    needs: str  # the block's *Needs …* line, or ""


def needs_line(lines: list, fence_index: int) -> str:
    """What the `*Needs …*` paragraph right above a block's fence says (blank lines and figure markers skipped; the
    paragraph may wrap over several lines), or ""."""
    i = fence_index - 1
    while i >= 0 and (not lines[i].strip() or MARKER_LINE.match(lines[i])):
        i -= 1
    paragraph = []
    while i >= 0 and lines[i].strip() and not MARKER_LINE.match(lines[i]):
        paragraph.insert(0, lines[i].strip())
        i -= 1
    m = NEEDS.match(" ".join(paragraph))
    return m.group("what") if m else ""


def doc_commands() -> list:
    out = []
    for path in doc_files():
        text = open(path, encoding="utf-8").read()
        lines = text.split("\n")
        blocks, _ = split_markdown(text, path)
        for b in blocks:
            if b.lang not in ("bash", "sh", "shell", "console"):
                continue
            needs = needs_line(lines, b.line - 2)
            for n, line in shell_lines(b):
                for words in simple_commands(line):
                    out.append(Command(os.path.relpath(path, REPO), n, line, tuple(words), needs))
    return out


COMMANDS = doc_commands()


def split_env(words: tuple) -> tuple[dict, list]:
    env, words = {}, list(words)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


def registered(cmd: Command):
    return next((r for r in runs.RUNS.values() if r.command() == cmd.text), None)


def kind(cmd: Command) -> str:
    """set-up, long, needs, run, or unknown."""
    if cmd.needs:
        return "needs"
    env, words = split_env(cmd.words)
    exe, args = words[0], words[1:]
    if exe in SETUP_TOOLS or exe.endswith("/pip") or (exe == "python3" and args[:2] == ["-m", "venv"]):
        return "set-up"
    if not exe.startswith(".venv/bin/python") or env.keys() - {"OMP_NUM_THREADS"}:
        return "unknown"
    if args[:2] == ["-m", "pip"]:
        return "set-up"
    if args[:2] == ["-m", "pytest"]:
        return "run" if any(a.startswith("tests/") for a in args) else "long"  # the whole suite is long
    run = registered(cmd)
    if run is not None:
        return "long" if run.minutes > 1 else "run"
    if args[:1] == ["-m"] and len(args) > 1 and args[1].startswith("gcache."):
        return "run"
    return "unknown"


def test_every_command_runs_as_written_or_says_what_it_needs():
    unknown = [f"{c.doc}:{c.line}: `{c.text}`" for c in COMMANDS if kind(c) == "unknown"]
    assert not unknown, ("commands that neither run in README's venv nor have a `*Needs …*` line above their block:\n"
                         + "\n".join(unknown))


def test_a_needs_line_names_what_provides_it():
    bad = [f"{c.doc}:{c.line}: *Needs {c.needs}*" for c in COMMANDS
           if c.needs and not re.search(r"`[^`]+`|\]\([^)]+\)", c.needs)]
    assert not bad, "a *Needs …* line names the command (in backticks) or links the section that provides it:\n" + \
        "\n".join(bad)


def test_the_sorting_can_fail():
    odd = Command("x.md", 1, "ray start --head", ("ray", "start", "--head"), "")
    assert kind(odd) == "unknown"
    assert kind(Command("x.md", 1, "", ("COMFYUI_PATH=x", ".venv/bin/python", "-m", "gcache.bench.x"), "")) == "unknown"
    assert kind(Command("x.md", 1, "", (".venv/bin/python", "-m", "pytest", "-q"), "")) == "long"
    assert kind(Command("x.md", 1, "", ("bash", "bench/gpu_check.sh"), "a GPU")) == "needs"
    lines = ["*Needs a GPU: `x`.*", "", "<!--gc:cmd.gpu-->", "```bash"]
    assert needs_line(lines, 3) == "a GPU: `x`."


def git_status() -> str:
    out = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=all"], capture_output=True,
                         text=True, timeout=60)
    return out.stdout if out.returncode == 0 else "(no git)"


CHEAP = sorted({c.text: c for c in COMMANDS if kind(c) == "run"}.values(), key=lambda c: c.text)


@pytest.fixture(scope="module")
def executed():
    """Every cheap command run once, two at a time: its text -> (exit code, output, files left in its temporary
    folder, the result bench/runs.py collects from it when it is a registered run, else None)."""
    before = git_status()

    def one(cmd: Command):
        env, words = split_env(cmd.words)
        argv = [sys.executable] + words[1:]
        in_repo = any(w.startswith("tests/") for w in words)
        work, tmp = tempfile.mkdtemp(prefix="gcache-doc-command-"), tempfile.mkdtemp(prefix="gcache-doc-tmp-")
        try:
            try:
                res = subprocess.run(argv, cwd=REPO if in_repo else work, capture_output=True, text=True,
                                     timeout=RUN_LIMIT_S,
                                     env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": tmp, **env})
            except subprocess.TimeoutExpired as e:  # this command fails its test; the others still run
                return cmd.text, (None, f"ran past {RUN_LIMIT_S} s: {(e.stdout or b'')[-2000:]!r}", [], None)
            run, result = registered(cmd), None
            if run is not None and res.returncode == 0:
                result = runs.COLLECTORS[run.collect](run, res.stdout.splitlines(), work)
            return cmd.text, (res.returncode, res.stdout + res.stderr, os.listdir(tmp), result)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        out = dict(pool.map(one, CHEAP))
    out["git status"] = (before, git_status())
    return out


@pytest.mark.doc_commands
@pytest.mark.parametrize("cmd", CHEAP, ids=[c.text for c in CHEAP])
def test_a_cheap_command_runs_as_written(cmd, executed):
    rc, output, left, _ = executed[cmd.text]
    assert rc == 0 and "Traceback" not in output, f"{cmd.doc}:{cmd.line}: `{cmd.text}` exited {rc}:\n{output[-3000:]}"
    # pytest's own base folder (pytest-of-<user>) is pytest's to keep; the tests' folders in it are removed when they
    # pass (pyproject.toml: tmp_path_retention_policy), and nothing of GCache's may stay
    left = [e for e in left if not (e.startswith("pytest-of-") and "pytest" in cmd.words)]
    assert left == [], f"`{cmd.text}` left {left} in its temporary folder"


@pytest.mark.doc_commands
def test_the_commands_leave_the_repository_as_it_was(executed):
    before, after = executed["git status"]
    assert after == before, f"the docs' commands changed the repository's files:\n{after}"


@pytest.mark.bench_rerun
@pytest.mark.parametrize("name", sorted(n for n, r in runs.RUNS.items() if r.fast))
def test_a_fast_run_reproduces_its_stored_result(name, executed):
    """CI's comparison: the fast deterministic runs again, their figures against bench/results (timings left out)."""
    run = runs.RUNS[name]
    if run.command() in executed:
        rc, output, _, fresh = executed[run.command()]
        assert rc == 0, output[-3000:]
    else:  # a fast run the docs do not show as a command
        fresh = runs.execute(run, echo=None)[0]
    stored = store.load(name)["result"]
    diff = runs.differences(runs.deterministic_part(run, stored), runs.deterministic_part(run, fresh))
    assert not diff, (f"`{run.command()}` no longer prints its stored figures ({', '.join(diff[:6])}): rerun "
                      f".venv/bin/python -m gcache.bench.runs {name} and .venv/bin/python -m gcache.bench.render_docs")
