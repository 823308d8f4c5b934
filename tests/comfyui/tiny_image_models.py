"""Tiny random-weight image models built from ComfyUI's own classes (test helper; imports ComfyUI).

The family matrix of the real-ComfyUI suite: every builder makes its model straight from a
`comfy.supported_models` class with small widths (ComfyUI's detection hard-codes full widths), float32 on the
CPU, and returns `(model_patcher, positive, negative, latent)` with the conds in ComfyUI's `[[tensor, {extras}]]`
form, carrying the extras that family's model_base reads.

FIRST_BLOCK names the first block the model's block loop actually calls (a forward pre-hook on it counts
block-stack runs); EXPECTED_FAMILY the GCache adapter a reader of nodes/patching/adapters.py expects for it.
"""
from __future__ import annotations

import comfy.supported_models as sm
import torch
from tiny_models import _cond, _patcher, _randomize, complete


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def flux_kontext(tmpdir: str, seed: int = 0):
    """Flux Kontext: a guidance-distilled Flux (ComfyUI loads Kontext as sm.Flux) sampled with `reference_latents`
    in the cond, as the ReferenceLatent node sets it; model_base.Flux turns it into `ref_latents`, and
    Flux._forward appends the reference tokens after the image tokens (img = cat(img, kontext))."""
    cfg = {"image_model": "flux", "in_channels": 16, "out_channels": 16, "patch_size": 2, "vec_in_dim": 24,
           "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 2.0, "num_heads": 2, "depth": 2,
           "depth_single_blocks": 2, "axes_dim": [8, 12, 12], "theta": 10000, "qkv_bias": True,
           "guidance_embed": True}
    m = _patcher(sm.Flux, complete(cfg, "flux.model.FluxParams"), seed)
    g = _gen(seed + 1)
    ref = torch.randn(1, 16, 8, 8, generator=g)  # a (smaller) reference image latent: 16 extra image tokens
    pos = _cond(6, 32, seed + 2, pooled_output=torch.randn(1, 24, generator=g), reference_latents=[ref])
    neg = _cond(6, 32, seed + 3, pooled_output=torch.randn(1, 24, generator=g), reference_latents=[ref])
    return m, pos, neg, torch.zeros(1, 16, 16, 16)


def _chroma_cfg(**over) -> dict:
    # the distilled guidance layer reads a fixed 64-wide input (16 timestep + 16 guidance + 32 index) over 344
    # modulation slots; its out_dim must equal hidden_size. Chroma's in/out channels are already patchified.
    cfg = {"image_model": "chroma", "in_channels": 64, "out_channels": 64, "context_in_dim": 32,
           "hidden_size": 64, "mlp_ratio": 2.0, "num_heads": 2, "depth": 2, "depth_single_blocks": 2,
           "axes_dim": [8, 12, 12], "theta": 10000, "patch_size": 2, "qkv_bias": True,
           "in_dim": 64, "out_dim": 64, "hidden_dim": 64, "n_layers": 1}
    cfg.update(over)
    return cfg


def chroma(tmpdir: str, seed: int = 0):
    """Chroma: model_base.Chroma inherits Flux.encode_adm (reads `pooled_output`; the T5 encoder gives None)."""
    m = _patcher(sm.Chroma, complete(_chroma_cfg(), "chroma.model.ChromaParams"), seed)
    return m, _cond(6, 32, seed + 2, pooled_output=None), _cond(6, 32, seed + 3, pooled_output=None), \
        torch.zeros(1, 16, 16, 16)


def chroma_radiance(tmpdir: str, seed: int = 0):
    """Chroma Radiance: pixel space (3 channels), a Conv2d patch embedder and a per-patch NeRF head."""
    cfg = _chroma_cfg(image_model="chroma_radiance", in_channels=3, out_channels=3, patch_size=8,
                      nerf_hidden_size=16, nerf_mlp_ratio=2, nerf_depth=1, nerf_max_freqs=4, nerf_tile_size=0,
                      nerf_final_head_type="conv", nerf_embedder_dtype=torch.float32)
    m = _patcher(sm.ChromaRadiance, complete(cfg, "chroma_radiance.model.ChromaRadianceParams"), seed)
    dm = m.model.diffusion_model
    with torch.no_grad():  # at 0.05-scale norms the NeRF head ignores the transformer: give its norms unit scale
        for norm in [b.norm for b in dm.nerf_blocks] + [dm.nerf_final_layer_conv.norm]:
            (norm.scale if hasattr(norm, "scale") else norm.weight).fill_(1.0)  # RMSNorm's scale is `weight` in 0.33
    return m, _cond(6, 32, seed + 2, pooled_output=None), _cond(6, 32, seed + 3, pooled_output=None), \
        torch.zeros(1, 3, 32, 32)


def qwen_image(tmpdir: str, seed: int = 0):
    """Qwen-Image: latents are Wan 2.1 format, 5-D (B, 16, 1, H, W); sum(axes_dims_rope) == attention_head_dim."""
    cfg = {"image_model": "qwen_image", "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 2,
           "attention_head_dim": 32, "num_attention_heads": 2, "joint_attention_dim": 32,
           "axes_dims_rope": (8, 12, 12)}
    m = _patcher(sm.QwenImage, cfg, seed)
    with torch.no_grad():  # a 0.05-scale txt_norm all but silences the text
        m.model.diffusion_model.txt_norm.weight.fill_(1.0)
    return m, _cond(6, 32, seed + 2), _cond(6, 32, seed + 3), torch.zeros(1, 16, 1, 16, 16)


def sd3(tmpdir: str, seed: int = 0):
    """SD3 MMDiT (OpenAISignatureMMDITWrapper): width is fixed at 64 * depth with `depth` heads, so depth=1 and
    num_blocks=2. The last joint block is pre_only: its dit replace returns {"txt": None, "img": ...}.
    pos_embed is a buffer (torch.empty), so it is filled here."""
    cfg = {"in_channels": 16, "out_channels": 16, "patch_size": 2, "depth": 1, "num_blocks": 2,
           "adm_in_channels": 24, "pos_embed_scaling_factor": None, "pos_embed_max_size": 8, "num_patches": 64,
           "qk_norm": "rms", "context_embedder_config": {"target": "torch.nn.Linear",
                                                         "params": {"in_features": 32, "out_features": 64}}}
    m = _patcher(sm.SD3, cfg, seed)
    with torch.no_grad():
        m.model.diffusion_model.pos_embed.copy_(torch.randn(1, 64, 64, generator=_gen(seed + 4)) * 0.05)
    g = _gen(seed + 1)
    pos = _cond(6, 32, seed + 2, pooled_output=torch.randn(1, 24, generator=g))
    neg = _cond(6, 32, seed + 3, pooled_output=torch.randn(1, 24, generator=g))
    return m, pos, neg, torch.zeros(1, 16, 16, 16)


def hidream(tmpdir: str, seed: int = 0):
    """HiDream: the cond tensor is the T5 stream (caption_channels[0]); `conditioning_llama3` stacks the Llama
    hidden states as (B, n_llama_layers, L, caption_channels[1]), of which llama_layers picks one per block
    (num_layers + num_single_layers entries); `pooled_output` feeds p_embedder (text_emb_dim)."""
    cfg = {"image_model": "hidream", "patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 2,
           "num_single_layers": 2, "attention_head_dim": 32, "num_attention_heads": 2, "caption_channels": [32, 24],
           "text_emb_dim": 24, "num_routed_experts": 2, "num_activated_experts": 1, "axes_dims_rope": [8, 12, 12],
           "max_resolution": [32, 32], "llama_layers": [0, 1, 2, 2]}
    m = _patcher(sm.HiDream, cfg, seed)
    g = _gen(seed + 1)

    def extras():
        return {"pooled_output": torch.randn(1, 24, generator=g),
                "conditioning_llama3": torch.randn(1, 3, 5, 24, generator=g)}
    return m, _cond(6, 32, seed + 2, **extras()), _cond(6, 32, seed + 3, **extras()), torch.zeros(1, 16, 16, 16)


def auraflow(tmpdir: str, seed: int = 0):
    """AuraFlow (comfy.ldm.aura.mmdit.MMDiT): double_layers then single_layers; 8 register tokens are prepended to
    the text, and the single layers run on cat(text, image). max_seq=64 gives an 8x8 positional grid."""
    cfg = {"in_channels": 4, "out_channels": 4, "patch_size": 2, "dim": 64, "n_layers": 4, "n_double_layers": 2,
           "n_heads": 2, "global_conddim": 64, "cond_seq_dim": 32, "max_seq": 64}
    m = _patcher(sm.AuraFlow, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.08)  # at 0.05 its (bias-free) modulations gate the blocks shut
    return m, _cond(6, 32, seed + 2), _cond(6, 32, seed + 3), torch.zeros(1, 4, 16, 16)


def pixart(tmpdir: str, seed: int = 0):
    """PixArt Sigma (PixArtMS): its block loop has no replace hook, so it is the unknown-model fallback case.
    PixArt derives its positional base size from round((H + W) / 2 / 64), which is 0 (a ZeroDivisionError) below a
    40-wide latent; patch 4 keeps a 40x40 latent at 100 tokens."""
    cfg = {"image_model": "pixart_sigma", "patch_size": 4, "in_channels": 4, "hidden_size": 48, "depth": 2,
           "num_heads": 2, "caption_channels": 32, "model_max_length": 6, "micro_condition": False}
    m = _patcher(sm.PixArtSigma, cfg, seed)
    return m, _cond(6, 32, seed + 2), _cond(6, 32, seed + 3), torch.zeros(1, 4, 40, 40)


BUILDERS = {"flux_kontext": flux_kontext, "chroma": chroma, "chroma_radiance": chroma_radiance,
            "qwen_image": qwen_image, "sd3": sd3, "hidream": hidream, "auraflow": auraflow, "pixart": pixart}

# The first block each model's loop calls (Chroma skips indices listed in skip_mmdit/skip_dit; both are empty).
FIRST_BLOCK = {"flux_kontext": "double_blocks.0", "chroma": "double_blocks.0", "chroma_radiance": "double_blocks.0",
               "qwen_image": "transformer_blocks.0", "sd3": "joint_blocks.0", "hidream": "double_stream_blocks.0",
               "auraflow": "double_layers.0", "pixart": "blocks.0"}

EXPECTED_FAMILY = {"flux_kontext": "flux", "chroma": "chroma", "chroma_radiance": "chroma",
                   "qwen_image": "qwen_image", "sd3": "sd3", "hidream": "hidream", "auraflow": "auraflow",
                   "pixart": "whole-model fallback"}
