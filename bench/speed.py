"""Speed of GCache Apply and Profile at real model sizes, with random weights (speed does not depend on them).

    python -m gcache.bench.speed --quick                  # tiny sizes, CPU float32, a few minutes on 2 cores
    python -m gcache.bench.speed --device cuda            # Flux-dev and Wan 2.1-1.3B at real sizes, bf16
    python -m gcache.bench.speed --device cuda --model wan --steps 12 --reps 5

Models (one torch definition per family, a size config each; `COMFYUI_PATH` set and importable → ComfyUI's own
comfy.ldm.flux.model.Flux / comfy.ldm.wan.model.WanModel are built instead, block stack swapped for a hook;
that path ran on the CPU at --quick sizes with ComfyUI a125cd84 (2025-10-12), never at real sizes or on a GPU):
  flux: Flux-dev transformer, 19 double + 38 single blocks, width 3072, 24 heads, 1024² image = 128² latent
        = 4096 image tokens (2×2 patches of 16 channels) + 512 T5 tokens, guidance embedding, batch 1 (cfg 1).
        RoPE is simplified: 1-D positions in rotate-half form; same elementwise work per block as Flux's 3-axis
        RoPE. Text tokens pass through unchanged on skipped steps (f_out reads image tokens only).
  wan:  Wan 2.1-1.3B, 30 blocks, width 1536, 12 heads, FFN 8960, self-attn + cross-attn to 512 text tokens,
        81 frames 480×832 → latent 21×60×104 → 1×2×2 patches → 32,760 tokens; CFG as a batch of 2 (branches
        cond/uncond). Same simplified RoPE.
  f_in = patch/text/time embedding; f_out = final adaLN layer + unpatchify; GCache wraps the block stack only:
  `z = cache.run(h_img, branches, blocks)`. A step = one model forward + an Euler update.

Measured, in one process, after warm-up, over --reps repetitions of N-step runs; each repetition runs every
variant once in a freshly shuffled order, ratios are taken within a repetition and the median over repetitions
is reported (drift on a shared machine cancels); CUDA events on a GPU, perf_counter on the CPU:
  none     no GCache                                  T    = time / N
  ones     ResidualCache, all-ones mask               overhead_all_ones = T(ones)/T(none) − 1   (goal ≤ 1 %),
           T per step as the median of single steps of the two variants in random order (the finest ABAB; whole
           runs vary ±3-5 % on a shared CPU, which hides 1 %); the whole-run ratio is printed too
  io       blocks replaced by the identity            T_io = time / N  (f_in + f_out + update)
  skip     mask 1,0,0,…: the real skip path           T_skip = (t(skip) − T) / (N − 1)
  half     K = N/2 computed, spread uniformly, step 0 computed
  third    K = N/3
  profile  all-ones mask + ProfileRecorder (+ finish()) profile_step_overhead = t(profile)/t(none) − 1
speedup = t(none)/t(K); ideal = N·T / (K·T + (N−K)·T_io); speedup_ratio = speedup / ideal (goal ≥ 0.95).

Profile memory model (core/profile.py), per branch b of B branches, S = numel(δ_b)·itemsize(δ):
  held for the whole run: the history N·S on the model's device (on the CPU with --history cpu) + one copy of
  the previous h, S;
  transient, on each recorded step, after the blocks have run: the full-batch δ = z − h the engine forms (B·S),
  and r·S for (hist_rows − δ) plus r·S for its abs(), r = min(N, max(1, chunk_elems // numel)).
  predicted: B·(N+1)·S <= peak extra <= B·(N+1)·S + B·S + 2·r·S  (the transients only count where they rise
  above the peak of the blocks' own activations, which they follow in time).
Measured peak extra = peak allocation of a profile run − that of an all-ones run: torch.cuda.max_memory_allocated
on a GPU, the torch profiler's allocation events (profile_memory=True, summed in time order) on the CPU;
ProfileRecorder.peak_bytes (history + previous h only) is reported too. The cache Apply holds is
CacheStats.peak_bytes of the K = N/2 run (one δ per branch: B·S).

Output: human-readable lines, then exactly one JSON line per model measured (the last stdout line is the last
model's): {"device", "model", "overhead_all_ones", "speedup_ratio_half", "speedup_ratio_third",
"profile_step_overhead", "profile_peak_extra_gb"} followed by extra keys (definition, sizes, T, T_io, …).
Threads: torch is pinned to --threads, default 1 (not 2): on the shared 2-core development machine a second
thread competing with other jobs made runs of the same variant vary 3-4x (OpenMP barriers; bench/RESULTS.md),
which no median repairs. Numbers from a shared machine are still noisy; read the per-repetition ratios.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

# Absolute imports: this file also runs as a script (`python bench/speed.py`); `pip install -e .` provides gcache.
from gcache.core import ProfileRecorder, ResidualCache
from gcache.core.profile import MAX_ELEMS, sample_stride
from gcache.search.baselines import uniform_mask


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
        return getattr(self, f"{s}_qn")(heads(q, self.nh)), getattr(self, f"{s}_kn")(heads(k, self.nh)), heads(v, self.nh)

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
        vec = self.time_in(timestep_embedding(t, 256).to(dt)) + self.guidance_in(timestep_embedding(guidance, 256).to(dt))
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


# ============================================================================ ComfyUI's own classes (untested here)
class _ComfyStack(nn.Module):
    """Stands in for ComfyUI's block list: forward_orig calls it once per step; it runs the real blocks
    through the hook. With this as the only entry, ComfyUI's forward_orig is exactly f_in → stack → f_out."""

    def __init__(self, family: str, real: list):
        super().__init__()
        self.family, self.real, self.hook = family, nn.ModuleList(nn.ModuleList(r) for r in real), None

    def forward(self, *args, **kw):
        if self.family == "flux":  # called as a double block: (img=, txt=, vec=, pe=, attn_mask=…) → (img, txt)
            img, txt = kw.pop("img"), kw.pop("txt")
            dbl, sgl = self.real

            def run(h):
                i, t = h, txt
                for blk in dbl:
                    i, t = blk(img=i, txt=t, **kw)
                x = torch.cat([t, i], dim=1)
                for blk in sgl:
                    x = blk(x, vec=kw["vec"], pe=kw["pe"], attn_mask=kw.get("attn_mask"),
                            **{k: v for k, v in kw.items() if k == "transformer_options"})
                return x[:, t.shape[1]:]
            return self.hook(img, run), txt
        x = args[0] if args else kw.pop("x")

        def run(h):
            for blk in self.real[0]:
                h = blk(h, **kw)
            return h
        return self.hook(x, run)


class ComfyModel(nn.Module):
    def __init__(self, family: str, c, device, dtype):
        super().__init__()
        sys.path.insert(0, os.environ["COMFYUI_PATH"])
        if torch.device(device).type == "cpu":  # before comfy.model_management probes for a GPU
            from comfy.cli_args import args as comfy_args
            comfy_args.cpu = True
        import comfy.ops  # ComfyUI's layers with init disabled
        ops = comfy.ops.disable_weight_init
        self.family, self.c, self.branches = family, c, FluxLike.branches if family == "flux" else WanLike.branches
        if family == "flux":
            from comfy.ldm.flux.model import Flux
            d = c.width // c.heads
            self.m = Flux(operations=ops, in_channels=c.channels, out_channels=c.channels, vec_in_dim=c.vec_dim,
                          context_in_dim=c.ctx_dim, hidden_size=c.width, mlp_ratio=c.mlp_ratio, num_heads=c.heads,
                          depth=c.double, depth_single_blocks=c.single, axes_dim=[16, 56, 56] if d == 128 else [d - 2 * (3 * d // 8), 3 * d // 8, 3 * d // 8],
                          theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True,
                          dtype=dtype, device=device)
            self.stack = _ComfyStack("flux", [list(self.m.double_blocks), list(self.m.single_blocks)])
            self.m.double_blocks, self.m.single_blocks = nn.ModuleList([self.stack]), nn.ModuleList()
        else:
            from comfy.ldm.wan.model import WanModel
            self.m = WanModel(model_type="t2v", patch_size=(1, 2, 2), text_len=c.txt_tokens, in_dim=c.channels,
                              dim=c.width, ffn_dim=c.ffn, freq_dim=c.freq_dim, text_dim=c.ctx_dim, out_dim=c.channels,
                              num_heads=c.heads, num_layers=c.depth, operations=ops, dtype=dtype, device=device)
            self.stack = _ComfyStack("wan", [list(self.m.blocks)])
            self.m.blocks = nn.ModuleList([self.stack])

    inputs = lambda self, device, dtype: (FluxLike.inputs if self.family == "flux" else WanLike.inputs)(self, device, dtype)  # noqa: E731

    def step(self, x, t, inp, stack):
        self.stack.hook = (lambda h, run: stack(h, self.branches, run))
        if self.family == "flux":
            return self.m(x, t, inp["ctx"], inp["y"], guidance=inp["guidance"])
        return self.m(x, t, inp["ctx"])


# ============================================================================ the step and the runs
def forward(model, x, t, inp, stack: Callable):
    """One model call: f_in → stack(h, branches, blocks) → f_out."""
    if isinstance(model, ComfyModel):
        return model.step(x, t, inp, stack)
    extra = {k: v for k, v in inp.items() if k != "x"}
    h, st = model.f_in(x, t, **extra)
    z = stack(h, model.branches, lambda hh: model.blocks(hh, st))
    return model.f_out(z, st)


VARIANTS = ("none", "ones", "profile", "io", "skip", "half", "third")


class Bench:
    def __init__(self, model, device, dtype, n_steps: int, history: Optional[str]):
        self.model, self.device, self.dtype, self.n = model, device, dtype, n_steps
        self.history = history
        self.inp = model.inputs(device, dtype)
        self.times = torch.linspace(1.0, 0.0, n_steps + 1).tolist()
        self.masks = {"ones": [1] * n_steps, "profile": [1] * n_steps, "skip": [1] + [0] * (n_steps - 1),
                      "half": uniform_mask(n_steps, n_steps // 2), "third": uniform_mask(n_steps, n_steps // 3)}
        self.last_stats = {}
        self.last_recorder = None

    def run(self, variant: str) -> None:
        """N sampler steps (Euler, flow matching) of one variant, including the cache's close()/finish()."""
        x = self.inp["x"]
        cache = rec = None
        if variant == "none":
            stack = lambda h, b, blocks: blocks(h)  # noqa: E731
        elif variant == "io":
            stack = lambda h, b, blocks: h  # noqa: E731
        else:
            if variant == "profile":
                rec = ProfileRecorder(self.times[:-1], history_device=self.history)
            cache = ResidualCache(self.masks[variant], recorder=rec)
            stack = cache.run
        for i in range(self.n):
            t0, t1 = self.times[i], self.times[i + 1]
            if cache is not None:
                cache.set_step(i)
            v = forward(self.model, x, torch.full((x.shape[0],), t0, device=self.device), self.inp, stack)
            x = x + (t1 - t0) * v
        if cache is not None:
            self.last_stats[variant] = cache.close()
        if rec is not None:
            self.last_recorder = rec
            rec.finish()
        self._sink = x

    def timed(self, variant: str) -> float:
        if self.device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            self.run(variant)
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1000.0
        t = time.perf_counter()
        self.run(variant)
        return time.perf_counter() - t

    def step_ab(self, count: int, seed: int = 1) -> dict:
        """Single steps, no GCache vs all-ones, in random order (the finest ABAB): median seconds per step."""
        rng = random.Random(seed)
        cache = ResidualCache([1] * count)
        none = lambda h, b, blocks: blocks(h)  # noqa: E731
        x, t = self.inp["x"], torch.full((self.inp["x"].shape[0],), 0.5, device=self.device)
        out = {"none": [], "ones": []}
        for i in range(count):
            v = rng.choice(("none", "ones"))
            sync(self.device)
            t0 = time.perf_counter()
            if v == "ones":
                cache.set_step(i)
            self._sink = x + 0.1 * forward(self.model, x, t, self.inp, none if v == "none" else cache.run)
            sync(self.device)
            out[v].append(time.perf_counter() - t0)
        cache.close()
        return {v: statistics.median(ts) for v, ts in out.items()}

    def peak_alloc(self, variant: str) -> int:
        """Peak bytes allocated above the level at the start of one run of `variant`."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            self.run(variant)
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - base
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
            self.run(variant)
        evs = sorted((e.start_ns(), e.nbytes()) for e in p.profiler.kineto_results.events() if e.name() == "[memory]")
        cur = peak = 0
        for _, nb in evs:
            cur += nb
            peak = max(peak, cur)
        return peak

    def pieces(self, reps: int) -> dict:
        """Median seconds of the parts of one step (synchronised per piece): where the time goes."""
        m, x, inp = self.model, self.inp["x"], self.inp
        if isinstance(m, ComfyModel):
            return {}
        t = torch.full((x.shape[0],), 0.5, device=self.device)
        extra = {k: v for k, v in inp.items() if k != "x"}
        h, st = m.f_in(x, t, **extra)
        z = m.blocks(h, st)
        delta = z - h
        ones = ResidualCache([1] * 2, time_steps=True)
        ones.set_step(0)
        skip = ResidualCache([1, 0])
        skip.set_step(0)
        skip.run(h, m.branches, lambda hh: z)  # stores δ (next step is skipped)
        skip.set_step(1)
        store = ResidualCache([1, 0])  # a computed step whose δ is kept: snapshot of h, δ into it, store
        store.set_step(0)
        fns = {"f_in": lambda: m.f_in(x, t, **extra), "blocks": lambda: m.blocks(h, st), "f_out": lambda: m.f_out(z, st),
               "update": lambda: x + 0.1 * x,
               "engine_all_ones_call": lambda: ones.run(h, m.branches, lambda hh: z),
               "engine_skip_call": lambda: skip.run(h, m.branches, lambda hh: z),
               "engine_store_call": lambda: store.run(h, m.branches, lambda hh: z),
               "h_snapshot": lambda: h.clone(),
               "delta_z_minus_h": lambda: z - h, "h_plus_delta": lambda: h + delta,
               "profile_record_mean": lambda: self._record_all(h, delta)}
        out = {}
        for k, fn in fns.items():
            fn()
            ts = []
            for _ in range(reps):
                sync(self.device)
                t0 = time.perf_counter()
                fn()
                sync(self.device)
                ts.append(time.perf_counter() - t0)
            out[k] = statistics.median(ts)
        out["profile_record_mean"] /= self.n  # that piece recorded all N steps
        ones.close()
        skip.close()
        store.close()
        return out

    def _record_all(self, h, delta) -> None:
        """A fresh ProfileRecorder fed N steps of every branch, then finish()."""
        rec = ProfileRecorder(self.times[:-1], history_device=self.history)
        br = self.model.branches
        hs, ds = h.chunk(len(br), 0), delta.chunk(len(br), 0)
        for i in range(self.n):
            for k, hp, dp in zip(br, hs, ds):
                rec.record(i, k, hp, dp)
        rec.finish()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ============================================================================ building and reporting
def build(family: str, size, device, dtype, use_comfy: bool):
    torch.manual_seed(0)
    if use_comfy:  # ComfyUI's layers are created uninitialised on the device in the model's dtype
        model = ComfyModel(family, size, device, dtype)
        definition = "ComfyUI " + ("comfy.ldm.flux.model.Flux" if family == "flux" else "comfy.ldm.wan.model.WanModel")
    else:  # on the meta device first: a 12B model is never materialised in float32
        with torch.device("meta"):
            model = FluxLike(size) if family == "flux" else WanLike(size)
        model = model.to(dtype=dtype).to_empty(device=device)
        definition = "bench/speed.py torch definition (simplified 1-D RoPE)"
    with torch.no_grad():  # random weights (speed does not depend on them), scaled to keep activations finite
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5 / math.sqrt(p[0].numel() if p.dim() > 2 else p.shape[-1]))
            elif "norm" in name or name.endswith(("qn.weight", "kn.weight")):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model.eval(), definition


def predicted_profile_bytes(numel_branch: int, itemsize: int, n: int, branches: int, chunk_elems: int = 1 << 25,
                            width: int = 1, max_elems: Optional[int] = MAX_ELEMS) -> dict:
    """core/profile.py's memory model: history and previous h of m sampled elements per branch, the batch's δ,
    and the row temporaries (m = numel up to max_elems, else every stride-th element)."""
    m = len(range(0, numel_branch, sample_stride(numel_branch, width, max_elems)))
    s, full = m * itemsize, numel_branch * itemsize
    r = min(max(1, chunk_elems // max(1, m)), n)
    hist = branches * n * s
    # Row temporaries: the difference block, plus its copy from the host when the history is offloaded.
    return {"history": hist, "prev_h": branches * s, "delta_batch": branches * full, "row_temps": 2 * r * s,
            "total": hist + branches * s + branches * full + 2 * r * s}


def real_size_predictions() -> list:
    """The memory formula at real sizes (bf16), for the text report."""
    rows = []
    f, w = FluxSize(), WanSize()
    flux_numel = (f.lat_h // 2) * (f.lat_w // 2) * f.width
    wan_numel = w.frames * (w.lat_h // 2) * (w.lat_w // 2) * w.width
    for name, numel, b, n in (("flux-dev 1024² bf16", flux_numel, 1, 30), ("wan2.1-1.3B 81f 480p bf16", wan_numel, 2, 30),
                              ("wan2.1-1.3B 81f 480p bf16", wan_numel, 2, 50)):
        p = predicted_profile_bytes(numel, 2, n, b, width=f.width if name.startswith("flux") else w.width)
        rows.append((name, n, b, numel * 2, p))
    return rows


def tune_malloc() -> str:
    """Keep freed CPU memory in the process (like CUDA's caching allocator). With glibc's defaults, large
    activations are returned to the OS and page-faulted back each step, and a run that holds more memory (the
    Profile history) changes that pattern: it measured 2-8 % *faster* than no GCache (bench/RESULTS.md)."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        ok = (libc.mallopt(-1, 1 << 30), libc.mallopt(-3, 32 << 20))  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD (max)
        return "M_TRIM_THRESHOLD=1 GiB, M_MMAP_THRESHOLD=32 MiB" if all(ok) else f"mallopt refused ({ok})"
    except (OSError, AttributeError) as e:
        return f"not glibc ({e})"


def gb(x: float) -> float:
    return x / 1e9


def paired(samples: dict, n: int) -> dict:
    """Per repetition (its variants ran back to back, so slow drift cancels), then the median over repetitions."""
    reps = len(samples["none"])
    per = {k: [] for k in ("over", "prof", "sp_half", "ideal_half", "ratio_half", "sp_third", "ideal_third", "ratio_third")}
    for r in range(reps):
        t = {v: samples[v][r] for v in VARIANTS}
        T, T_io = t["none"] / n, t["io"] / n
        per["over"].append(t["ones"] / t["none"] - 1)
        per["prof"].append(t["profile"] / t["none"] - 1)
        for key, k in (("half", n // 2), ("third", n // 3)):
            ideal = n * T / (k * T + (n - k) * T_io)
            sp = t["none"] / t[key]
            per[f"sp_{key}"].append(sp)
            per[f"ideal_{key}"].append(ideal)
            per[f"ratio_{key}"].append(sp / ideal)
    return {k: (statistics.median(v), v) for k, v in per.items()}


def measure(family: str, args) -> dict:
    device = torch.device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    size = (QUICK if args.quick else FULL)[family]
    use_comfy = bool(os.environ.get("COMFYUI_PATH"))
    model, definition = build(family, size, device, dtype, use_comfy)
    n, reps = args.steps, args.reps
    bench = Bench(model, device, dtype, n, None if args.history == "device" else "cpu")
    print(f"\n== {family}: {definition}; {asdict(size)}; device {device}, {dtype}, N={n}, reps={reps}", flush=True)

    with torch.inference_mode():
        for v in VARIANTS:  # warm-up (allocator, kernels, caches)
            bench.run(v)
        samples = {v: [] for v in VARIANTS}
        rng = random.Random(0)
        for r in range(reps):
            order = list(VARIANTS)
            rng.shuffle(order)  # a fixed cyclic order left a position bias of a few % (bench/RESULTS.md)
            for v in order:
                samples[v].append(bench.timed(v))
        ab = bench.step_ab(max(40, 2 * n * reps))
        pieces = bench.pieces(max(reps, 5))
        peak_ones = bench.peak_alloc("ones")
        peak_prof = bench.peak_alloc("profile")
        rec_peak = bench.last_recorder.peak_bytes
        bench.run("half")
        apply_bytes = bench.last_stats["half"].peak_bytes
        x = bench.inp["x"]
        numel = None
        if not isinstance(model, ComfyModel):
            h, _ = model.f_in(x, torch.zeros(x.shape[0], device=device), **{k: v for k, v in bench.inp.items() if k != "x"})
            numel = h.numel() // h.shape[0]

    med = {v: statistics.median(s) for v, s in samples.items()}
    pr = paired(samples, n)
    T, T_io = med["none"] / n, med["io"] / n
    T_skip = (med["skip"] - T) / (n - 1)
    extra = peak_prof - peak_ones
    fmt = lambda v: ",".join(f"{x:.3f}" for x in v)  # noqa: E731
    print(f"per step (median of {reps} N-step runs / N):  T={T * 1e3:.2f} ms  T_io(f_in+f_out+update)={T_io * 1e3:.2f} ms"
          f"  T_skip(real skip path)={T_skip * 1e3:.2f} ms  all-ones={med['ones'] / n * 1e3:.2f} ms"
          f"  profile={med['profile'] / n * 1e3:.2f} ms")
    print("runs (s): " + "  ".join(f"{v}={fmt(samples[v])}" for v in VARIANTS))
    over_steps = ab["ones"] / ab["none"] - 1
    print(f"overhead all-ones: {over_steps * 100:+.2f} % from {max(40, 2 * n * reps)} single steps in random order "
          f"(median {ab['ones'] * 1e3:.3f} vs {ab['none'] * 1e3:.3f} ms; goal <= 1 %); from whole runs "
          f"{pr['over'][0] * 100:+.2f} % (per repetition {fmt(pr['over'][1])})")
    for key in ("half", "third"):
        k = sum(bench.masks[key])
        print(f"K={k}/{n} mask {''.join(map(str, bench.masks[key]))}: speed-up {pr['sp_' + key][0]:.3f}x, ideal "
              f"{pr['ideal_' + key][0]:.3f}x, ratio {pr['ratio_' + key][0]:.3f} (per repetition "
              f"{fmt(pr['ratio_' + key][1])}; goal >= 0.95)")
    print(f"profile overhead per step: {pr['prof'][0] * 100:+.2f} % vs no GCache (per repetition {fmt(pr['prof'][1])})")
    if pieces:
        print("where the time goes (median per piece, synchronised): " +
              "  ".join(f"{k}={v * 1e3:.3f}ms" for k, v in pieces.items()))
        print(f"  engine cost per all-ones step / T = {pieces['engine_all_ones_call'] / T * 100:.4f} %; "
              f"profile record cost per step (mean over N) / T = {pieces['profile_record_mean'] / T * 100:.3f} %; "
              f"skip call (enter + cat + h+δ) {pieces['engine_skip_call'] * 1e3:.3f} ms vs one add h+δ "
              f"{pieces['h_plus_delta'] * 1e3:.3f} ms")
        print(f"  snapshot of h on entry (in-place-safe δ, on computed steps whose δ is kept): "
              f"{pieces['h_snapshot'] * 1e3:.3f} ms = {pieces['h_snapshot'] / T * 100:.3f} % of T; such a step's "
              f"engine call {pieces['engine_store_call'] * 1e3:.3f} ms vs z − h alone {pieces['delta_z_minus_h'] * 1e3:.3f} ms")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if numel is not None:
        b = len(model.branches)
        p = predicted_profile_bytes(numel, itemsize, n, b)
        low = p["history"] + p["prev_h"]
        print(f"profile memory, measured: peak extra {extra / 2**20:.3f} MiB (profile run {peak_prof / 2**20:.2f} MiB − "
              f"all-ones run {peak_ones / 2**20:.2f} MiB), recorder.peak_bytes {rec_peak / 2**20:.3f} MiB; predicted from "
              f"the formula: held B·(N+1)·S = {low / 2**20:.3f} MiB <= extra <= upper bound {p['total'] / 2**20:.3f} MiB "
              f"({', '.join(f'{k} {v / 2**20:.3f}' for k, v in p.items() if k != 'total')} MiB) -> "
              f"{'MET' if low <= extra <= p['total'] else 'NOT MET'}")
        print(f"Apply cache held (K=N/2), measured: {apply_bytes / 2**20:.3f} MiB; predicted B·S = {b * numel * itemsize / 2**20:.3f} MiB")
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {"device": dev, "model": family + ("-quick" if args.quick else ""),
            "overhead_all_ones": round(over_steps, 4), "speedup_ratio_half": round(pr["ratio_half"][0], 4),
            "speedup_ratio_third": round(pr["ratio_third"][0], 4), "profile_step_overhead": round(pr["prof"][0], 4),
            "profile_peak_extra_gb": round(gb(extra), 6),
            "definition": definition, "dtype": args.dtype, "steps": n, "reps": reps, "history": args.history,
            "overhead_all_ones_runs": round(pr["over"][0], 4), "T_ms": round(T * 1e3, 3), "T_io_ms": round(T_io * 1e3, 3), "T_skip_ms": round(T_skip * 1e3, 3),
            "speedup_half": round(pr["sp_half"][0], 4), "ideal_half": round(pr["ideal_half"][0], 4),
            "speedup_third": round(pr["sp_third"][0], 4), "ideal_third": round(pr["ideal_third"][0], 4),
            "recorder_peak_gb": round(gb(rec_peak), 6), "apply_cache_gb": round(gb(apply_bytes), 6),
            **({"snapshot_ms": round(pieces["h_snapshot"] * 1e3, 4),
                "snapshot_share": round(pieces["h_snapshot"] / T, 6)} if pieces else {}),
            "date": time.strftime("%Y-%m-%d")}


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes on the CPU in float32 (a few minutes)")
    ap.add_argument("--model", choices=("flux", "wan", "all"), default="all")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available and not --quick)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--steps", type=int, default=12, help="N sampler steps per run (K = N/2 and N/3)")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per variant (medians)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, see the docstring)")
    ap.add_argument("--history", choices=("device", "cpu"), default="device", help="ProfileRecorder history_device")
    args = ap.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    if args.steps < 6 or args.reps < 1:
        ap.error("--steps must be >= 6 (K = N/3 >= 2) and --reps >= 1")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    if not args.device.startswith("cuda"):
        print(f"glibc malloc tuned for stable CPU timings: {tune_malloc()}")
    if os.environ.get("COMFYUI_PATH"):
        print(f"models: ComfyUI's classes from COMFYUI_PATH={os.environ['COMFYUI_PATH']} (checked at --quick sizes on CPU only)")
    else:
        print("models: bench/speed.py's own torch definitions (COMFYUI_PATH not set)")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print("profile memory formula at real sizes (predicted from the formula, not measured):")
    for name, n, b, s, p in real_size_predictions():
        low = p["history"] + p["prev_h"]
        print(f"  {name}, N={n}, {b} branch(es), S={s / 2**20:.1f} MiB: held history {gb(p['history']):.3f} GB + prev h "
              f"{gb(p['prev_h']):.3f} GB = {gb(low):.3f} GB; upper bound with δ {gb(p['delta_batch']):.3f} GB + row "
              f"temporaries {gb(p['row_temps']):.3f} GB = {gb(p['total']):.3f} GB on the device "
              f"(--history cpu: {gb(p['history']):.3f} GB host RAM, device <= {gb(p['total'] - p['history'] + p['row_temps'] / 2):.3f} GB"
              " incl. the streamed rows)")
    lines = []
    for fam in (("flux", "wan") if args.model == "all" else (args.model,)):
        lines.append(measure(fam, args))
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    for line in lines:
        print(json.dumps(line))
    return lines


if __name__ == "__main__":
    main()
