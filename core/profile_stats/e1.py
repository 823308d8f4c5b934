"""E1[p, i, j]: mean |δ_j − δ̂_j| of the linear forecast δ̂_j = δ_i + c·(δ_i − δ_p), c = (t_j − t_i)/(t_i − t_p), from
recorded steps p < i < j (0 elsewhere): the order-1 forecast DP's input (search/dp_forecast.py). N³ float64 per
sample (216 KB at N = 30, 1 MB at N = 50), O(N³·m) work over the run. Differences in float32 whatever δ's dtype."""
from __future__ import annotations

import numpy as np
import torch

from . import Tensor, nonnegative, register


def linear_c(s) -> torch.Tensor:
    """c[p, i] = (t_j − t_i)/(t_i − t_p) for step s.j, float32 on δ's device (entries p ≥ i are never read)."""
    t = s.times
    with np.errstate(divide="ignore", invalid="ignore"):
        return torch.from_numpy(np.nan_to_num((t[s.j] - t)[None, :] / (t[None, :] - t[:, None]))).to(
            s.device, torch.float32, non_blocking=True)  # one transfer per step


class LinearForecastErrors:
    name = "e1"
    tensors = {"e1_sum": Tensor(lambda n: (n, n, n), nonnegative)}
    order = 40  # takes c.block, which the fit statistics read first
    missing = ("This profile has no forecast errors (E1): profile again with forecast recording on (GCache "
               "Profile's 'record forecast errors', or ProfileRecorder(forecast=True)).")

    def on_triples(self, acc, c):
        s = c.step
        coef = s.cached("e1.c", lambda: linear_c(s))[c.lo:c.hi, c.i][:, None]
        pred = c.take_block().mul_(-coef).add_(c.di * (1 + coef))  # (1 + c)·δ_i − c·δ_p, in the block's copy
        acc["e1_sum"][c.lo:c.hi, c.i, s.j] = pred.sub_(s.dj).abs_().mean(dim=1).double()


register(LinearForecastErrors())
