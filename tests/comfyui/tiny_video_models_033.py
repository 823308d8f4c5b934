"""Tiny random-weight video diffusion transformers of ComfyUI 0.33 (test helper; imports ComfyUI).

Same conventions as tiny_models / tiny_video_models: float32 on the CPU, each builder is
`build(tmpdir, seed=0) -> (ModelPatcher, positive, negative, latent)` with the conds in ComfyUI's
`[[tensor, {extras}]]` form carrying the extras the family's model_base reads, sampled with
`nodes.common_ksampler(model, 0, 6, cfg, "euler", "simple", pos, neg, {"samples": latent})` (cfg 1 and 3: finite,
and the output changes when the blocks' weights change). Most models are built straight from
`comfy.supported_models.<X>(unet_config)` (ComfyUI's detection fixes widths/head counts or cannot tell the variant
from weights); HunyuanVideo 1.5 is written as safetensors and loaded through comfy.sd.load_diffusion_model.
LTX-2 and MiniMax H3 sample a NestedTensor (video, audio) latent.

BUILDERS: every family (each cfg-3 6-step sample < 0.5 s on one CPU thread); SLOW_BUILDERS: variants that work but
take tens of seconds. FIRST_BLOCK: the first block module the model's loop calls (a forward pre-hook on it counts
block-stack runs), except for NO_PRE_HOOK models, whose loop calls block methods directly. FACTS: per family, what
its block loop does (class, mro, loop, route + keys, img, returns, block_index, inplace, between_blocks, prefetch,
notes), read from ComfyUI 0.33's source (file:line under comfy/ldm/ unless noted) and checked by sampling with a
probe dit patch on every block.
"""
from __future__ import annotations

import os

import comfy.clip_vision
import comfy.nested_tensor
import comfy.supported_models as sm
import comfy.utils
import torch
from tiny_models import _cond, _ops, _patcher, _randomize, complete, load_unet


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _save(sd: dict, path: str) -> str:
    comfy.utils.save_torch_file({k: v.contiguous() for k, v in sd.items()}, path)
    return path


def _patcher_scaled(model_config_cls, unet_config: dict, seed: int, scale: float):
    """_patcher with weights at `scale` (adaLN-gated stacks barely matter at tiny_models' 0.05)."""
    m = _patcher(model_config_cls, unet_config, seed)
    _randomize(m.model.diffusion_model, seed, scale)
    return m


# ------------------------------------------------------------------------------------------------ LTX-2
def ltx2(tmpdir: str, seed: int = 0):
    """LTX-2 (LTXAVModel, supported_models.LTXAV, model_base.LTXAV): a joint audio-video model. The latent is a
    comfy.nested_tensor.NestedTensor((video 1x128xTxHxW, audio 1x8xTax16)) as LTXVConcatAVLatent builds it; the
    sampler packs it flat and model_base unpacks it by `latent_shapes`. Every block takes and returns the pair
    (vx, ax) and adds into both in place (addcmul_/add_). Detection fixes 32 heads, so the model is built from
    the config. Quirks of the tiny config: the text context goes through the model's own embeddings connectors
    (cond extra `unprocessed_ltxav_embeds`, as ComfyUI's LTXAV text encoder sets it outside compat mode,
    text_encoders/lt.py:195-204), whose width
    (connector heads x head dim) must equal caption_channels; cross_attention_dim must equal the video width and
    audio_cross_attention_dim the audio width (the a2v/v2a rope is built at that width); audio_in_channels is 128
    (8 audio channels x 16 mel bins, fixed in the class). No attention_mask (the Gemma encoder gives none)."""
    cfg = {"image_model": "ltxav", "in_channels": 128, "audio_in_channels": 128,
           "num_attention_heads": 2, "attention_head_dim": 32, "cross_attention_dim": 64,
           "audio_num_attention_heads": 2, "audio_attention_head_dim": 16, "audio_cross_attention_dim": 32,
           "caption_channels": 32, "num_layers": 2,
           "connector_num_attention_heads": 1, "connector_attention_head_dim": 32, "connector_num_layers": 1}
    m = _patcher_scaled(sm.LTXAV, cfg, seed, 0.1)
    pos = _cond(6, 32, seed + 2, frame_rate=25.0, unprocessed_ltxav_embeds=True)
    neg = _cond(6, 32, seed + 3, frame_rate=25.0, unprocessed_ltxav_embeds=True)
    lat = comfy.nested_tensor.NestedTensor((torch.zeros(1, 128, 3, 4, 4), torch.zeros(1, 8, 9, 16)))
    return m, pos, neg, lat


# ------------------------------------------------------------------------------------------- HunyuanVideo 1.5
def _hv15_state_dict(seed: int) -> dict:
    from comfy.ldm.hunyuan_video.model import HunyuanVideo
    # detection: hidden_size and in/out channels from img_in / final_layer, num_heads = hidden // 128,
    # axes_dim [16, 56, 56], mlp_ratio 4, theta 256; vision_in_dim (1152 selects HunyuanVideo15) from
    # vision_in.proj.0, byt5 / cond_type_embedding / meanflow from key presence
    cfg = dict(in_channels=65, out_channels=32, vec_in_dim=None, context_in_dim=32, hidden_size=128, mlp_ratio=4.0,
               num_heads=1, depth=3, depth_single_blocks=0, axes_dim=[16, 56, 56], theta=256, patch_size=[1, 1, 1],
               qkv_bias=True, guidance_embed=False, byt5=True, meanflow=False, use_cond_type_embedding=True,
               vision_in_dim=1152, meanflow_sum=True)
    net = HunyuanVideo(image_model="hunyuan_video", operations=_ops(),
                       **complete(cfg, "hunyuan_video.model.HunyuanVideoParams"))
    _randomize(net, seed, 0.1)
    return net.state_dict()


def hunyuan_video15(tmpdir: str, seed: int = 0):
    """HunyuanVideo 1.5 i2v (comfy.ldm.hunyuan_video.model.HunyuanVideo, supported_models.HunyuanVideo15,
    model_base.HunyuanVideo15): the HunyuanVideo class with double blocks only (depth_single_blocks 0, as the
    real 1.5), no vector_in, cond_type_embedding, a ByT5 glyph mapper (fixed 1472->2048->2048->hidden) and a
    SigLIP vision projection (vision_in_dim 1152, which selects the 1.5 config). 32-channel latent, patch 1x1x1;
    img_in takes 65 channels = latent 32 + concat_latent_image 32 + mask 1 (model_base.HunyuanVideo15.concat_cond).
    The text stream is cat(vision tokens, byt5 tokens, text tokens), joined to the image stream as cat(txt, img)
    only in the single blocks (of which 1.5 has none). Written as safetensors and loaded through
    comfy.sd.load_diffusion_model (detection fixes num_heads = hidden // 128, hence hidden 128)."""
    m = load_unet(_save(_hv15_state_dict(seed), os.path.join(tmpdir, f"hv15_tiny_{seed}.safetensors")))
    t, h, w = 3, 4, 4
    g = _gen(seed + 1)
    cv = comfy.clip_vision.Output()
    cv["last_hidden_state"] = torch.randn(1, 4, 1152, generator=g)  # SigLIP tokens (729 in the real encoder)
    start = torch.zeros(1, 32, t, h, w)
    start[:, :, :1] = torch.randn(1, 32, 1, h, w, generator=g)
    mask = torch.ones(1, 1, t, h, w)
    mask[:, :, :1] = 0.0
    extra = {"pooled_output": None,  # model_base.HunyuanVideo.encode_adm reads it; 1.5 has no vector_in
             "conditioning_byt5small": torch.randn(1, 3, 1472, generator=g), "clip_vision_output": cv,
             "concat_latent_image": start, "concat_mask": mask}
    return m, _cond(6, 32, seed + 2, **extra), _cond(6, 32, seed + 3, **extra), torch.zeros(1, 32, t, h, w)


# ------------------------------------------------------------------------------------------------ Wan variants
T, H, W = 3, 8, 8  # latent frames, height, width of the Wan builders (16 tokens per frame at patch 1x2x2)


def _wan_cfg(model_type: str, **over) -> dict:
    """A tiny Wan unet_config: width 64, 2 heads (head dim 32; rope axes 12/10/10), 3 blocks, text width 32.
    Built straight from the config (detection would fix num_heads = dim // 128 and text_dim 4096, and cannot
    detect Animate 2 / FlowRVS / CausalAR from weights at all)."""
    cfg = {"image_model": "wan2.1", "model_type": model_type, "patch_size": (1, 2, 2), "in_dim": 16, "dim": 64,
           "ffn_dim": 128, "out_dim": 16, "num_heads": 2, "num_layers": 3, "text_dim": 32, "freq_dim": 256,
           "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6}
    cfg.update(over)
    return cfg


def _clip_vision(g: torch.Generator, tokens: int = 4):
    """A CLIP-vision output as model_base.WAN21 reads it (penultimate_hidden_states, 1280 wide; 257 tokens in
    the real ViT-H)."""
    cv = comfy.clip_vision.Output()
    cv["penultimate_hidden_states"] = torch.randn(1, tokens, 1280, generator=g)
    return cv


def _wan_conds(seed: int, **extra):
    return _cond(6, 32, seed + 2, **extra), _cond(6, 32, seed + 3, **extra)


def wan_animate(tmpdir: str, seed: int = 0, face: bool = False):
    """Wan 2.2 Animate (AnimateWanModel, supported_models.WAN22_Animate): i2v-shaped (in_dim 36 = latent 16 + mask 4
    + image 16), latent = 1 reference frame + 2 video frames. Conds as WanAnimateToVideo sets them:
    concat_latent_image / concat_mask, clip_vision_output, pose_video_latent (added to the patch embedding of
    frames 1..) and, with face=True, face_video_pixels. The face adapter adds its output to the stream after every
    block i with i % 5 == 0 (`x = x + face_adapter.fuser_blocks[i // 5](x, motion_vec)`), so the tiny model has 5
    blocks (with fewer, num_layers // 5 == 0 fuser blocks exist and block 0 would index past them). The face path is
    off by default: the motion encoder is a fixed StyleGAN-style image encoder that needs 3x512x512 input (7
    stride-2 stages down to 4x4, ~40 GFLOP per face frame, run on every model call), so one face frame makes a
    cfg-3 6-step sample take ~40 s on one CPU thread instead of <1 s (see SLOW_BUILDERS)."""
    m = _patcher_scaled(sm.WAN22_Animate, _wan_cfg("animate", in_dim=36, num_layers=5), seed, 0.1)
    g = _gen(seed + 1)
    concat = torch.randn(1, 16, T, H, W, generator=g)
    mask = torch.ones(1, 4, T, H, W)
    mask[:, :, :1] = 0.0  # the reference frame is known
    extra = {"clip_vision_output": _clip_vision(g), "concat_latent_image": concat, "concat_mask": mask,
             "pose_video_latent": torch.randn(1, 16, T - 1, H, W, generator=g)}
    pos_face, neg_face = {}, {}
    if face:
        pixels = torch.rand(1, 3, 1, 512, 512, generator=g) * 2 - 1
        pos_face, neg_face = {"face_video_pixels": pixels}, {"face_video_pixels": pixels * 0.0 - 1.0}  # as the node
    pos = _cond(6, 32, seed + 2, **pos_face, **extra)
    neg = _cond(6, 32, seed + 3, **neg_face, **extra)
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def wan_animate_face(tmpdir: str, seed: int = 0):
    """wan_animate with one face frame (face adapter active after block 0): ~25 s (cfg 1) / ~40 s (cfg 3)."""
    return wan_animate(tmpdir, seed, face=True)


def wan_animate2(tmpdir: str, seed: int = 0):
    """Wan Animate 2 (WanAnimate2Model, supported_models.WAN_Animate2, not detectable from weights): Wan 2.1 i2v
    weights (in_dim 36) run as two branches in lockstep: a pose branch over the pose video's latents (block i's
    forward_pose) feeds K/V to the generation branch (block i's forward_gen). Latent = 1 reference-image slot + 2
    frames; pose_video_latent has T - 1 frames. Conds as WanAnimate2ToVideo sets them (concat_latent_image,
    concat_mask 1-channel, clip_vision_output, pose_video_latent, clip_vision_output_pose, cross_attn_pose)."""
    m = _patcher_scaled(sm.WAN_Animate2, _wan_cfg("animate2", in_dim=36), seed, 0.1)
    g = _gen(seed + 1)
    mask = torch.ones(1, 1, T, H, W)
    mask[:, :, :1] = 0.0
    cv = _clip_vision(g)
    extra = {"clip_vision_output": cv, "concat_latent_image": torch.randn(1, 16, T, H, W, generator=g),
             "concat_mask": mask, "pose_video_latent": torch.randn(1, 16, T - 1, H, W, generator=g),
             "clip_vision_output_pose": cv, "cross_attn_pose": torch.randn(1, 6, 32, generator=g)}
    pos, neg = _wan_conds(seed, **extra)
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def wan_s2v(tmpdir: str, seed: int = 0):
    """Wan 2.2 S2V (WanModel_S2V, supported_models.WAN22_S2V): t2v-shaped, audio injected after the blocks listed in
    audio_inject_layers (here [0, 2]; the real list is [0, 4, 8, ..., 39]) by AudioInjector_WAN, in place on the
    image tokens `x[:, :seq_len]`. The stream is [video | reference frame | FramePack motion tokens] (image first);
    the timestep is per frame (e0 is B x frames x 6 x D). Conds as WanSoundImageToVideo sets them: audio_embed
    (B x 25 wav2vec layers x audio_dim x 4*T frames; audio_dim 32 here, 1024 real), reference_latents (1 frame),
    reference_motion (19 latent frames, the FramePack buckets 1+2+16; proj_4x needs H, W >= 8), control_video."""
    cfg = _wan_cfg("s2v", audio_dim=32, num_audio_token=4, enable_adain=True, cond_dim=16,
                   audio_inject_layers=[0, 2], adain_mode="attn_norm", framepack_drop_mode="padd")
    m = _patcher_scaled(sm.WAN22_S2V, cfg, seed, 0.1)
    g = _gen(seed + 1)
    audio = torch.randn(1, 25, 32, 4 * T, generator=g)
    extra = {"reference_latents": [torch.randn(1, 16, 1, H, W, generator=g)],
             "reference_motion": torch.randn(1, 16, 19, H, W, generator=g),
             "control_video": torch.zeros(1, 16, T, H, W)}
    pos = _cond(6, 32, seed + 2, audio_embed=audio, **extra)
    neg = _cond(6, 32, seed + 3, audio_embed=audio * 0.0, **extra)
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def wan_humo(tmpdir: str, seed: int = 0):
    """HuMo 17B (HumoWanModel, supported_models.WAN21_HuMo): t2v-shaped with in_dim 36 (model_base.WAN21_HuMo
    builds the 20 concat channels itself), every block a WanAttentionBlockAudio with an extra audio cross-attention
    (kv width 1536, fixed) reading per-frame audio tokens (16 per latent frame). AudioProjModel's first linear is
    fixed at 8*5*1280 = 51200 -> 512 (26M parameters: the bulk of the tiny model). The reference latent's tokens are
    appended after the image tokens (stream [video | reference]); audio is padded with zeros over the reference
    frame. Conds as WanHuMoImageToVideo sets them: audio_embed (B x T x 8 x 5 x 1280 windows), reference_latents."""
    m = _patcher_scaled(sm.WAN21_HuMo, _wan_cfg("humo", in_dim=36), seed, 0.1)
    g = _gen(seed + 1)
    ref = [torch.randn(1, 16, 1, H, W, generator=g)]
    audio = torch.randn(1, T, 8, 5, 1280, generator=g)
    pos = _cond(6, 32, seed + 2, audio_embed=audio, reference_latents=ref)
    neg = _cond(6, 32, seed + 3, audio_embed=audio * 0.0, reference_latents=[torch.zeros_like(ref[0])])
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def wan_camera(tmpdir: str, seed: int = 0):
    """Wan 2.1 Fun Camera (CameraWanModel, supported_models.WAN21_Camera): i2v (CLIP image tokens in the context),
    in_dim 32 = latent 16 + concat_latent_image 16 (no mask channels). camera_conditions (B x 24 x T x 8H x 8W
    Plucker embedding, as WanCameraEmbedding makes it) go through control_adapter (pixel-unshuffle 8 + conv) and are
    added to the patch embedding once, before the blocks."""
    m = _patcher_scaled(sm.WAN21_Camera, _wan_cfg("camera", in_dim=32), seed, 0.1)
    # the adapter's conv sees 24 * 64 = 1536 inputs: at 0.1 its output swamps the blocks (blocks' weights changed
    # -> output changed by 2%); at 0.01 they matter
    _randomize(m.model.diffusion_model.control_adapter, seed + 5, 0.01)
    g = _gen(seed + 1)
    extra = {"clip_vision_output": _clip_vision(g), "concat_latent_image": torch.randn(1, 16, T, H, W, generator=g),
             "camera_conditions": torch.randn(1, 24, T, 8 * H, 8 * W, generator=g)}
    pos, neg = _wan_conds(seed, **extra)
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def wan_scail(tmpdir: str, seed: int = 0):
    """SCAIL preview (SCAILWanModel, supported_models.WAN21_SCAIL): i2v (CLIP tokens), in_dim 20 = latent 16 + 4
    zero concat channels. The stream is [reference frame | video | pose] (the reference latent is concatenated
    before the video on the time axis before patchify; the half-resolution pose latents, patchified by
    patch_embedding_pose, are appended after). Conds as WanSCAILToVideo sets them: reference_latents,
    pose_video_latent (half resolution), clip_vision_output, ref_mask_flag."""
    m = _patcher_scaled(sm.WAN21_SCAIL, _wan_cfg("scail", in_dim=20), seed, 0.1)
    g = _gen(seed + 1)
    extra = {"ref_mask_flag": True, "reference_latents": [torch.randn(1, 16, 1, H, W, generator=g)],
             "clip_vision_output": _clip_vision(g),
             "pose_video_latent": torch.randn(1, 16, T, H // 2, W // 2, generator=g)}
    pos, neg = _wan_conds(seed, **extra)
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def wan_scail2(tmpdir: str, seed: int = 0):
    """SCAIL-2 (SCAIL2WanModel, supported_models.WAN21_SCAIL2): SCAIL plus an additive 28-channel identity-mask
    stream (patch_embedding_mask) on the reference+video tokens (ref_mask_28ch) and on the pose tokens
    (driving_mask_28ch). Same stream layout [reference | video | pose]."""
    m = _patcher_scaled(sm.WAN21_SCAIL2, _wan_cfg("scail2", in_dim=20), seed, 0.1)
    g = _gen(seed + 1)
    extra = {"ref_mask_flag": True, "reference_latents": [torch.randn(1, 16, 1, H, W, generator=g)],
             "clip_vision_output": _clip_vision(g),
             "pose_video_latent": torch.randn(1, 16, T, H // 2, W // 2, generator=g),
             "driving_mask_28ch": (torch.rand(1, T, 28, H // 2, W // 2, generator=g) > 0.5).float(),
             "ref_mask_28ch": torch.cat([(torch.rand(1, 1, 28, H, W, generator=g) > 0.5).float(),
                                         torch.zeros(1, T, 28, H, W)], dim=1)}
    pos, neg = _wan_conds(seed, **extra)
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def wan_dancer(tmpdir: str, seed: int = 0):
    """WanDancer (WanDancerModel, supported_models.WAN22_WanDancer): i2v (in_dim 36) with two CLIP token sets
    (clip_vision_output and clip_vision_output_ref, both prepended to the text context) and music: audio_embed
    (B x frames x 35 music features) runs through a 2-layer music encoder and is injected after the blocks in
    audio_inject_layers (here [0, 2]; real [0, 4, ..., 27]) by AudioInjector_WAN, in place on the image tokens,
    scaled by audio_inject_scale. fps 30 takes patch_embedding/head; any other fps takes patch_embedding_global/
    head_global and a stretched rope."""
    m = _patcher_scaled(sm.WAN22_WanDancer, _wan_cfg("wandancer", in_dim=36, audio_inject_layers=[0, 2]), seed, 0.1)
    g = _gen(seed + 1)
    mask = torch.ones(1, 1, T, H, W)
    mask[:, :, :1] = 0.0
    extra = {"clip_vision_output": _clip_vision(g), "clip_vision_output_ref": _clip_vision(g),
             "concat_latent_image": torch.randn(1, 16, T, H, W, generator=g), "concat_mask": mask,
             "audio_embed": torch.randn(1, 4 * T, 35, generator=g), "fps": 30.0, "audio_inject_scale": 1.0}
    pos, neg = _wan_conds(seed, **extra)
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def wan_flowrvs(tmpdir: str, seed: int = 0):
    """FlowRVS (WanModel t2v, supported_models.WAN21_FlowRVS, model_base.WAN21_FlowRVS; not detectable from
    weights): referring video segmentation as a flow from the video latent to the mask latent. ModelType
    IMG_TO_IMG_FLOW: noise_scaling returns the latent itself (the sampler starts from the input video, not from
    noise), the model output is the denoised value directly. The latent is therefore a random video latent."""
    m = _patcher_scaled(sm.WAN21_FlowRVS, _wan_cfg("flow_rvs"), seed, 0.1)
    lat = torch.randn(1, 16, T, H, W, generator=_gen(seed + 1))
    pos, neg = _wan_conds(seed)
    return m, pos, neg, lat


def wan_causal(tmpdir: str, seed: int = 0):
    """Causal-Forcing Wan (CausalWanModel, supported_models.WAN21_CausalAR_T2V,
    model_base.WAN21_CausalAR): WanModel weights with
    CausalWanAttentionBlock. Sampled with euler (no ar_state in transformer_options) it runs WanModel's own
    forward_orig loop (dit replace, full bidirectional attention, kv_cache None). With the ar_video sampler
    (SamplerARVideo node) CausalWanModel.forward calls forward_block: a loop with no replace hook and no
    DIFFUSION_MODEL wrapper, denoising one frame block at a time against per-block KV caches carried across calls."""
    m = _patcher_scaled(sm.WAN21_CausalAR_T2V, _wan_cfg("t2v", causal_ar=True), seed, 0.1)
    pos, neg = _wan_conds(seed)
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


# ------------------------------------------------------------------------------------------- other video DiTs
def kandinsky5(tmpdir: str, seed: int = 0):
    """Kandinsky 5 video (comfy.ldm.kandinsky5.model.Kandinsky5, supported_models.Kandinsky5): text blocks
    (TransformerEncoderBlock, run once per call on the text) then visual blocks (TransformerDecoderBlock: self-attn
    on the image tokens, cross-attn to the text). visual_embed_dim 132 = (latent 16 + concat zeros 16 + mask 1) x
    patch 1x2x2 (model_base.Kandinsky5.concat_cond always adds the 17 channels). Conds: cross_attn (Qwen2.5-VL,
    width 32 here, 3584 real) and pooled_output (CLIP, 24 here, 768 real; added to the time embedding).
    head_dim = sum(axes_dims) = 32, 2 heads."""
    cfg = {"image_model": "kandinsky5", "in_visual_dim": 16, "out_visual_dim": 16, "in_text_dim": 32,
           "in_text_dim2": 24, "time_dim": 32, "model_dim": 64, "ff_dim": 128, "visual_embed_dim": 132,
           "patch_size": (1, 2, 2), "num_text_blocks": 1, "num_visual_blocks": 3, "axes_dims": (8, 12, 12)}
    m = _patcher_scaled(sm.Kandinsky5, cfg, seed, 0.1)
    g = _gen(seed + 1)
    pos = _cond(6, 32, seed + 2, pooled_output=torch.randn(1, 24, generator=g))
    neg = _cond(6, 32, seed + 3, pooled_output=torch.randn(1, 24, generator=g))
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def cogvideox(tmpdir: str, seed: int = 0):
    """CogVideoX 1.0 5B-style (CogVideoXTransformer3DModel, supported_models.CogVideoX_T2V): v-prediction DDPM
    (zsnr linear schedule), 3D rope (use_rotary_positional_embeddings; rope splits head_dim 32 into t 8 / h 12 /
    w 12), patch 2 (Conv2d per frame). Blocks take (hidden_states, encoder_hidden_states) as two tensors and return
    both; text and image are joined only inside each block's attention/FFN. No dit replace in the loop."""
    cfg = {"image_model": "cogvideox", "num_attention_heads": 2, "attention_head_dim": 32, "in_channels": 16,
           "out_channels": 16, "time_embed_dim": 32, "text_embed_dim": 32, "num_layers": 3, "patch_size": 2,
           "use_rotary_positional_embeddings": True, "use_learned_positional_embeddings": False}
    m = _patcher_scaled(sm.CogVideoX_T2V, cfg, seed, 0.2)  # at 0.1 skipping all blocks changes one call by 2%
    pos, neg = _wan_conds(seed)
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


def minimax_h3(tmpdir: str, seed: int = 0):
    """MiniMax H3 (MiniMaxH3Model, supported_models.MiniMaxH3, model_base.MiniMaxH3, ModelType.FLOW_AV): one packed
    single-stream sequence [text | audio | video] of shape [S, D] (no batch dimension: batch size 1 only; cfg runs
    cond and uncond as separate calls because each carries its own PackedLayout in minimax_payload). The latent is
    NestedTensor((video 1x24xTxHxW, audio 1x32x2xTa)) with Ta = round(5/3 * pixel frames), as
    latent_formats.MiniMaxH3AV.fix_empty_latent builds it. The text goes through condition_proj + token_refiner once
    in extra_conds. rope.inv_freq is a buffer (loaded from the checkpoint, torch.empty otherwise): filled here;
    head_dim 32 with rope over the first 6 x rope_inv_freq_len = 24 dims."""
    cfg = {"image_model": "minimax_h3", "hidden_size": 64, "num_layers": 2, "token_refiner_num_layers": 1,
           "num_attention_heads": 2, "attention_head_dim": 32, "ffn_hidden_size": 128, "latents_dim": 24,
           "audio_latents_dim": 32, "patch_size": (1, 2, 2), "text_dim": 32, "timestep_input_dim": 256,
           "time_embed_hidden_size": 64, "time_embed_dim": 32, "rope_inv_freq_len": 4}
    m = _patcher_scaled(sm.MiniMaxH3, cfg, seed, 0.2)  # at 0.1 changing the blocks changes the sample by 1%
    dm = m.model.diffusion_model
    with torch.no_grad():
        n = dm.rope.inv_freq.shape[0]
        dm.rope.inv_freq.copy_(1.0 / (10000.0 ** (torch.arange(n, dtype=torch.float32) / n)))
    t = 2  # latent frames: 1 + 4 pixel frames -> audio 8 latent frames
    audio_t = round(5 * 5.0 / 3.0)
    lat = comfy.nested_tensor.NestedTensor((torch.zeros(1, 24, t, H, W), torch.zeros(1, 32, 2, audio_t)))
    pos, neg = _wan_conds(seed)
    return m, pos, neg, lat


def mochi(tmpdir: str, seed: int = 0):
    """Genmo Mochi preview (AsymmDiTJoint, supported_models.GenmoMochi): asymmetric joint blocks with separate image
    (width 64) and text (width 32) streams; the last block does not update the text (update_y False). T5 features
    (width 32 here, 4096 real) are pooled by an attention pool that needs attention_mask (model_base.GenmoMochi
    also derives num_tokens from it). 12-channel latent, patch 2."""
    cfg = {"image_model": "mochi_preview", "depth": 2, "patch_size": 2, "num_heads": 2, "hidden_size_x": 64,
           "hidden_size_y": 32, "mlp_ratio_x": 4.0, "mlp_ratio_y": 4.0, "learn_sigma": False, "in_channels": 12,
           "qk_norm": True, "qkv_bias": False, "out_bias": True, "attn_drop": 0.0, "patch_embed_bias": True,
           "posenc_preserve_area": True, "timestep_mlp_bias": True, "attend_to_padding": False,
           "timestep_scale": 1000.0, "use_t5": True, "t5_feat_dim": 32, "t5_token_length": 6, "rope_theta": 10000.0}
    cfg["mlp_ratio_x"] = 12288 / cfg["hidden_size_x"]  # AsymmetricJointBlock asserts width * mlp_ratio_x == 1536 * 8
    m = _patcher_scaled(sm.GenmoMochi, cfg, seed, 0.1)
    mask = torch.ones(1, 6, dtype=torch.long)
    pos = _cond(6, 32, seed + 2, attention_mask=mask)
    neg = _cond(6, 32, seed + 3, attention_mask=mask)
    return m, pos, neg, torch.zeros(1, 12, T, H, W)


def seedvr2(tmpdir: str, seed: int = 0):
    """SeedVR2 3B-style (comfy.ldm.seedvr.model.NaDiT, supported_models.SeedVR2): a video restoration DiT over a
    flattened ("native resolution", no batch dimension) token sequence: vid [sum of tokens, D] and txt [sum, D] with
    their shapes carried beside them (vid_shape / txt_shape), window attention (windows (4, 3, 3), alternating
    shifted), MM blocks (separate vid/txt weights) for the first mm_layers blocks, shared weights after. The
    positive/negative text embeddings are the model's own buffers positive_conditioning (58 x 5120) /
    negative_conditioning (64 x 5120), as SeedVR2Conditioning takes them (filled with random values here); the
    `condition` extra is the low-quality video latent + a ones mask (17 channels); vid_in takes latent 16 +
    condition 17 = 33 channels. rope_dim must fit the head (16 of 32 here; 128 real)."""
    cfg = {"image_model": "seedvr2", "vid_dim": 64, "heads": 2, "head_dim": 32, "num_layers": 2, "mm_layers": 1,
           "norm_eps": 1e-5, "mlp_type": "swiglu", "rope_dim": 16, "vid_out_norm": True, "txt_in_dim": 5120}
    m = _patcher_scaled(sm.SeedVR2, cfg, seed, 0.2)
    dm = m.model.diffusion_model
    g = _gen(seed + 1)
    with torch.no_grad():
        dm.positive_conditioning.copy_(torch.randn(dm.positive_conditioning.shape, generator=g))
        dm.negative_conditioning.copy_(torch.randn(dm.negative_conditioning.shape, generator=g))
    lq = torch.randn(1, 16, T, H, W, generator=g)
    condition = torch.cat((lq, torch.ones(1, 1, T, H, W)), dim=1)
    pos = [[dm.positive_conditioning.clone().unsqueeze(0), {"condition": condition}]]
    neg = [[dm.negative_conditioning.clone().unsqueeze(0), {"condition": condition}]]
    return m, pos, neg, torch.zeros(1, 16, T, H, W)


BUILDERS = {"ltx2": ltx2, "hunyuan_video15": hunyuan_video15, "wan_animate": wan_animate, "wan_animate2": wan_animate2,
            "wan_s2v": wan_s2v, "wan_humo": wan_humo, "wan_camera": wan_camera, "wan_scail": wan_scail,
            "wan_scail2": wan_scail2, "wan_dancer": wan_dancer, "wan_flowrvs": wan_flowrvs, "wan_causal": wan_causal,
            "kandinsky5": kandinsky5, "cogvideox": cogvideox, "minimax_h3": minimax_h3, "mochi": mochi,
            "seedvr2": seedvr2}

# builders that work but are slow on the CPU (wan_animate with the face path: ~40 s per cfg-3 sample)
SLOW_BUILDERS = {"wan_animate_face": wan_animate_face}

# the first block module the loop calls (a forward pre-hook on it counts block-stack runs). Exception: Wan Animate 2
# calls its blocks' forward_gen / forward_pose methods directly, so a forward pre-hook on blocks.0 never fires, and
# every submodule of blocks.0 also runs for the pose branch (NO_PRE_HOOK).
FIRST_BLOCK = {"ltx2": "transformer_blocks.0", "hunyuan_video15": "double_blocks.0",
               "kandinsky5": "visual_transformer_blocks.0", "cogvideox": "blocks.0", "minimax_h3": "blocks.0",
               "mochi": "blocks.0", "seedvr2": "blocks.0", "wan_animate_face": "blocks.0"}
FIRST_BLOCK.update({n: "blocks.0" for n in BUILDERS if n.startswith("wan_")})
NO_PRE_HOOK = {"wan_animate2"}

_L = "comfy.ldm."
_WAN = _L + "wan.model.WanModel"
_WAN_LOOP = ("forward_orig: `for i, block in enumerate(self.blocks)`; the dit patch gets {img, txt, vec, pe, "
             "transformer_options} and the loop reads out['img']")


def _wan(cls: str, loop: str, img: str, between: str, notes: str, mro_extra=()) -> dict:
    """FACTS of a Wan variant: every one copies WanModel.forward_orig's loop (comfy/ldm/wan/model.py:603-624)."""
    return {"class": cls, "mro": [cls, *mro_extra, _WAN] if cls != _WAN else [_WAN], "loop": loop,
            "route": "dit", "keys": [("double_block", "i for i in range(num_layers)")],
            "img": img, "returns": ["img"],
            "block_index": "yes: total_blocks, block_type 'double', block_index i set in transformer_options",
            "inplace": "no (WanAttentionBlock.forward: out-of-place torch.addcmul / x + ..., wan/model.py:257-268)",
            "between_blocks": "transformer_options['patches']['double_block'] post-block patches, if a node sets "
                              "any (wan/model.py:620-623 in WanModel; the same in every copy); " + between,
            "prefetch": "no", "notes": notes}


FACTS = {
    "ltx2": {
        "class": _L + "lightricks.av_model.LTXAVModel",
        "mro": [_L + "lightricks.av_model.LTXAVModel", _L + "lightricks.model.LTXVModel",
                _L + "lightricks.model.LTXBaseModel"],
        "loop": "LTXAVModel._process_transformer_blocks (lightricks/av_model.py:910-1020), called by "
                "LTXBaseModel._forward (lightricks/model.py:1019)",
        "route": "dit", "keys": [("double_block", "i for i in range(num_layers)")],
        "img": "a tuple (vx [B, Nv, Dv], ax [B, Na, Da]): the video tokens (plus any keyframe/guide tokens "
               "LTXVAddGuide appends, lightricks/model.py:1119-1165) and the audio tokens (plus ref_audio tokens "
               "prepended, av_model.py:708-731); widths differ (probe: (Tensor[2,48,64], Tensor[2,9,32])); no "
               "img_slice (av_model.py:972-995)",
        "returns": ["img"],  # a tuple (vx, ax) again: `vx, ax = out["img"]` (av_model.py:995)
        "block_index": "no (no block_index/total_blocks/block_type); blocks listed in "
                       "transformer_options['stg_self_attn_blocks'] get a copy with stg_skip_self_attn "
                       "(av_model.py:938-947)",
        "inplace": "yes, both streams: vx.addcmul_/vx.add_, ax.addcmul_/ax.add_ (av_model.py:287-386)",
        "between_blocks": "nothing",
        "prefetch": "yes: comfy.model_prefetch queue popped before each block, also before a replaced one "
                    "(av_model.py:935, 942, 1018)",
        "notes": "every block mixes the two streams (a2v/v2a cross attention, av_model.py:318-356), so each stream "
                 "needs its own residual; what a block computes depends on transformer_options run_vx / run_ax / "
                 "a2v_cross_attn / v2a_cross_attn (av_model.py:266-272), which LTXVModalityGuidance and the "
                 "LTXV STG node change for an extra cond pass (comfy_extras/nodes_lt.py:968-988, 1038-1039); "
                 "the latent is a NestedTensor (video, "
                 "audio) packed flat by the sampler and unpacked by model_base via latent_shapes "
                 "(model_base.py:241-242)"},
    "hunyuan_video15": {
        "class": _L + "hunyuan_video.model.HunyuanVideo", "mro": [_L + "hunyuan_video.model.HunyuanVideo"],
        "loop": "HunyuanVideo.forward_orig (hunyuan_video/model.py:289-457)",
        "route": "dit", "keys": [("double_block", "i for i in range(depth)"),
                                 ("single_block", "i for i in range(depth_single_blocks)")],
        "img": "double blocks: Tensor [B, N_img, D], image tokens only (the text stream cat(vision, byt5, text) "
               "is args['txt']; probe: img Tensor[2,48,128], txt Tensor[2,13,128]); single blocks (none in 1.5): "
               "cat(txt, img) with transformer_options['img_slice'] = [txt_len, total] (model.py:416-420)",
        "returns": ["img", "txt"],  # double blocks; single blocks: ["img"]
        "block_index": "yes: total_blocks, block_type ('double' / 'single'), block_index (model.py:393-396, "
                       "418-422), in a copy of transformer_options (model.py:307)",
        "inplace": "yes: DoubleStreamBlock does `img += ...`, `txt += ...` (flux/layers.py:246-253)",
        "between_blocks": "ControlNet residuals `img += control['input'][i]` after double block i and into the "
                          "image part after single block i (model.py:409-414, 434-439), only with a ControlNet",
        "prefetch": "no",
        "notes": "1.5 has no single blocks: after the double stack the text stream is discarded "
                 "(cat then slice, model.py:416, 441), so only img's residual matters"},
    "wan_animate": _wan(
        _L + "wan.model_animate.AnimateWanModel", "AnimateWanModel.forward_orig (wan/model_animate.py:483-560)",
        "Tensor [B, T*h*w, D], image tokens only (the reference frame is latent frame 0; pose latents are added "
        "to the patch embedding before the blocks, model_animate.py:451-454)",
        "face adapter: `x = x + face_adapter.fuser_blocks[i // 5](x, motion_vec)` after every block i % 5 == 0 "
        "when face_video_pixels is given (model_animate.py:549-550)",
        "face injection is per-block conditioning inside the stack: on a skipped step it only enters through "
        "the cached residual; the 40-block real model injects after blocks 0, 5, ..., 35"),
    "wan_animate2": _wan(
        _L + "wan.model_animate2.WanAnimate2Model", "WanAnimate2Model.forward_orig (wan/model_animate2.py:281-387)",
        "Tensor [B, f_gen*h*w, D]: generation-branch tokens, frame 0 = the reference-image slot (first h*w tokens; "
        "double_block patches get img_offset = h*w, model_animate2.py:384)",
        "the pose branch: before the replace of block i the loop runs block.forward_pose on the pose tokens (or, "
        "with the WanAnimate2Cache node, block.kv_from_input on cached inputs) and hands its K/V to the "
        "generation block through the block_wrap closure (model_animate2.py:359-380)",
        "the pose branch runs 'even under a block replace' (model_animate2.py:369): skipping the generation "
        "blocks does not skip it; the K/V it feeds change every step (pose timestep is fixed at 1, but the "
        "generation context changes); animate2_cache (PoseBranchCache) carries per-block pose inputs across "
        "calls (model_animate2.py:113-230, 295-299); blocks are called as forward_gen/forward_pose methods, so "
        "forward hooks on blocks.0 never fire"),
    "wan_s2v": _wan(
        _L + "wan.model.WanModel_S2V", "WanModel_S2V.forward_orig (wan/model.py:1348-1443)",
        "Tensor [B, N, D], a joint stream [video | reference frame | FramePack motion tokens], image tokens first "
        "(x[:, :seq_len], model.py:1379-1398; probe Tensor[2,88,64] = 48 video + 16 ref + 24 motion); no "
        "img_slice",
        "audio injection: `x = self.audio_injector(x, i, ...)` after every block in audio_inject_layers "
        "(model.py:1436-1437), in place on the image tokens `x[:, :seq_len] = ...` (model.py:1218)",
        "the injection writes into the tensor the patch just returned (probe: returned tensor changed after the "
        "patch returned, blocks 0 and 2); the real layer list [0, 4, ..., 36, 39] includes the last block (39 "
        "of 40), so the stack output z is modified after the last block's patch returns; the timestep is per "
        "frame (e0 B x frames x 6 x D, model.py:1375-1409)"),
    "wan_humo": _wan(
        _L + "wan.model.HumoWanModel", "HumoWanModel.forward_orig (wan/model.py:1628-1700)",
        "Tensor [B, N, D], [video | reference frame] (model.py:1653-1657; probe Tensor[2,64,64]); no img_slice",
        "nothing (the audio tokens enter every block through its own audio cross attention; the block_wrap "
        "closure passes audio=audio, model.py:1681-1684)",
        "per-block audio conditioning is inside each block (WanAttentionBlockAudio, model.py:1486-1537)"),
    "wan_camera": _wan(
        _L + "wan.model.CameraWanModel", "CameraWanModel.forward_orig (wan/model.py:903-964)",
        "Tensor [B, T*h*w, D], image tokens only (camera_conditions are added to the patch embedding once, "
        "model.py:916-918)", "nothing else", "plain i2v loop"),
    "wan_scail": _wan(
        _L + "wan.model.SCAILWanModel", "SCAILWanModel.forward_orig (wan/model.py:1708-1786)",
        "Tensor [B, N, D], a joint stream [reference frame | video | pose tokens]: the reference latent is "
        "concatenated on the time axis before patchify (model.py:1713-1714), the half-resolution pose tokens "
        "appended after (model.py:1728-1734); probe Tensor[2,76,64] = 16 ref + 48 video + 12 pose; no img_slice "
        "(double_block patches get img_offset = reference token count)", "nothing else",
        "image tokens are in the middle of the stream"),
    "wan_scail2": _wan(
        _L + "wan.model.SCAIL2WanModel", "SCAILWanModel.forward_orig (wan/model.py:1708-1786, inherited)",
        "as SCAIL: [reference | video | pose] (probe Tensor[2,76,64]); the 28-channel identity masks are added "
        "to the reference+video and pose embeddings before the blocks (model.py:1721-1731)", "nothing else",
        "SCAIL2WanModel adds no loop of its own", mro_extra=(_L + "wan.model.SCAILWanModel",)),
    "wan_dancer": _wan(
        _L + "wan.model_wandancer.WanDancerModel", "WanDancerModel.forward_orig (wan/model_wandancer.py:112-204)",
        "Tensor [B, T*h*w, D], image tokens only (a ref_conv reference would be prepended, "
        "model_wandancer.py:133-137; not used by the pipeline)",
        "music injection after every block in audio_inject_layers (model_wandancer.py:190-191, AudioInjector_WAN "
        "in place on x[:, :seq_len], wan/model.py:1218)",
        "the injection writes into the tensor the patch returned (probe: blocks 0 and 2); real layers [0, 4, "
        "..., 24, 27] of 40, so not after the last block; fps != 30 switches patch embedding, head and rope"),
    "wan_flowrvs": _wan(
        _WAN, "WanModel.forward_orig (wan/model.py:532-636)", "Tensor [B, T*h*w, D], image tokens only",
        "nothing else",
        "ModelType IMG_TO_IMG_FLOW (model_sampling.py:111-119): sampling starts from the input video latent, "
        "not noise, and the model output is the denoised value"),
    "wan_causal": _wan(
        _L + "wan.ar_model.CausalWanModel",
        "euler etc.: WanModel.forward_orig (wan/model.py:532-636, inherited); ar_video sampler: "
        "CausalWanModel.forward_block (wan/ar_model.py:172-224)",
        "Tensor [B, T*h*w, D], image tokens only (WanModel path)", "nothing else",
        "with the ar_video sampler (SamplerARVideo node; transformer_options['ar_state'], "
        "k_diffusion/sampling.py:1845-1955) CausalWanModel.forward (ar_model.py:260-276) bypasses the "
        "DIFFUSION_MODEL wrappers and runs forward_block, whose loop (ar_model.py:215-220) has no replace hook: "
        "probe: 0 dit patches reached, 15 block-0 calls for 3 frame blocks x (4 steps + 1 cache fill); blocks "
        "append K/V to per-layer caches that persist across model calls and whose 'end' the sampler rewinds "
        "(sampling.py:1937-1949); ar_video fails at cfg > 1 in 0.33 (cache sized to the latent batch)"),
    "kandinsky5": {
        "class": _L + "kandinsky5.model.Kandinsky5", "mro": [_L + "kandinsky5.model.Kandinsky5"],
        "loop": "Kandinsky5.forward_orig (kandinsky5/model.py:362-387)",
        "route": "dit (broken in 0.33)", "keys": [("double_block", "i for i in range(num_visual_blocks)")],
        "img": "no 'img' key: args are {x, context, time_embed, freqs, transformer_options}; args['x'] is a "
               "Tensor [B, T*h*w, D] of image tokens only (model.py:371-372; probe Tensor[2,48,64])",
        "returns": ["x"],  # the loop reads patch(...)["x"] (model.py:382)
        "block_index": "yes: total_blocks, block_type 'double', block_index (model.py:375-378)",
        "inplace": "no (apply_gate_sum is an out-of-place torch.addcmul, model.py:23-24)",
        "between_blocks": "nothing (the text blocks run once before, model.py:366-367)",
        "prefetch": "no",
        "notes": "original_block is broken: block_wrap calls block(x=..., context=..., ...) (model.py:380-381) "
                 "but TransformerDecoderBlock.forward takes (visual_embed, text_embed, time_embed, freqs) "
                 "(model.py:254): any dit patch that calls original_block raises TypeError (probe: 18 of 18 "
                 "calls); it also returns a bare tensor while the loop expects a dict with 'x'; object patches "
                 "on visual_transformer_blocks[i].forward (token arg 0 / visual_embed) work"},
    "cogvideox": {
        "class": _L + "cogvideo.model.CogVideoXTransformer3DModel",
        "mro": [_L + "cogvideo.model.CogVideoXTransformer3DModel"],
        "loop": "CogVideoXTransformer3DModel._forward (cogvideo/model.py:444-518; blocks 488-494)",
        "route": "none", "keys": [],
        "img": "no dit patch (probe: 0 reached); blocks are called with keywords hidden_states (image tokens "
               "[B, T*h*w, D]), encoder_hidden_states (text [B, L, D]), temb, image_rotary_emb, "
               "transformer_options",
        "returns": "the block returns the tuple (hidden_states, encoder_hidden_states) (model.py:319)",
        "block_index": "no", "inplace": "no (model.py:304-317)", "between_blocks": "nothing", "prefetch": "no",
        "notes": "object patches must take the image tokens from the keyword hidden_states and return the "
                 "text stream too (like HiDream's double blocks); v-prediction DDPM (zsnr)"},
    "minimax_h3": {
        "class": _L + "minimax.model.MiniMaxH3Model", "mro": [_L + "minimax.model.MiniMaxH3Model"],
        "loop": "MiniMaxH3Model._forward (minimax/model.py:553-731; blocks 697-713)",
        "route": "dit", "keys": [("double_block", "i for i in range(num_layers)")],
        "img": "Tensor [S, D] with NO batch dimension: the packed sequence [text | keyframe cond / reference "
               "rows | audio (2 x Ta rows) | video (T*h*w rows)] in PackedLayout.segments order (model.py:318-"
               "438), target audio and video always the last two segments; no img_slice (probe Tensor[54,64] = "
               "6 text + 16 audio + 32 video)",
        "returns": ["img"],
        "block_index": "no",
        "inplace": "yes: _mod_gate does x[a:b].addcmul_ per segment (model.py:238-242)",
        "between_blocks": "nothing",
        "prefetch": "yes (model.py:699-713)",
        "notes": "batch size 1 only (model.py:558-559); cond and uncond run as separate calls (their "
                 "minimax_payload CONDConstant carries a per-cond PackedLayout); per-segment timesteps (audio on "
                 "its own shifted schedule) via mod_segments; both audio and video outputs are read from the "
                 "last segments of h"},
    "mochi": {
        "class": _L + "genmo.joint_model.asymm_models_joint.AsymmDiTJoint",
        "mro": [_L + "genmo.joint_model.asymm_models_joint.AsymmDiTJoint"],
        "loop": "AsymmDiTJoint.forward (genmo/joint_model/asymm_models_joint.py:487-561; blocks 519-545)",
        "route": "dit", "keys": [("double_block", "i for i in range(depth)")],
        "img": "Tensor [B, T*h*w, Dx], image tokens only; text is args['txt'] [B, L, Dy] (probe Tensor[2,48,64] "
               "/ Tensor[2,6,32])",
        "returns": ["img", "txt"],
        "block_index": "no", "inplace": "no", "between_blocks": "nothing", "prefetch": "no",
        "notes": "the last block does not update the text (update_y False, asymm_models_joint.py:421); "
                 "AsymmetricJointBlock asserts hidden_size_x * mlp_ratio_x == 12288 (line 199)"},
    "seedvr2": {
        "class": _L + "seedvr.model.NaDiT", "mro": [_L + "seedvr.model.NaDiT"],
        "loop": "NaDiT.forward (seedvr/model.py:1274-1361; blocks 1313-1346)",
        "route": "dit", "keys": [("block", "i for i in range(num_layers)")],
        "img": "no 'img' key: args are {vid, txt, vid_shape, txt_shape, emb, cache} (no transformer_options); "
               "args['vid'] is a Tensor [sum of tokens, D] flattened over the batch (no batch dimension), "
               "vid_shape [B, 3] its (t, h, w) per sample (probe Tensor[48,64], vid_shape Tensor[1,3])",
        "returns": ["vid", "txt", "vid_shape", "txt_shape"],
        "block_index": "no", "inplace": "no", "between_blocks": "nothing", "prefetch": "no",
        "notes": "window attention with alternating shifted windows (4, 3, 3) per block; a Cache object made "
                 "per forward (model.py:1297) memoises window/rope layouts across blocks of one call only; "
                 "positive (58 tokens) and negative (64) text differ in length, so cfg runs them as separate "
                 "calls; the output halves are swapped back per cond_or_uncond (model.py:1268-1272, 1361)"},
}
FACTS["wan_animate_face"] = FACTS["wan_animate"]
