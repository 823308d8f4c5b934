"""Euler sampler on a shifted flow-matching schedule (as Flux/SD3), with batched classifier-free guidance.

The sampler owns step attribution for the reference model: it tells the cache which sampler step each
model call belongs to (`cache.set_step(i)`), exactly once per step.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .model import TinyDiT

BRANCHES_CFG = ("cond", "uncond")


def flow_sigmas(n_steps: int, shift: float = 2.0) -> torch.Tensor:
    """N + 1 sigmas from 1 to 0: σ = shift·t / (1 + (shift − 1)·t) on a uniform t grid."""
    t = torch.linspace(1.0, 0.0, n_steps + 1, dtype=torch.float64)
    return (shift * t / (1 + (shift - 1) * t)).float()


def initial_noise(seeds: Sequence[int], model: TinyDiT) -> torch.Tensor:
    c, s = model.cfg.channels, model.cfg.image_size
    return torch.stack([torch.randn(c, s, s, generator=torch.Generator().manual_seed(int(sd))) for sd in seeds])


@torch.no_grad()
def sample(model: TinyDiT, labels: Sequence[int], seeds: Sequence[int], n_steps: int = 30, cfg_scale: float = 3.0,
           shift: float = 2.0, cache=None, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Images in [-1, 1], shape [B, C, H, W]. `cache` is a ResidualCache (or anything with set_step/run)."""
    device = next(model.parameters()).device
    sigmas = flow_sigmas(n_steps, shift).to(device)
    x = (noise if noise is not None else initial_noise(seeds, model)).to(device)
    y = torch.as_tensor(list(labels), dtype=torch.long, device=device)
    use_cfg = cfg_scale != 1.0
    if use_cfg:
        y_in = torch.cat([y, torch.full_like(y, model.cfg.num_classes)])
        branches = BRANCHES_CFG
    else:
        y_in, branches = y, ("cond",)
    if cache is not None:
        cache.expect_steps(n_steps)
    stack = cache.run if cache is not None else None
    for i in range(n_steps):
        if cache is not None:
            cache.set_step(i)
        x_in = torch.cat([x, x]) if use_cfg else x
        s = sigmas[i].expand(x_in.shape[0])
        v = model(x_in, s, y_in, stack=stack, branches=branches)
        if use_cfg:
            vc, vu = v.chunk(2)
            v = vu + cfg_scale * (vc - vu)
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    return x


def to_unit(images: torch.Tensor) -> torch.Tensor:
    return ((images.clamp(-1, 1) + 1) / 2).float()
