"""Stored bench results: bench/results/<name>.json, one file per registered run (bench/runs.py).

Each file holds what a bench command returned (its JSON line, or what bench/runs.py collected from its output), the
command that made it, when and where, and a hash of the code the figures depend on: the source files the run
declares (bench/runs.py). The docs are rendered from these files (bench/render_docs.py), and a test fails when a
file's hash differs from today's sources (the figures are older than the code they measure).

The hash covers code, not prose: a .py file is hashed as its syntax tree without docstrings (a comment or a
docstring changes no figure), any other file (the reference model's weights) byte for byte.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import subprocess
import time
from typing import Iterable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
RESULTS_DIR = os.path.join(REPO, "bench", "results")
SOURCE_SUFFIXES = (".py", ".safetensors")  # what a declared folder contributes
FORMAT = 1


def result_path(name: str) -> str:
    return os.path.join(RESULTS_DIR, f"{name}.json")


def expand_sources(declared: Iterable[str], root: str = REPO) -> list[str]:
    """The files a run's declared sources name (repository-relative; a folder names every .py and .safetensors file
    under it, caches left out), sorted. A declared path that does not exist raises FileNotFoundError."""
    files = set()
    for path in declared:
        full = os.path.join(root, path)
        if os.path.isfile(full):
            files.add(path.replace(os.sep, "/"))
        elif os.path.isdir(full):
            for folder, dirs, names in os.walk(full):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                files.update(os.path.relpath(os.path.join(folder, n), root).replace(os.sep, "/")
                             for n in names if n.endswith(SOURCE_SUFFIXES))
        else:
            raise FileNotFoundError(f"declared source {path} does not exist")
    return sorted(files)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def file_hash(data: bytes, path: str) -> str:
    """sha256 of a source file's code: a .py file's syntax tree without docstrings (so prose edits keep results
    fresh), any other file's bytes. A .py file that does not parse is hashed as bytes."""
    if path.endswith(".py"):
        try:
            data = ast.dump(_without_docstrings(ast.parse(data.decode("utf-8"))), include_attributes=False).encode()
        except (SyntaxError, UnicodeDecodeError, ValueError):
            pass
    return hashlib.sha256(data).hexdigest()


def sources_hash(declared: Iterable[str], root: str = REPO) -> tuple[str, dict]:
    """(the hash of every file the declared sources name, {file: its hash}) in the tree at `root`."""
    per_file = {}
    for f in expand_sources(declared, root):
        with open(os.path.join(root, f), "rb") as fh:
            per_file[f] = file_hash(fh.read(), f)
    return combine(per_file), per_file


def sources_hash_at(commit: str, declared: Iterable[str]) -> tuple[str, dict]:
    """sources_hash of the tree at a git commit (a result made elsewhere, at that commit)."""
    listed = git("ls-tree", "-r", "--name-only", commit, "--", *declared)
    if listed is None:
        raise FileNotFoundError(f"git cannot list the sources at {commit}")
    files = [f for f in listed.splitlines() if f.endswith(SOURCE_SUFFIXES) and "__pycache__" not in f]
    per_file = {}
    for f in sorted(files):
        data = subprocess.run(["git", "-C", REPO, "show", f"{commit}:{f}"], capture_output=True, timeout=60).stdout
        per_file[f] = file_hash(data, f)
    return combine(per_file), per_file


def combine(per_file: dict) -> str:
    return hashlib.sha256("".join(f"{f}\0{h}\n" for f, h in sorted(per_file.items())).encode()).hexdigest()


def git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def machine() -> dict:
    """Where a run ran: what timings depend on (quality figures do not)."""
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    try:
        import torch
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(v, 2) for v in os.getloadavg()]
    return info


def write(name: str, command: str, result, declared: Iterable[str], wall_s: Optional[float] = None,
          extra: Optional[dict] = None, commit: Optional[str] = None) -> str:
    """Store one run's result; returns the file's path. The sources are hashed as they are now, or as they were at
    `commit` (a result made elsewhere: the GPU check's output folder); the machine is this one unless `extra` says
    otherwise."""
    declared = list(declared)
    if commit:
        total, per_file = sources_hash_at(commit, declared)
        changed = ""
    else:
        total, per_file = sources_hash(declared)
        changed = git("status", "--porcelain", "--", *declared)
    record = {"format": FORMAT, "name": name, "command": command, "date": time.strftime("%Y-%m-%d %H:%M %Z"),
              "git_commit": git("rev-parse", commit or "HEAD"), "sources_changed_since_commit": bool(changed),
              "sources": declared, "sources_hash": total, "source_files": per_file,
              "machine": None if commit else machine(),
              "wall_s": None if wall_s is None else round(wall_s, 1), **(extra or {}), "result": result}
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = result_path(name)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def load(name: str) -> dict:
    with open(result_path(name), encoding="utf-8") as f:
        return json.load(f)


def staleness(record: dict, declared: Iterable[str], root: Optional[str] = None) -> Optional[str]:
    """Why a stored record no longer describes today's code (None: it does): sources declared otherwise, a source
    changed, or figures that were typed rather than measured by the pipeline."""
    declared = list(declared)
    if record.get("transcribed"):
        return f"its figures were typed into the docs before results were stored ({record['transcribed']})"
    if record.get("sources") != declared:
        return f"the run now declares the sources {declared}, the stored result {record.get('sources')}"
    try:
        total, per_file = sources_hash(declared, root or REPO)
    except FileNotFoundError as e:
        return str(e)
    if total == record.get("sources_hash"):
        return None
    old = record.get("source_files", {})
    changed = sorted(f for f in set(old) | set(per_file) if old.get(f) != per_file.get(f))
    return "changed since it ran: " + ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8
                                                                  else "")
