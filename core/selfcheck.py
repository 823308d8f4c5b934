"""What the self-check of the skip path measures and concludes. Torch only.

In a run that computes every step, one model call (per branch) is called again with the block stack skipped by the
residual that call just produced (replay.py; nodes/patching/selfcheck.py drives it inside ComfyUI). A correct adapter
gives the same model output up to rounding: on the cached tokens h + (z − h) = z, and nothing else changes. A wrong
token range leaves some image tokens at h, a block that writes into its input makes δ = 0, a stream left out of the
cache stays stale: each changes the output far beyond rounding, and a patch that is never called lets the blocks
run (counted by the caller).

The error compares the replayed output y' with the computed y relative to what the model contributed, y − y₀ (y₀: the
output with the model's raw prediction at zero: the model input for flow and ε models, c_skip·x for EDM), not to the
latent itself. It is the worst of 256 contiguous groups of each sample's elements, each group's RMS(y' − y) over the
sample's RMS(y − y₀): a wrong range of a few tokens moves its own group by O(1) where a relative norm over the whole
output would dilute it by the square root of its share. The tolerance is TOLERANCE_EPS times one unit of rounding:
the machine epsilon of the lowest precision on the path from the block stack to the output (the stream's dtype, and
the head's weights and compute dtype: a float32 stack's last bits, which the replay's h + δ may change, move a 16-bit
head's rounding; `lowest_precision`) plus the output's own rounding (its dtype's epsilon times its largest group over
the model's contribution: late in an EDM schedule the float32 output is much larger than what the model adds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"
RESULTS = (PASS, FAIL, NOT_CHECKED)
GROUPS = 256  # contiguous groups per sample (fewer when a sample has fewer elements)
# The tolerance, in units of rounding (the stream dtype's machine epsilon, 1.19e-7 float32, 9.77e-4 float16, 7.81e-3
# bfloat16, plus the output's own rounding). Measured on every family of tests/comfyui's tiny ComfyUI models, both
# trees, 6 steps, cfg 1 and 3 (bench/RESULTS.md, 2026-11-27): correct adapters at most 1.51 units in float32, 1.49 in
# bfloat16, 1.57 in float16 (real-size Flux and Wan on an H200 in bfloat16: 0.08); the mildest negative control in a
# 16-bit dtype 25 units (LTX-2's audio left out, bfloat16), the others 78 and more. 6 lies 3.8x above the first and
# 4.2x below the second (tests/comfyui/test_selfcheck.py asserts 3x on each side).
TOLERANCE_EPS = 6.0


def lowest_precision(dtypes) -> torch.dtype:
    """The dtype of largest machine epsilon among `dtypes` (None and non-float ones left out), float32 when none is
    given. A 1-byte float (fp8 weights) does not count: ComfyUI computes with them in a wider dtype (it casts them to
    the compute dtype, exactly), which the caller lists, and a float8 epsilon would let any broken adapter pass."""
    found = [d for d in dtypes if isinstance(d, torch.dtype) and d.is_floating_point and d.itemsize >= 2]
    return max(found, key=lambda d: float(torch.finfo(d).eps), default=torch.float32)


def tolerance(dtype: torch.dtype, output_rounding: float = 0.0) -> float:
    """The largest replay error a correct adapter may show: TOLERANCE_EPS times the rounding of a block stack
    running in `dtype` (its machine epsilon) plus the rounding of the output itself (`output_rounding`, from
    replay_error: late in an EDM schedule the float32 output is far larger than what the model adds to it)."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float32).eps
    return TOLERANCE_EPS * (float(eps) + float(output_rounding))


def replay_error(computed: Sequence[torch.Tensor], replayed: Sequence[torch.Tensor],
                 without_model: Sequence[torch.Tensor]) -> tuple[float, float]:
    """(error, output rounding). error: the max over samples and groups of RMS(replayed − computed) in the group
    over RMS(computed − without_model) in the sample (module docstring); without_model: the output the model's own
    prediction would leave at zero. Output rounding: the same ratio for one machine epsilon of the output's dtype
    on every element of the group (the output's own rounding, which no adapter can beat). 0 when the outputs are
    equal; the error is inf when the replay holds NaN/Inf or differs where the model contributed nothing. Raises
    ValueError when the computed output itself is not finite (nothing to compare with). Each argument: the parts
    of one model output (one tensor, or the tensors of a nested output), batch first."""
    worst, rounding = 0.0, 0.0
    for y, y2, x in zip(computed, replayed, without_model):
        b = y.shape[0]
        out_eps = torch.finfo(y.dtype).eps if y.dtype.is_floating_point else torch.finfo(torch.float32).eps
        y, y2, x = (t.detach().float().reshape(b, -1) for t in (y, y2, x))
        if not bool(torch.isfinite(y).all()):
            raise ValueError("the computed model output holds NaN/Inf")
        if not bool(torch.isfinite(y2).all()):
            return math.inf, rounding
        if y.shape[1] == 0:
            continue
        ref = (y - x).square().mean(dim=1)  # per sample: what the model contributed
        diff = _worst_group((y2 - y).square())
        ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / ref)
        worst = max(worst, float(ratio.max().sqrt()))
        scale = torch.where(ref > 0, _worst_group(y.square()) / ref, torch.zeros_like(ref))
        rounding = max(rounding, out_eps * float(scale.max().sqrt()))
    return worst, rounding


def _worst_group(sq: torch.Tensor) -> torch.Tensor:
    """Per sample (row), the largest mean over GROUPS contiguous groups of its elements."""
    b, n = sq.shape
    g = min(GROUPS, n)
    size = -(-n // g)
    sums = torch.nn.functional.pad(sq, (0, g * size - n)).reshape(b, g, size).sum(dim=2)
    counts = (n - torch.arange(g, device=sq.device) * size).clamp(0, size)  # the last groups may be short
    return (sums[:, counts > 0] / counts[counts > 0]).max(dim=1).values


@dataclass
class Outcome:
    """The self-check of one run: its result, why (fail: what differed; not checked: why not), and the error
    measured against the tolerance of the stream's dtype."""
    result: str = NOT_CHECKED
    why: str = ""
    error: Optional[float] = None
    tolerance: Optional[float] = None
    dtype: str = ""
    calls: int = 0               # model calls replayed

    def describe(self) -> str:
        """'error 3.1e-07 ≤ tolerance 9.5e-07 for float32', and what went wrong, for log lines."""
        if self.error is None:
            return self.why
        sign = "≤" if self.error <= (self.tolerance or 0.0) else ">"
        measured = f"error {self.error:.3g} {sign} tolerance {self.tolerance:.3g} for {self.dtype}"
        return f"{measured}; {self.why}" if self.why else measured


def conclude(errors: Sequence[tuple[float, float, str]], problems: Sequence[str], skipped: Sequence[str]) -> Outcome:
    """One run's outcome from its replayed calls: (error, tolerance, dtype) of each, what went wrong in any (a fail
    wins), and why calls were not checked (the run is 'not checked' when none was)."""
    if errors:
        err, tol, dtype = max(errors, key=lambda e: e[0] / e[1] if e[1] else math.inf)
    else:
        err = tol = None
        dtype = ""
    worse = list(problems)
    if err is not None and not err <= tol:
        worse.insert(0, "the skip path's output differs from the computed step's")
    if worse:
        return Outcome(FAIL, "; ".join(dict.fromkeys(worse)), err, tol, dtype, len(errors))
    if err is None:
        why = "; ".join(dict.fromkeys(skipped)) or "no model call at the step checked"
        return Outcome(NOT_CHECKED, why, calls=0)
    return Outcome(PASS, "", err, tol, dtype, len(errors))
