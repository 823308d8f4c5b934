"""A fresh clone does what README says.

- Nothing machine-local is tracked: no symlink (a `.venv` link once made README's `python3 -m venv .venv` fail), and
  no file that names an absolute path of the machine it was made on (a link's target, a path in a committed result).
  Negative controls: a repository made here with such files, and the commit before the fix when history has it.
- CI runs README's quick start as written (`.ci/readme_quickstart`, called by `.ci/run`): the commands it reads are
  README's, in order; a quick start that fails, as on a tracked `.venv`, fails it; one that works passes in a clone.
- A docs command's output folder is one git ignores, so following the docs leaves `git status` clean.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(REPO, ".ci", "readme_quickstart")
BEFORE_THE_FIX = "b3b90d4"  # main when a tracked .venv link broke README's first command
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(*args, cwd=REPO, binary=False):
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True, timeout=120,
                         env={**os.environ, **GIT_ENV}).stdout
    return out if binary else out.decode()


def machine_roots() -> list[str]:
    """Absolute folders that are this machine's and no one else's: the workplace's roots, the home folder, the temp
    folder, and the folder the clone lies in."""
    roots = {"/work", "/root", os.path.expanduser("~"), tempfile.gettempdir(), os.path.dirname(REPO)}
    return sorted(r.rstrip("/") for r in roots if r and r.rstrip("/") not in ("", "/", "/usr", "/home"))


def machine_paths(text: str, roots: list[str]) -> list[str]:
    pattern = re.compile(r"(?<![\w.~-])(?:" + "|".join(re.escape(r) for r in roots) + r")/[\w.-]+")
    return pattern.findall(text)


def problems(rev, cwd: str = REPO) -> list[str]:
    """What is machine-local in the tree of `rev` (None: the files git tracks, as they are in the work tree):
    symlinks, and files naming a machine path."""
    roots, out = machine_roots(), []
    if rev is None:
        entries = [e.split(" ", 1)[0] + " blob -\t" + e.split("\t", 1)[1]
                   for e in git("ls-files", "-s", "-z", cwd=cwd).split("\0") if e]
    else:
        entries = git("ls-tree", "-r", "-z", rev, cwd=cwd).split("\0")
    for entry in filter(None, entries):
        meta, path = entry.split("\t", 1)
        mode, _, blob = meta.split()
        full = os.path.join(cwd, path)
        if mode == "120000" or (rev is None and os.path.islink(full)):
            target = git("cat-file", "blob", blob, cwd=cwd) if rev else os.readlink(full)
            out.append(f"{path}: a tracked symlink (to {target}); git tracks no link: ignore it instead")
            continue
        if rev is None and not os.path.exists(full):  # deleted in the work tree, not yet in the index
            continue
        data = open(full, "rb").read() if rev is None else git("cat-file", "blob", blob, cwd=cwd, binary=True)
        if b"\0" in data[:8000]:  # binary (weights, images)
            continue
        found = machine_paths(data.decode(errors="replace"), roots)
        if found:
            out.append(f"{path}: names this machine's path {found[0]}" + (f" and {len(found) - 1} more"
                                                                          if len(found) > 1 else ""))
    return out


def test_nothing_machine_local_is_tracked():
    found = problems(None)
    assert not found, "machine-local files in git:\n" + "\n".join(found)
    # what a commit that isn't made yet would add
    status = git("status", "--porcelain", "-z").split("\0")
    links = [e[3:] for e in status if e[:2] in ("A ", "??") and os.path.islink(os.path.join(REPO, e[3:]))]
    assert not links, f"symlinks about to be tracked: {links}"


def test_the_check_finds_a_link_and_a_machine_path(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    os.symlink(os.path.join(tempfile.gettempdir(), "venv"), repo / ".venv")
    local = "/" + "work/comfyui-0.33.0"  # in two parts, so that this file names no machine path itself
    (repo / "result.json").write_text(f'{{"path": "{local}", "ok": "/srv/ComfyUI/models"}}\n')
    (repo / "clean.md").write_text("README's `.venv/bin/python`, ../shared/comfyui, /path/to/ComfyUI\n")
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "x", cwd=repo)
    found = problems("HEAD", cwd=str(repo))
    assert len(found) == 2, found
    assert found[0].startswith(".venv: a tracked symlink") and found[1].startswith(f"result.json: names this "
                                                                                  f"machine's path {local}")


def test_the_commit_before_the_fix_fails_the_check():
    try:
        git("cat-file", "-e", f"{BEFORE_THE_FIX}^{{commit}}")
    except subprocess.CalledProcessError:
        pytest.skip(f"this clone's history has no {BEFORE_THE_FIX} (a shallow clone)")
    assert any(p.startswith(".venv: a tracked symlink") for p in problems(BEFORE_THE_FIX))


# ------------------------------------------------------------------------------------------------ README's quick start
def quickstart(repo, folder, *check):
    return subprocess.run(["bash", QUICKSTART, str(repo), str(folder), *check], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **GIT_ENV})


def test_ci_runs_readmes_quick_start_as_written():
    printed = subprocess.run(["bash", QUICKSTART, REPO, "--print"], capture_output=True, text=True, check=True,
                             timeout=60).stdout.splitlines()
    assert printed == ["python3 -m venv .venv", '.venv/bin/pip install -e ".[test]"',
                       ".venv/bin/python -m gcache.reference_model.demo", ".venv/bin/python -m pytest -q"]
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    for line in printed:  # each inside a fenced block of README, as a user copies it
        assert f"\n{line}\n" in readme
    ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
    first = ci.index("\n.ci/readme_quickstart")  # the command, not the comment that names it
    assert "set -euo pipefail" in ci[:first] and "-m pytest" not in ci[:first], \
        ".ci/run must run README's quick start first, and stop when it fails"


def _repo_with_quickstart(tmp_path, commands: list[str], venv_link: bool) -> str:
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)
    git("init", "-q", cwd=repo)
    block = "\n".join(commands)
    (repo / "README.md").write_text(f"# x\n\n<!--quickstart-->\n```bash\n{block}\n```\n<!--/quickstart-->\n")
    if venv_link:
        os.symlink("/nonexistent/venv", repo / ".venv")
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "x", cwd=repo)
    return str(repo)


@pytest.mark.skipif(shutil.which("python3") is None, reason="README's first command needs python3 on PATH")
def test_the_quick_start_fails_on_a_tracked_venv_and_passes_without_it(tmp_path):
    commands = ["python3 -m venv --without-pip .venv", ".venv/bin/python -c \"open('ran', 'w').write('yes')\""]
    broken = quickstart(_repo_with_quickstart(tmp_path / "a", commands, venv_link=True), tmp_path / "out-a")
    assert broken.returncode != 0
    assert "README's quick start failed: `python3 -m venv --without-pip .venv`" in broken.stdout
    fine = quickstart(_repo_with_quickstart(tmp_path / "b", commands, venv_link=False), tmp_path / "out-b")
    assert fine.returncode == 0, fine.stdout + fine.stderr
    assert (tmp_path / "out-b" / "clone" / "ran").read_text() == "yes"  # ran in the fresh clone, in order


def test_ci_lints_in_the_quick_starts_venv_right_after_its_set_up(tmp_path):
    """.ci/run hands the lint to the quick start, which runs it after the first command that pip-installs and before
    the rest (the demo, the suite): a lint error fails CI in its first minutes. The lint is ruff as pyproject.toml
    pins it in the `test` extra the quick start installs, with the project's line length."""
    import tomllib
    ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
    assert '\n.ci/readme_quickstart "$REPO" "$QUICK" ".venv/bin/ruff check ."\n' in ci
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert re.fullmatch(r"ruff==[\d.]+", next(r for r in project["project"]["optional-dependencies"]["test"]
                                               if r.startswith("ruff")))
    assert project["tool"]["ruff"]["line-length"] == 120 and {"E", "F", "I"} <= set(project["tool"]["ruff"]["lint"]
                                                                                   ["select"])
    commands = ["echo set-up > log", "echo pip install >> log", "echo demo >> log"]
    ok = quickstart(_repo_with_quickstart(tmp_path / "a", commands, venv_link=False), tmp_path / "out-a",
                    "echo lint >> log")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (tmp_path / "out-a" / "clone" / "log").read_text().split() == ["set-up", "pip", "install", "lint", "demo"]
    failing = quickstart(_repo_with_quickstart(tmp_path / "b", commands, venv_link=False), tmp_path / "out-b",
                         "exit 3")
    assert failing.returncode == 1 and "`exit 3` (after the quick start's set-up) exited with 3" in failing.stdout
    assert "demo" not in (tmp_path / "out-b" / "clone" / "log").read_text()
    never = quickstart(_repo_with_quickstart(tmp_path / "c", ["echo demo"], venv_link=False), tmp_path / "out-c",
                       "echo lint")
    assert never.returncode == 1 and "did not run" in never.stdout


def test_a_readme_without_a_quick_start_fails(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("# x\n```bash\necho hi\n```\n")
    res = quickstart(repo, tmp_path / "out")
    assert res.returncode == 1 and "no quick-start block" in res.stdout


# ------------------------------------------------------------------------------------------------ docs' output folders
def test_every_output_folder_the_docs_name_is_ignored():
    from test_docs import doc_files
    folders = set()
    for path in doc_files():
        folders |= set(re.findall(r"--out\s+([\w./-]+)", open(path, encoding="utf-8").read()))
    assert folders
    for folder in sorted(folders):
        res = subprocess.run(["git", "check-ignore", "-q", f"{folder}/x"], cwd=REPO, timeout=60)
        assert res.returncode == 0, f"the docs write into {folder}/, which git does not ignore: add /{folder}/ to " \
                                    ".gitignore"
