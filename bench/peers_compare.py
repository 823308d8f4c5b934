"""bench/peers.py's arithmetic (no ComfyUI, no torch): a row's speed-up on both axes, a curve's value at a speed-up,
the bootstrap interval, and the headline against the best alternative at each matched speed-up.

Two axes:
- passes: N / (block-stack passes per run), what README's figure has always drawn;
- io: N / (the run's cost in full steps). A GCache step that skips still runs the model's input and output layers
  (its io share r of a full step, measured by auto's run 1), so a GCache row computing K of N costs K + (N − K)·r;
  EasyCache, LazyCache and plain sampling with fewer steps skip the whole model call, so they cost their passes.
"""
from __future__ import annotations

import random
import statistics

BOOTSTRAP = 2000
AXES = ("passes", "io")
GCACHE_KINDS = ("gcache", "gcache k", "gcache search")
# what a user has instead of GCache: ComfyUI's cache nodes at either window, and sampling fewer steps
ALTERNATIVES = ("EasyCache", "EasyCache wide", "LazyCache", "LazyCache wide", "fewer steps")


def io_cost(n_steps: int, n_computed: float, io_share: float) -> float:
    """A GCache run's cost in full steps: K computed steps, N − K that still run the io layers."""
    return n_computed + (n_steps - n_computed) * io_share


def speedups(row: dict, n_steps: int, plain_passes: float, io_share: float) -> dict:
    """The row's speed-up on both axes, from its mean passes per run."""
    passes = statistics.mean(row["passes"])
    cost = io_cost(n_steps, passes, io_share) if row["kind"] in GCACHE_KINDS else passes
    return {"speedup_passes": round(plain_passes / passes, 3), "speedup_io": round(n_steps / cost, 3)}


def interpolate(curve, x):
    """Per-pair values of a curve at speed-up x: linear between the two rows whose mean speed-ups bracket x (rows of
    equal speed-up: their mean). None when x lies outside the curve's rows."""
    pts = {}
    for sp, vals in curve:
        pts.setdefault(sp, []).append(vals)
    xs = sorted(pts)
    if not xs or x < xs[0] - 1e-9 or x > xs[-1] + 1e-9:
        return None
    avg = {k: [statistics.mean(v) for v in zip(*pts[k])] for k in xs}
    for lo, hi in zip(xs, xs[1:] + [xs[-1]]):
        if lo - 1e-9 <= x <= hi + 1e-9:
            w = 0.0 if hi == lo else (x - lo) / (hi - lo)
            return [(1 - w) * p + w * q for p, q in zip(avg[lo], avg[hi])]
    return None


def bootstrap(diffs, n=BOOTSTRAP, seed=0):
    """95 % percentile interval of the mean over resampled pairs."""
    rng = random.Random(seed)
    means = sorted(statistics.mean(rng.choices(diffs, k=len(diffs))) for _ in range(n))
    return [round(means[int(0.025 * n)], 3), round(means[int(0.975 * n) - 1], 3)]


def curve(rows, kind: str, axis: str, metric: str = "psnr") -> list:
    return [(r[f"speedup_{axis}"], r[metric]) for r in rows if r["kind"] == kind]


def headline(rows, axis: str = "passes") -> list:
    """For each GCache row: every alternative's mean PSNR at the row's speed-up on this axis (None where its rows
    don't reach it), the best of them (highest mean), and GCache's PSNR minus the best's per pair, with a bootstrap
    interval over the pairs (and the same for SSIM against that alternative)."""
    out = []
    for g in (r for r in rows if r["kind"] in GCACHE_KINDS):
        x = g[f"speedup_{axis}"]
        present = [alt for alt in ALTERNATIVES if any(r["kind"] == alt for r in rows)]
        at = {alt: interpolate(curve(rows, alt, axis), x) for alt in present}
        item = {"gcache": g["row"], "kind": g["kind"], "k": g["passes"][0], "axis": axis, f"speedup_{axis}": x,
                "psnr": round(statistics.mean(g["psnr"]), 3),
                "alternatives": {alt: None if v is None else round(statistics.mean(v), 3) for alt, v in at.items()}}
        reached = {alt: v for alt, v in at.items() if v is not None}
        if not reached:
            item.update(best=None, psnr_diff=None, why="no alternative's rows reach this speed-up")
        else:
            best = max(reached, key=lambda alt: statistics.mean(reached[alt]))
            diffs = [a - b for a, b in zip(g["psnr"], reached[best])]
            item.update(best=best, best_psnr=round(statistics.mean(reached[best]), 3),
                        psnr_diff=round(statistics.mean(diffs), 3), interval=bootstrap(diffs))
            ssim_at = interpolate(curve(rows, best, axis, "ssim"), x)
            if ssim_at is not None and "ssim" in g:
                sd = [a - b for a, b in zip(g["ssim"], ssim_at)]
                item.update(ssim_diff=round(statistics.mean(sd), 4), ssim_interval=bootstrap(sd))
        out.append(item)
    return out


def search_vs_auto(rows) -> list:
    """GCache Search's PSNR minus auto's at the same K, per K (bootstrap over the pairs)."""
    out = []
    for srow in (r for r in rows if r["kind"] == "gcache search"):
        auto = next(r for r in rows if r["kind"] == "gcache" and r["passes"][0] == srow["k"])
        diffs = [a - b for a, b in zip(srow["psnr"], auto["psnr"])]
        out.append({"k": srow["k"], "search": srow["row"], "auto": auto["row"],
                    "psnr_diff": round(statistics.mean(diffs), 3), "interval": bootstrap(diffs)})
    return out
