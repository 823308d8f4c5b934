"""Tiny random-weight models built from ComfyUI's own classes (test helper; imports ComfyUI).

Each builder returns a ModelPatcher (sampled on ComfyUI's device: the CPU here, the GPU in bench/gpu_check.sh)
and the conditioning/latent shapes it needs. Flux is built
directly from its classes (ComfyUI's detection fixes Flux's width at 3072); Wan 2.1 and HunyuanVideo are
written as safetensors and loaded through comfy.sd.load_diffusion_model, the stock UNETLoader's loader.
"""
from __future__ import annotations

import dataclasses
import importlib
import os

import comfy.model_management
import comfy.model_patcher
import comfy.sd
import comfy.supported_models as sm
import comfy.utils
import torch

CPU = torch.device("cpu")
DEVICE = comfy.model_management.get_torch_device()  # where ComfyUI samples: the GPU in bench/gpu_check.sh


# Fields that the params dataclasses of newer ComfyUI require (0.33: FluxParams.txt_ids_dims, ChromaParams.vec_in_dim,
# ChromaRadianceParams.use_x0, HunyuanVideoParams.use_cond_type_embedding, ...), with the value comfy.model_detection
# gives a plain model of the family. A required field this table lacks fails the builder with its name.
PLAIN = {"txt_ids_dims": [], "vec_in_dim": None, "use_x0": False, "use_sequential_txt_ids": False,
         "use_cond_type_embedding": False, "vision_in_dim": None, "meanflow_sum": False}


def complete(cfg: dict, params: str) -> dict:
    """`cfg` plus every field the params dataclass `params` ("module.Class" under comfy.ldm) requires and cfg
    lacks, so that one builder works on every ComfyUI version."""
    module, cls = params.rsplit(".", 1)
    fields = dataclasses.fields(getattr(importlib.import_module("comfy.ldm." + module), cls))
    out = dict(cfg)
    for f in fields:
        if f.name in out or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        if f.name not in PLAIN:
            raise KeyError(f"{params} requires {f.name!r}, which tests/comfyui/tiny_models.PLAIN does not know: "
                           "add the value comfy.model_detection gives a plain model")
        out[f.name] = PLAIN[f.name]
    return out


def _randomize(module: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def _patcher(model_config_cls, unet_config: dict, seed: int):
    mc = model_config_cls(unet_config)
    mc.set_inference_dtype(torch.float32, None)
    model = mc.get_model({}, device=CPU)
    model.diffusion_model.to(torch.float32)
    _randomize(model.diffusion_model, seed)
    model.eval()
    return comfy.model_patcher.ModelPatcher(model, load_device=DEVICE, offload_device=CPU)


def _cond(batch_tokens: int, dim: int, seed: int, **extra):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(1, batch_tokens, dim, generator=g), dict(extra)]]


def flux(seed: int = 0, hidden_size: int = 64, depth: int = 2, side: int = 16):
    """Tiny Flux; a wider/deeper/larger one (hidden_size 256, depth 4, side 32) where the block stack, not
    Python, dominates a step (for speed checks)."""
    cfg = {"image_model": "flux", "in_channels": 16, "out_channels": 16, "patch_size": 2, "vec_in_dim": 24,
           "context_in_dim": 32, "hidden_size": hidden_size, "mlp_ratio": 2.0, "num_heads": hidden_size // 32,
           "depth": depth, "depth_single_blocks": depth, "axes_dim": [8, 12, 12], "theta": 10000, "qkv_bias": True,
           "guidance_embed": False}
    m = _patcher(sm.Flux, complete(cfg, "flux.model.FluxParams"), seed)
    g = torch.Generator().manual_seed(seed + 1)
    pos = _cond(6, 32, seed + 2, pooled_output=torch.randn(1, 24, generator=g))
    neg = _cond(6, 32, seed + 3, pooled_output=torch.randn(1, 24, generator=g))
    return m, pos, neg, torch.zeros(1, 16, side, side)


def _wan_state_dict(seed: int) -> dict:
    from comfy.ldm.wan.model import WanModel
    # detection reads dim, ffn_dim, layers and in/out dims from the weights; freq_dim/text_dim are fixed there
    net = WanModel(model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=128, ffn_dim=256, out_dim=16,
                   num_heads=1, num_layers=3, operations=_ops())
    _randomize(net, seed)
    return net.state_dict()


def _hunyuan_state_dict(seed: int) -> dict:
    from comfy.ldm.hunyuan_video.model import HunyuanVideo
    # detection fixes vec_in_dim=768 and mlp_ratio=4; width, heads (width // 128) and depths come from weights
    cfg = dict(in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=32, hidden_size=128, mlp_ratio=4.0,
               num_heads=1, depth=2, depth_single_blocks=2, axes_dim=[16, 56, 56], theta=256, patch_size=[1, 2, 2],
               qkv_bias=True, guidance_embed=False, byt5=False, meanflow=False)
    net = HunyuanVideo(image_model="hunyuan_video", operations=_ops(),
                       **complete(cfg, "hunyuan_video.model.HunyuanVideoParams"))
    _randomize(net, seed)
    return net.state_dict()


def _ops():
    import comfy.ops
    return comfy.ops.disable_weight_init


def write_unet(kind: str, path: str, seed: int = 0) -> str:
    sd = {"wan": _wan_state_dict, "hunyuan_video": _hunyuan_state_dict}[kind](seed)
    comfy.utils.save_torch_file({k: v.contiguous() for k, v in sd.items()}, path)
    return path


def load_unet(path: str):
    m = comfy.sd.load_diffusion_model(path, model_options={"dtype": torch.float32})
    return m


def wan(tmpdir: str, seed: int = 0):
    m = load_unet(write_unet("wan", os.path.join(tmpdir, "wan_tiny.safetensors"), seed))
    return m, _cond(8, 4096, seed + 2), _cond(8, 4096, seed + 3), torch.zeros(1, 16, 3, 8, 8)


def hunyuan_video(tmpdir: str, seed: int = 0):
    m = load_unet(write_unet("hunyuan_video", os.path.join(tmpdir, "hv_tiny.safetensors"), seed))
    g = torch.Generator().manual_seed(seed + 1)
    pos = _cond(6, 32, seed + 2, pooled_output=torch.randn(1, 768, generator=g))
    neg = _cond(6, 32, seed + 3, pooled_output=torch.randn(1, 768, generator=g))
    return m, pos, neg, torch.zeros(1, 16, 3, 8, 8)


def lumina2(seed: int = 0):
    """Lumina2 / NextDiT: no dit replace in its loop, so GCache gates its blocks through object patches."""
    cfg = {"image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 64, "n_layers": 3,
           "n_refiner_layers": 1, "n_heads": 2, "n_kv_heads": 2, "multiple_of": 16, "ffn_dim_multiplier": None,
           "norm_eps": 1e-5, "qk_norm": True, "cap_feat_dim": 32, "axes_dims": [8, 12, 12],
           "axes_lens": [300, 512, 512]}
    m = _patcher(sm.Lumina2, cfg, seed)
    mask = torch.ones(1, 6, dtype=torch.long)
    return m, _cond(6, 32, seed + 2, attention_mask=mask), _cond(6, 32, seed + 3, attention_mask=mask), \
        torch.zeros(1, 16, 8, 8)


class BlockRuns:
    """Counts a Flux model's block-stack runs: the first double block's forward calls (at cfg 1, one per computed
    step; CFG branches batched together count once)."""

    def __init__(self, model):
        block = model.get_model_object("diffusion_model").double_blocks[0]
        self.n = 0
        self.h = block.register_forward_pre_hook(lambda *a: setattr(self, "n", self.n + 1))

    def __enter__(self):
        return self

    def __exit__(self, *e):
        self.h.remove()


def ksample(model, pos, neg, lat, steps: int):
    """KSampler's own sampling of `lat` with euler / simple, CFG 1, seed 0: the auto tests' run."""
    import nodes
    return nodes.common_ksampler(model, 0, steps, 1.0, "euler", "simple", pos, neg, {"samples": lat})[0]["samples"]
