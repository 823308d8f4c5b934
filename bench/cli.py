"""What every bench/ command shares: an argument parser whose errors are one line, argument types that check their
values, the check of COMFYUI_PATH, and progress lines for the long benches.

A bad command ends before any work in one line on stderr, `python -m gcache.bench.<name>: error: <what to do>`,
exit code 2 and no traceback; so does a GCacheError raised later in a run.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Callable, Iterator, Optional

EXIT_ERROR = 2
PLACEHOLDER_PREFIX = "/path/to/"  # how the docs write a folder the reader fills in


@contextlib.contextmanager
def own_inductor_cache() -> Iterator[None]:
    """torch.profiler starts inductor's cache, which otherwise stays behind as <temp>/torchinductor_<user>: a folder
    of its own for the duration, removed afterwards (unless the user named one)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        yield
        return
    folder = tempfile.mkdtemp(prefix="gcache-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        yield
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        shutil.rmtree(folder, ignore_errors=True)


def one_line(text) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


class BenchParser(argparse.ArgumentParser):
    """argparse, with its errors (and the checks below) as one line and exit code 2."""

    def __init__(self, module: str, doc: Optional[str], **kw):
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(prog=f"python -m {module}", description=doc, **kw)

    def error(self, message):
        self.exit(EXIT_ERROR, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def whole(least: int = 1) -> Callable[[str], int]:
    """An argparse type: a whole number ≥ least."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value
    parse.__name__ = f"whole number >= {least}"
    return parse


def number(low: float = -math.inf, high: float = math.inf, open_low: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] ((low, high] with open_low)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value > high or (value <= low if open_low else value < low):
            raise argparse.ArgumentTypeError(f"{text} is outside {'(' if open_low else '['}{low:g}, {high:g}]")
        return value
    parse.__name__ = "number"
    return parse


def seeds(text: str) -> list:
    """An argparse type: a seed list, '0-15' or '1,2,3' (search/infra/cli.py parse_seeds)."""
    from ..core.errors import GCacheError
    from ..search.infra.cli import parse_seeds
    try:
        return parse_seeds(text, "the seed list")
    except GCacheError as e:
        raise argparse.ArgumentTypeError(one_line(e)) from None


def seed_text(text: str) -> str:
    """An argparse type that checks a seed list and keeps its text (the benches parse it again themselves)."""
    seeds(text)
    return text


def comfyui_problem(path: Optional[str]) -> Optional[str]:
    """Why COMFYUI_PATH does not name a ComfyUI folder (None: it does)."""
    if not path:
        return "COMFYUI_PATH is not set: set it to your ComfyUI folder (the one with main.py and comfy/)"
    if path.startswith(PLACEHOLDER_PREFIX):
        return (f"COMFYUI_PATH={path} is the docs' placeholder: set it to your ComfyUI folder (the one with main.py "
                "and comfy/)")
    if not os.path.isdir(path):
        return f"COMFYUI_PATH={path} does not exist: set it to your ComfyUI folder (the one with main.py and comfy/)"
    missing = [p for p in ("main.py", "nodes.py", "comfy") if not os.path.exists(os.path.join(path, p))]
    if missing:
        return (f"COMFYUI_PATH={path} is no ComfyUI folder (it has no {', '.join(missing)}): set it to the folder "
                "with main.py and comfy/")
    return None


def require_comfyui(ap: BenchParser) -> str:
    """COMFYUI_PATH, checked before any work (ap.error otherwise)."""
    path = os.environ.get("COMFYUI_PATH")
    why = comfyui_problem(path)
    if why:
        ap.error(why)
    return path


def check_optional_comfyui(ap: BenchParser) -> Optional[str]:
    """COMFYUI_PATH when it is set (checked), else None."""
    return require_comfyui(ap) if os.environ.get("COMFYUI_PATH") else None


def require_module(ap: BenchParser, module: str, what: str, install: str) -> None:
    """ap.error naming the install command when `module` cannot be imported."""
    import importlib
    try:
        importlib.import_module(module)
    except ImportError:
        ap.error(f"{what} needs {module}, which is not installed in this Python ({sys.executable}): {install}")


def run_main(main: Callable[[], object], module: str) -> int:
    """The exit code of a bench run as a command: 0, or 2 with one line for a GCacheError; a main() that returns an
    int (a command that reports its own errors, e.g. through search/infra/cli.py run_command) gives that."""
    from ..core.errors import GCacheError
    try:
        code = main()
    except GCacheError as e:
        print(f"python -m {module}: error: {one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """One line per unit of work: `[3/15] 1:02 elapsed, about 4:08 left: <what was done>`, flushed. The first line
    says how many units and the expected total (the bench's own estimate until units have been timed)."""

    def __init__(self, total: int, what: str, expected_s: Optional[float] = None, stream=None):
        self.total, self.done, self.t0 = max(1, total), 0, time.monotonic()
        self.stream = stream or sys.stdout
        about = f", about {clock(expected_s)} on one CPU core" if expected_s else ""
        print(f"{what}: {total} units of work{about}", file=self.stream, flush=True)

    def step(self, message: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.t0
        left = elapsed / self.done * (self.total - self.done)
        print(f"[{self.done}/{self.total}] {clock(elapsed)} elapsed, about {clock(left)} left: {message}",
              file=self.stream, flush=True)
