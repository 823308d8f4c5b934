"""Every command in README.md and docs/*.md works as written after the README's quick start (a `.venv` at the root).

What is run and what is only checked:
- `.venv/bin/python -m gcache.<module> ARGS`: the module is imported (without ComfyUI) and its own argument parser
  parses ARGS exactly as written; the parse is stopped there, so nothing samples, downloads or starts Ray. The
  module must also run as `python -m` (a `__main__` guard).
- `… -c CODE`: every `gcache` name CODE imports must exist.
- `… -m pytest PATHS`: the test files (and `::test` names) exist. `… -m pip install`: the pyproject extras named
  exist, and so do the requirement files (in the repository). `git clone` of this project: pyproject's Repository
  URL; `comfy node install`: the Registry id (pyproject's name). `bash FILE`, `./FILE`: the file exists.
- Any other word that is a path inside the repository (its first part is a top-level entry: `bench/…`,
  `tests/…`, …) must exist; a `gcache.x.y` module named in prose must import.
- Bare `python`/`pip` is refused everywhere (the quick start never activates the venv): `.venv/bin/python`, another
  venv's `…/bin/python`, or `"$COMFYUI_PYTHON"` (ComfyUI's Python, which the README defines).
- Relative links and images resolve, with their `#anchor` among the target's headings.
Commands that need ComfyUI, a GPU, a Ray cluster or minutes of CPU are checked as above, never run.
"""
from __future__ import annotations

import argparse
import ast
import glob
import importlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from unittest import mock

import pytest

try:
    import tomllib  # Python 3.11+
except ImportError:  # pragma: no cover
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib (3.11+) or tomli")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
README_LIMIT = 10_000  # bytes (10 KB): the front door stays short; everything else goes to docs/
SHELL_LANGS = {"bash", "sh", "shell", "console"}
ALLOWED_TOOLS = {"cd", "git", "comfy", "bash", "grep", "cp", "mkdir"}  # beyond Python/pip: checked below
# commands an extra installs into README's venv (.venv/bin/<tool>): the extra
VENV_TOOLS = {"ray": "cluster", "ruff": "test"}
TEAM_WORDS = ("2-core", "dev machine", "development machine", "ci machine", "was lent", "no gpu was",
              "load average")  # the docs speak about the project, not the machines it was built on


def doc_files() -> list[str]:
    return [README] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def pyproject() -> dict:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


_ROOTS: list = []


def repo_roots() -> set[str]:
    """Top-level entries of the repository (git's tracked files; without git, the folder less hidden entries and
    caches): a word starting with one of them is a path the docs promise exists. Output folders a command made
    (`demo_out/`) are not among them."""
    if not _ROOTS:
        try:
            files = subprocess.run(["git", "-C", REPO, "ls-files"], capture_output=True, text=True, timeout=60,
                                   check=True).stdout.split()
            roots = {f.split("/")[0] for f in files}
        except (OSError, subprocess.SubprocessError):
            roots = set()
        _ROOTS.append(roots | {"docs"} if roots else
                      {e for e in os.listdir(REPO) if not e.startswith(".") or e == ".ci"} - {"__pycache__"})
    return _ROOTS[0]


# ---------------------------------------------------------------------------------------------------------------
# Reading the markdown


@dataclass
class Block:
    doc: str
    line: int       # 1-based line of the block's first content line
    lang: str
    text: str


def split_markdown(text: str, doc: str) -> tuple[list[Block], str]:
    """Fenced blocks, and the prose with the blocks blanked out (line numbers kept)."""
    blocks, prose, lines = [], [], text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*(```+)\s*([\w+-]*)\s*$", lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        fence, lang, start, body = m.group(1), m.group(2).lower(), i + 1, []
        prose.append("")
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            prose.append("")
            i += 1
        prose.append("")
        i += 1
        blocks.append(Block(doc, start + 1, lang, "\n".join(body)))
    return blocks, "\n".join(prose)


def inline_spans(prose: str) -> list[tuple[int, str]]:
    out = []
    for n, line in enumerate(prose.split("\n"), 1):
        for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", line):
            out.append((n, m.group(1)))
    return out


def shell_lines(block: Block) -> list[tuple[int, str]]:
    """(line number, command line) with continuation lines joined; comment lines dropped."""
    out, pending, first = [], "", None
    for n, raw in enumerate(block.text.split("\n"), block.line):
        line = raw.strip()
        if block.lang == "console" and line.startswith("$ "):
            line = line[2:]
        if not pending and (not line or line.startswith("#")):
            continue
        first = n if not pending else first
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((first, pending + line))
        pending = ""
    assert not pending, f"{block.doc}:{block.line}: a block ends with a line continuation"
    return out


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line, split at && || ; | and with redirections dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    cmds, cur, skip_next = [], [], False
    for tok in lex:
        if skip_next:
            skip_next = False
            continue
        if tok in ("&&", "||", ";", "|", "&"):
            cmds.append(cur)
            cur = []
        elif tok in (">", ">>", "<", "2>", "2>&1"):
            skip_next = tok != "2>&1"
        else:
            cur.append(tok)
    cmds.append(cur)
    return [c for c in cmds if c]


# ---------------------------------------------------------------------------------------------------------------
# Checking one command


class _Parsed(Exception):
    """Raised by the patched parse_args once a command's arguments parsed: nothing after it runs."""


def parse_only(module: str, argv: list[str]) -> str | None:
    """None when `module`'s main() parses `argv`; else what went wrong (import error, parse error)."""
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is the finding
        return f"`{module}` does not import without ComfyUI: {type(e).__name__}: {e}"
    src = open(mod.__file__, encoding="utf-8").read()
    if not re.search(r"""if __name__ == ["']__main__["']:""", src) or not callable(getattr(mod, "main", None)):
        return f"`{module}` has no main() run under `if __name__ == '__main__'`: `python -m {module}` does nothing"
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed()

    err = io.StringIO()
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_and_stop), \
            redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            mod.main(argv)
        except _Parsed:
            return None
        except SystemExit as e:
            return f"`{module}` refuses {' '.join(argv)!r} (exit {e.code}): {err.getvalue().strip()}"
    return f"`{module}`'s main() returned without parsing its arguments"


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@dataclass
class Shell:
    """What a block's commands have done so far: where they stand, and the clone folders that are this repository."""
    doc: str
    in_repo: bool = True  # blocks start at the repository root, where the quick start leaves the reader
    clones: set = field(default_factory=set)
    problems: list = field(default_factory=list)

    def bad(self, where: str, what: str) -> None:
        self.problems.append(f"{os.path.relpath(self.doc, REPO)}:{where}: {what}")

    def repo_path(self, word: str) -> str | None:
        """The repository-relative path `word` names, or None when it names something outside the repository."""
        word = word.split("::", 1)[0]
        if word.startswith(("/", "~", "$", "http://", "https://")) or "=" in word:
            return None
        parts = word.split("/")
        if not self.in_repo:
            return "/".join(parts[1:]) or "." if parts[0] in self.clones else None
        return word if parts[0] in repo_roots() and word not in (".", "..") else None

    def check_path(self, where: str, word: str) -> None:
        path = self.repo_path(word)
        if path is None:
            return
        full = os.path.join(REPO, path)
        if not (glob.glob(full) if any(c in path for c in "*?[") else os.path.exists(full)):
            self.bad(where, f"`{word}` does not exist in the repository")
            return
        if "::" in word and os.path.isfile(full):
            for name in word.split("::")[1:]:
                if not re.search(rf"^\s*(def|class) {re.escape(name.split('[')[0])}\b",
                                 open(full, encoding="utf-8").read(), re.M):
                    self.bad(where, f"`{word}`: no test `{name}` in {path}")

    def run(self, where: str, words: list[str]) -> None:
        env = {}
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            k, v = words[0].split("=", 1)
            env[k] = v
            words = words[1:]
        if not words:
            return
        exe, args = words[0], words[1:]
        if exe in ("python", "python3", "pip", "pip3") and not (exe == "python3" and args[:2] == ["-m", "venv"]):
            self.bad(where, f"bare `{exe}`: write `.venv/bin/{exe.rstrip('3')}` (or `\"$COMFYUI_PYTHON\"` for "
                            "ComfyUI's)")
            return
        if exe == "python3":  # python3 -m venv DIR
            return
        if exe in VENV_TOOLS:
            self.bad(where, f"bare `{exe}`: write `.venv/bin/{exe}` (README's venv, with the `{VENV_TOOLS[exe]}` "
                            "extra)")
            return
        if exe.endswith(("/python", "/python3")) or exe == "$COMFYUI_PYTHON" or exe.endswith("python.exe"):
            self.python(where, args)
        elif exe.startswith(".venv/bin/") and os.path.basename(exe) in VENV_TOOLS:
            extra = VENV_TOOLS[os.path.basename(exe)]
            if not any(r.startswith(os.path.basename(exe)) for r in pyproject()["project"]["optional-dependencies"]
                       .get(extra, [])):
                self.bad(where, f"`{exe}`: pyproject.toml's `{extra}` extra does not install it")
        elif exe.endswith("/pip"):
            self.pip(where, args)
        elif exe == "cd":
            self.cd(where, args)
        elif exe == "git":
            self.git(where, args)
        elif exe == "comfy":
            if args[:2] == ["node", "install"]:
                name = pyproject()["project"]["name"]
                if args[2:] != [name]:
                    self.bad(where, f"`comfy node install {' '.join(args[2:])}`: the Registry id is `{name}`")
        elif exe == "bash" or exe.startswith("./") or (self.repo_path(exe) and "/" in exe):
            target = args[0] if exe == "bash" else exe
            self.check_path(where, target.removeprefix("./"))
            if self.repo_path(target.removeprefix("./")) is None and self.in_repo:
                self.bad(where, f"`{target}` is not a file of the repository")
        elif exe not in ALLOWED_TOOLS:
            self.bad(where, f"`{exe}`: a command the docs test does not know; add a check for it to tests/test_docs.py")
            return
        for w in words[1:]:
            self.check_path(where, w)

    def cd(self, where: str, args: list[str]) -> None:
        target = args[0] if args else "~"
        if self.in_repo and self.repo_path(target):
            self.check_path(where, target)
        elif target in self.clones:
            self.in_repo = True
        else:
            self.in_repo = False

    def git(self, where: str, args: list[str]) -> None:
        if args[:1] != ["clone"]:
            return
        rest = [a for a in args[1:] if not a.startswith("-")]
        url = rest[0] if rest else ""
        ours = pyproject()["project"]["urls"]["Repository"]
        if "gcache" in url.lower():
            if url.rstrip("/").removesuffix(".git") != ours:
                self.bad(where, f"`git clone {url}`: the project's repository is {ours}")
            folder = rest[1] if len(rest) > 1 else url.rstrip("/").split("/")[-1].removesuffix(".git")
            self.clones.add(folder)

    def python(self, where: str, args: list[str]) -> None:
        if args[:2] == ["-m", "pip"]:
            return self.pip(where, args[2:])
        if args[:2] == ["-m", "venv"]:
            return
        if args[:2] == ["-m", "pytest"]:
            for a in args[2:]:
                if not a.startswith("-") and a not in ("no:cacheprovider",):
                    if self.repo_path(a) is None and self.in_repo:
                        self.bad(where, f"pytest `{a}`: not a test path of the repository")
            return
        if args[:1] == ["-m"] and len(args) > 1 and args[1].startswith("gcache."):
            why = parse_only(args[1], args[2:])
            if why:
                self.bad(where, why)
            return
        if args[:1] == ["-c"] and len(args) > 1:
            return self.code(where, args[1])
        if args[:1] == ["-m"]:
            self.bad(where, f"`-m {args[1] if len(args) > 1 else ''}`: not a module of this project, pip, venv or "
                            "pytest")
            return
        if args and not self.in_repo and args[0] == "main.py":  # ComfyUI's own main.py, in ComfyUI's folder
            return
        if args:
            self.check_path(where, args[0])
            if self.repo_path(args[0]) is None:
                self.bad(where, f"`{args[0]}` is not a script of the repository")

    def code(self, where: str, code: str) -> None:
        try:
            tree = ast.parse(code)
        except SyntaxError as e:
            self.bad(where, f"`-c` code does not parse: {e}")
            return
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gcache"):
                if not module_exists(node.module):
                    self.bad(where, f"`{node.module}` does not exist")
                    continue
                mod = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(mod, alias.name) and not module_exists(f"{node.module}.{alias.name}"):
                        self.bad(where, f"`{node.module}` has no `{alias.name}`")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("gcache") and not module_exists(alias.name):
                        self.bad(where, f"`{alias.name}` does not exist")

    def pip(self, where: str, args: list[str]) -> None:
        if args[:1] != ["install"]:
            self.bad(where, f"`pip {' '.join(args[:1])}`: only `pip install` is expected in the docs")
            return
        extras = pyproject()["project"].get("optional-dependencies", {})
        it = iter(args[1:])
        for a in it:
            if a == "-r":
                req = next(it, "")
                path = self.repo_path(req) if "/" in req or self.in_repo else None
                if path is None and self.in_repo and not req.startswith(("/", "../")):
                    path = req
                if path is not None and not os.path.isfile(os.path.join(REPO, path)):
                    self.bad(where, f"`-r {req}`: no such file in the repository")
            elif a == "-e":
                self.editable(where, next(it, ""), extras)
            elif a.startswith(".") and not a.startswith(".."):
                self.editable(where, a, extras)

    def editable(self, where: str, spec: str, extras: dict) -> None:
        m = re.fullmatch(r"\.(?:\[([\w,\s-]*)\])?", spec)
        if not m:
            self.bad(where, f"`{spec}`: expected `.` or `.[extra,…]` (the repository root)")
            return
        if not self.in_repo:
            self.bad(where, f"`pip install {spec}` outside the repository root")
        for name in filter(None, (e.strip() for e in (m.group(1) or "").split(","))):
            if name not in extras:
                self.bad(where, f"`{spec}`: pyproject.toml has no extra `{name}` (it has {', '.join(extras)})")


COMMAND_START = re.compile(r"^(\S*=\S*\s+)*(\.venv/bin/|\S*/bin/python|\S*/bin/pip|\"?\$COMFYUI_PYTHON\"?\s|python3?\s|"
                           r"pip3?\s|bash\s|comfy\s|git clone\s)")


def check_doc(path: str, base: str | None = None) -> list[str]:
    """Every problem of the page at `path`; its relative links resolve from `base` (default: its own folder)."""
    text = open(path, encoding="utf-8").read()
    blocks, prose = split_markdown(text, path)
    problems = []
    for b in blocks:
        if b.lang not in SHELL_LANGS:
            continue
        sh = Shell(path)
        for n, line in shell_lines(b):
            for words in simple_commands(line):
                sh.run(str(n), words)
        problems += sh.problems
    for n, span in inline_spans(prose):
        sh = Shell(path)
        if COMMAND_START.match(span):
            for words in simple_commands(span):
                sh.run(str(n), words)
        else:
            first = span.split()[0] if span.split() else ""
            sh.check_path(str(n), first)
            if re.fullmatch(r"test_\w+\.py", first) and not glob.glob(os.path.join(REPO, "tests", "**", first),
                                                                      recursive=True):
                sh.bad(str(n), f"`{first}`: no such test file under tests/")
            for mod in re.findall(r"(?<![\w/.])gcache(?:\.\w+)+", span):
                if not module_exists(mod):
                    sh.bad(str(n), f"module `{mod}` does not exist")
        problems += sh.problems
    problems += check_links(path, text, base or os.path.dirname(path))
    return list(dict.fromkeys(problems))  # a word checked twice (as a script and as a path) is reported once


# ---------------------------------------------------------------------------------------------------------------
# Links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but - and _), spaces as -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    _, prose = split_markdown(open(path, encoding="utf-8").read(), path)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", prose, re.M)}


def check_links(path: str, text: str, base: str) -> list[str]:
    _, prose = split_markdown(text, path)
    problems = []
    for n, line in enumerate(prose.split("\n"), 1):
        for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", line):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(base, file)) if file else path
            where = f"{os.path.relpath(path, REPO)}:{n}"
            if not full.startswith(REPO) or not os.path.exists(full):
                problems.append(f"{where}: link `{target}`: no such file")
            elif anchor and (not full.endswith(".md") or anchor not in anchors(full)):
                problems.append(f"{where}: link `{target}`: no heading with that anchor")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# The tests


def test_readme_is_at_most_10_kb():
    """What the writers wrote: the notes rendered under stale figures (bench/render_docs.py) don't count, or a code
    change would push README over its limit before its benches run again."""
    from gcache.bench import render_docs
    text = open(README, encoding="utf-8").read()
    text = re.sub(r"\[\^stale-[\w-]+\]", "", render_docs.STALE_BLOCK.sub("\n", text))
    text = text.replace("\n\n*Code changed since these figures were measured.*", "")
    size = len(text.encode("utf-8"))
    assert size <= README_LIMIT, f"README.md is {size} bytes; keep it ≤ {README_LIMIT} and move details to docs/"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: os.path.relpath(p, REPO))
def test_every_command_and_path_in_the_docs_exists_as_written(path):
    problems = check_doc(path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))),
                         ids=lambda p: os.path.relpath(p, REPO))
def test_every_docs_page_starts_with_what_it_is_for(path):
    text = open(path, encoding="utf-8").read()
    first = next(p for p in text.split("\n\n") if p.strip() and not p.startswith("#"))
    assert first.startswith("This page"), f"{os.path.relpath(path, REPO)}: start with what the page is for"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: os.path.relpath(p, REPO))
def test_the_docs_speak_about_the_project_not_the_machines_it_was_built_on(path):
    text = open(path, encoding="utf-8").read().lower()
    found = [w for w in TEAM_WORDS if w in text]
    assert not found, f"{os.path.relpath(path, REPO)} mentions {found}"


def test_the_checker_finds_what_does_not_exist(tmp_path):
    """The checks above can fail: a page that names a missing module, file, extra, flag or anchor, or bare python."""
    page = tmp_path / "bad.md"
    page.write_text("# Bad\n\n"
                    "```bash\n"
                    ".venv/bin/python -m gcache.bench.no_such_bench --quick\n"
                    ".venv/bin/python -m gcache.reference_model.demo --no-such-flag\n"
                    ".venv/bin/pip install -e \".[test,no_such_extra]\"\n"
                    "bash bench/no_such_script.sh\n"
                    "python -m gcache.reference_model.demo\n"
                    "ray start --head\n"
                    ".venv/bin/python -m pytest tests/test_policy.py::test_no_such_test\n"
                    "```\n\n"
                    "See `core/no_such_file.py`, `gcache.core.no_such_module`, `test_no_such_file.py`, "
                    "[x](../README.md#no-such-heading) and [y](no-such-page.md).\n",
                    encoding="utf-8")
    problems = "\n".join(check_doc(str(page), base=os.path.join(REPO, "docs")))
    for expected in ("gcache.bench.no_such_bench", "--no-such-flag", "no_such_extra", "bench/no_such_script.sh",
                     "bare `python`", "bare `ray`", "test_no_such_test", "core/no_such_file.py",
                     "gcache.core.no_such_module",
                     "test_no_such_file.py", "no-such-heading", "no-such-page.md"):
        assert expected in problems, (expected, problems)


def test_the_quick_start_command_runs_as_a_process():
    """The README's first headless command as the shell runs it: `python -m` finds the module and its main()."""
    out = subprocess.run([sys.executable, "-m", "gcache.reference_model.demo", "--help"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and "--steps" in out.stdout, out.stderr
