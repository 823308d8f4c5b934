"""Family adapters: where the block stack starts and ends, and which tokens carry the image. Data first.

No ComfyUI import: a diffusion model is recognised by the module and name of a class in its MRO
(`comfy.ldm.flux.model.Flux`), so Wan's VACE/Camera/S2V subclasses find the Wan entry and AuraFlow's `MMDiT`
(comfy.ldm.aura.mmdit) is not taken for SD3's (comfy.ldm.modules.diffusionmodules.mmdit). Facts per family:
research/comfyui-internals.md §4; each entry is verified in ComfyUI's own classes by tests/comfyui.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Optional, Union

import torch

log = logging.getLogger("gcache")


class Route(str, Enum):
    DIT = "dit"            # ComfyUI's `patches_replace["dit"]` block patches (the block loop asks for them)
    OBJECT = "object"      # no replace hook in the loop: each block's `forward` is swapped by an object patch
    #                        (ModelPatcher.add_object_patch, restored when the model is unpatched)
    FALLBACK = "fallback"  # any other model: the whole model output difference (denoised − x) at APPLY_MODEL


class Layout(str, Enum):
    """Where a block's image tokens sit in the tensor it passes on."""
    IMG = "img"              # image tokens only
    TXT_FIRST = "txt_first"  # cat(txt, img): Flux/Chroma/AuraFlow single blocks
    IMG_FIRST = "img_first"  # cat(img, txt): HunyuanVideo/HiDream single blocks
    ALL = "all"              # every token is cached (Lumina2's joint stream, Cosmos): more memory, still correct


@dataclass(frozen=True)
class ObjectCall:
    """How an object-patched block (Route.OBJECT) is called: where its tokens are and what it returns."""
    arg: Union[int, str] = 0            # the token argument: positional index or keyword
    returns_text: Optional[str] = None  # the block returns (image, <this keyword's tensor>) (HiDream)
    batch_dim: int = 0                  # the tokens' batch dimension (Cosmos 1 passes T H W B D)


@dataclass(frozen=True)
class Stack:
    key: str                 # dit replace name ("double_block") or, for object patches, a label
    attr: str                # attribute of the diffusion model holding the blocks (ModuleList/ModuleDict)
    layout: Layout           # where the image tokens are in what these blocks pass on
    skip_attr: Optional[str] = None  # blocks listed here are never called (Chroma's skip_mmdit/skip_dit)
    call: ObjectCall = ObjectCall()  # Route.OBJECT only


@dataclass(frozen=True)
class Adapter:
    name: str
    classes: tuple           # "module.Class" of the model classes (or bases) this entry serves
    route: Route
    stacks: tuple = ()
    notes: str = ""


IMG, TXT_FIRST, IMG_FIRST, ALL = Layout.IMG, Layout.TXT_FIRST, Layout.IMG_FIRST, Layout.ALL
_FLUX = (Stack("double_block", "double_blocks", IMG), Stack("single_block", "single_blocks", TXT_FIRST))
_CHROMA = (Stack("double_block", "double_blocks", IMG, skip_attr="skip_mmdit"),
           Stack("single_block", "single_blocks", TXT_FIRST, skip_attr="skip_dit"))
_LDM = "comfy.ldm."

ADAPTERS = (
    Adapter("flux", (_LDM + "flux.model.Flux",), Route.DIT, _FLUX,
            notes="Kontext reference latents are image tokens too"),
    Adapter("chroma", (_LDM + "chroma.model.Chroma",), Route.DIT, _CHROMA,
            notes="Chroma Radiance subclasses Chroma; its blocks add into their input in place"),
    Adapter("hunyuan_video", (_LDM + "hunyuan_video.model.HunyuanVideo",), Route.DIT,
            (Stack("double_block", "double_blocks", IMG), Stack("single_block", "single_blocks", IMG_FIRST))),
    Adapter("wan", (_LDM + "wan.model.WanModel",), Route.DIT, (Stack("double_block", "blocks", IMG),),
            notes="VACE hints / S2V audio are added between blocks; on skipped steps they enter through δ"),
    Adapter("ltxv", (_LDM + "lightricks.model.LTXVModel",), Route.DIT,
            (Stack("double_block", "transformer_blocks", IMG),), notes="blocks add into their input in place"),
    Adapter("qwen_image", (_LDM + "qwen_image.model.QwenImageTransformer2DModel",), Route.DIT,
            (Stack("double_block", "transformer_blocks", IMG),)),
    Adapter("sd3", (_LDM + "modules.diffusionmodules.mmdit.MMDiT",), Route.DIT,
            (Stack("double_block", "joint_blocks", IMG),)),
    Adapter("auraflow", (_LDM + "aura.mmdit.MMDiT",), Route.DIT,
            (Stack("double_block", "double_layers", IMG), Stack("single_block", "single_layers", TXT_FIRST))),
    Adapter("lumina2", (_LDM + "lumina.model.NextDiT",), Route.OBJECT, (Stack("layer", "layers", ALL),),
            notes="Lumina2 / Z-Image: joint [caption, image] stream cached whole"),
    Adapter("hidream", (_LDM + "hidream.model.HiDreamImageTransformer2DModel",), Route.OBJECT,
            (Stack("double_stream", "double_stream_blocks", IMG,
                   call=ObjectCall("image_tokens", returns_text="text_tokens")),
             Stack("single_stream", "single_stream_blocks", IMG_FIRST, call=ObjectCall("image_tokens")))),
    Adapter("cosmos_predict2", (_LDM + "cosmos.predict2.MiniTrainDIT",), Route.OBJECT, (Stack("block", "blocks", ALL),)),
    Adapter("cosmos", (_LDM + "cosmos.model.GeneralDIT",), Route.OBJECT,
            (Stack("block", "blocks", ALL, call=ObjectCall(0, batch_dim=3)),),
            notes="Cosmos 1 adds a position term before every block; it enters through δ on skipped steps"),
)

FALLBACK = Adapter("whole-model fallback", (), Route.FALLBACK,
                   notes="unknown model: caches the whole model output difference (denoised − x)")


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def find_adapter(diffusion_model) -> Adapter:
    """The adapter of the first class in the model's MRO that the table names (module and class), else
    FALLBACK. Table lookup only: `choose_adapter` also checks that the blocks are there."""
    for cls in type(diffusion_model).__mro__:
        name = qualified_name(cls)
        for a in ADAPTERS:
            if name in a.classes:
                return a
    return FALLBACK


def choose_adapter(diffusion_model) -> Adapter:
    """The family adapter if its blocks are where the table says, else FALLBACK with a warning: a family
    adapter that patches no block would silently do nothing."""
    ad = find_adapter(diffusion_model)
    if ad.route == Route.FALLBACK:
        log.info("GCache: %s has no family adapter; using the %s (%s).", qualified_name(type(diffusion_model)),
                 ad.name, ad.notes)
    elif not block_slots(ad, diffusion_model):
        log.warning("GCache: %s looks like %s but has none of its blocks (%s); using the %s instead.",
                    qualified_name(type(diffusion_model)), ad.name, ", ".join(st.attr for st in ad.stacks),
                    FALLBACK.name)
        return FALLBACK
    return ad


@dataclass(frozen=True)
class BlockSlot:
    """One block of the stack and its role: the first enters the cache, the last leaves it."""
    stack: Stack
    index: int               # index in the block list (dit key number)
    child: str               # child name in the container (object patch path)
    first: bool
    last: bool


def block_slots(adapter: Adapter, diffusion_model) -> list[BlockSlot]:
    """Every block that is actually called, in call order, with first/last marked."""
    found = []
    for st in adapter.stacks:
        container = getattr(diffusion_model, st.attr, None)
        if container is None:
            continue
        skip = set(getattr(diffusion_model, st.skip_attr, None) or []) if st.skip_attr else set()
        for i, (child, _) in enumerate(container.named_children()):
            if i not in skip:
                found.append((st, i, child))
    return [BlockSlot(st, i, child, n == 0, n == len(found) - 1) for n, (st, i, child) in enumerate(found)]


def estimated_io_share(adapter: Adapter, diffusion_model) -> float:
    """Share of a step's cost outside the block stack, estimated by parameter count (0 for the fallback);
    Apply's predicted speed-up uses it before anything has been timed."""
    if adapter.route == Route.FALLBACK:
        return 0.0
    total = sum(p.numel() for p in diffusion_model.parameters())
    inside = sum(p.numel() for st in adapter.stacks if getattr(diffusion_model, st.attr, None) is not None
                 for p in getattr(diffusion_model, st.attr).parameters())
    return max(0.0, min(1.0, 1.0 - inside / total)) if total else 0.0


# ---------------------------------------------------------------------------------------------- token layout
def take_image(t: torch.Tensor, layout: Layout, n_img: int) -> torch.Tensor:
    """The image tokens of a block stream (n_img = image tokens at the stack's entry)."""
    if layout == TXT_FIRST:
        return t[:, t.shape[1] - n_img:]
    if layout == IMG_FIRST:
        return t[:, :n_img]
    return t


def put_image(t: torch.Tensor, layout: Layout, z: torch.Tensor) -> torch.Tensor:
    """`t` with its image tokens replaced by z (text tokens kept as they are)."""
    n = z.shape[1]
    if layout == TXT_FIRST:
        return torch.cat((t[:, :t.shape[1] - n], z), 1)
    if layout == IMG_FIRST:
        return torch.cat((z, t[:, n:]), 1)
    return z
