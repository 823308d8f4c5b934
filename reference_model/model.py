"""The bundled reference model: a tiny class-conditional DiT for 16×16 digits (flow matching).

Its forward is split exactly like the large DiTs GCache targets:
    f_in  = patch embedding + position + conditioning   -> h  [B, tokens, width]
    f_mid = adaLN-conditioned transformer blocks         -> z  (the block stack GCache skips)
    f_out = final adaLN layer + unpatchify               -> velocity
`forward(..., stack=...)` hands the block stack to a hook with the same contract the ComfyUI family
adapters use: `stack(h, branches, run_blocks) -> z`.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Callable, Hashable, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
WEIGHTS = os.path.join(HERE, "tiny_dit_digits.safetensors")

StackHook = Callable[[torch.Tensor, Sequence[Hashable], Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]


@dataclass
class TinyDiTConfig:
    image_size: int = 16
    channels: int = 1
    patch: int = 2
    width: int = 64
    depth: int = 6
    heads: int = 4
    mlp_ratio: float = 4.0
    num_classes: int = 10  # label `num_classes` is the null label used for classifier-free guidance


def _modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = (t.float() * 1000.0)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, width))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        s1, sc1, g1, s2, sc2, g2 = self.ada(c).chunk(6, dim=-1)
        b, n, d = x.shape
        q, k, v = self.qkv(_modulate(self.norm1(x), s1, sc1)).view(b, n, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + g1[:, None] * self.proj(a)
        return x + g2[:, None] * self.mlp(_modulate(self.norm2(x), s2, sc2))


class TinyDiT(nn.Module):
    def __init__(self, cfg: TinyDiTConfig = TinyDiTConfig()):
        super().__init__()
        self.cfg = cfg
        p, w = cfg.patch, cfg.width
        self.tokens = (cfg.image_size // p) ** 2
        self.patch_in = nn.Linear(cfg.channels * p * p, w)
        self.pos = nn.Parameter(torch.zeros(1, self.tokens, w))
        self.t_mlp = nn.Sequential(nn.Linear(w, w), nn.SiLU(), nn.Linear(w, w))
        self.y_emb = nn.Embedding(cfg.num_classes + 1, w)
        self.blocks = nn.ModuleList(Block(w, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(w, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Sequential(nn.SiLU(), nn.Linear(w, 2 * w))
        self.head = nn.Linear(w, cfg.channels * p * p)
        nn.init.normal_(self.pos, std=0.02)
        for blk in self.blocks:  # adaLN-Zero: every block starts as the identity
            nn.init.zeros_(blk.ada[1].weight)
            nn.init.zeros_(blk.ada[1].bias)
        nn.init.zeros_(self.ada_out[1].weight)
        nn.init.zeros_(self.ada_out[1].bias)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    # ---- f_in
    def embed(self, x: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor):
        b, c, hgt, wid = x.shape
        p = self.cfg.patch
        patches = x.reshape(b, c, hgt // p, p, wid // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, self.tokens, c * p * p)
        h = self.patch_in(patches) + self.pos
        cond = self.t_mlp(timestep_embedding(sigma, self.cfg.width)) + self.y_emb(y)
        return h, cond

    # ---- f_mid
    def run_blocks(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            h = blk(h, cond)
        return h

    # ---- f_out
    def output(self, z: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        shift, scale = self.ada_out(cond).chunk(2, dim=-1)
        out = self.head(_modulate(self.norm_out(z), shift, scale))
        b = out.shape[0]
        c, p, s = self.cfg.channels, self.cfg.patch, self.cfg.image_size // self.cfg.patch
        return out.reshape(b, s, s, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, c, s * p, s * p)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor,
                stack: Optional[StackHook] = None, branches: Sequence[Hashable] = ("all",)) -> torch.Tensor:
        h, cond = self.embed(x, sigma, y)
        run = lambda hh: self.run_blocks(hh, cond)  # noqa: E731  (binds this call's conditioning)
        z = run(h) if stack is None else stack(h, branches, run)
        return self.output(z, cond)


def save_model(model: TinyDiT, path: str = WEIGHTS, dtype=torch.float16, extra: Optional[dict] = None) -> None:
    import json

    from safetensors.torch import save_file
    meta = {"config": json.dumps(asdict(model.cfg))}
    meta.update({k: str(v) for k, v in (extra or {}).items()})
    save_file({k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}, path, metadata=meta)


def load_model(path: str = WEIGHTS, device: str | torch.device = "cpu", dtype=torch.float32) -> TinyDiT:
    """The shipped weights (safetensors, no pickle)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Reference weights missing at {path}: run `python -m gcache.reference_model.train`.")
    with safe_open(path, "pt") as f:
        cfg = TinyDiTConfig(**json.loads(f.metadata()["config"]))
    model = TinyDiT(cfg)
    model.load_state_dict({k: v.to(dtype) for k, v in load_file(path).items()})
    return model.to(device).eval()


def load_training_info(path: str = WEIGHTS) -> dict:
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return dict(f.metadata())
