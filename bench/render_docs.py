"""The figures in README.md and docs/*.md, written from the stored bench results (bench/results/*.json).

    python -m gcache.bench.render_docs           # rewrite every marked region from the stored results
    python -m gcache.bench.render_docs --check   # exit 1, naming each region that differs (nothing is written)

A figure in the docs stands between two markers, which GitHub does not show:

    PSNR <!--gc:demo/policy.metrics.psnr|.2f-->41.10<!--/gc--> dB

The marker names either a value in a stored result, `<run>/<path>|<format>` (the path goes into the result the run
returned: keys separated by dots, `[key=value]` picks the item of a list that has it; `@date`, `@command`, … read
the record around it; the format is Python's, and a dict or a list of values is written as `a / b / c`), or a block
this file renders (a table, a command, a sentence with several figures): `<!--gc:few_steps.table-->`. Negative
numbers get a proper minus sign. The runs, their commands and what they need: bench/runs.py.
"""
from __future__ import annotations

import difflib
import glob
import os
import re
import sys

from . import render_blocks, store  # noqa: F401  (render_blocks registers the blocks)
from .cli import BenchParser
from .doc_text import BLOCKS, RenderError, fenced, joined, num  # noqa: F401  (RenderError: callers catch it here)

MARKER = re.compile(r"<!--gc:(?P<name>[^>]*?)-->(?P<body>.*?)<!--/gc-->", re.S)


def doc_files() -> list[str]:
    return [os.path.join(store.REPO, "README.md")] + sorted(glob.glob(os.path.join(store.REPO, "docs", "*.md")))


class Results:
    """The stored records, each loaded once; `used` collects the runs a marker read (for its stale note)."""

    def __init__(self):
        self.cache: dict = {}
        self.used: set = set()
        self._stale: dict = {}

    def record(self, name: str) -> dict:
        if name not in self.cache:
            if not os.path.exists(store.result_path(name)):
                raise RenderError(f"no stored result {name}: run `.venv/bin/python -m gcache.bench.runs {name}`")
            self.cache[name] = store.load(name)
        self.used.add(name)
        return self.cache[name]

    def stale(self, name: str) -> bool:
        """Whether the run's code changed since its result was stored. A run bench/runs.py does not register (a
        test's) and the GPU check (whose own sentence says its commit and that the code changed since) never are."""
        if name not in self._stale:
            from . import runs
            run = runs.RUNS.get(name)
            self._stale[name] = (run is not None and run.needs != "gpu"
                                 and store.staleness(self.record(name), run.sources) is not None)
        return self._stale[name]

    def __call__(self, name: str):
        return self.record(name)["result"]


# ------------------------------------------------------------------------------------------------ values
SEGMENT = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")


def lookup(data, path: str):
    """The value at `path` in data: keys split by dots, [i] an index, [k=v,k2=v2] the list item with those values."""
    for key, selector in SEGMENT.findall(path):
        if key:
            if isinstance(data, list):
                data = data[int(key)]
            elif key in data:
                data = data[key]
            else:
                raise RenderError(f"no key {key!r} in {path!r} (keys: {', '.join(map(str, data))[:200]})")
        elif re.fullmatch(r"-?\d+", selector):
            data = data[int(selector)]
        else:
            want = dict(part.split("=", 1) for part in selector.split(","))
            hits = [item for item in data if all(same(item.get(k), v) for k, v in want.items())]
            if len(hits) != 1:
                raise RenderError(f"[{selector}] in {path!r} matches {len(hits)} items, not one")
            data = hits[0]
    return data


def same(value, text: str) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return str(value) == text


def value(results: Results, expr: str) -> str:
    """`run/path|format` → text."""
    target, _, spec = expr.partition("|")
    run, _, path = target.partition("/")
    if path.startswith("@"):
        v = lookup(results.record(run), path[1:])
        if path == "@date":
            v = str(v)[:10]
    else:
        v = lookup(results(run), path)
    if isinstance(v, dict):
        return joined(v.values(), spec)
    if isinstance(v, list):
        return joined(v, spec)
    return num(v, spec)


def render_marker(results: Results, name: str) -> str:
    name = name.strip()
    if "/" in name:
        return value(results, name)
    if name.startswith("cmd."):  # the command a stored result was made by, as a shell block (no figure of it)
        command_text = results.record(name[4:])["command"]
        results.used.discard(name[4:])
        return fenced(command_text, "bash")
    if name not in BLOCKS:
        raise RenderError(f"no block named {name!r} in bench/render_docs.py")
    return BLOCKS[name](results)


# A stale result (its code changed since it ran) is still rendered, as what it is: each figure carries a footnote
# that names the commit it was measured at and says the code changed since; the notes close the page. Fixing code
# never waits for a rerun of the benches (`python -m gcache.bench.runs --refresh` reruns them when there is time).
STALE_NOTES = "stale.notes"
STALE_BLOCK = re.compile(r"\n*<!--gc:stale\.notes-->.*?<!--/gc-->\n?", re.S)


def stale_ref(run: str) -> str:
    return f"[^stale-{run.replace('_', '-').replace('.', '-')}]"


def stale_note(results: Results, run: str) -> str:
    rec = results.record(run)
    return (f"{stale_ref(run)}: Run {run}, measured on {str(rec.get('date'))[:10]} at commit "
            f"{str(rec.get('git_commit'))[:7]}; the code it measures has changed since, so its figures may be out of "
            f"date (`.venv/bin/python -m gcache.bench.runs --refresh` reruns the stale runs).")


def with_stale_refs(body: str, runs: list) -> str:
    """The rendered body with a footnote reference per stale run: after the figure, or under a table or block."""
    if not runs:
        return body
    refs = "".join(stale_ref(r) for r in runs)
    if "\n" not in body:
        return body + refs
    return body.rstrip("\n") + f"\n\n*Code changed since these figures were measured{refs}.*\n"


def render_text(text: str, results: Results, where: str = "") -> str:
    stale_runs: list = []

    def one(m: re.Match) -> str:
        results.used = set()
        try:
            body = render_marker(results, m.group("name"))
            stale = sorted(r for r in results.used if results.stale(r))
        except RenderError as e:
            raise RenderError(f"{where}: <!--gc:{m.group('name')}-->: {e}") from None
        stale_runs.extend(r for r in stale if r not in stale_runs)
        return f"<!--gc:{m.group('name')}-->{with_stale_refs(body, stale)}<!--/gc-->"
    out = MARKER.sub(one, STALE_BLOCK.sub("\n", text).rstrip("\n") + "\n")
    if stale_runs:  # the notes close the page
        notes = "\n".join(stale_note(results, r) for r in sorted(stale_runs))
        out += f"\n<!--gc:{STALE_NOTES}-->\n{notes}\n<!--/gc-->\n"
    return out


# ------------------------------------------------------------------------------------------------ pictures
def _peers_flux(results):
    from .peers_plot import draw
    return draw(results("peers"), "flux")


IMAGES = {"docs/peers_flux.png": _peers_flux}  # pictures drawn from stored results, written with the docs


def render_images(results: Results, write: bool) -> list[str]:
    """Draw each picture from its stored result; returns the files whose pixels differed (rewritten when write)."""
    from PIL import Image, ImageChops
    changed = []
    for rel, draw in IMAGES.items():
        path = os.path.join(store.REPO, rel)
        img = draw(results)
        if os.path.exists(path):
            with Image.open(path) as old:
                if old.size == img.size and ImageChops.difference(old.convert("RGB"), img).getbbox() is None:
                    continue
        changed.append(path)
        if write:
            img.save(path, optimize=True)
    return changed


# ------------------------------------------------------------------------------------------------ the command
def render_all(write: bool) -> list[str]:
    """Render every doc and picture; returns those that differed (and, when write, were rewritten)."""
    results, changed, rendered = Results(), [], []
    for path in doc_files():  # every doc rendered before any is written: a failing block writes nothing
        with open(path, encoding="utf-8") as f:
            text = f.read()
        rendered.append((path, text, render_text(text, results, os.path.relpath(path, store.REPO))))
    changed += render_images(results, write)
    for path, text, new in rendered:
        if new != text:
            changed.append(path)
            if write:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
            else:
                diff = difflib.unified_diff(text.splitlines(), new.splitlines(), os.path.relpath(path, store.REPO),
                                            "rendered", n=0, lineterm="")
                print("\n".join(list(diff)[:40]))
    return changed


def main(argv=None) -> int:
    ap = BenchParser("gcache.bench.render_docs", __doc__)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a doc differs from its rendering")
    a = ap.parse_args(argv)
    try:
        changed = render_all(write=not a.check)
    except RenderError as e:
        print(f"python -m gcache.bench.render_docs: error: {e}", file=sys.stderr)
        return 2
    names = ", ".join(os.path.relpath(p, store.REPO) for p in changed)
    if a.check:
        if changed:
            print(f"{names}: the figures differ from the stored results; run .venv/bin/python -m "
                  "gcache.bench.render_docs to write them")
            return 1
        print("every figure in README.md and docs/ is its stored result's rendering")
        return 0
    print(f"rewrote {names}" if changed else "nothing to rewrite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
