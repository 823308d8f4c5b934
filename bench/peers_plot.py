"""README's first figure: quality against speed-up for GCache (auto at each K, and searched), EasyCache and LazyCache
at their default window and at the widest, and plain sampling with fewer steps, on the trained tiny Flux-class model
in ComfyUI, drawn from the stored bench result (bench/results/peers.json) with PIL. The speed-up counts block-stack
passes (N / passes per run): a GCache step that skips still runs the model's io layers, which it leaves out.

bench/render_docs.py writes it with the docs (docs/peers_flux.png) and tests/test_bench_results.py checks that the
committed picture is this drawing of the stored result: a figure is regenerated, never edited.
"""
from __future__ import annotations

import math

from PIL import Image, ImageDraw, ImageFont

SIZE = (800, 420)
BOX = (62, 24, 560, 372)  # the plot area: left, top, right, bottom
SERIES = (  # (row kind, label, colour, marker: "o" a dot, "s" a square)
    ("gcache k", "GCache Apply (auto), K {ks}", (200, 40, 40), "o"),
    ("gcache search", "GCache Search (budget 64)", (120, 20, 140), "o"),
    ("fewer steps", "plain sampling, fewer steps", (20, 20, 20), "o"),
    ("EasyCache", "EasyCache (default window)", (30, 110, 200), "o"),
    ("EasyCache wide", "EasyCache, start 0, end 1", (120, 180, 240), "s"),
    ("LazyCache", "LazyCache (default window)", (40, 150, 70), "o"),
    ("LazyCache wide", "LazyCache, start 0, end 1", (130, 210, 140), "s"),
)
X_LABEL = "speed-up in block-stack passes ({n} / passes per run; io layers not counted)"


def points(family: dict, kind: str) -> list[tuple[float, float]]:
    """(speed-up in block-stack passes, mean PSNR in dB) of the rows of one kind, by speed-up."""
    return sorted((r["speedup_passes"], r["psnr_mean"]) for r in family["rows"] if r["kind"] == kind)


def _ticks(lo: float, hi: float, step: float) -> list[float]:
    return [step * i for i in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def draw(result: dict, family: str = "flux") -> Image.Image:
    fam = result["families"][family]
    ks = sorted(r["k"] for r in fam["rows"] if r["kind"] == "gcache k")
    series = [(label.format(ks=f"{ks[0]}-{ks[-1]}" if ks else ""), colour, marker, points(fam, kind))
              for kind, label, colour, marker in SERIES]
    series = [s for s in series if s[-1]]  # kinds the result has
    xs = [x for *_, pts in series for x, _ in pts]
    ys = [min(y, 60.0) for *_, pts in series for _, y in pts]  # identical images read 100 dB: the axis stops at 60
    x0, x1 = 1.0, math.ceil(max(xs))
    y0, y1 = 5 * math.floor(min(ys) / 5), 5 * math.ceil(max(ys) / 5)
    left, top, right, bottom = BOX
    img = Image.new("RGB", SIZE, "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()

    def at(x, y):
        y = min(y, 60.0)
        return (left + (x - x0) / (x1 - x0) * (right - left), bottom - (y - y0) / (y1 - y0) * (bottom - top))
    for x in _ticks(x0, x1, 1.0 if x1 <= 12 else 2.0):
        px = at(x, y0)[0]
        d.line([(px, top), (px, bottom)], fill=(230, 230, 230))
        d.text((px - 8, bottom + 6), f"{x:g}x", fill="black", font=font)
    for y in _ticks(y0, y1, 5.0):
        py = at(x0, y)[1]
        d.line([(left, py), (right, py)], fill=(230, 230, 230))
        d.text((left - 34, py - 6), f"{y:g}", fill="black", font=font)
    d.rectangle(BOX, outline="black")
    x_label = X_LABEL.format(n=result.get("steps", 20))
    d.text((left + (right - left) // 2 - 3 * len(x_label), bottom + 24), x_label, fill="black", font=font)
    y_label = f"PSNR vs every step computed (dB, mean of {result.get('held_out_pairs', 16)} held-out pairs)"
    d.text((4, top - 18), y_label, fill="black", font=font)
    for i, (label, colour, marker, pts) in enumerate(series):
        xy = [at(x, y) for x, y in pts]
        if len(xy) > 1:
            d.line(xy, fill=colour, width=2)
        for px, py in xy:
            (d.ellipse if marker == "o" else d.rectangle)([px - 4, py - 4, px + 4, py + 4], fill=colour)
        ly = top + 10 + 22 * i
        d.line([(right + 16, ly + 6), (right + 40, ly + 6)], fill=colour, width=2)
        (d.ellipse if marker == "o" else d.rectangle)([right + 24, ly + 2, right + 32, ly + 10], fill=colour)
        d.text((right + 46, ly), label, fill="black", font=font)
    d.text((right + 16, top + 10 + 22 * len(series) + 8), f"trained tiny {family.capitalize()}-class model,",
           fill=(90, 90, 90), font=font)
    d.text((right + 16, top + 10 + 22 * len(series) + 22), f"ComfyUI {result.get('comfyui', '?')}, on a CPU",
           fill=(90, 90, 90), font=font)
    return img
