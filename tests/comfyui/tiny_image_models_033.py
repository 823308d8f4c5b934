"""Tiny random-weight image diffusion transformers of ComfyUI 0.33.0 (test helper; imports ComfyUI).

The image families ComfyUI 0.33.0 added or changed since the families in tiny_image_models.py: every builder makes
its model straight from a `comfy.supported_models` class with small widths (ComfyUI's detection hard-codes full
widths), float32 on the CPU, and returns `(model_patcher, positive, negative, latent)` with the conds in ComfyUI's
`[[tensor, {extras}]]` form, carrying the extras that family's model_base reads. Each samples with
`nodes.common_ksampler(model, 0, 6, cfg, "euler", "simple", pos, neg, {"samples": latent})` at cfg 1 and cfg 3 to a
finite result that changes when the blocks' weights change (some gated models get larger-than-0.05 weights for
that).

FIRST_BLOCK names the first block the model's block loop calls (a forward pre-hook on it counts block-stack runs);
EXPECTED_FAMILY the GCache adapter nodes/patching/adapters.py chooses for it today (the same shape as
tiny_image_models.py, so test_family_matrix can take this module as it takes that one).
FACTS records, per family, what ComfyUI 0.33.0's block loop does (read in comfy/ldm/..., file:line in "notes", and
observed by sampling with a probe dit patch or forward hooks): "class" (the diffusion model), "mro" (its comfy.ldm
classes), "stacks" (the block containers, in call order), "loop" (the method holding the block loop), "route"
("dit" with its patches_replace["dit"] keys as (name, number of blocks), else "none"), "img" (per stack, what the
loop passes as args["img"] / the block's token argument, and transformer_options["img_slice"]), "returns" (what the
loop reads back), "block_index" (whether the loop sets transformer_options block_index/total_blocks/block_type),
"inplace" (whether the blocks add into their token input in place), "between_blocks" (what the loop adds to the
stream between blocks) and "notes". Written against ComfyUI 0.33.0.
"""
from __future__ import annotations

import comfy.supported_models as sm
import torch
from tiny_models import CPU, DEVICE, _cond, _patcher, _randomize, complete


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _unit_norms(m, seed: int, scale: float) -> None:
    """Re-randomize the diffusion model at `scale` and give every norm weight ("norm" in its name) the value 1:
    with small random norm weights some models all but ignore their blocks or their text."""
    _randomize(m.model.diffusion_model, seed, scale=scale)
    with torch.no_grad():
        for name, p in m.model.diffusion_model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)


def _patcher_forced(model_config_cls, unet_config: dict, seed: int):
    """tiny_models._patcher for a supported_models class whose unet_extra_config forces full-size values over the
    given config (BASE.__init__ copies unet_extra_config over unet_config): the tiny values are put back after
    the model config is made, before the model is built."""
    import comfy.model_patcher
    mc = model_config_cls(unet_config)
    mc.unet_config.update(unet_config)
    mc.set_inference_dtype(torch.float32, None)
    model = mc.get_model({}, device=CPU)
    model.diffusion_model.to(torch.float32)
    _randomize(model.diffusion_model, seed)
    model.eval()
    return comfy.model_patcher.ModelPatcher(model, load_device=DEVICE, offload_device=CPU)


# ----------------------------------------------------------------------------------------------------- Flux 2
def _flux2_cfg(**over) -> dict:
    # what comfy/model_detection.py:264-277 sets for a Flux 2 checkpoint (double_stream_modulation_img present),
    # at tiny width: patch 1 on the 128-channel Flux 2 latent, 4 RoPE axes, shared (global) modulation, bias-free
    cfg = {"image_model": "flux2", "in_channels": 128, "out_channels": 128, "patch_size": 1, "vec_in_dim": None,
           "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 3.0, "num_heads": 2, "depth": 2,
           "depth_single_blocks": 2, "axes_dim": [8, 8, 8, 8], "theta": 2000, "qkv_bias": False,
           "guidance_embed": True, "txt_ids_dims": [3], "global_modulation": True, "mlp_silu_act": True,
           "ops_bias": False, "default_ref_method": "index", "ref_index_scale": 10.0}
    cfg.update(over)
    return complete(cfg, "flux.model.FluxParams")


def flux2(tmpdir: str, seed: int = 0):
    """Flux 2 [dev] (comfy.ldm.flux.model.Flux with global modulation, sm.Flux2 / model_base.Flux2): the double
    blocks get a tuple vec (img mods, txt mods) from the shared double_stream_modulation_*; model_base.Flux2 pads
    the text to 512 tokens (zeros in front), so the single stream is 512 + image tokens long. No pooled output
    (vec_in_dim None); guidance embedded (model_base.Flux sends `guidance`, 3.5 by default). Sampled as an edit:
    one `reference_latents` entry, appended after the image tokens with the "index" method (RoPE index 10)."""
    m = _patcher(sm.Flux2, _flux2_cfg(), seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    g = _gen(seed + 1)
    ref = torch.randn(1, 128, 4, 4, generator=g)  # 16 reference tokens
    pos = _cond(6, 32, seed + 2, reference_latents=[ref])
    neg = _cond(6, 32, seed + 3, reference_latents=[ref])
    return m, pos, neg, torch.zeros(1, 128, 8, 8)


def flux2_klein(tmpdir: str, seed: int = 0):
    """Flux 2 Klein: the same class and config as Flux 2 but no guidance embedding (guidance_in absent, so
    detection says guidance_embed False); Qwen3 text features. Text-to-image here (no reference latents)."""
    m = _patcher(sm.Flux2, _flux2_cfg(guidance_embed=False), seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    return m, _cond(6, 32, seed + 2), _cond(6, 32, seed + 3), torch.zeros(1, 128, 8, 8)


# ---------------------------------------------------------------------------------------------------- Z-Image
def _zimage_cfg(**over) -> dict:
    # what comfy/model_detection.py:598-613 sets for Z-Image (dim 3840), at tiny width: z_image_modulation (the
    # adaLN input is a 256-wide timestep embedding), 1000x time scale, cap/x pad tokens to a multiple of 32.
    # dim must be >= 256: the blocks' adaLN Linear reads min(dim, 256) features but t_embedder always gives 256.
    cfg = {"image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 256, "n_layers": 2,
           "n_refiner_layers": 1, "n_heads": 8, "n_kv_heads": 8, "multiple_of": 16, "ffn_dim_multiplier": 8.0 / 3.0,
           "norm_eps": 1e-5, "qk_norm": True, "cap_feat_dim": 32, "axes_dims": [8, 12, 12],
           "axes_lens": [1536, 512, 512], "rope_theta": 256.0, "z_image_modulation": True, "time_scale": 1000.0,
           "pad_tokens_multiple": 32}
    cfg.update(over)
    return cfg


def _mask_cond(seed: int, n: int = 6, dim: int = 32, **extra):
    return _cond(n, dim, seed, attention_mask=torch.ones(1, n, dtype=torch.long), **extra)


def z_image(tmpdir: str, seed: int = 0):
    """Z-Image (Turbo/Base; sm.ZImage -> model_base.Lumina2 -> comfy.ldm.lumina.model.NextDiT with
    z_image_modulation): no dit replace hook in its loop. The main layers run on ONE joint stream
    cat(caption tokens padded to 32, image tokens padded to 32 with x_pad_token); the noise/context refiners run
    before the loop on the image / caption tokens alone. An all-ones `attention_mask` is dropped by
    model_base.Lumina2 (it only sets num_tokens). Z-Image's adaLN gates go through tanh: 0.1-scale weights."""
    m = _patcher(sm.ZImage, _zimage_cfg(), seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    return m, _mask_cond(seed + 2), _mask_cond(seed + 3), torch.zeros(1, 16, 8, 8)


def z_image_pixel(tmpdir: str, seed: int = 0):
    """Z-Image pixel space (sm.ZImagePixelSpace -> model_base.ZImagePixelSpace -> NextDiTPixelSpace): RGB in,
    a per-patch MLP decoder (dec_net, SimpleMLPAdaLN) instead of final_layer, and it OVERRIDES _forward (its own
    copy of the block loop). forward returns (x + x0) / t (comfy/ldm/lumina/model.py:1122-1139)."""
    cfg = _zimage_cfg(image_model="zimage_pixel", in_channels=3, patch_size=4, decoder_in_channels=48,
                      decoder_hidden_size=32, decoder_num_res_blocks=1, decoder_max_freqs=4)
    m = _patcher(sm.ZImagePixelSpace, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.2)  # at 0.1 the per-patch decoder all but ignores the blocks
    return m, _mask_cond(seed + 2), _mask_cond(seed + 3), torch.zeros(1, 3, 32, 32)


# ---------------------------------------------------------------------------------- Qwen-Image edit / layered
def _qwen_cfg(**over) -> dict:
    # comfy/model_detection.py:952-961; sum(axes_dims_rope) == attention_head_dim
    cfg = {"image_model": "qwen_image", "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 2,
           "attention_head_dim": 32, "num_attention_heads": 2, "joint_attention_dim": 32,
           "axes_dims_rope": (8, 12, 12)}
    cfg.update(over)
    return cfg


def _qwen(cfg: dict, seed: int):
    m = _patcher(sm.QwenImage, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    with torch.no_grad():  # a small txt_norm all but silences the text
        m.model.diffusion_model.txt_norm.weight.fill_(1.0)
    return m


def qwen_image_edit_2509(tmpdir: str, seed: int = 0):
    """Qwen-Image-Edit 2509 (TextEncodeQwenImageEditPlus): up to 3 `reference_latents` (two here, of different
    sizes), each appended after the image tokens with the "index" method (RoPE frame index 1, 2, ...); the text
    cond comes with an `attention_mask` (model_base.QwenImage passes it on; the model makes it additive)."""
    m = _qwen(_qwen_cfg(), seed)
    g = _gen(seed + 1)
    refs = [torch.randn(1, 16, 1, 8, 8, generator=g), torch.randn(1, 16, 1, 4, 8, generator=g)]  # 16 + 8 tokens
    mask = torch.ones(1, 6, dtype=torch.long)
    return m, _cond(6, 32, seed + 2, reference_latents=refs, attention_mask=mask), \
        _cond(6, 32, seed + 3, reference_latents=refs, attention_mask=mask), torch.zeros(1, 16, 1, 8, 8)


def qwen_image_edit_2511(tmpdir: str, seed: int = 0):
    """Qwen-Image-Edit 2511: default_ref_method "index_timestep_zero" (detection sees __index_timestep_zero__):
    the reference tokens are modulated with the embedding of timestep 0, so the loop's temb (args["vec"]) has
    TWICE the batch ([t, 0]) and every block gets timestep_zero_index = number of image tokens."""
    m = _qwen(_qwen_cfg(default_ref_method="index_timestep_zero"), seed)
    ref = torch.randn(1, 16, 1, 8, 8, generator=_gen(seed + 1))
    return m, _cond(6, 32, seed + 2, reference_latents=[ref]), _cond(6, 32, seed + 3, reference_latents=[ref]), \
        torch.zeros(1, 16, 1, 8, 8)


def qwen_image_layered(tmpdir: str, seed: int = 0):
    """Qwen-Image-Layered: use_additional_t_cond (addition_t_embedding; the model feeds 0 when no
    additional_t_cond is given, and model_base.QwenImage never gives one) and default_ref_method
    "negative_index"; the latent has layers + 1 frames (EmptyQwenImageLayeredLatentImage: (B, 16, layers+1, H, W)),
    the frames get RoPE index 0..T-1 and the input image (a reference latent) index -1."""
    m = _qwen(_qwen_cfg(use_additional_t_cond=True, default_ref_method="negative_index"), seed)
    ref = torch.randn(1, 16, 1, 8, 8, generator=_gen(seed + 1))
    return m, _cond(6, 32, seed + 2, reference_latents=[ref]), _cond(6, 32, seed + 3, reference_latents=[ref]), \
        torch.zeros(1, 16, 3, 8, 8)


# ---------------------------------------------------------------------------------------------- LongCat-Image
def longcat_image(tmpdir: str, seed: int = 0):
    """LongCat-Image (sm.LongCatImage -> model_base.LongCatImage, a model_base.Flux): the plain Flux class with no
    pooled vector (vec_in_dim None), no guidance (model_base drops `guidance`), text RoPE ids on axes 1 and 2
    (txt_ids_dims [1, 2]) and model_base._apply_model shifting the image RoPE by the text length through
    transformer_options["rope_options"] (shift_t 1, shift_y = shift_x = text tokens)."""
    cfg = {"image_model": "flux", "in_channels": 16, "out_channels": 16, "patch_size": 2, "vec_in_dim": None,
           "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 4.0, "num_heads": 2, "depth": 2,
           "depth_single_blocks": 2, "axes_dim": [8, 12, 12], "theta": 10000, "qkv_bias": True,
           "guidance_embed": False, "txt_ids_dims": [1, 2]}
    m = _patcher(sm.LongCatImage, complete(cfg, "flux.model.FluxParams"), seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    return m, _cond(6, 32, seed + 2), _cond(6, 32, seed + 3), torch.zeros(1, 16, 16, 16)


# ------------------------------------------------------------------------------------------------ ERNIE-Image
def ernie_image(tmpdir: str, seed: int = 0):
    """ERNIE-Image (sm.ErnieImage -> model_base.ErnieImage -> comfy.ldm.ernie.model.ErnieImageModel): a
    single-stream DiT on the 128-channel Flux 2 latent (patch 1) with ONE shared adaLN modulation for all
    layers. Its block loop is in forward itself (no _forward, no DIFFUSION_MODEL wrapper executor, no dit
    replace, no transformer_options to the blocks); the stream is cat(image, text), image first. Detection sets
    only image_model (comfy/model_detection.py:1112-1115): every width is a constructor default, given here."""
    cfg = {"image_model": "ernie", "hidden_size": 64, "num_attention_heads": 2, "num_layers": 2,
           "ffn_hidden_size": 128, "in_channels": 128, "out_channels": 128, "patch_size": 1, "text_in_dim": 32,
           "rope_theta": 256, "rope_axes_dim": (8, 12, 12)}
    m = _patcher(sm.ErnieImage, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.2)  # at 0.1 the shared adaLN gates keep the blocks at ~1%
    return m, _cond(6, 32, seed + 2), _cond(6, 32, seed + 3), torch.zeros(1, 128, 8, 8)


# ------------------------------------------------------------------------------------------------- HiDream-O1
def _hidream_o1_cond(seed: int):
    """What HiDreamO1TE gives: the prompt's token ids in the chat template, ending in <|boi|><|tms|> (the tms
    token's embedding is replaced by the timestep embedding), as `text_input_ids`; the cond tensor is only a
    float surrogate of the ids (comfy/text_encoders/hidream_o1.py:99-107)."""
    from comfy.text_encoders import hidream_o1 as te
    words = torch.randint(1000, 5000, (4,), generator=_gen(seed)).tolist()
    ids = torch.tensor([[te.IM_START_ID, te.USER_ID, te.NEWLINE_ID, *words, te.IM_END_ID, te.NEWLINE_ID,
                         te.IM_START_ID, te.ASSISTANT_ID, te.NEWLINE_ID, te.BOI_TOKEN_ID, te.TMS_TOKEN_ID]])
    return [[ids.unsqueeze(-1).float(), {"text_input_ids": ids}]]


def hidream_o1(tmpdir: str, seed: int = 0):
    """HiDream-O1-Image (sm.HiDreamO1 -> model_base.HiDreamO1 -> comfy.ldm.hidream_o1.model.HiDreamO1Transformer):
    pixel space, 32x32 RGB patches embedded into a Qwen3-VL decoder (Llama2_) that runs ONE sequence
    [text ids (causal prefix, ar_len) | target patches | reference patches]; the blocks are
    language_model.layers. Its dit replace passes and reads args["x"] (not "img"). model_base.HiDreamO1 builds
    input_ids / position_ids (MRoPE) / vinput_mask / ar_len from `text_input_ids`. The embedding table keeps
    Qwen's full 151936-token vocabulary (the chat-template ids are ~151k): ~10M parameters at width 64. The
    vision tower (used only for reference images) is shrunk to one 32-wide block."""
    cfg = {"image_model": "hidream_o1",
           "text_config_overrides": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                                     "rope_dims": [6, 5, 5]},
           "vision_config_overrides": {"hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "depth": 1,
                                       "num_position_embeddings": 64, "deepstack_visual_indexes": ()}}
    m = _patcher(sm.HiDreamO1, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    with torch.no_grad():  # 0.1-scale RMSNorm weights shrink every block's branch: the blocks barely mattered
        for name, p in m.model.diffusion_model.language_model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
    return m, _hidream_o1_cond(seed + 2), _hidream_o1_cond(seed + 3), torch.zeros(1, 3, 128, 128)


# ----------------------------------------------------------------------------------------------------- Krea 2
def krea2(tmpdir: str, seed: int = 0):
    """Krea 2 (sm.Krea2 -> model_base.Krea2 -> comfy.ldm.krea2.model.SingleStreamDiT): single-stream blocks on
    cat(text, image) (img_slice set), with no dit replace in the loop. The cond tensor is a stack of `txtlayers`
    Qwen3-VL hidden states flattened on the feature axis, (B, L, txtlayers * txtdim), fused by a small text
    transformer (txtfusion) before the blocks. Head dim 32 gives RoPE axes [8, 12, 12]
    (headdim - 12 * (headdim // 16), ...). Wan 2.1 latent format: a 5-D (B, 16, 1, H, W) latent, folded into
    the batch (T = 1)."""
    cfg = {"image_model": "krea2", "features": 64, "tdim": 256, "txtdim": 32, "heads": 2, "kvheads": 1,
           "multiplier": 2, "layers": 2, "patch": 2, "channels": 16, "txtlayers": 2, "txtheads": 2,
           "txtkvheads": 2}
    m = _patcher(sm.Krea2, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    return m, _cond(6, 64, seed + 2), _cond(6, 64, seed + 3), torch.zeros(1, 16, 1, 8, 8)


# ------------------------------------------------------------------------------------------------------ Anima
def anima(tmpdir: str, seed: int = 0):
    """Anima (sm.Anima -> model_base.Anima -> comfy.ldm.anima.model.Anima, a subclass of Cosmos Predict2's
    MiniTrainDIT that overrides only forward): the Cosmos Predict2 block loop (MiniTrainDIT._forward, no dit
    replace) on (B, T, H, W, D) image tokens, cross-attending to text. The text goes through llm_adapter first:
    Qwen3-0.6B hidden states (the cond tensor, 1024 wide) + the `t5xxl_ids` / `t5xxl_weights` extras ->
    (B, 512, 1024). LLMAdapter is built at its fixed full size (1024 wide, 6 layers, a 32128-token embedding:
    ~120M parameters, ~0.5 GB float32) whatever the config, so crossattn_emb_channels stays 1024."""
    cfg = {"image_model": "anima", "max_img_h": 240, "max_img_w": 240, "max_frames": 128, "in_channels": 16,
           "out_channels": 16, "patch_spatial": 2, "patch_temporal": 1, "model_channels": 64,
           "concat_padding_mask": True, "crossattn_emb_channels": 1024, "pos_emb_cls": "rope3d",
           "pos_emb_learnable": True, "pos_emb_interpolation": "crop", "min_fps": 1, "max_fps": 30,
           "use_adaln_lora": True, "adaln_lora_dim": 32, "num_blocks": 2, "num_heads": 2,
           "extra_per_block_abs_pos_emb": False, "rope_h_extrapolation_ratio": 4.0,
           "rope_w_extrapolation_ratio": 4.0, "rope_t_extrapolation_ratio": 1.0, "extra_h_extrapolation_ratio": 1.0,
           "extra_w_extrapolation_ratio": 1.0, "extra_t_extrapolation_ratio": 1.0,
           "rope_enable_fps_modulation": False}
    m = _patcher(sm.Anima, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    g = _gen(seed + 1)

    def cond(s):
        ids = torch.randint(0, 32128, (8,), generator=g)
        return _cond(6, 1024, s, t5xxl_ids=ids, t5xxl_weights=torch.ones(8))
    return m, cond(seed + 2), cond(seed + 3), torch.zeros(1, 16, 1, 8, 8)


# ------------------------------------------------------------------------------------------- HunyuanImage 2.1
def hunyuan_image21(tmpdir: str, seed: int = 0):
    """HunyuanImage 2.1 (sm.HunyuanImage21 -> model_base.HunyuanImage21 -> comfy.ldm.hunyuan_video.model.HunyuanVideo
    with a 2-D patch [1, 1] and 2 RoPE axes): 64-channel 32x-downscaled latent (4-D). Extras: `attention_mask`
    (dropped when all ones), `conditioning_byt5small` -> txt_byt5 (the glyph/ByT5 tokens, 1472 wide, mapped by
    byt5_in and appended AFTER the text tokens), `guidance` (6.0 by default; read when guidance_embed). The same
    forward_orig as HunyuanVideo: double blocks on image tokens, single blocks on cat(txt, img) with img_slice."""
    cfg = {"in_channels": 64, "out_channels": 64, "patch_size": [1, 1], "vec_in_dim": None, "context_in_dim": 32,
           "hidden_size": 64, "mlp_ratio": 4.0, "num_heads": 2, "depth": 2, "depth_single_blocks": 2,
           "axes_dim": [16, 16], "theta": 256, "qkv_bias": True, "guidance_embed": True, "byt5": True,
           "meanflow": False}
    m = _patcher(sm.HunyuanImage21, dict(complete(cfg, "hunyuan_video.model.HunyuanVideoParams"),
                                         image_model="hunyuan_video"), seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    g = _gen(seed + 1)
    mask = torch.ones(1, 6, dtype=torch.long)

    def cond(s):
        return _cond(6, 32, s, attention_mask=mask, conditioning_byt5small=torch.randn(1, 4, 1472, generator=g))
    return m, cond(seed + 2), cond(seed + 3), torch.zeros(1, 64, 8, 8)


# ------------------------------------------------------------------------------------------ Kandinsky 5 image
def kandinsky5_image(tmpdir: str, seed: int = 0):
    """Kandinsky 5 image (sm.Kandinsky5Image -> model_base.Kandinsky5Image -> comfy.ldm.kandinsky5.model.Kandinsky5):
    text goes through its own text_transformer_blocks first, then visual_transformer_blocks (self-attention on
    the image tokens, cross-attention to the text, feed forward) on image tokens only. model_base.Kandinsky5's
    encode_adm reads kwargs["pooled_output"] (a KeyError without it): the CLIP pooled vector (in_text_dim2). The
    Flux-format 4-D latent is unsqueezed to (B, C, 1, H, W); visual_embed_dim = 16 channels x 2 x 2 patch."""
    cfg = {"image_model": "kandinsky5", "in_visual_dim": 16, "out_visual_dim": 16, "in_text_dim": 32,
           "in_text_dim2": 24, "time_dim": 32, "model_dim": 64, "ff_dim": 128, "visual_embed_dim": 64,
           "patch_size": (1, 2, 2), "num_text_blocks": 1, "num_visual_blocks": 2, "axes_dims": (8, 12, 12),
           "rope_scale_factor": (1.0, 1.0, 1.0)}
    m = _patcher(sm.Kandinsky5Image, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    g = _gen(seed + 1)
    mask = torch.ones(1, 6, dtype=torch.long)
    pos = _cond(6, 32, seed + 2, pooled_output=torch.randn(1, 24, generator=g), attention_mask=mask)
    neg = _cond(6, 32, seed + 3, pooled_output=torch.randn(1, 24, generator=g), attention_mask=mask)
    return m, pos, neg, torch.zeros(1, 16, 8, 8)


# -------------------------------------------------------------------------------------------------- OmniGen 2
def omnigen2(tmpdir: str, seed: int = 0):
    """OmniGen 2 (sm.Omnigen2 -> model_base.Omnigen2 -> comfy.ldm.omnigen.omnigen2.OmniGen2Transformer2DModel):
    Lumina-like. Context / noise / reference-image refiners first, then `layers` on ONE joint stream
    cat(text, reference-image tokens, image tokens) (image last). The block loop is in forward itself: no
    DIFFUSION_MODEL wrapper executor, no dit replace, no transformer_options block_index. Extras: `attention_mask`
    (dropped when all ones; num_tokens is always set) and `reference_latents` (the edit input). Detection sets
    only fixed full-size values (comfy/model_detection.py:900-918)."""
    cfg = {"image_model": "omnigen2", "axes_dim_rope": [8, 12, 12], "axes_lens": [1024, 1664, 1664],
           "ffn_dim_multiplier": None, "hidden_size": 64, "in_channels": 16, "multiple_of": 16, "norm_eps": 1e-5,
           "num_attention_heads": 2, "num_kv_heads": 1, "num_layers": 2, "num_refiner_layers": 1,
           "out_channels": None, "patch_size": 2, "text_feat_dim": 32, "timestep_scale": 1000.0}
    m = _patcher(sm.Omnigen2, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.2)  # at 0.1 its tanh-gated blocks moved the output ~5%
    g = _gen(seed + 1)
    ref = torch.randn(1, 16, 8, 8, generator=g)  # 16 reference tokens
    mask = torch.ones(1, 6, dtype=torch.long)
    return m, _cond(6, 32, seed + 2, attention_mask=mask, reference_latents=[ref]), \
        _cond(6, 32, seed + 3, attention_mask=mask, reference_latents=[ref]), torch.zeros(1, 16, 8, 8)


# ------------------------------------------------------------------------------------------------------ Boogu
def boogu(tmpdir: str, seed: int = 0):
    """Boogu-Image (sm.Boogu -> model_base.Boogu (Omnigen2's extra_conds) -> comfy.ldm.boogu.model
    .BooguTransformer2DModel): OmniGen 2 plus a dual-stream stage. Two stacks, both looped in forward itself
    (no wrapper executor, no dit replace, no block_index): double_stream_layers(img, text, ...) -> (img, text) on
    the [reference ; image] tokens and the instruction tokens separately, then single_stream_layers on
    cat(text, reference, image) (image last). Same extras as OmniGen 2 (attention_mask, reference_latents)."""
    cfg = {"image_model": "boogu", "patch_size": 2, "in_channels": 16, "hidden_size": 64, "num_layers": 2,
           "num_double_stream_layers": 2, "num_refiner_layers": 1, "num_attention_heads": 2, "num_kv_heads": 1,
           "multiple_of": 16, "axes_dim_rope": (8, 12, 12), "axes_lens": (2048, 1664, 1664),
           "instruction_feat_dim": 32}
    m = _patcher(sm.Boogu, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.2)  # tanh-gated like OmniGen 2
    ref = torch.randn(1, 16, 8, 8, generator=_gen(seed + 1))
    mask = torch.ones(1, 6, dtype=torch.long)
    return m, _cond(6, 32, seed + 2, attention_mask=mask, reference_latents=[ref]), \
        _cond(6, 32, seed + 3, attention_mask=mask, reference_latents=[ref]), torch.zeros(1, 16, 8, 8)


# ------------------------------------------------------------------------------------------------------- Lens
def lens(tmpdir: str, seed: int = 0):
    """Microsoft Lens (sm.Lens -> model_base.Lens -> comfy.ldm.lens.model.LensTransformer2DModel): a dual-stream
    MMDiT like Qwen-Image (dit replace ("double_block", i), args img/txt/vec/pe/attn_mask, returns txt and img)
    on the 128-channel Flux 2 latent taken as tokens as is (no patchify in _forward: in_channels 128,
    out_channels 32 x patch 2 x 2 = 128). The cond is `len(selected_layer_index)` GPT-OSS hidden states
    flattened on the feature axis (B, S, L * enc_hidden_dim), each normed by its own txt_norm; `attention_mask`
    (read by model_base.Lens) becomes an additive joint [image ones ; text mask] mask. No pooled output."""
    cfg = {"image_model": "lens", "in_channels": 128, "out_channels": 32, "num_layers": 2, "attention_head_dim": 32,
           "num_attention_heads": 2, "enc_hidden_dim": 32, "axes_dims_rope": (8, 12, 12),
           "multi_layer_encoder_feature": True, "selected_layer_index": (0, 1)}
    m = _patcher(sm.Lens, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.15)
    with torch.no_grad():  # small txt_norm weights all but silence the text
        for norm in m.model.diffusion_model.txt_norm:
            norm.weight.fill_(1.0)
    mask = torch.ones(1, 6, dtype=torch.long)
    return m, _cond(6, 64, seed + 2, attention_mask=mask), _cond(6, 64, seed + 3, attention_mask=mask), \
        torch.zeros(1, 128, 8, 8)


# --------------------------------------------------------------------------------------------------- MageFlow
def mage_flow(tmpdir: str, seed: int = 0):
    """Mage-Flow (sm.MageFlow -> model_base.MageFlow, a model_base.QwenImage -> comfy.ldm.mage_flow.model
    .MageFlowTransformer2DModel): Qwen-Image's dual-stream blocks (QwenImageTransformerBlock) on the 128-channel
    Flux 2 latent at patch 1 (raw latent pixels as tokens); `reference_latents` appended after the image tokens
    (RoPE frame index 1..N), `attention_mask` made additive. model_base.MageFlow.process_timestep casts the
    timestep to bfloat16 even on a float32 model."""
    cfg = {"image_model": "mage_flow", "in_channels": 128, "out_channels": 128, "num_layers": 2,
           "attention_head_dim": 32, "num_attention_heads": 2, "joint_attention_dim": 32,
           "axes_dims_rope": (8, 12, 12)}
    m = _patcher(sm.MageFlow, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    with torch.no_grad():  # as Qwen-Image: a small txt_norm all but silences the text
        m.model.diffusion_model.txt_norm.weight.fill_(1.0)
    ref = torch.randn(1, 128, 4, 4, generator=_gen(seed + 1))
    mask = torch.ones(1, 6, dtype=torch.long)
    return m, _cond(6, 32, seed + 2, attention_mask=mask, reference_latents=[ref]), \
        _cond(6, 32, seed + 3, attention_mask=mask, reference_latents=[ref]), torch.zeros(1, 128, 8, 8)


# --------------------------------------------------------------------------------------------------- JoyImage
def joyimage(tmpdir: str, seed: int = 0):
    """JoyImage (sm.JoyImage -> model_base.JoyImage -> comfy.ldm.joyimage.model.JoyImageTransformer3DModel):
    dual-stream (HunyuanVideo-like) double_blocks only, on 5-D Wan 2.1 latents patched by a Conv3d; the
    `reference_latents` (edit inputs, 5-D) are appended after the target tokens, each with its own RoPE frame
    band. sm.JoyImage.unet_extra_config OVERRIDES rope_dim_list to [16, 56, 56] (BASE.__init__ copies it over
    the given config), so the head dim must be 128: one head at width 128. The double-block returns (img, txt)."""
    cfg = {"image_model": "joyimage", "patch_size": [1, 2, 2], "in_channels": 16, "hidden_size": 128,
           "num_attention_heads": 1, "text_dim": 32, "mlp_width_ratio": 2.0, "num_layers": 2}
    m = _patcher(sm.JoyImage, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    ref = torch.randn(1, 16, 1, 8, 8, generator=_gen(seed + 1))
    return m, _cond(6, 32, seed + 2, reference_latents=[ref]), _cond(6, 32, seed + 3, reference_latents=[ref]), \
        torch.zeros(1, 16, 1, 8, 8)


# ------------------------------------------------------------------------------------------------- Ideogram 4
def ideogram4(tmpdir: str, seed: int = 0):
    """Ideogram 4 (sm.Ideogram4 -> model_base.Ideogram4 -> comfy.ldm.ideogram4.model.Ideogram4Transformer2DModel):
    a single-stream DiT whose block loop (Ideogram4Transformer._backbone, called from _run_conditional /
    _run_image_only) has no dit replace. One packed sequence [text rows, image rows]: the image rows carry the
    128-channel Flux 2 latent (2x2 x 32, taken as tokens), the text rows the projected LLM features (the cond
    tensor: many Qwen3-VL layers concatenated, llm_features_dim wide); `attention_mask` (dropped when all ones)
    becomes a block-diagonal segment mask. sm.Ideogram4.unet_extra_config forces the full widths (18 heads x
    256, 53248-wide LLM features: GBs), so the tiny values are put back over it (_patcher_forced)."""
    cfg = {"image_model": "ideogram4", "in_channels": 128, "num_layers": 2, "num_attention_heads": 2,
           "attention_head_dim": 32, "intermediate_size": 128, "adaln_dim": 32, "llm_features_dim": 48,
           "rope_theta": 5000000, "mrope_section": [6, 5, 5], "norm_eps": 1e-5}
    m = _patcher_forced(sm.Ideogram4, cfg, seed)
    _unit_norms(m, seed, scale=0.1)  # the blocks' outputs pass 0.1-scale RMSNorms and tanh gates: ~3% without this
    return m, _cond(6, 48, seed + 2), _cond(6, 48, seed + 3), torch.zeros(1, 128, 8, 8)


# --------------------------------------------------------------------------------------------------- PixelDiT
def _pixeldit_cfg(**over) -> dict:
    cfg = {"image_model": "pixeldit_t2i", "in_channels": 3, "num_groups": 2, "hidden_size": 64,
           "pixel_hidden_size": 8, "pixel_attn_hidden_size": 32, "pixel_num_groups": 2, "patch_depth": 2,
           "pixel_depth": 1, "patch_size": 4, "txt_embed_dim": 32, "txt_max_length": 16}
    cfg.update(over)
    return cfg


def pixeldit(tmpdir: str, seed: int = 0):
    """PixelDiT T2I (sm.PixelDiTT2I -> model_base.PixelDiTT2I -> comfy.ldm.pixeldit.model.PixDiT_T2I): pixel space,
    two stacks in _forward with no dit replace: patch_blocks (MMDiT blocks(s, y, c, ...) -> (s, y), image patch
    tokens and text kept as two streams, joint attention [text, image]), then pixel_blocks (PiT blocks on
    per-pixel tokens (B*L, P*P, pixel_hidden) conditioned on silu(t_emb + s)). Detection gives only image_model
    (comfy/model_detection.py:573-574): every width is a constructor default, given here."""
    m = _patcher(sm.PixelDiTT2I, _pixeldit_cfg(), seed)
    _unit_norms(m, seed, scale=0.3)  # at 0.1 neither the blocks (<1%) nor the text mattered
    mask = torch.ones(1, 6, dtype=torch.long)
    return m, _cond(6, 32, seed + 2, attention_mask=mask), _cond(6, 32, seed + 3, attention_mask=mask), \
        torch.zeros(1, 3, 32, 32)


def pid(tmpdir: str, seed: int = 0):
    """PiD, the pixel diffusion decoder (sm.PiD -> model_base.PiD -> comfy.ldm.pixeldit.pid.PidNet, a PixDiT_T2I
    that overrides _forward and calls PixDiT_T2I._forward): decodes/upscales a latent to pixels. Extras (the
    PiDConditioning node): `lq_latent` (the latent being decoded, 16 channels for Flux/SD3) and `degrade_sigma`;
    an LQ branch injects a sigma-gated feature into the patch stream BEFORE every lq_interval-th patch block
    (_pre_patch_block, inside the block loop)."""
    cfg = _pixeldit_cfg(image_model="pid", lq_latent_channels=16, lq_hidden_dim=16, lq_num_res_blocks=1,
                        lq_interval=1, sr_scale=4, latent_spatial_down_factor=8)
    m = _patcher(sm.PiD, cfg, seed)
    _unit_norms(m, seed, scale=0.3)  # as PixelDiT
    g = _gen(seed + 1)
    lq = torch.randn(1, 16, 2, 2, generator=g)
    sigma = torch.tensor([0.1])
    return m, _cond(6, 32, seed + 2, lq_latent=lq, degrade_sigma=sigma), \
        _cond(6, 32, seed + 3, lq_latent=lq, degrade_sigma=sigma), torch.zeros(1, 3, 32, 32)


# ------------------------------------------------------------------------------------------------- HunyuanDiT
def hunyuan_dit(tmpdir: str, seed: int = 0):
    """HunyuanDiT 1.2 (sm.HunyuanDiT -> model_base.HunyuanDiT -> comfy.ldm.hydit.models.HunYuanDiT): v-prediction
    (discrete schedule, not flow), SDXL latent, learn_sigma (8 output channels, the first 4 returned). U-Net-like
    LONG SKIPS inside the block stack: block i < depth/2 - 1 pushes its output, block i > depth/2 pops one (depth
    must be even: 4 here). Text is cat(CLIP tokens, mT5 tokens through mlp_t5) with padding rows substituted where
    the masks are 0; the mT5 tokens are also attention-pooled into the adaLN vector. Extras: `attention_mask`
    (-> text_embedding_mask), `conditioning_mt5xl`, `attention_mask_mt5xl`, width/height (image_meta_size, read
    only with size_cond). text_len / text_len_t5 must equal the cond lengths (the real encoders pad to 77 / 256)."""
    cfg = {"image_model": "hydit", "input_size": 32, "patch_size": 2, "in_channels": 4, "hidden_size": 64,
           "depth": 4, "num_heads": 2, "mlp_ratio": 2.0, "text_states_dim": 32, "text_states_dim_t5": 32,
           "text_len": 6, "text_len_t5": 8}
    m = _patcher(sm.HunyuanDiT, cfg, seed)
    _randomize(m.model.diffusion_model, seed, scale=0.1)
    g = _gen(seed + 1)

    def cond(s):
        return _cond(6, 32, s, attention_mask=torch.ones(1, 6, dtype=torch.long),
                     conditioning_mt5xl=torch.randn(1, 8, 32, generator=g),
                     attention_mask_mt5xl=torch.ones(1, 8, dtype=torch.long))
    return m, cond(seed + 2), cond(seed + 3), torch.zeros(1, 4, 16, 16)


BUILDERS = {"flux2": flux2, "flux2_klein": flux2_klein, "z_image": z_image, "z_image_pixel": z_image_pixel,
            "qwen_image_edit_2509": qwen_image_edit_2509, "qwen_image_edit_2511": qwen_image_edit_2511,
            "qwen_image_layered": qwen_image_layered, "longcat_image": longcat_image, "ernie_image": ernie_image,
            "hidream_o1": hidream_o1, "krea2": krea2, "anima": anima, "hunyuan_image21": hunyuan_image21,
            "kandinsky5_image": kandinsky5_image, "omnigen2": omnigen2, "lens": lens, "boogu": boogu,
            "mage_flow": mage_flow, "joyimage": joyimage, "ideogram4": ideogram4, "pixeldit": pixeldit, "pid": pid,
            "hunyuan_dit": hunyuan_dit}

FIRST_BLOCK = {"flux2": "double_blocks.0", "flux2_klein": "double_blocks.0", "z_image": "layers.0",
               "z_image_pixel": "layers.0", "qwen_image_edit_2509": "transformer_blocks.0",
               "qwen_image_edit_2511": "transformer_blocks.0", "qwen_image_layered": "transformer_blocks.0",
               "longcat_image": "double_blocks.0", "ernie_image": "layers.0",
               "hidream_o1": "language_model.layers.0", "krea2": "blocks.0", "anima": "blocks.0",
               "hunyuan_image21": "double_blocks.0", "kandinsky5_image": "visual_transformer_blocks.0",
               "omnigen2": "layers.0", "lens": "transformer_blocks.0", "boogu": "double_stream_layers.0",
               "mage_flow": "transformer_blocks.0", "joyimage": "double_blocks.0", "ideogram4": "layers.0",
               "pixeldit": "patch_blocks.0", "pid": "patch_blocks.0", "hunyuan_dit": "blocks.0"}

# The GCache adapter nodes/patching/adapters.py chooses for each today (checked with the family-matrix test body on
# these builders, cfg 1 and 3): the rest fall back to the whole model.
_FALLBACK = "whole-model fallback"
EXPECTED_FAMILY = {"flux2": "flux", "flux2_klein": "flux", "longcat_image": "flux", "z_image": "lumina2",
                   "qwen_image_edit_2509": "qwen_image", "qwen_image_edit_2511": "qwen_image",
                   "qwen_image_layered": "qwen_image", "anima": "cosmos_predict2", "hunyuan_image21": "hunyuan_video"}
EXPECTED_FAMILY.update({n: _FALLBACK for n in BUILDERS if n not in EXPECTED_FAMILY})

# Verified against ComfyUI 0.33.0 (file:line under comfy/); "route" counts are the tiny builders' block counts. The
# probe shapes quoted are from sampling the tiny models at cfg 3 (batch 2: cond + uncond).
_LDM = "comfy.ldm."
_FLUX_LOOP = {
    "loop": "comfy.ldm.flux.model.Flux.forward_orig",
    "route": [("double_block", 2), ("single_block", 2)],
    "returns": "double_block: out['img'], out['txt'] (ldm/flux/model.py:240-241); single_block: out['img'] "
               "(ldm/flux/model.py:294)",
    "block_index": "yes: total_blocks / block_type 'double' then 'single' / block_index, set on a copy of "
                   "transformer_options made at forward_orig's entry (ldm/flux/model.py:162, 217-220, 272-276)",
    "inplace": "yes: DoubleStreamBlock does img += ..., txt += ... and SingleStreamBlock x += ... on their inputs "
               "(ldm/flux/layers.py:246-253, 352); the probe saw args['img'] (and 'txt') changed by the call",
    "between_blocks": "ControlNet: control['input'][i] added in place into img[:, :n] after double block i, "
                      "control['output'][i] into the single stream's image part after single block i "
                      "(ldm/flux/model.py:251-256, 298-303); 'post_input' patches run once before the loops "
                      "(ldm/flux/model.py:184-190)",
}


def _flux_facts(**kw) -> dict:
    out = {"class": _LDM + "flux.model.Flux", "mro": [_LDM + "flux.model.Flux"],
           "stacks": ["double_blocks", "single_blocks"]}
    out.update(_FLUX_LOOP)
    out.update(kw)
    return out


_QWEN_BLOCK_LOOP = ("double_block: out['img'], out['txt'] (block_wrap returns txt, img from the block)")

FACTS = {
    "flux2": _flux_facts(
        img={"double_blocks": "image tokens + reference tokens, cat(img, ref...) in that order "
                              "(ldm/flux/model.py:390); no img_slice (DoubleStreamBlock only puts one in its own "
                              "attention-patch options, ldm/flux/layers.py:227). Probe: img (2, 80, 64) = 64 image "
                              "+ 16 reference tokens, txt (2, 512, 64), img_slice None",
             "single_blocks": "joint cat(txt, img + refs) (ldm/flux/model.py:261), img_slice = [text tokens, "
                              "total] (ldm/flux/model.py:274), i.e. it INCLUDES the reference tokens. Probe: img "
                              "(2, 592, 64), img_slice [512, 592]"},
        notes="sm.Flux2 -> model_base.Flux2 (model_base.py:1084-1093) pads the text to 512 tokens with zeros in "
              "FRONT, so the single stream is 512 + image (+ reference) tokens; global_modulation: the blocks get "
              "a shared modulation, args['vec'] is a tuple ((img mods), (txt mods)) in the double blocks and a "
              "ModulationOut in the single blocks (ldm/flux/model.py:213-214, 263-264); reference latents use "
              "default_ref_method 'index' (RoPE index 10 per reference). 'index_timestep_zero' (FluxKVCache node, "
              "comfy_extras/nodes_flux.py:282-299) doubles the timestep batch and modulates the reference tokens "
              "with t = 0 (ldm/flux/model.py:392-396, 201-211), and its post_input patch drops the reference "
              "tokens from img once their K/V are cached, so the stack's token count changes after the first "
              "step. The model output is out[:, :img_tokens] (reference tokens dropped, ldm/flux/model.py:407)."),
    "flux2_klein": _flux_facts(
        img={"double_blocks": "image tokens only (no reference latent here). Probe: img (2, 64, 64), txt "
                              "(2, 512, 64), img_slice None",
             "single_blocks": "joint cat(txt, img), img_slice [512, 576] in the probe (ldm/flux/model.py:261, "
                              "274)"},
        notes="Same class, loop and config as Flux 2 without guidance_in (guidance_embed False, so "
              "model_base.Flux's `guidance` is ignored); the text is still padded to 512 tokens by "
              "model_base.Flux2. Klein edits use reference_latents exactly as Flux 2."),
    "longcat_image": _flux_facts(
        img={"double_blocks": "image tokens only. Probe: img (2, 64, 64), txt (2, 6, 64)",
             "single_blocks": "joint cat(txt, img), img_slice [6, 70] in the probe"},
        notes="sm.LongCatImage -> model_base.LongCatImage (model_base.py:1064-1082): plain Flux with vec_in_dim "
              "None (no pooled vector), guidance dropped, txt_ids_dims [1, 2], and _apply_model adding "
              "rope_options shift_t 1 / shift_y = shift_x = text length (image RoPE offset)."),
    "hunyuan_image21": {
        "class": _LDM + "hunyuan_video.model.HunyuanVideo", "mro": [_LDM + "hunyuan_video.model.HunyuanVideo"],
        "stacks": ["double_blocks", "single_blocks"],
        "loop": "comfy.ldm.hunyuan_video.model.HunyuanVideo.forward_orig",
        "route": [("double_block", 2), ("single_block", 2)],
        "img": {"double_blocks": "image tokens only (a ref_latent, HunyuanVideo I2V only, would be put IN FRONT: "
                                 "ldm/hunyuan_video/model.py:326). Probe: img (2, 64, 64), txt (2, 10, 64) = 6 text "
                                 "+ 4 ByT5 tokens (appended after the text, :368), img_slice None",
                "single_blocks": "joint cat(txt, img) (ldm/hunyuan_video/model.py:416), img_slice [10, 74] "
                                 "(:420)"},
        "returns": "double_block: out['img'], out['txt']; single_block: out['img'] "
                   "(ldm/hunyuan_video/model.py:404-405, 430)",
        "block_index": "yes, on a copy of transformer_options (ldm/hunyuan_video/model.py:307, 393-396, 418-422)",
        "inplace": "yes (Flux's DoubleStreamBlock / SingleStreamBlock from ldm/flux/layers.py; probe confirmed)",
        "between_blocks": "ControlNet img += control['input'][i] (:410-414) and into the single stream's image "
                          "part (:435-439)",
        "notes": "sm.HunyuanImage21 -> model_base.HunyuanImage21 (model_base.py:2580-2600): 2-D patch [1, 1], 2 RoPE "
                 "axes, 64-channel latent; extras attention_mask (dropped when all ones), conditioning_byt5small "
                 "-> txt_byt5, guidance (6.0). The Refiner (sm.HunyuanImage21Refiner) is the same class with a 3-D "
                 "patch [1, 1, 1] and a concat latent; not built here."},
    "z_image": {
        "class": _LDM + "lumina.model.NextDiT", "mro": [_LDM + "lumina.model.NextDiT"], "stacks": ["layers"],
        "loop": "comfy.ldm.lumina.model.NextDiT._forward", "route": "none",
        "img": {"layers": "the block's first positional argument x (forward(x, x_mask, freqs_cis, adaln_input, "
                          "timestep_zero_index=, transformer_options=), ldm/lumina/model.py:313, call at :863): ONE "
                          "joint stream cat(caption tokens padded to a multiple of 32 with cap_pad_token, image "
                          "tokens padded to a multiple of 32 with x_pad_token) (:807, :654-660, :709); image last. "
                          "No img_slice. Probe: x (2, 64, 256) = 32 caption (6 real) + 32 image (16 real)"},
        "returns": "the new stream (a tensor)",
        "block_index": "yes, written into the CALLER's transformer_options (no copy in _forward): total_blocks, "
                       "block_type 'double', block_index (ldm/lumina/model.py:858-862)",
        "inplace": "no (x = x + ..., ldm/lumina/model.py:338-350; probe: input unchanged)",
        "between_blocks": "patches['double_block'] after every layer (ldm/lumina/model.py:864-870): they get "
                          "img[:, cap:] / txt / img_input and write back into the stream in place; Z-Image Fun "
                          "ControlNet (ZImageControlPatch, comfy_extras/nodes_model_patch.py:510-536, 581-584) "
                          "adds its hints this way (and through patches['noise_refiner'] in the refiner, :800-805)",
        "notes": "sm.ZImage -> model_base.Lumina2 (model_base.py:1503-1548). Before the loop: context_refiner on "
                 "the caption, noise_refiner on the image tokens (ldm/lumina/model.py:774-805). With "
                 "reference_latents (Z-Image Omni) timesteps are doubled [0, t] and timestep_zero_index marks the "
                 "reference/caption ranges (:828, :793-794, :808-811). z_image_modulation needs dim >= 256 (the "
                 "adaLN Linear reads min(dim, 256) features; t_embedder always gives 256)."},
    "z_image_pixel": {
        "class": _LDM + "lumina.model.NextDiTPixelSpace",
        "mro": [_LDM + "lumina.model.NextDiTPixelSpace", _LDM + "lumina.model.NextDiT"], "stacks": ["layers"],
        "loop": "comfy.ldm.lumina.model.NextDiTPixelSpace._forward (its own copy of NextDiT's loop)",
        "route": "none",
        "img": {"layers": "as Z-Image: x = joint cat(caption padded, image padded). Probe: x (2, 96, 256) = 32 "
                          "caption + 64 image tokens (32x32 RGB / patch 4), no img_slice"},
        "returns": "the new stream (a tensor)",
        "block_index": "yes, on the caller's dict (ldm/lumina/model.py:1089-1093)",
        "inplace": "no",
        "between_blocks": "patches['double_block'] as Z-Image (ldm/lumina/model.py:1095-1100)",
        "notes": "Overrides _forward (ldm/lumina/model.py:1045-1120), so GCache's lumina2 row (verified on NextDiT, "
                 "loop _forward) refuses it and falls back to the whole model. After the loop only "
                 "img[:, cap:cap+N] goes to dec_net, a per-patch MLP decoder that also reads the raw noisy pixels "
                 "(:1103-1108); forward returns (x + x0) / t (:1122-1139)."},
    "qwen_image_edit_2509": {
        "class": _LDM + "qwen_image.model.QwenImageTransformer2DModel",
        "mro": [_LDM + "qwen_image.model.QwenImageTransformer2DModel"], "stacks": ["transformer_blocks"],
        "loop": "comfy.ldm.qwen_image.model.QwenImageTransformer2DModel._forward",
        "route": [("double_block", 2)],
        "img": {"transformer_blocks": "image tokens + all reference tokens, cat(img, ref1, ref2) "
                                      "(ldm/qwen_image/model.py:489); txt separate; no img_slice. Probe: img "
                                      "(2, 40, 64) = 16 image + 16 + 8 reference, txt (2, 6, 64), vec (2, 64)"},
        "returns": _QWEN_BLOCK_LOOP + " (ldm/qwen_image/model.py:529-535)",
        "block_index": "yes (ldm/qwen_image/model.py:524-527), on a copy only when reference latents are given "
                       "(:496); without them on the caller's dict",
        "inplace": "no (probe: inputs unchanged)",
        "between_blocks": "patches['double_block'] after every block (DiffSynth ControlNet / inpaint patches, "
                          "ldm/qwen_image/model.py:547-551, comfy_extras/nodes_model_patch.py:586) and "
                          "control['input'][i] added in place into hidden_states[:, :n] (:553-558)",
        "notes": "model_base.QwenImage (model_base.py:2467-2490): attention_mask (made additive in the model, "
                 ":452-453), reference_latents (-> ref_latents, 'index' method: RoPE frame index 1, 2, ...), "
                 "reference_latents_method. The output keeps the first num_embeds tokens (:566)."},
    "qwen_image_edit_2511": {
        "class": _LDM + "qwen_image.model.QwenImageTransformer2DModel",
        "mro": [_LDM + "qwen_image.model.QwenImageTransformer2DModel"], "stacks": ["transformer_blocks"],
        "loop": "comfy.ldm.qwen_image.model.QwenImageTransformer2DModel._forward",
        "route": [("double_block", 2)],
        "img": {"transformer_blocks": "image + reference tokens (16 + 16 in the probe: img (2, 32, 64)); "
                                      "args['vec'] has TWICE the batch (4, 64): [temb(t), temb(0)]"},
        "returns": _QWEN_BLOCK_LOOP,
        "block_index": "yes, on a copy (reference latents present)",
        "inplace": "no",
        "between_blocks": "as Qwen-Image-Edit 2509",
        "notes": "default_ref_method 'index_timestep_zero' (model_detection.py:956-957): timestep becomes "
                 "cat(t, 0) and every block gets timestep_zero_index = image token count, modulating the "
                 "reference tokens with t = 0 (ldm/qwen_image/model.py:493-495, 250-266, 561)."},
    "qwen_image_layered": {
        "class": _LDM + "qwen_image.model.QwenImageTransformer2DModel",
        "mro": [_LDM + "qwen_image.model.QwenImageTransformer2DModel"], "stacks": ["transformer_blocks"],
        "loop": "comfy.ldm.qwen_image.model.QwenImageTransformer2DModel._forward",
        "route": [("double_block", 2)],
        "img": {"transformer_blocks": "tokens of all layers+1 latent frames (frame RoPE index 0..T-1), then the "
                                      "reference tokens (index -1). Probe: img (2, 64, 64) = 3 frames x 16 + 16"},
        "returns": _QWEN_BLOCK_LOOP,
        "block_index": "yes, on a copy",
        "inplace": "no",
        "between_blocks": "as Qwen-Image-Edit 2509",
        "notes": "use_additional_t_cond (addition_t_embedding added to temb; 0 when no additional_t_cond, and "
                 "model_base.QwenImage never passes one: ldm/qwen_image/model.py:86-89) and default_ref_method "
                 "'negative_index' (model_detection.py:958-960). Latent (B, 16, layers + 1, H, W) from "
                 "EmptyQwenImageLayeredLatentImage (comfy_extras/nodes_qwen.py:112)."},
    "ernie_image": {
        "class": _LDM + "ernie.model.ErnieImageModel", "mro": [_LDM + "ernie.model.ErnieImageModel"],
        "stacks": ["layers"], "loop": "comfy.ldm.ernie.model.ErnieImageModel.forward", "route": "none",
        "img": {"layers": "first positional argument (layer(hidden_states, rotary_pos_emb, temb), "
                          "ldm/ernie/model.py:294-295): joint cat(image, text), IMAGE FIRST (:257); the head reads "
                          "[:, :N_img] (:299). Probe: (2, 70, 64) = 64 image + 6 text, no transformer_options"},
        "returns": "the new stream (a tensor)",
        "block_index": "no (no transformer_options reach the loop or the blocks)",
        "inplace": "no (residual + gate * ..., ldm/ernie/model.py:163-177)",
        "between_blocks": "nothing",
        "notes": "The loop is in forward itself: no DIFFUSION_MODEL wrapper executor, no patches of any kind. "
                 "temb (one shared adaLN modulation, 6 tensors) is the same list object for every layer. "
                 "model_base.ErnieImage reads only the cond (model_base.py:2779-2788); 128-channel Flux 2 latent, "
                 "patch 1."},
    "hidream_o1": {
        "class": _LDM + "hidream_o1.model.HiDreamO1Transformer",
        "mro": [_LDM + "hidream_o1.model.HiDreamO1Transformer"],
        "stacks": ["language_model.layers"], "loop": "comfy.ldm.hidream_o1.model.HiDreamO1Transformer._forward",
        "route": [("double_block", 2)],
        "img": {"language_model.layers": "args['x'] (NOT 'img'): ONE sequence [text-id embeddings (causal AR "
                                         "prefix) incl. the tms token, target 32x32 pixel patches, reference "
                                         "patches] (ldm/hidream_o1/model.py:158, 194); no img_slice. Probe: x "
                                         "(2, 30, 64) = 14 text + 16 target tokens; freqs_cis a 3-tuple"},
        "returns": "out['x'] (ldm/hidream_o1/model.py:262)",
        "block_index": "yes, on the caller's dict (ldm/hidream_o1/model.py:203-204, 234, 246)",
        "inplace": "yes: the Llama TransformerBlock writes its result into its input (torch.add(residual, x, "
                   "out=output) with output = x, comfy/text_encoders/llama.py:669, 686); probe confirmed",
        "between_blocks": "nothing",
        "notes": "KV cache of the text prefix: without dit replace patches and with ar_len > 0 the first call "
                 "stores each layer's prefix K/V in the model object (keyed by input_ids, reference id, position "
                 "ids; not by weights) and later calls run the layers on inputs_embeds[:, ar_len:] only "
                 "(ldm/hidream_o1/model.py:206-243, 272-282). Any dit patch turns that cache off (can_cache = not "
                 "blocks_replace, :208), so the stream is 30 tokens with patches and 17 without in the probe. The "
                 "output head takes the target tokens via vinput_mask (:289-298). Cond: `text_input_ids` "
                 "(model_base.HiDreamO1 builds input_ids/position_ids/vinput_mask/ar_len, model_base.py:2312-2343; "
                 "reference images via reference_latents = IMAGES)."},
    "krea2": {
        "class": _LDM + "krea2.model.SingleStreamDiT", "mro": [_LDM + "krea2.model.SingleStreamDiT"],
        "stacks": ["blocks"], "loop": "comfy.ldm.krea2.model.SingleStreamDiT._forward", "route": "none",
        "img": {"blocks": "first positional argument (block(combined, tvec, freqs, None, timestep_zero_index=, "
                          "transformer_options=), ldm/krea2/model.py:370): joint cat(text, image [+ references]) "
                          "(:353), text first; img_slice = [text tokens, total] set (:367). Probe: (2, 22, 64) = "
                          "6 text + 16 image, img_slice [6, 22]"},
        "returns": "the new stream (a tensor)",
        "block_index": "yes: total_blocks, block_type 'single', block_index, img_slice on a copy made at _forward's "
                       "entry (ldm/krea2/model.py:296, 365-369)",
        "inplace": "no (x = x + ...; the timestep-zero path mutates only its own temporaries, :185-210)",
        "between_blocks": "nothing ('post_input' patches once before the loop, :346-351)",
        "notes": "model_base.Krea2 (model_base.py:2551-2571): reference_latents are used only when a "
                 "reference_latents_method is set (default_ref_method None); 'index_timestep_zero' doubles tvec "
                 "(:335-337). The cond is txtlayers Qwen3-VL layers flattened (B, L, txtlayers*txtdim), fused by "
                 "txtfusion before the loop."},
    "anima": {
        "class": _LDM + "anima.model.Anima", "mro": [_LDM + "anima.model.Anima", _LDM + "cosmos.predict2.MiniTrainDIT"],
        "stacks": ["blocks"], "loop": "comfy.ldm.cosmos.predict2.MiniTrainDIT._forward (Anima overrides only "
                                      "forward, ldm/anima/model.py:210-214)", "route": "none",
        "img": {"blocks": "first positional argument: image tokens only as a (B, T, H, W, D) tensor "
                          "(block(x_B_T_H_W_D, t_embedding_B_T_D, crossattn_emb, rope_emb_L_1_1_D=, "
                          "adaln_lora_B_T_3D=, extra_per_block_pos_emb=, transformer_options=), "
                          "ldm/cosmos/predict2.py:923-928); text by cross-attention. Probe: (2, 1, 4, 4, 64), "
                          "context (2, 512, 1024)"},
        "returns": "the new stream (a tensor)",
        "block_index": "block_index only (no total_blocks / block_type), on the caller's dict unless 'post_input' "
                       "patches exist (ldm/cosmos/predict2.py:898-900, 922)",
        "inplace": "no",
        "between_blocks": "nothing in the loop; each Block adds extra_per_block_pos_emb itself when given "
                          "(ldm/cosmos/predict2.py:483-484; None here, extra_per_block_abs_pos_emb False)",
        "notes": "Text: Qwen3-0.6B hidden states (cond, 1024 wide) + t5xxl_ids / t5xxl_weights through "
                 "llm_adapter (fixed full size, ~120M parameters) padded to 512 tokens (ldm/anima/model.py:"
                 "193-214; model_base.Anima does it in extra_conds under inference mode, model_base.py:1478-1501, "
                 "else Anima.forward does). GCache's cosmos_predict2 row accepts it as an unverified subclass "
                 "running MiniTrainDIT's own loop."},
    "kandinsky5_image": {
        "class": _LDM + "kandinsky5.model.Kandinsky5", "mro": [_LDM + "kandinsky5.model.Kandinsky5"],
        "stacks": ["visual_transformer_blocks"], "loop": "comfy.ldm.kandinsky5.model.Kandinsky5.forward_orig",
        "route": [("double_block", 2)],
        "img": {"visual_transformer_blocks": "args['x'] (NOT 'img'): image tokens only, flattened (B, L, D); "
                                             "args 'context' (text after text_transformer_blocks), 'time_embed', "
                                             "'freqs', 'transformer_options'. Probe: x (2, 16, 64), context "
                                             "(2, 6, 64)"},
        "returns": "the loop reads ...['x'] of the patch's return (ldm/kandinsky5/model.py:382)",
        "block_index": "yes, on the caller's dict (ldm/kandinsky5/model.py:375-378)",
        "inplace": "no",
        "between_blocks": "nothing (text_transformer_blocks run before the loop, :367-368)",
        "notes": "BUG in 0.33.0: the dit replace's original_block calls block(x=..., context=..., ...) but "
                 "TransformerDecoderBlock.forward takes (visual_embed, text_embed, time_embed, freqs) "
                 "(ldm/kandinsky5/model.py:381 vs :254): calling it raises TypeError (seen); and block_wrap "
                 "returns a tensor, not a dict. A patch must call the block itself and return {'x': ...}. "
                 "model_base.Kandinsky5.encode_adm reads kwargs['pooled_output'] unguarded (model_base.py:2727-2728)."},
    "omnigen2": {
        "class": _LDM + "omnigen.omnigen2.OmniGen2Transformer2DModel",
        "mro": [_LDM + "omnigen.omnigen2.OmniGen2Transformer2DModel"], "stacks": ["layers"],
        "loop": "comfy.ldm.omnigen.omnigen2.OmniGen2Transformer2DModel.forward", "route": "none",
        "img": {"layers": "first positional argument (layer(hidden_states, None, rotary_emb, temb, "
                          "transformer_options=), ldm/omnigen/omnigen2.py:458-459): joint cat(text, reference "
                          "tokens, image tokens) (:455, :410), image LAST; the head reads [:, -img_len:] (:464). "
                          "Probe: (2, 38, 64) = 6 text + 16 reference + 16 image, no img_slice"},
        "returns": "the new stream (a tensor)",
        "block_index": "no",
        "inplace": "no (hidden_states + gate * ..., ldm/omnigen/omnigen2.py:185-187)",
        "between_blocks": "nothing",
        "notes": "Loop in forward itself (no DIFFUSION_MODEL wrapper executor, no patches). model_base.Omnigen2 "
                 "(model_base.py:2435-2453): attention_mask (dropped when all ones; num_tokens always set), "
                 "reference_latents. Refiners (context / noise / reference) run before the loop."},
    "boogu": {
        "class": _LDM + "boogu.model.BooguTransformer2DModel", "mro": [_LDM + "boogu.model.BooguTransformer2DModel"],
        "stacks": ["double_stream_layers", "single_stream_layers"],
        "loop": "comfy.ldm.boogu.model.BooguTransformer2DModel.forward", "route": "none",
        "img": {"double_stream_layers": "first positional argument: [reference ; image] tokens; the text "
                                        "(instruction) stream is the SECOND positional argument and comes back as "
                                        "the second output (layer(img, text, rope, img_rope, temb, ...) -> (img, "
                                        "text), ldm/boogu/model.py:300-306, 140, 167). Probe: (2, 32, 64) and "
                                        "(2, 6, 64)",
                "single_stream_layers": "first positional argument: joint cat(text, reference, image) (:308-311), "
                                        "image last, no img_slice. Probe: (2, 38, 64)"},
        "returns": "double: a tuple (img, text); single: the new stream",
        "block_index": "no",
        "inplace": "no",
        "between_blocks": "nothing (the text stream is concatenated in front between the two stacks, :308)",
        "notes": "Loop in forward itself (no wrapper executor, no patches). model_base.Boogu = Omnigen2's "
                 "extra_conds (model_base.py:2462-2465)."},
    "lens": {
        "class": _LDM + "lens.model.LensTransformer2DModel", "mro": [_LDM + "lens.model.LensTransformer2DModel"],
        "stacks": ["transformer_blocks"], "loop": "comfy.ldm.lens.model.LensTransformer2DModel._forward",
        "route": [("double_block", 2)],
        "img": {"transformer_blocks": "image tokens only (the 128-channel latent taken as tokens, no patchify); "
                                      "txt separate; attn_mask (B, 1, 1, img + txt) additive. Probe: img (2, 64, "
                                      "64), txt (2, 6, 64), no img_slice"},
        "returns": "double_block: out['img'], out['txt'] (ldm/lens/model.py:455-468)",
        "block_index": "yes, on a copy (ldm/lens/model.py:388, 439-442)",
        "inplace": "no",
        "between_blocks": "patches['double_block'] after each block (:478-487) and control['input'][i] added in "
                          "place into hidden_states[:, :n] (:489-495)",
        "notes": "model_base.Lens (model_base.py:1096-1114): attention_mask, no pooled output. The cond is "
                 "len(selected_layer_index) GPT-OSS layers flattened on the feature axis."},
    "mage_flow": {
        "class": _LDM + "mage_flow.model.MageFlowTransformer2DModel",
        "mro": [_LDM + "mage_flow.model.MageFlowTransformer2DModel"], "stacks": ["transformer_blocks"],
        "loop": "comfy.ldm.mage_flow.model.MageFlowTransformer2DModel._forward", "route": [("double_block", 2)],
        "img": {"transformer_blocks": "image tokens (patch 1) + reference tokens, cat(img, refs) "
                                      "(ldm/mage_flow/model.py:114); txt separate. Probe: img (2, 80, 64) = 64 + "
                                      "16, txt (2, 6, 64), no img_slice"},
        "returns": _QWEN_BLOCK_LOOP + " (ldm/mage_flow/model.py:151-157)",
        "block_index": "yes (ldm/mage_flow/model.py:146-149), on a copy only when reference latents are given "
                       "(:117)",
        "inplace": "no",
        "between_blocks": "patches['double_block'] (:168-172) and control['input'][i] in place (:174-179)",
        "notes": "Qwen-Image's block (QwenImageTransformerBlock) in its own class; the attention mask is closed "
                 "over in block_wrap, not passed in args. model_base.MageFlow.process_timestep casts the "
                 "timestep to bfloat16 (model_base.py:2503-2505)."},
    "joyimage": {
        "class": _LDM + "joyimage.model.JoyImageTransformer3DModel",
        "mro": [_LDM + "joyimage.model.JoyImageTransformer3DModel"], "stacks": ["double_blocks"],
        "loop": "comfy.ldm.joyimage.model.JoyImageTransformer3DModel._forward", "route": [("double_block", 2)],
        "img": {"double_blocks": "target tokens then reference tokens, cat(img_tokens) (ldm/joyimage/model.py:404); "
                                 "txt separate; args['vec'] (B, 6, D). Probe: img (2, 32, 128) = 16 + 16, txt "
                                 "(2, 6, 128), no img_slice"},
        "returns": "double_block: out['txt'], out['img'] (ldm/joyimage/model.py:438-439)",
        "block_index": "yes, on the copy made in forward (ldm/joyimage/model.py:375, 416-419)",
        "inplace": "no",
        "between_blocks": "nothing",
        "notes": "The head keeps the first target_tokens (:449-451). sm.JoyImage.unet_extra_config forces "
                 "rope_dim_list [16, 56, 56] (head dim 128)."},
    "ideogram4": {
        "class": _LDM + "ideogram4.model.Ideogram4Transformer2DModel",
        "mro": [_LDM + "ideogram4.model.Ideogram4Transformer2DModel", _LDM + "ideogram4.model.Ideogram4Transformer"],
        "stacks": ["layers"], "loop": "comfy.ldm.ideogram4.model.Ideogram4Transformer._backbone", "route": "none",
        "img": {"layers": "first positional argument (layer(h, attn_mask, freqs_cis, adaln_input, "
                          "transformer_options=), ldm/ideogram4/model.py:215-216): ONE packed sequence [text rows, "
                          "image rows] (:270-272), image last; image-only when context is None (:295-306). Probe: "
                          "(2, 70, 64) = 6 text + 64 image, no img_slice"},
        "returns": "the new stream (a tensor)",
        "block_index": "no",
        "inplace": "no",
        "between_blocks": "nothing",
        "notes": "model_base.Ideogram4 (model_base.py:2536-2549): attention_mask (dropped when all ones; else a "
                 "block-diagonal segment mask). sm.Ideogram4.unet_extra_config forces the full widths over any "
                 "given config."},
    "pixeldit": {
        "class": _LDM + "pixeldit.model.PixDiT_T2I", "mro": [_LDM + "pixeldit.model.PixDiT_T2I"],
        "stacks": ["patch_blocks", "pixel_blocks"], "loop": "comfy.ldm.pixeldit.model.PixDiT_T2I._forward",
        "route": "none",
        "img": {"patch_blocks": "first positional argument s: image patch tokens only; the text stream y is the "
                                "second positional argument and comes back second (blk(s, y, c, pos_img, pos_txt, "
                                "None, transformer_options=) -> (s, y), ldm/pixeldit/model.py:227-229). Probe: s "
                                "(2, 64, 64), y (2, 6, 64)",
                "pixel_blocks": "per-pixel tokens (B*L, P*P, pixel_hidden) built from the INPUT x, conditioned on "
                                "silu(t_emb + s) (:230-236). Probe: (128, 16, 8)"},
        "returns": "patch: a tuple (s, y); pixel: the new pixel tokens",
        "block_index": "no",
        "inplace": "no",
        "between_blocks": "PixDiT_T2I._pre_patch_block(s, i) before every patch block (identity here; PiD's LQ "
                          "gate), s = silu(t_emb + s) between the stacks",
        "notes": "Two stacks in different token spaces: h (patch tokens) and z (pixel tokens) do not align, so one "
                 "residual over both stacks is not defined; patch_blocks is the cacheable stack. "
                 "model_base.PixelDiTT2I reads attention_mask (model_base.py:1563-1573)."},
    "pid": {
        "class": _LDM + "pixeldit.pid.PidNet",
        "mro": [_LDM + "pixeldit.pid.PidNet", _LDM + "pixeldit.model.PixDiT_T2I"],
        "stacks": ["patch_blocks", "pixel_blocks"],
        "loop": "comfy.ldm.pixeldit.model.PixDiT_T2I._forward (PidNet._forward prepares the LQ features and calls "
                "it, ldm/pixeldit/pid.py:234-263)", "route": "none",
        "img": {"patch_blocks": "as PixelDiT. Probe: s (2, 64, 64)", "pixel_blocks": "as PixelDiT"},
        "returns": "patch: a tuple (s, y); pixel: the new pixel tokens",
        "block_index": "no",
        "inplace": "no",
        "between_blocks": "PidNet._pre_patch_block: before every lq_interval-th patch block s = s + sigmoid-gate * "
                          "lq_feature, the gate depending on s, the LQ latent and degrade_sigma "
                          "(ldm/pixeldit/pid.py:221-227, 16-32)",
        "notes": "A 4-step distilled latent-to-pixel decoder/upscaler: extras lq_latent and degrade_sigma "
                 "(PiDConditioning, comfy_extras/nodes_pid.py; model_base.PiD, model_base.py:1576-1589)."},
    "hunyuan_dit": {
        "class": _LDM + "hydit.models.HunYuanDiT", "mro": [_LDM + "hydit.models.HunYuanDiT"], "stacks": ["blocks"],
        "loop": "comfy.ldm.hydit.models.HunYuanDiT.forward", "route": [("double_block", 4)],
        "img": {"blocks": "args['img']: image tokens only; args txt (cat(CLIP, mT5) text), vec, pe (cos, sin), skip "
                          "(the long-skip tensor or None); no transformer_options in args. Probe: img (2, 64, 64), "
                          "txt (2, 14, 32), skip None at block 0 and (2, 64, 64) at block 3"},
        "returns": "out['img'] (ldm/hydit/models.py:383-384)",
        "block_index": "no (transformer_options is not written)",
        "inplace": "no",
        "between_blocks": "U-Net-like long skips: outputs of blocks < depth/2 - 1 are pushed and popped as the "
                          "`skip` argument of blocks > depth/2, plus ControlNet outputs added to the skips "
                          "(ldm/hydit/models.py:367-390)",
        "notes": "v-prediction (discrete, not flow). Writes padding rows into the cond tensor in place "
                 "(:323-324). Loop in forward itself (no wrapper executor)."},
}
