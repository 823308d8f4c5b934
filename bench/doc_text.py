"""How a figure is written in the docs, and the registry of the blocks bench/render_blocks.py renders: what both
bench/render_docs.py (the markers, the pages) and bench/render_blocks.py (the blocks) use, so that neither imports
the other's caller.
"""
from __future__ import annotations

from typing import Callable

BLOCKS: dict[str, Callable] = {}


class RenderError(Exception):
    pass


def num(value, spec: str = "") -> str:
    """A number in the docs' style: Python's format, with a minus sign (−) rather than a hyphen."""
    if isinstance(value, str):
        return value
    text = format(value, spec) if spec else str(value)
    return text.replace("-", "−") if not text.startswith(("e", "E")) else text


def joined(values, spec: str = "", sep: str = " / ") -> str:
    return sep.join(num(v, spec) for v in values)


def block(name: str):
    def register(fn):
        BLOCKS[name] = fn
        return fn
    return register



def table(header: list, rows: list) -> str:
    """A markdown table as a block (blank-line separated from the markers)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n" + "\n".join(lines) + "\n"


def fenced(text: str, lang: str = "") -> str:
    return f"\n```{lang}\n{text}\n```\n"


def db(v, spec: str = ".2f") -> str:
    return "—" if v is None else num(v, spec)
