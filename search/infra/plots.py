"""Pictures a person can look at (Pillow only, no matplotlib): the search and the profile.

plot_search:  loss per iteration (start masks / grid / GP / polish / reused / final, running best), the learned w(t),
              the mask timeline (the chosen mask, and which method it came from).
plot_policy:  an instant policy: its propagation weights w_j per step and the mask timeline.
plot_profile: the E heatmap (log scale) and the local indicators ‖δ‖, rel-L1 of δ, rel-L1 of h per step.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from PIL import Image, ImageDraw

from ...core.weights import bernstein_w
from ..choice import choose
from ..state import SearchState, mask_of

W, PANEL_H, PAD = 720, 220, 48
BG, FG, GRID = (255, 255, 255), (30, 30, 30), (225, 225, 225)
COLORS = {"instant": (148, 103, 189), "grid": (150, 150, 150), "gp": (31, 119, 180), "reused": (174, 199, 232),
          "best": (214, 39, 40), "final": (44, 160, 44), "polish": (255, 127, 14), "a": (31, 119, 180),
          "b": (255, 127, 14), "c": (44, 160, 44)}


class _Panel:
    """One titled chart area with linear axes."""

    def __init__(self, draw: ImageDraw.ImageDraw, top: int, title: str, xr, yr, height: int = PANEL_H):
        self.d, self.top, self.h = draw, top, height
        self.x0, self.x1, self.y0, self.y1 = PAD, W - 16, top + 22, top + height - 24
        self.xr = (xr[0], xr[1] if xr[1] != xr[0] else xr[0] + 1)
        lo, hi = yr
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
            lo, hi = (lo - 1, lo + 1) if math.isfinite(lo) else (0, 1)
        self.yr = (lo, hi)
        draw.text((PAD, top + 4), title, fill=FG)
        draw.rectangle([self.x0, self.y0, self.x1, self.y1], outline=FG)
        for f in (0.25, 0.5, 0.75):
            y = self.y0 + f * (self.y1 - self.y0)
            draw.line([self.x0 + 1, y, self.x1 - 1, y], fill=GRID)
        draw.text((4, self.y0 - 4), f"{hi:.3g}", fill=FG)
        draw.text((4, self.y1 - 8), f"{lo:.3g}", fill=FG)
        draw.text((self.x0, self.y1 + 4), f"{self.xr[0]:.3g}", fill=FG)
        draw.text((self.x1 - 30, self.y1 + 4), f"{self.xr[1]:.3g}", fill=FG)

    def xy(self, x: float, y: float) -> tuple[float, float]:
        fx = (x - self.xr[0]) / (self.xr[1] - self.xr[0])
        fy = (y - self.yr[0]) / (self.yr[1] - self.yr[0])
        return self.x0 + fx * (self.x1 - self.x0), self.y1 - min(max(fy, 0.0), 1.0) * (self.y1 - self.y0)

    def line(self, xs, ys, color, width: int = 2):
        pts = [self.xy(x, y) for x, y in zip(xs, ys)]
        if len(pts) > 1:
            self.d.line(pts, fill=color, width=width)

    def dot(self, x, y, color, r: int = 3, hollow: bool = False):
        px, py = self.xy(x, y)
        self.d.ellipse([px - r, py - r, px + r, py + r], outline=color, fill=None if hollow else color)

    def legend(self, items):
        x = self.x1 - 130
        for j, (label, color) in enumerate(items):
            y = self.y0 + 4 + 12 * j
            self.d.rectangle([x, y + 2, x + 8, y + 10], fill=color)
            self.d.text((x + 12, y), label, fill=FG)


def _mask_row(draw: ImageDraw.ImageDraw, top: int, mask: Sequence[int], title: str) -> int:
    draw.text((PAD, top + 2), title, fill=FG)
    n = len(mask)
    cell = (W - 16 - PAD) / max(n, 1)
    for j, m in enumerate(mask):
        x = PAD + j * cell
        draw.rectangle([x, top + 18, x + cell - 1, top + 38], fill=COLORS["gp"] if m else (235, 235, 235), outline=FG)
    draw.text((PAD, top + 42), "step 0", fill=FG)
    draw.text((W - 60, top + 42), f"step {n - 1}", fill=FG)
    return top + 60


def ringed(result_or_state, state: SearchState):
    """The history entry the plot rings: the final policy's (a SearchResult's end game: after the fresh seeds replaced
    the pick, the finalist that won), else the mask the search would return now (choice.choose)."""
    final = getattr(getattr(result_or_state, "end", None), "final", None)  # end_game.Candidate
    if final is None:
        return choose(state).entry
    entries = list(state.history) + list(state.all_finals()) + list(state.kept_entries())
    own = next((e for e in entries if e["mask"] == final.key), None)
    if own is not None:
        return own
    # a forecaster check's variant has no history entry: it is ringed where it was measured
    return {"i": final.measured.first, "loss": final.loss, "mask": final.key,
            "s": None if final.s is None else list(final.s)}


def plot_search(result_or_state, times: Optional[Sequence[float]] = None) -> Image.Image:
    """A SearchResult, a SearchState, or a state file's content (a dict) → RGB image."""
    state = getattr(result_or_state, "state", result_or_state)
    if isinstance(state, dict):
        state = SearchState(state, None)
    policy = getattr(result_or_state, "policy", None)
    if times is None and policy is not None:
        times = policy.times
    hist, fin = state.history, state.final
    img = Image.new("RGB", (W, 2 * PANEL_H + 76), BG)
    d = ImageDraw.Draw(img)
    cfg = state.config
    losses = [h["loss"] for h in hist] + ([fin["loss"]] if fin else [])
    log = bool(losses) and min(losses) > 0  # losses span decades: show them on a log axis when we can
    f = (lambda v: math.log10(v)) if log else (lambda v: v)  # noqa: E731
    lo, hi = (f(min(losses)), f(max(losses))) if losses else (0.0, 1.0)
    p = _Panel(d, 0, f"{'log10 ' if log else ''}loss per iteration ({cfg.get('objective')}, K={cfg.get('k')}, "
                     f"{len(state.masks)} distinct masks of {len(hist)} iterations)", (0, max(len(hist), 1)),
               (lo, hi))
    run_best = np.minimum.accumulate([h["loss"] for h in hist]) if hist else []
    p.line(range(len(run_best)), [f(v) for v in run_best], COLORS["best"])
    for h in hist:
        p.dot(h["i"], f(h["loss"]), COLORS["reused" if h.get("reused") else h["kind"]], hollow=h.get("reused", False))
    if fin:
        p.dot(len(hist), f(fin["loss"]), COLORS["final"], r=5)
    p.legend([("start masks", COLORS["instant"]), ("start grid", COLORS["grid"]), ("GP-LCB", COLORS["gp"]),
              ("polish", COLORS["polish"]), ("reused mask", COLORS["reused"]), ("best so far", COLORS["best"]),
              ("argmin mu", COLORS["final"])])
    winner = ringed(result_or_state, state)
    if winner is not None:  # the chosen mask: a ring around its point
        x = len(hist) if winner is fin else winner.get("i", len(hist))
        p.dot(x, f(winner["loss"]), COLORS["best"], r=8, hollow=True)

    # w(t): the chosen s, or (when an instant mask won) the best learned one
    learned = [h for h in hist if h.get("s")] + ([fin] if fin and fin.get("s") else [])
    chosen = (winner or {}).get("s") or (min(learned, key=lambda h: h["loss"])["s"] if learned else None)
    if chosen:
        t = np.linspace(1.0, 0.0, 101)
        w = bernstein_w(t, chosen)
        q = _Panel(d, PANEL_H, f"{'' if (winner or {}).get('s') else 'best '}learned w(t), s = "
                               f"[{', '.join(f'{v:.2f}' for v in chosen)}]   (t: 1 = start -> 0 = end)",
                   (1.0, 0.0), (min(0.0, float(w.min())), float(w.max()) + 1e-9))
        q.line(t, w, COLORS["a"])
        for tj in times or []:
            q.dot(float(tj), float(bernstein_w([tj], chosen)[0]), COLORS["a"], r=2)
    mask = policy.mask if policy is not None else (mask_of(winner["mask"]) if winner else [])
    won = policy.provenance.get("won") if policy is not None else None
    if mask:
        _mask_row(d, 2 * PANEL_H + 10, mask, f"chosen mask{f' (won by {won})' if won else ''}: {sum(mask)} of "
                                             f"{len(mask)} steps computed (blue)")
    return img


def plot_policy(policy, w: Sequence[float], title: str = "") -> Image.Image:
    """w_j per step (dots on the policy's normalized times, computed steps filled) and the mask timeline."""
    img = Image.new("RGB", (W, PANEL_H + 76), BG)
    d = ImageDraw.Draw(img)
    times = policy.times or [1.0 - i / policy.n_steps for i in range(policy.n_steps)]
    w = [float(v) for v in w]
    p = _Panel(d, 0, title or f"propagation weight w_j per step ({policy.method})   (t: 1 = start -> 0 = end)",
               (1.0, 0.0), (min(w), max(w) + 1e-9))
    p.line(times, w, COLORS["a"], width=1)
    for tj, wj, m in zip(times, w, policy.mask):
        p.dot(tj, wj, COLORS["a"], r=4, hollow=not m)
    _mask_row(d, PANEL_H + 10, policy.mask, f"mask: {policy.n_computed} of {policy.n_steps} steps computed (blue)")
    return img


def _heat(v: float) -> tuple[int, int, int]:
    """Dark blue → yellow ramp for v ∈ [0, 1]."""
    v = min(max(v, 0.0), 1.0)
    return int(255 * v), int(40 + 200 * v), int(120 * (1 - v) + 40)


def plot_profile(profile) -> Image.Image:
    E = np.asarray(profile.E, dtype=np.float64)
    n = E.shape[0]
    side = min(W - 2 * PAD, 12 * n)
    img = Image.new("RGB", (W, side + PANEL_H + 60), BG)
    d = ImageDraw.Draw(img)
    d.text((PAD, 4), f"E[i, j] = mean |delta_i - delta_j| (log scale), N = {n}, {profile.count} samples", fill=FG)
    logE = np.log10(E + 1e-12)
    off = ~np.eye(n, dtype=bool)
    lo, hi = (float(logE[off].min()), float(logE[off].max())) if n > 1 else (0.0, 1.0)
    cell = side / n
    for i in range(n):
        for j in range(n):
            v = 0.0 if i == j else (logE[i, j] - lo) / max(hi - lo, 1e-12)
            d.rectangle([PAD + j * cell, 20 + i * cell, PAD + (j + 1) * cell, 20 + (i + 1) * cell], fill=_heat(v))
    d.text((PAD + side + 8, 20), f"max 1e{hi:.2f}", fill=FG)
    d.text((PAD + side + 8, 20 + side - 10), f"min 1e{lo:.2f}", fill=FG)
    series = [("|delta| (mean)", profile.delta_norm, COLORS["a"]), ("rel-L1 delta", profile.rel_delta, COLORS["b"]),
              ("rel-L1 h (block input)", profile.rel_h, COLORS["c"])]
    p = _Panel(d, side + 30, "local indicators per step (each scaled to its max)", (0, max(n - 1, 1)), (0.0, 1.0))
    for _, ys, color in series:
        ys = np.asarray(ys, dtype=np.float64)
        top = float(ys.max()) if ys.size and ys.max() > 0 else 1.0
        p.line(range(n), ys / top, color)
    p.legend([(f"{label}", c) for label, _, c in series])
    return img
