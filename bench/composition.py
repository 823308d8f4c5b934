"""How far GCache beside another node (X) lands from that node alone: the figures of docs/works-with.md's "Nodes that
share GCache's block slots or call the model again".

Tiny Flux and Wan from ComfyUI's own classes (random weights; tests/comfyui/tiny_models.py), 6 euler steps, cfg 3,
GCache Apply with the policy 101001 connected. X is each of the nodes tests/comfyui/test_composition.py composes with
GCache, applied as it applies them (tests/comfyui/composition_cases.py): SkipLayerGuidanceDiT and ...Simple on the
stack's first, a middle and the last block, SkipLayerGuidanceDiT on 30-80 % of the steps, PerpNegGuider and
DualCFGGuider, CFGZeroStar and APG, and another node's block patch in the slot of the first, a middle and the last
block; and on a tiny Lumina2 (whose blocks GCache patches as objects) another node's object patch of the first or
the last block after GCache. For each, the relative L2 distance of the final latents (same seed and mask):

- GCache + X against plain + X, and its ratio to GCache against plain (the test's rule: at most 3);
- X against plain (what X itself changes);
- whether the node orders give bit-identical latents (X then GCache Apply, GCache Apply then X; for the block patch
  also after GCache calling through GCache's own patch). The guiders take the model, so they have one order.

    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.bench.composition [--comfyui 0.33.0]   # under a minute on one core

COMFYUI_PATH names a ComfyUI folder (the one with main.py; 0.3.64 or 0.33.0) whose requirements this venv has (see
docs/development.md); the bench checks it, and with --comfyui its version, before any work. The figures depend on
the code (and the ComfyUI version) only.

Ends with one JSON line.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile

from .cli import BenchParser, Progress, require_comfyui, run_main

FAMILIES = ("flux", "wan", "lumina2")  # lumina2: only the object patch (its blocks have no dit slot)
FACTOR = 3.0  # tests/comfyui/test_composition.py's rule: GCache + X within 3 × GCache's own distance
PLACES = ("first", "middle", "last")
EXPECTED_S = {"flux": 12.0, "wan": 12.0, "lumina2": 2.0}  # seconds on one CPU core


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.composition", __doc__)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--comfyui", metavar="VERSION", help="stop before any work unless COMFYUI_PATH holds this ComfyUI "
                                                         "version (bench/runs.py stores a result per version)")
    a = ap.parse_args(argv)
    path = require_comfyui(ap)
    version = comfyui_version(path)
    if a.comfyui and version != a.comfyui:
        ap.error(f"--comfyui {a.comfyui}: COMFYUI_PATH={path} holds ComfyUI {version or 'of no known version'}; set "
                 f"COMFYUI_PATH to a ComfyUI {a.comfyui} folder")
    sys.path.insert(0, path)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "comfyui"))
    import comfy.cli_args
    import torch
    comfy.cli_args.args.cpu = not torch.cuda.is_available()
    torch.set_num_threads(1)
    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False  # a bar per sampling run would bury the bench's own progress lines
    import composition_cases as cc
    import tiny_models as tm

    out = {"comfyui": version, "N": cc.N, "mask": "".join(map(str, cc.MASK)), "cfg": cc.CFG,
           "factor": FACTOR, "gcache_vs_plain": {}, "rows": []}
    progress = Progress(sum(1 + len(cases(cc, fam)) for fam in a.families), "composition: runs of GCache beside X",
                        expected_s=sum(EXPECTED_S[fam] for fam in a.families))
    with tempfile.TemporaryDirectory(prefix="gcache-composition-") as files:  # the tiny Wan's file, removed at the end
        for fam in a.families:
            m, pos, neg, lat = tm.wan(files) if fam == "wan" else getattr(tm, fam)()
            b = dict(m=m, pos=pos, neg=neg, lat=lat)
            plain = cc.ksample(m, pos, neg, lat)
            base = cc.rel(cc.ksample(cc.gcache(m), pos, neg, lat), plain)
            out["gcache_vs_plain"][fam] = figure(base)
            progress.step(f"{fam}: GCache vs plain {base:.4f}")
            for x, where, run in cases(cc, fam):
                latents = run(b)
                with_x, with_gcache = latents[0], latents[1]
                d = cc.rel(with_gcache, with_x)
                orders = None if len(latents) == 2 else \
                    "identical" if all(torch.equal(with_gcache, o) for o in latents[2:]) else "differ"
                row = {"family": fam, "x": x, "where": where, "gcache_x_vs_plain_x": figure(d),
                       "ratio": figure(d / base) if base else None, "x_vs_plain": figure(cc.rel(with_x, plain)),
                       "orders": orders}
                out["rows"].append(row)
                progress.step(f"{fam} {x}{' ' + where if where else ''}: GCache + X vs plain + X {d:.4f} "
                              f"({times(row['ratio'])} GCache vs plain), X vs plain {row['x_vs_plain']:.4f}"
                              + (f", orders {orders}" if orders else ""))
    print(table(out))
    print(json.dumps(out))
    return out


def figure(x: float) -> float:
    """A distance or ratio as stored: 4 significant digits (the docs show 4 decimals of distances near 0.005)."""
    return float(f"{x:.4g}")


def times(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.2f} ×"


def comfyui_version(path: str) -> str:
    """The version a ComfyUI folder's comfyui_version.py names ("" when it names none), read without importing it."""
    try:
        with open(os.path.join(path, "comfyui_version.py"), encoding="utf-8") as f:
            found = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", f.read(), re.M)
    except OSError:
        return ""
    return found.group(1) if found else ""


def cases(cc, fam) -> list:
    """(X, where, run): run(b) samples plain + X, then GCache + X in each node order (the first order first)."""
    def node_orders(x):
        return lambda b: [cc.ksample(x(b["m"]), b["pos"], b["neg"], b["lat"]),
                          cc.ksample(cc.gcache(x(b["m"])), b["pos"], b["neg"], b["lat"]),   # X, then GCache Apply
                          cc.ksample(x(cc.gcache(b["m"])), b["pos"], b["neg"], b["lat"])]   # GCache Apply, then X

    def guider(kind):
        return lambda b: [cc.guided(fam, b["m"], b, kind), cc.guided(fam, cc.gcache(b["m"]), b, kind)]

    def block_patch(key):
        def run(b):
            m, pos, neg, lat = b["m"], b["pos"], b["neg"], b["lat"]
            g = cc.gcache(m)
            ours = g.model_options["transformer_options"]["patches_replace"]["dit"][key]
            return [cc.ksample(cc.with_patch(m, key, cc.counting_patch([])), pos, neg, lat),
                    cc.ksample(cc.gcache(cc.with_patch(m, key, cc.counting_patch([]))), pos, neg, lat),  # before
                    cc.ksample(cc.with_patch(g, key, cc.counting_patch([])), pos, neg, lat),             # after
                    cc.ksample(cc.with_patch(g, key, cc.counting_patch([], ours)), pos, neg, lat)]       # chaining
        return run

    def object_patch_after(where):  # GCache can't wrap an object patch per call: the calls that miss its gate compute
        return lambda b: [cc.ksample(cc.object_patched(b["m"], where, []), b["pos"], b["neg"], b["lat"]),
                          cc.ksample(cc.object_patched(cc.gcache(b["m"]), where, []), b["pos"], b["neg"], b["lat"])]

    if fam == "lumina2":
        return [("another node's object patch after GCache", where, object_patch_after(where))
                for where in ("first", "last")]
    out = [(node, where, node_orders(cc.slg(node, *cc.LAYERS[fam][where])))
           for node in ("SkipLayerGuidanceDiT", "SkipLayerGuidanceDiTSimple") for where in PLACES]
    out.append(("SkipLayerGuidanceDiT 30-80 %", "middle",
                node_orders(cc.slg("SkipLayerGuidanceDiT", *cc.LAYERS[fam]["middle"], start=0.3, end=0.8))))
    out += [(kind, None, guider(kind)) for kind in ("PerpNegGuider", "DualCFGGuider")]
    out += [(kind, None, node_orders(cc.cfg_node(kind))) for kind in ("CFGZeroStar", "APG")]
    out += [("another node's block patch", where, block_patch(cc.SLOT[fam][where])) for where in PLACES]
    return out


def table(out: dict) -> str:
    lines = [f"ComfyUI {out['comfyui']}, N = {out['N']}, mask {out['mask']}, cfg {out['cfg']:g}: relative L2 distance "
             "of the final latents",
             f"{'family':7} {'X':50} {'GCache vs plain':>15} {'GCache+X vs plain+X':>20} {'ratio':>8} "
             f"{'X vs plain':>10} orders"]
    for r in out["rows"]:
        name = r["x"] + (f" {r['where']}" if r["where"] else "")
        lines.append(f"{r['family']:7} {name:50} {out['gcache_vs_plain'][r['family']]:15.4f} "
                     f"{r['gcache_x_vs_plain_x']:20.4f} {times(r['ratio']):>8} {r['x_vs_plain']:10.4f} "
                     f"{r['orders'] or '-'}")
    worst = max(out["rows"], key=lambda r: r["ratio"] or 0)
    lines.append(f"largest ratio {worst['ratio']:.2f} ({worst['family']} {worst['x']}); the rule: at most "
                 f"{out['factor']:g}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.composition"))
