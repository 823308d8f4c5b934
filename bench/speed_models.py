"""The models bench/speed.py times: Flux-dev- and Wan-2.1-1.3B-shaped DiTs in plain torch, real sizes or quick
ones (see speed.py's docstring for the shapes and what is simplified). Random weights: speed does not depend on
them. Each model splits a step into f_in → blocks → f_out, so that GCache wraps exactly the block stack."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


# ============================================================================ size configs
@dataclass
class FluxSize:
    width: int = 3072
    heads: int = 24
    double: int = 19
    single: int = 38
    lat_h: int = 128          # 1024² image / 8 (VAE); 2×2 patches → 64·64 = 4096 tokens
    lat_w: int = 128
    channels: int = 16
    txt_tokens: int = 512
    ctx_dim: int = 4096       # T5-XXL
    vec_dim: int = 768        # CLIP-L pooled
    mlp_ratio: float = 4.0
    batch: int = 1            # guidance-distilled: one branch, cfg 1


@dataclass
class WanSize:
    width: int = 1536
    heads: int = 12
    depth: int = 30
    ffn: int = 8960
    frames: int = 21          # 81 frames → (81 − 1)/4 + 1 latent frames
    lat_h: int = 60           # 480 / 8
    lat_w: int = 104          # 832 / 8; 1×2×2 patches → 21·30·52 = 32,760 tokens
    channels: int = 16
    txt_tokens: int = 512
    ctx_dim: int = 4096
    freq_dim: int = 256
    batch: int = 2            # CFG cond + uncond in one batch


QUICK = {"flux": FluxSize(width=256, heads=4, double=2, single=4, lat_h=32, lat_w=32, txt_tokens=64, ctx_dim=256,
                          vec_dim=64),
         "wan": WanSize(width=256, heads=4, depth=6, ffn=1536, frames=3, lat_h=16, lat_w=32, txt_tokens=64,
                        ctx_dim=256, freq_dim=64)}
FULL = {"flux": FluxSize(), "wan": WanSize()}


# ============================================================================ shared pieces
def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = (t.float() * 1000.0)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def rope_table(n: int, head_dim: int, device, dtype):
    """Simplified RoPE: 1-D positions, rotate-half form (cos, sin: [n, head_dim/2])."""
    half = head_dim // 2
    inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32, device=device) / half))
    ang = torch.arange(n, dtype=torch.float32, device=device)[:, None] * inv[None]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, pe) -> torch.Tensor:  # x [B, H, L, D]
    cos, sin = pe
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def heads(x: torch.Tensor, n: int) -> torch.Tensor:  # [B, L, W] → [B, H, L, D]
    b, l, w = x.shape
    return x.view(b, l, n, w // n).transpose(1, 2)


def merge(x: torch.Tensor) -> torch.Tensor:  # [B, H, L, D] → [B, L, W]
    b, h, l, d = x.shape
    return x.transpose(1, 2).reshape(b, l, h * d)


def mod(x, shift, scale):
    return x * (1 + scale) + shift


def mlp(w_in: int, hidden: int, w_out: int, act: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(w_in, hidden), act, nn.Linear(hidden, w_out))


def ln(w: int, affine: bool = False) -> nn.LayerNorm:
    return nn.LayerNorm(w, elementwise_affine=affine, eps=1e-6)


# ============================================================================ Flux-like MMDiT
class DoubleBlock(nn.Module):
    def __init__(self, w: int, nh: int, ratio: float):
        super().__init__()
        self.nh = nh
        for s in ("img", "txt"):
            setattr(self, f"{s}_mod", nn.Linear(w, 6 * w))
            setattr(self, f"{s}_qkv", nn.Linear(w, 3 * w))
            setattr(self, f"{s}_qn", nn.RMSNorm(w // nh, eps=1e-6))
            setattr(self, f"{s}_kn", nn.RMSNorm(w // nh, eps=1e-6))
            setattr(self, f"{s}_proj", nn.Linear(w, w))
            setattr(self, f"{s}_mlp", mlp(w, int(w * ratio), w, nn.GELU(approximate="tanh")))
        self.norm = ln(w)

    def _qkv(self, s: str, x, m):
        q, k, v = getattr(self, f"{s}_qkv")(mod(self.norm(x), m[0], m[1])).chunk(3, dim=-1)
        return (getattr(self, f"{s}_qn")(heads(q, self.nh)), getattr(self, f"{s}_kn")(heads(k, self.nh)),
                heads(v, self.nh))

    def forward(self, img, txt, vec, pe):
        mi = self.img_mod(F.silu(vec))[:, None].chunk(6, dim=-1)
        mt = self.txt_mod(F.silu(vec))[:, None].chunk(6, dim=-1)
        qi, ki, vi = self._qkv("img", img, mi)
        qt, kt, vt = self._qkv("txt", txt, mt)
        q, k, v = (torch.cat(p, dim=2) for p in ((qt, qi), (kt, ki), (vt, vi)))
        a = merge(F.scaled_dot_product_attention(apply_rope(q, pe), apply_rope(k, pe), v))
        at, ai = a[:, :txt.shape[1]], a[:, txt.shape[1]:]
        img = img + mi[2] * self.img_proj(ai)
        img = img + mi[5] * self.img_mlp(mod(self.norm(img), mi[3], mi[4]))
        txt = txt + mt[2] * self.txt_proj(at)
        txt = txt + mt[5] * self.txt_mlp(mod(self.norm(txt), mt[3], mt[4]))
        return img, txt


class SingleBlock(nn.Module):
    def __init__(self, w: int, nh: int, ratio: float):
        super().__init__()
        self.nh, self.w, self.hidden = nh, w, int(w * ratio)
        self.mod = nn.Linear(w, 3 * w)
        self.norm = ln(w)
        self.linear1 = nn.Linear(w, 3 * w + self.hidden)
        self.linear2 = nn.Linear(w + self.hidden, w)
        self.qn = nn.RMSNorm(w // nh, eps=1e-6)
        self.kn = nn.RMSNorm(w // nh, eps=1e-6)

    def forward(self, x, vec, pe):
        shift, scale, gate = self.mod(F.silu(vec))[:, None].chunk(3, dim=-1)
        qkv, h = self.linear1(mod(self.norm(x), shift, scale)).split([3 * self.w, self.hidden], dim=-1)
        q, k, v = (heads(t, self.nh) for t in qkv.chunk(3, dim=-1))
        a = merge(F.scaled_dot_product_attention(apply_rope(self.qn(q), pe), apply_rope(self.kn(k), pe), v))
        return x + gate * self.linear2(torch.cat([a, F.gelu(h, approximate="tanh")], dim=-1))


class FluxLike(nn.Module):
    branches = ("cond",)

    def __init__(self, c: FluxSize):
        super().__init__()
        self.c, w = c, c.width
        self.img_in = nn.Linear(c.channels * 4, w)
        self.time_in = mlp(256, w, w, nn.SiLU())
        self.guidance_in = mlp(256, w, w, nn.SiLU())
        self.vector_in = mlp(c.vec_dim, w, w, nn.SiLU())
        self.txt_in = nn.Linear(c.ctx_dim, w)
        self.double_blocks = nn.ModuleList(DoubleBlock(w, c.heads, c.mlp_ratio) for _ in range(c.double))
        self.single_blocks = nn.ModuleList(SingleBlock(w, c.heads, c.mlp_ratio) for _ in range(c.single))
        self.final_mod = nn.Linear(w, 2 * w)
        self.final_norm = ln(w)
        self.final = nn.Linear(w, c.channels * 4)

    def inputs(self, device, dtype):
        c = self.c
        return dict(x=torch.randn(c.batch, c.channels, c.lat_h, c.lat_w, device=device, dtype=dtype),
                    ctx=torch.randn(c.batch, c.txt_tokens, c.ctx_dim, device=device, dtype=dtype),
                    y=torch.randn(c.batch, c.vec_dim, device=device, dtype=dtype),
                    guidance=torch.full((c.batch,), 3.5, device=device))

    def f_in(self, x, t, ctx, y, guidance):
        b, ch, hh, ww = x.shape
        img = self.img_in(x.view(b, ch, hh // 2, 2, ww // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, ch * 4))
        dt = img.dtype
        vec = (self.time_in(timestep_embedding(t, 256).to(dt))
               + self.guidance_in(timestep_embedding(guidance, 256).to(dt)))
        vec = vec + self.vector_in(y)
        txt = self.txt_in(ctx)
        pe = rope_table(txt.shape[1] + img.shape[1], self.c.width // self.c.heads, x.device, dt)
        return img, dict(txt=txt, vec=vec, pe=pe, shape=x.shape)

    def blocks(self, img, st):
        txt, vec, pe = st["txt"], st["vec"], st["pe"]
        for blk in self.double_blocks:
            img, txt = blk(img, txt, vec, pe)
        x = torch.cat([txt, img], dim=1)
        for blk in self.single_blocks:
            x = blk(x, vec, pe)
        return x[:, txt.shape[1]:]

    def f_out(self, z, st):
        shift, scale = self.final_mod(F.silu(st["vec"]))[:, None].chunk(2, dim=-1)
        out = self.final(mod(self.final_norm(z), shift, scale))
        b, ch, hh, ww = st["shape"]
        return out.view(b, hh // 2, ww // 2, ch, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, ch, hh, ww)


# ============================================================================ Wan-like DiT
class WanBlock(nn.Module):
    def __init__(self, w: int, nh: int, ffn: int):
        super().__init__()
        self.nh = nh
        self.modulation = nn.Parameter(torch.zeros(1, 6, w))
        self.norm1, self.norm2, self.norm3 = ln(w), ln(w), ln(w, affine=True)
        for s in ("sa", "ca"):
            for p in "qkvo":
                setattr(self, f"{s}_{p}", nn.Linear(w, w))
            setattr(self, f"{s}_qn", nn.RMSNorm(w, eps=1e-6))
            setattr(self, f"{s}_kn", nn.RMSNorm(w, eps=1e-6))
        self.ffn = mlp(w, ffn, w, nn.GELU(approximate="tanh"))

    def _attn(self, s, x, ctx, pe=None):
        g = lambda n: getattr(self, f"{s}_{n}")  # noqa: E731
        q, k, v = heads(g("qn")(g("q")(x)), self.nh), heads(g("kn")(g("k")(ctx)), self.nh), heads(g("v")(ctx), self.nh)
        if pe is not None:
            q, k = apply_rope(q, pe), apply_rope(k, pe)
        return g("o")(merge(F.scaled_dot_product_attention(q, k, v)))

    def forward(self, x, e0, ctx, pe):
        e = (self.modulation + e0).chunk(6, dim=1)
        y = mod(self.norm1(x), e[0], e[1])
        x = x + e[2] * self._attn("sa", y, y, pe)
        x = x + self._attn("ca", self.norm3(x), ctx)
        return x + e[5] * self.ffn(mod(self.norm2(x), e[3], e[4]))


class WanLike(nn.Module):
    branches = ("cond", "uncond")

    def __init__(self, c: WanSize):
        super().__init__()
        self.c, w = c, c.width
        self.patch_embedding = nn.Conv3d(c.channels, w, kernel_size=(1, 2, 2), stride=(1, 2, 2))
        self.text_embedding = mlp(c.ctx_dim, w, w, nn.GELU(approximate="tanh"))
        self.time_embedding = mlp(c.freq_dim, w, w, nn.SiLU())
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(w, 6 * w))
        self.blocks_ = nn.ModuleList(WanBlock(w, c.heads, c.ffn) for _ in range(c.depth))
        self.head_mod = nn.Parameter(torch.zeros(1, 2, w))
        self.head_norm = ln(w)
        self.head = nn.Linear(w, c.channels * 4)

    def inputs(self, device, dtype):
        c = self.c
        return dict(x=torch.randn(c.batch, c.channels, c.frames, c.lat_h, c.lat_w, device=device, dtype=dtype),
                    ctx=torch.randn(c.batch, c.txt_tokens, c.ctx_dim, device=device, dtype=dtype))

    def f_in(self, x, t, ctx):
        h = self.patch_embedding(x)
        grid = h.shape[2:]
        h = h.flatten(2).transpose(1, 2)
        e = self.time_embedding(timestep_embedding(t, self.c.freq_dim).to(h.dtype))
        e0 = self.time_projection(e).unflatten(1, (6, self.c.width))
        pe = rope_table(h.shape[1], self.c.width // self.c.heads, x.device, h.dtype)
        return h, dict(e=e, e0=e0, ctx=self.text_embedding(ctx), pe=pe, grid=grid)

    def blocks(self, h, st):
        for blk in self.blocks_:
            h = blk(h, st["e0"], st["ctx"], st["pe"])
        return h

    def f_out(self, z, st):
        shift, scale = (self.head_mod + st["e"][:, None]).chunk(2, dim=1)
        out = self.head(mod(self.head_norm(z), shift, scale))
        b, (f, hh, ww), ch = out.shape[0], st["grid"], self.c.channels
        return out.view(b, f, hh, ww, 1, 2, 2, ch).permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(b, ch, f, hh * 2, ww * 2)
