"""The other nodes GCache is composed with, as tests/comfyui/test_composition.py and bench/composition.py apply them
(test helper; imports ComfyUI): ComfyUI's own Skip Layer Guidance, PerpNeg and DualCFG guiders, CFGZeroStar and APG,
and another node's block patch, on the tiny Flux and Wan of tiny_models.py; 6 euler steps, cfg 3, GCache Apply with
the policy 101001 connected.
"""
from __future__ import annotations

import comfy.sample
import comfy.samplers
import comfy.utils
import torch

import nodes as comfy_nodes
from gcache.core.policy import Policy
from gcache.nodes.apply_node import GCacheApply

N = 6
MASK = [1, 0, 1, 0, 0, 1]
CFG = 3.0
# Skip Layer Guidance's layers (double, single) for the stack's first, a middle and the last block: tiny Flux has
# 2 double and 2 single blocks, tiny Wan 3 blocks
LAYERS = {"flux": {"first": ("0", ""), "middle": ("", "0"), "last": ("", "1")},
          "wan": {"first": ("0", ""), "middle": ("1", ""), "last": ("2", "")}}
# the dit patch slots of the same blocks
SLOT = {"flux": {"first": ("double_block", 0), "middle": ("single_block", 0), "last": ("single_block", 1)},
        "wan": {"first": ("double_block", 0), "middle": ("double_block", 1), "last": ("double_block", 2)}}


def ksample(model, pos, neg, lat, seed=0):
    return comfy_nodes.common_ksampler(model, seed, N, CFG, "euler", "simple", pos, neg,
                                       {"samples": lat})[0]["samples"]


def gcache(model):
    """GCache Apply with the policy connected (not auto)."""
    return GCacheApply.execute(model, "(auto)", "model device", "remap", policy=Policy(list(MASK))).result[0]


def rel(a, b) -> float:
    """The relative L2 distance of a from b."""
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def third_cond(family, seed=11):
    """A third conditioning of the family's shape (PerpNeg's empty prompt, DualCFG's second cond)."""
    g = torch.Generator().manual_seed(seed)
    if family == "flux":
        return [[torch.randn(1, 6, 32, generator=g), {"pooled_output": torch.randn(1, 24, generator=g)}]]
    return [[torch.randn(1, 8, 4096, generator=g), {}]]


# ------------------------------------------------------------------------------------------ Skip Layer Guidance
def slg(node, double, single, start=0.0, end=1.0):
    """A function that adds ComfyUI's Skip Layer Guidance node `node` to a model."""
    from comfy_extras.nodes_slg import SkipLayerGuidanceDiT, SkipLayerGuidanceDiTSimple

    def add(model):
        if node == "SkipLayerGuidanceDiT":
            out = SkipLayerGuidanceDiT.execute(model, 3.0, start, end, double_layers=double, single_layers=single)
        else:
            out = SkipLayerGuidanceDiTSimple.execute(model, start, end, double_layers=double, single_layers=single)
        return out.result[0] if hasattr(out, "result") else out[0]
    return add


# ------------------------------------------------------------------------------------------ guiders and CFG functions
def guided(family, model, b, kind, seed=0):
    """A sampling run with PerpNegGuider or DualCFGGuider; b: the family's pos, neg and lat."""
    from comfy_extras.nodes_custom_sampler import Guider_DualCFG
    from comfy_extras.nodes_perpneg import Guider_PerpNeg
    if kind == "PerpNegGuider":
        guider = Guider_PerpNeg(model)
        guider.set_conds(b["pos"], b["neg"], third_cond(family))
        guider.set_cfg(CFG, 1.0)
    else:
        guider = Guider_DualCFG(model)
        guider.set_conds(b["pos"], third_cond(family), b["neg"])
        guider.set_cfg(CFG, 2.0)
    lat = b["lat"]
    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", N)
    return guider.sample(comfy.sample.prepare_noise(lat, seed), lat, comfy.samplers.sampler_object("euler"), sigmas,
                         disable_pbar=not comfy.utils.PROGRESS_BAR_ENABLED, seed=seed)


def cfg_node(kind):
    """A function that adds CFGZeroStar or APG (a post- or a pre-CFG function) to a model."""
    def add(model):
        if kind == "CFGZeroStar":
            from comfy_extras.nodes_cfg import CFGZeroStar
            return CFGZeroStar.execute(model).result[0]
        from comfy_extras.nodes_apg import APG
        return APG.execute(model, 1.0, 5.0, -0.5).result[0]
    return add


# ------------------------------------------------------------------------------------------ another node's dit patch
def counting_patch(counter: list, previous=None):
    """Another node's block patch (a ControlNet-like change of the block's image tokens) that counts its calls;
    `previous`: the patch it found in the slot, which it calls through (ComfyUI 0.38's core patches do)."""
    def other_nodes_block(args, extra):
        counter.append(1)
        out = previous(args, extra) if previous is not None else extra["original_block"](args)
        img = out["img"]  # a fixed direction added to every token (a norm layer would undo a scale)
        return dict(out, img=img + 0.3 * torch.sin(torch.arange(img.shape[-1], dtype=img.dtype, device=img.device)))
    return other_nodes_block


def with_patch(model, key, patch):
    m = model.clone()
    m.set_model_patch_replace(patch, "dit", *key)
    return m


# ------------------------------------------------------------------------------------------ another node's object patch
def object_patched(model, where, counter: list):
    """A clone of `model` with another node's object patch of its first or last block's forward (Lumina2, whose
    blocks GCache patches as objects): the block's own forward plus a fixed direction, counting its calls."""
    dm = model.get_model_object("diffusion_model")
    i = 0 if where == "first" else len(dm.layers) - 1
    block = dm.layers[i]
    original = type(block).forward.__get__(block)

    def other_nodes_forward(*a, **kw):
        counter.append(1)
        out = original(*a, **kw)
        return out + 0.3 * torch.sin(torch.arange(out.shape[-1], dtype=out.dtype, device=out.device))

    m = model.clone()
    m.add_object_patch(f"diffusion_model.layers.{i}.forward", other_nodes_forward)
    return m
