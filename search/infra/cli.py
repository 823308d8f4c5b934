"""What the command-line tools share (the reference model's demo, search and cluster commands, bench/): seed lists,
thread pinning, and the checks of their arguments.

A command checks its arguments before any model loads or any sampling starts, and names every problem at once, cheap
ones (K, steps, seeds, the output folder) before what it needs installed or downloaded (packages, LPIPS' backbone,
Ray). A bad command, and a GCacheError later in a run, end in one line on stderr, `<prog>: error: <what is wrong and
what to do>`, with exit code 2, no traceback, and nothing written.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Callable

from ...core.errors import GCacheError
from .ray_executor import message as worker_message  # imports no Ray

EXIT_ERROR = 2  # argparse's exit code for a bad command line; the commands use it for every GCacheError
MIN_STEPS = 2   # with one step there is nothing to skip (step 0 always computes); GCache Search's widget says 2 too


def parse_seeds(text: str, flag: str = "seeds") -> list[int]:
    """'0-15' or '1,2,3' → list of ints: at least one, each once."""
    try:
        if "-" in text:
            a, b = text.split("-", 1)
            seeds = list(range(int(a), int(b) + 1))
        else:
            seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise GCacheError(f"{flag} must look like '0-15' or '1,2,3', got {text!r}.") from None
    if not seeds:
        raise GCacheError(f"{flag} {text!r} names no seed: give at least one, as '0-15' (first-last) or '1,2,3'.")
    if len(set(seeds)) != len(seeds):
        raise GCacheError(f"{flag} {text!r} names a seed twice: name each seed once.")
    return seeds


def forecast_choices() -> tuple[str, ...]:
    """What a command's --forecast accepts: every registered forecaster, and the old orders 0/1/2."""
    from ...core import forecasters
    return (*forecasters.names(), "0", "1", "2")


def forecaster_of(text: str) -> str:
    """A forecaster's name from --forecast (a name, or an old order 0/1/2)."""
    from ...core import forecasters
    return forecasters.canonical(int(text) if text.isdigit() else text)


def set_threads(n: int) -> None:
    """Pin every thread pool (torch, BLAS): on a busy 2-core machine 2 threads collapse 10-100x."""
    import torch
    from threadpoolctl import threadpool_limits
    torch.set_num_threads(n)
    threadpool_limits(n)


def command_name(module: str) -> str:
    """How a user runs the command of `module` (its __spec__.name, also when it runs as __main__)."""
    return f"python -m {module}"


def one_line(text) -> str:
    """A message as one line (requirements' install command stands on a line of its own in ComfyUI's log)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


class ArgumentParser(argparse.ArgumentParser):
    """argparse's own errors (a value that is no number, an unknown flag) as the one line every error is."""

    def error(self, message):
        self.exit(EXIT_ERROR, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def run_command(prog: str, body: Callable[[], int]) -> int:
    """body()'s exit code; a GCacheError (bad input, a missing package, a failed evaluation) becomes one line on
    stderr and EXIT_ERROR. A Ray worker's error shows its own message, not Ray's wrapper with the remote traceback."""
    try:
        return body()
    except GCacheError as e:
        print(f"{prog}: error: {one_line(worker_message(e))}", file=sys.stderr)
        return EXIT_ERROR


class Problems:
    """What is wrong with a command's arguments, collected so that one message names all of it."""

    def __init__(self):
        self.messages: list[str] = []

    def check(self, fn: Callable, *args, **kwargs):
        """fn(*args, **kwargs), or None after noting the GCacheError it raised."""
        try:
            return fn(*args, **kwargs)
        except GCacheError as e:
            self.messages.append(one_line(e))
            return None

    def require(self, ok: bool, message: str) -> bool:
        if not ok:
            self.messages.append(message)
        return ok

    def raise_any(self) -> None:
        if self.messages:
            raise GCacheError(" ".join(self.messages))


def check_steps(problems: Problems, steps: int, flag: str = "--steps") -> bool:
    return problems.require(steps >= MIN_STEPS, f"{flag} {steps}: a run needs at least {MIN_STEPS} sampler steps "
                                                "(step 0 always computes; with one step nothing can be skipped).")


def check_at_least(problems: Problems, flag: str, value, least, what: str) -> bool:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and value >= least
    return problems.require(ok, f"{flag} {value}: {what} must be at least {least}.")


def check_out_folder(path: str, flag: str = "--out") -> None:
    """Raises unless `path` is a folder this process can write, or one it can make; makes nothing."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise GCacheError(f"{flag} {path} is a file, not a folder: name a folder (a missing one is made).")
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise GCacheError(f"{flag} {path}: this folder cannot be written (permissions): name another folder.")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise GCacheError(f"{flag} {path} cannot be made: {parent} is a file, not a folder. Name another folder.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GCacheError(f"{flag} {path} cannot be made: {parent} cannot be written (permissions). Name a folder "
                          "you can write.")


def make_out_folder(path: str, flag: str = "--out") -> None:
    """Made once every check has passed, before the work starts (a failure now says so, not after the work)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise GCacheError(f"{flag} {path} cannot be made ({e}): name another folder.") from None
