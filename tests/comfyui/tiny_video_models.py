"""Tiny random-weight video models built from ComfyUI's own classes (test helper; imports ComfyUI).

Same conventions as tiny_models: float32 on the CPU, each builder returns (ModelPatcher, positive, negative,
latent) with conds in ComfyUI's [[tensor, {extras}]] form. LTXV and both Cosmos generations are built directly
as comfy.supported_models.<X>(unet_config) (their detection fixes widths, depths or head counts); the Wan
variants are written as safetensors and loaded through comfy.sd.load_diffusion_model (the stock UNETLoader
path), whose detection reads their sizes from the weights (Wan's head count is dim // 128, hence dim 128).
"""
from __future__ import annotations

import os

import comfy.supported_models as sm
import comfy.utils
import torch
from tiny_models import _cond, _ops, _patcher, _randomize, load_unet, write_unet


def _save(sd: dict, path: str) -> str:
    comfy.utils.save_torch_file({k: v.contiguous() for k, v in sd.items()}, path)
    return path


def _patcher_scaled(model_config_cls, unet_config: dict, seed: int, scale: float):
    """_patcher, with weights at `scale`: at tiny_models' 0.05 the adaLN-gated stacks of LTXV and Cosmos barely
    change the output (Cosmos 1: blocks on vs skipped differ by 0.008 on an output of std 0.4)."""
    m = _patcher(model_config_cls, unet_config, seed)
    _randomize(m.model.diffusion_model, seed, scale)
    return m


def ltxv(tmpdir: str, seed: int = 0):
    """LTX-Video (LTXVModel): 128-channel latent (1x128xTxHxW, 1 token per latent pixel), 2 blocks of width 64.
    Its blocks add into their input in place (`x += ...` in BasicTransformerBlock)."""
    cfg = {"image_model": "ltxv", "in_channels": 128, "num_attention_heads": 2, "attention_head_dim": 32,
           "cross_attention_dim": 64, "caption_channels": 32, "num_layers": 2}  # cross_attention_dim == width
    m = _patcher_scaled(sm.LTXV, cfg, seed, 0.1)
    mask = torch.ones(1, 6, dtype=torch.long)  # LTXVModel.forward requires it; its T5 encoder always returns one
    pos = _cond(6, 32, seed + 2, attention_mask=mask, frame_rate=25.0)
    neg = _cond(6, 32, seed + 3, attention_mask=mask, frame_rate=25.0)
    return m, pos, neg, torch.zeros(1, 128, 3, 4, 4)


def _vace_state_dict(seed: int) -> dict:
    from comfy.ldm.wan.model import VaceWanModel
    # detection: model_type "vace" from vace_patch_embedding, vace_in_dim (32 frame + 64 mask channels) and
    # vace_layers from the weights; hints join after blocks range(0, num_layers, num_layers // vace_layers)
    net = VaceWanModel(patch_size=(1, 2, 2), in_dim=16, dim=128, ffn_dim=256, out_dim=16, num_heads=1,
                       num_layers=4, vace_layers=2, vace_in_dim=96, operations=_ops())
    _randomize(net, seed)
    return net.state_dict()


def wan_vace(tmpdir: str, seed: int = 0):
    """Wan 2.1 VACE (VaceWanModel, WAN21_Vace): 4 blocks, VACE hints added after blocks 0 and 2. The conds
    carry vace_frames / vace_mask / vace_strength as WanVaceToVideo appends them (frames: 32 latent channels,
    inactive+reactive; mask: 64 channels = the 8x8 pixel stride folded into channels; both at latent size)."""
    m = load_unet(_save(_vace_state_dict(seed), os.path.join(tmpdir, f"wan_vace_tiny_{seed}.safetensors")))
    t, h, w = 3, 8, 8
    g = torch.Generator().manual_seed(seed + 1)
    vace = {"vace_frames": [torch.randn(1, 32, t, h, w, generator=g)], "vace_mask": [torch.ones(1, 64, t, h, w)],
            "vace_strength": [1.0]}
    return m, _cond(8, 4096, seed + 2, **vace), _cond(8, 4096, seed + 3, **vace), torch.zeros(1, 16, t, h, w)


def wan22_14b(tmpdir: str, seed: int = 0):
    """Wan 2.2 A14B: two Wan 2.1-architecture t2v experts (high noise, low noise) with different weights.
    Returns (high_patcher, low_patcher, positive, negative, latent)."""
    high = load_unet(write_unet("wan", os.path.join(tmpdir, f"wan22_high_{seed}.safetensors"), seed))
    low = load_unet(write_unet("wan", os.path.join(tmpdir, f"wan22_low_{seed + 100}.safetensors"), seed + 100))
    return high, low, _cond(8, 4096, seed + 2), _cond(8, 4096, seed + 3), torch.zeros(1, 16, 3, 8, 8)


def _wan22_5b_state_dict(seed: int) -> dict:
    from comfy.ldm.wan.model import WanModel
    # out_dim 48 is what detection matches to WAN22_T2V (Wan 2.2 VAE latent, 48 channels)
    net = WanModel(model_type="t2v", patch_size=(1, 2, 2), in_dim=48, dim=128, ffn_dim=256, out_dim=48,
                   num_heads=1, num_layers=3, operations=_ops())
    _randomize(net, seed)
    return net.state_dict()


def wan22_5b(tmpdir: str, seed: int = 0):
    """Wan 2.2 TI2V 5B (WanModel, WAN22_T2V, model_base.WAN22): 48-channel Wan22 latent. Plain t2v sampling
    uses one timestep per sample; with a latent noise_mask (see wan22_5b_noise_mask) model_base.WAN22 turns
    the timestep into one per latent frame, and each block gets a per-frame modulation (vec is B x T x 6 x D)."""
    m = load_unet(_save(_wan22_5b_state_dict(seed), os.path.join(tmpdir, f"wan22_5b_tiny_{seed}.safetensors")))
    return m, _cond(8, 4096, seed + 2), _cond(8, 4096, seed + 3), torch.zeros(1, 48, 3, 8, 8)


def wan22_5b_noise_mask(latent: torch.Tensor) -> torch.Tensor:
    """The noise_mask Wan22ImageToVideoLatent sets with a start image: frame 0 kept, the rest denoised."""
    mask = torch.ones(latent.shape[0], 1, *latent.shape[2:])
    mask[:, :, :1] = 0.0
    return mask


def cosmos_predict2(tmpdir: str, seed: int = 0):
    """Cosmos Predict2 (MiniTrainDIT, CosmosT2IPredict2): 2 blocks of width 64, tokens as B T H W D.
    No dit replace in its loop (GCache uses object patches)."""
    cfg = {"image_model": "cosmos_predict2", "max_img_h": 240, "max_img_w": 240, "max_frames": 128,
           "in_channels": 16, "out_channels": 16, "patch_spatial": 2, "patch_temporal": 1,
           "concat_padding_mask": True, "model_channels": 64, "num_blocks": 2, "num_heads": 2,
           "crossattn_emb_channels": 32, "pos_emb_cls": "rope3d", "pos_emb_learnable": True,
           "pos_emb_interpolation": "crop", "min_fps": 1, "max_fps": 30, "use_adaln_lora": True,
           "adaln_lora_dim": 16, "extra_per_block_abs_pos_emb": False, "rope_h_extrapolation_ratio": 4.0,
           "rope_w_extrapolation_ratio": 4.0, "rope_t_extrapolation_ratio": 1.0,
           "extra_h_extrapolation_ratio": 1.0, "extra_w_extrapolation_ratio": 1.0,
           "extra_t_extrapolation_ratio": 1.0, "rope_enable_fps_modulation": False}
    m = _patcher_scaled(sm.CosmosT2IPredict2, cfg, seed, 0.1)
    return m, _cond(6, 32, seed + 2), _cond(6, 32, seed + 3), torch.zeros(1, 16, 3, 8, 8)


def cosmos1(tmpdir: str, seed: int = 0):
    """Cosmos 1 (GeneralDIT, CosmosT2V): 2 blocks of width 64 (FA-CA-MLP), tokens as T H W B D (batch on
    dim 3), a learnable extra position term added in place before every block, no dit replace in its loop."""
    cfg = {"image_model": "cosmos", "max_img_h": 240, "max_img_w": 240, "max_frames": 128, "in_channels": 16,
           "out_channels": 16, "patch_spatial": 2, "patch_temporal": 1, "model_channels": 64,
           "block_config": "FA-CA-MLP", "concat_padding_mask": True, "pos_emb_cls": "rope3d",
           "pos_emb_learnable": False, "pos_emb_interpolation": "crop", "block_x_format": "THWBD",
           "affline_emb_norm": True, "use_adaln_lora": True, "adaln_lora_dim": 16, "num_blocks": 2,
           "num_heads": 2, "crossattn_emb_channels": 32,
           # GeneralDIT._forward calls .to() on the extra position term, so it must exist (as in all Cosmos 1)
           "extra_per_block_abs_pos_emb": True, "extra_per_block_abs_pos_emb_type": "learnable",
           "rope_h_extrapolation_ratio": 1.0, "rope_w_extrapolation_ratio": 1.0, "rope_t_extrapolation_ratio": 2.0}
    m = _patcher_scaled(sm.CosmosT2V, cfg, seed, 0.1)
    return m, _cond(6, 32, seed + 2), _cond(6, 32, seed + 3), torch.zeros(1, 16, 3, 8, 8)


BUILDERS = {"ltxv": ltxv, "wan_vace": wan_vace, "wan22_5b": wan22_5b, "cosmos_predict2": cosmos_predict2,
            "cosmos1": cosmos1}

# the first block the model's loop calls (a forward pre-hook on it counts block-stack runs). Cosmos 1's block
# gets x as T H W B D: its first positional argument's shape[0] is T, not the batch.
FIRST_BLOCK = {"ltxv": "transformer_blocks.0", "wan_vace": "blocks.0", "wan22_5b": "blocks.0",
               "wan22_14b": "blocks.0", "cosmos_predict2": "blocks.0", "cosmos1": "blocks.block0"}

EXPECTED_FAMILY = {"ltxv": "ltxv", "wan_vace": "wan", "wan22_5b": "wan", "wan22_14b": "wan",
                   "cosmos_predict2": "cosmos_predict2", "cosmos1": "cosmos"}
