"""README's first figure: quality against speed-up for GCache (auto and searched), EasyCache and LazyCache on the
trained tiny Flux-class model in ComfyUI, drawn from the stored bench result (bench/results/peers.json) with PIL.

bench/render_docs.py writes it with the docs (docs/peers_flux.png) and tests/test_bench_results.py checks that the
committed picture is this drawing of the stored result: a figure is regenerated, never edited.
"""
from __future__ import annotations

import math

from PIL import Image, ImageDraw, ImageFont

SIZE = (760, 420)
BOX = (62, 24, 560, 372)  # the plot area: left, top, right, bottom
SERIES = (  # (row kind, label, colour, line)
    ("gcache", "GCache Apply (auto)", (200, 40, 40), True),
    ("gcache search", "GCache Search (budget 64)", (120, 20, 140), True),
    ("EasyCache", "EasyCache", (30, 110, 200), True),
    ("LazyCache", "LazyCache", (40, 150, 70), True),
)


def points(family: dict, kind: str) -> list[tuple[float, float]]:
    """(speed-up in block-stack passes, mean PSNR in dB) of the rows of one kind, by speed-up."""
    return sorted((r["speedup_passes"], r["psnr_mean"]) for r in family["rows"] if r["kind"] == kind)


def _ticks(lo: float, hi: float, step: float) -> list[float]:
    return [step * i for i in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def draw(result: dict, family: str = "flux") -> Image.Image:
    fam = result["families"][family]
    series = [(label, colour, line, points(fam, kind)) for kind, label, colour, line in SERIES]
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
    d.text((left + (right - left) // 2 - 110, bottom + 24), "speed-up (block-stack passes, 20 steps)", fill="black",
           font=font)
    d.text((4, top - 18), "PSNR vs every step computed (dB, mean of 16 held-out pairs)", fill="black", font=font)
    for i, (label, colour, line, pts) in enumerate(series):
        xy = [at(x, y) for x, y in pts]
        if line and len(xy) > 1:
            d.line(xy, fill=colour, width=2)
        for px, py in xy:
            d.ellipse([px - 4, py - 4, px + 4, py + 4], fill=colour)
        ly = top + 10 + 22 * i
        d.line([(right + 16, ly + 6), (right + 40, ly + 6)], fill=colour, width=2)
        d.ellipse([right + 24, ly + 2, right + 32, ly + 10], fill=colour)
        d.text((right + 46, ly), label, fill="black", font=font)
    d.text((right + 16, top + 10 + 22 * len(series) + 8), f"trained tiny {family.capitalize()}-class model,",
           fill=(90, 90, 90), font=font)
    d.text((right + 16, top + 10 + 22 * len(series) + 22), f"ComfyUI {result.get('comfyui', '?')}, on a CPU",
           fill=(90, 90, 90), font=font)
    return img
