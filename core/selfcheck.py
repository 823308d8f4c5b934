"""What the self-check of the skip path measures and concludes. Torch only.

In a run that computes every step, one model call (per branch) is called again with the block stack skipped by the
residual that call just produced (replay.py; nodes/patching/selfcheck.py drives it inside ComfyUI). A correct adapter
gives the same model output up to rounding: on the cached tokens h + (z − h) = z, and nothing else changes. A wrong
token range, a block that writes into its input (δ = 0), a stream left out of the cache, one stale token: each moves
the output beyond rounding, and a patch that is never called lets the blocks run (counted by the caller).

Every figure is relative to what the model contributed, y − y₀ (y₀: the output with the model's raw prediction at
zero: the model input for flow and ε models, c_skip·x for EDM), per sample. Two statistics, and the call fails when
either is over its allowance:

- "element": the worst single element, max |y' − y| over RMS(y − y₀). One stale token moves its own elements by O(1)
  whatever the token count, so its power does not fall with the image's size (issue 47: a mean over groups of 1024
  elements diluted one wrong token of 4096 to 5 of the 6 allowed units).
- "group": the worst of 256 contiguous groups of the sample's elements, RMS(y' − y) over RMS(y − y₀). A fault spread
  thinly over every token (a wrong weight, δ = 0 behind a long skip) shows here first; it is logged beside the first.

The allowance is measured, not assumed (`allowance`): the same replay is made a second time with its h + δ nudged by
one unit of rounding (each element moved by ±ε·max(|h|, |h + δ|), ε the machine epsilon of the lowest precision on
the path from the stack to the output: `lowest_precision`), and the statistics of (nudged − replayed) are the floor:
what one unit of rounding at the stack's output does to this model's output, through its own head, casts and
scaling. The element statistic's floor is the nudge's worst element (one rounding of the lowest precision may land
anywhere). The group statistic's is the nudge's worst group, scaled by √(ε of the stream / ε of the nudge) where the
replay's own arithmetic is more precise than the head (a float32 stack's last bits flip a 16-bit head's rounding on
rare elements only), plus one element moved by the nudge's worst (one such flip). The allowance is SAFETY times
(the floor + the output's own rounding: its dtype's epsilon on its largest values). A correct replay differs from z
by at most about one such unit; a fault by far more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"
RESULTS = (PASS, FAIL, NOT_CHECKED)
GROUPS = 256  # contiguous groups per sample (fewer when a sample has fewer elements)
STATISTICS = ("element", "group")
# The allowance over the measured floor (module docstring). Measured on every family of tests/comfyui's tiny ComfyUI
# models (docs/families.md, "The self-check's margins"): correct trees at most SAFETY / 3 of the floor or less.
SAFETY = 3.5


def lowest_precision(dtypes) -> torch.dtype:
    """The dtype of largest machine epsilon among `dtypes` (None and non-float ones left out), float32 when none is
    given. A 1-byte float (fp8 weights) does not count: ComfyUI computes with them in a wider dtype (it casts them to
    the compute dtype, exactly), which the caller lists, and a float8 epsilon would let any broken adapter pass."""
    found = [d for d in dtypes if isinstance(d, torch.dtype) and d.is_floating_point and d.itemsize >= 2]
    return max(found, key=lambda d: float(torch.finfo(d).eps), default=torch.float32)


def unit(dtype: torch.dtype) -> float:
    """One unit of rounding of `dtype`: its machine epsilon (float32's for a non-float)."""
    return float(torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps)


def nudged(h: torch.Tensor, delta: torch.Tensor, eps: float, seed: int = 0) -> torch.Tensor:
    """δ' with h + δ' = (h + δ) moved by ±eps·max(|h|, |h + δ|) on each element (signs from a fixed hash of the
    element's index: the same on every device and run), in δ's dtype and device: the nudged replay's residual."""
    hf = h.detach().float()
    z = hf + delta.detach().to(h.device).float()
    idx = torch.arange(z.numel(), device=z.device, dtype=torch.int64) + seed * 7919
    sign = (((idx * 2654435761) >> 15) & 1).reshape(z.shape).float() * 2 - 1
    return (z + sign * eps * torch.maximum(z.abs(), hf.abs()) - hf).to(delta.dtype).to(delta.device)


@dataclass
class Figures:
    """One statistic of one replayed call: its error, the floor measured by the nudged replay, the output's own
    rounding (all relative to what the model contributed) and the allowance they make."""
    statistic: str
    error: float
    floor: float = 0.0
    rounding: float = 0.0

    @property
    def tolerance(self) -> float:
        return allowance(self.floor, self.rounding)

    def ratio(self) -> float:
        tol = self.tolerance
        return self.error / tol if tol > 0 else (0.0 if self.error == 0 else math.inf)


def allowance(floor: float, output_rounding: float = 0.0) -> float:
    """The largest error a correct replay may show: SAFETY times the measured floor plus the output's own rounding."""
    return SAFETY * (float(floor) + float(output_rounding))


def _flat(ts, b):
    return (t.detach().float().reshape(b, -1) for t in ts)


def measure(computed: Sequence[torch.Tensor], replayed: Sequence[torch.Tensor], nudged_out: Sequence[torch.Tensor],
            without_model: Sequence[torch.Tensor], stream_share: float = 1.0) -> dict[str, Figures]:
    """Each statistic of a replayed call (module docstring), the worst over samples and output parts by its ratio to
    its allowance. Each argument: the parts of one model output (one tensor, or those of a nested one), batch first:
    the computed output, the replay's, the nudged replay's and the output the model's prediction at zero would
    leave. An error is inf when the replay holds NaN/Inf or differs where the model contributed nothing. Raises
    ValueError when the computed output or the nudged one is not finite (no reference, no floor).

    stream_share: (ε of the stream's dtype / ε of the nudge's) ** 0.5, 1 when the replay's own arithmetic runs in
    the lowest precision. A float32 stack before a 16-bit head differs from the computed call in float32's last bits,
    which the head's rounding turns into a whole 16-bit unit on a rare element: the group statistic's floor is then
    the nudge's group figure scaled by this share (what a difference that small leaves on average) plus one element
    moved by the nudge's worst over the group (one such rounding; it is always added)."""
    worst: dict[str, Optional[Figures]] = {s: None for s in STATISTICS}
    if len(replayed) != len(computed) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(computed, replayed)):
        # the skip path gave an output of another form (a part missing, another shape): a skipped step would too
        return {"element": Figures("element", math.inf), "group": Figures("group", 0.0)}
    for y, y2, y3, x in zip(computed, replayed, nudged_out, without_model):
        b = y.shape[0]
        out_eps = unit(y.dtype)
        y, y2, y3, x = _flat((y, y2, y3, x), b)
        if not bool(torch.isfinite(y).all()):
            raise ValueError("the computed model output holds NaN/Inf")
        if y.shape[1] == 0:
            continue
        if not bool(torch.isfinite(y2).all()):
            worst["element"] = Figures("element", math.inf)
            worst["group"] = worst["group"] or Figures("group", 0.0)
            continue
        if not bool(torch.isfinite(y3).all()):
            raise ValueError("the nudged replay (the rounding floor's) holds NaN/Inf")
        ref = (y - x).square().mean(dim=1).sqrt()  # per sample: what the model contributed
        diff, noise = y2 - y, y3 - y2
        one = noise.abs().amax(dim=1)  # the nudge's worst element
        group_floor = _worst_group(noise.square()).sqrt() * stream_share + one / math.sqrt(_group_size(y.shape[1]))
        per = {"element": (diff.abs().amax(dim=1), one, y.abs().amax(dim=1)),
               "group": (_worst_group(diff.square()).sqrt(), group_floor, _worst_group(y.square()).sqrt())}
        for s, (e, f, r) in per.items():
            for i in range(b):  # (where the model contributed nothing, any change is an infinite error)
                figs = Figures(s, _rel(e[i], ref[i]), _rel(f[i], ref[i], 0.0), out_eps * _rel(r[i], ref[i], 0.0))
                if worst[s] is None or figs.ratio() > worst[s].ratio():
                    worst[s] = figs
    return {s: f or Figures(s, 0.0) for s, f in worst.items()}


def _rel(v: torch.Tensor, ref: torch.Tensor, nothing: float = math.inf) -> float:
    """v relative to what the model contributed; `nothing` where it contributed nothing (and v is not 0)."""
    v, ref = float(v), float(ref)
    if v == 0:
        return 0.0
    return v / ref if ref > 0 else nothing


def _group_size(n: int) -> int:
    return -(-n // min(GROUPS, n))


def _worst_group(sq: torch.Tensor) -> torch.Tensor:
    """Per sample (row), the largest mean over GROUPS contiguous groups of its elements."""
    b, n = sq.shape
    g = min(GROUPS, n)
    size = _group_size(n)
    sums = torch.nn.functional.pad(sq, (0, g * size - n)).reshape(b, g, size).sum(dim=2)
    counts = (n - torch.arange(g, device=sq.device) * size).clamp(0, size)  # the last groups may be short
    return (sums[:, counts > 0] / counts[counts > 0]).max(dim=1).values


@dataclass
class Measured:
    """What one replayed call measured: its statistics and the dtype whose unit nudged the floor's replay."""
    figures: dict
    dtype: str

    def deciding(self) -> Figures:
        """The statistic farthest over (or nearest to) its allowance."""
        return max(self.figures.values(), key=lambda f: f.ratio())

    def failed(self) -> bool:
        return any(not f.error <= f.tolerance for f in self.figures.values())


@dataclass
class Outcome:
    """The self-check of one run: its result, why (fail: what differed; not checked: why not), and the deciding
    statistic's error against its allowance, with the group statistic's beside it."""
    result: str = NOT_CHECKED
    why: str = ""
    error: Optional[float] = None
    tolerance: Optional[float] = None
    dtype: str = ""
    calls: int = 0               # model calls replayed
    statistic: str = ""          # the deciding statistic ("element" or "group")
    group_error: Optional[float] = None
    group_tolerance: Optional[float] = None

    def describe(self) -> str:
        """'element error 3.1e-07 ≤ tolerance 9.5e-07 (float32 floor ×4); group error ..', and what went wrong."""
        if self.error is None:
            return self.why.rstrip(".")
        sign = "≤" if self.error <= (self.tolerance or 0.0) else ">"
        name = f"{self.statistic} error" if self.statistic else "error"
        measured = f"{name} {self.error:.3g} {sign} tolerance {self.tolerance:.3g} for {self.dtype}"
        if self.statistic and self.statistic != "group" and self.group_error is not None:
            gsign = "≤" if self.group_error <= (self.group_tolerance or 0.0) else ">"
            measured += f" (group error {self.group_error:.3g} {gsign} {self.group_tolerance:.3g})"
        return f"{measured}; {self.why.rstrip('.')}" if self.why else measured


def conclude(measured: Sequence[Measured], problems: Sequence[str], skipped: Sequence[str]) -> Outcome:
    """One run's outcome from its replayed calls (what each measured), what went wrong in any (a fail wins), and why
    calls were not checked (the run is 'not checked' when none was)."""
    worse = list(problems)
    worst = max(measured, key=lambda m: m.deciding().ratio()) if measured else None
    if worst is not None and any(m.failed() for m in measured):
        worse.insert(0, "the skip path's output differs from the computed step's")
    fields = {}
    if worst is not None:
        d, g = worst.deciding(), worst.figures.get("group")
        fields = dict(error=d.error, tolerance=d.tolerance, dtype=worst.dtype, statistic=d.statistic,
                      group_error=None if g is None else g.error, group_tolerance=None if g is None else g.tolerance)
    if worse:
        return Outcome(FAIL, "; ".join(dict.fromkeys(worse)), calls=len(measured), **fields)
    if worst is None:
        why = "; ".join(dict.fromkeys(skipped)) or "no model call at the step checked"
        return Outcome(NOT_CHECKED, why, calls=0)
    return Outcome(PASS, "", calls=len(measured), **fields)
