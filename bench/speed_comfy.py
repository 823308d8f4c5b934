"""ComfyUI's own Flux / WanModel for bench/speed.py (when COMFYUI_PATH is set): the real forward_orig, with
the block list swapped for one hook module, so that forward_orig is exactly f_in → stack → f_out."""
from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn

from .speed_models import FluxLike, WanLike


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
                          depth=c.double, depth_single_blocks=c.single,
                          axes_dim=[16, 56, 56] if d == 128 else [d - 2 * (3 * d // 8), 3 * d // 8, 3 * d // 8],
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

    inputs = lambda self, device, dtype: (  # noqa: E731
        FluxLike.inputs if self.family == "flux" else WanLike.inputs)(self, device, dtype)

    def step(self, x, t, inp, stack):
        self.stack.hook = (lambda h, run: stack(h, self.branches, run))
        if self.family == "flux":
            return self.m(x, t, inp["ctx"], inp["y"], guidance=inp["guidance"])
        return self.m(x, t, inp["ctx"])
