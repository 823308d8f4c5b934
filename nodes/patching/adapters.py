"""Family adapters: where the block stack starts and ends, and which tokens carry the image. Data first.

No ComfyUI import: a diffusion model is recognised by the module and name of a class in its MRO
(`comfy.ldm.flux.model.Flux`), so Wan's VACE/Camera/S2V subclasses find the Wan entry and AuraFlow's `MMDiT`
(comfy.ldm.aura.mmdit) is not taken for SD3's (comfy.ldm.modules.diffusionmodules.mmdit). Facts per family:
the README's family table; each row is verified in ComfyUI's own classes by tests/comfyui/test_family_matrix.py.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Optional, Union

from .streams import Layout

log = logging.getLogger("gcache")


class Route(str, Enum):
    DIT = "dit"            # ComfyUI's `patches_replace["dit"]` block patches (the block loop asks for them)
    OBJECT = "object"      # no replace hook in the loop: each block's `forward` is swapped by an object patch
    #                        (ModelPatcher.add_object_patch, restored when the model is unpatched)
    FALLBACK = "fallback"  # any other model: the whole model output difference (denoised − x) at APPLY_MODEL


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
    batched: bool = True             # False: the loop passes [tokens, dim] for one cond per call (MiniMax H3)


@dataclass(frozen=True)
class Adapter:
    name: str
    classes: tuple           # "module.Class" of the model classes this row was verified on (tests/comfyui)
    route: Route
    stacks: tuple = ()
    loop: tuple = ()         # methods that hold the block loop (either ComfyUI version): a subclass that
    #                          overrides one has a loop of its own, which this row was not verified on
    notes: str = ""


IMG, TXT_FIRST, IMG_FIRST, ALL = Layout.IMG, Layout.TXT_FIRST, Layout.IMG_FIRST, Layout.ALL
_FLUX = (Stack("double_block", "double_blocks", IMG), Stack("single_block", "single_blocks", TXT_FIRST))
_CHROMA = (Stack("double_block", "double_blocks", IMG, skip_attr="skip_mmdit"),
           Stack("single_block", "single_blocks", TXT_FIRST, skip_attr="skip_dit"))
_LDM = "comfy.ldm."

_WAN = ("WanModel", "VaceWanModel", "WanModel_S2V", "HumoWanModel", "CameraWanModel", "SCAILWanModel", "SCAIL2WanModel")

ADAPTERS = (
    Adapter("flux", (_LDM + "flux.model.Flux",), Route.DIT, _FLUX, ("forward_orig",),
            notes="Flux 1, Kontext (reference latents are image tokens too), Flux 2, Flux 2 Klein, LongCat-Image"),
    Adapter("chroma", (_LDM + "chroma.model.Chroma", _LDM + "chroma_radiance.model.ChromaRadiance"), Route.DIT,
            _CHROMA, ("forward_orig",), notes="its blocks add into their input in place"),
    Adapter("hunyuan_video", (_LDM + "hunyuan_video.model.HunyuanVideo",), Route.DIT,
            (Stack("double_block", "double_blocks", IMG), Stack("single_block", "single_blocks", IMG_FIRST)),
            ("forward_orig",), notes="HunyuanVideo 1 and 1.5, HunyuanImage 2.1; single stream cat(img, txt) in ComfyUI "
                                     "0.3.64, cat(txt, img) + img_slice since"),
    Adapter("wan", tuple(_LDM + "wan.model." + c for c in _WAN) + (
        _LDM + "wan.model_animate.AnimateWanModel", _LDM + "wan.model_animate2.WanAnimate2Model",
        _LDM + "wan.model_wandancer.WanDancerModel"), Route.DIT, (Stack("double_block", "blocks", IMG),),
            ("forward_orig",), notes="VACE hints, S2V audio, WanDancer music are added between blocks: on skipped "
                                     "steps they enter through δ; S2V/HuMo/SCAIL reference tokens are cached with the "
                                     "image"),
    Adapter("ltx2", (_LDM + "lightricks.av_model.LTXAVModel",), Route.DIT,
            (Stack("double_block", "transformer_blocks", IMG),), ("_process_transformer_blocks", "_forward"),
            notes="blocks carry a (video, audio) pair: each stream keeps its own residual"),
    Adapter("ltxv", (_LDM + "lightricks.model.LTXVModel",), Route.DIT,
            (Stack("double_block", "transformer_blocks", IMG),), ("_process_transformer_blocks", "_forward"),
            notes="blocks add into their input in place"),
    Adapter("qwen_image", (_LDM + "qwen_image.model.QwenImageTransformer2DModel",), Route.DIT,
            (Stack("double_block", "transformer_blocks", IMG),), ("_forward",),
            notes="Qwen-Image, -Edit 2509/2511 (reference latents are image tokens too), -Layered"),
    Adapter("sd3", (_LDM + "modules.diffusionmodules.mmdit.MMDiT",
                    _LDM + "modules.diffusionmodules.mmdit.OpenAISignatureMMDITWrapper"), Route.DIT,
            (Stack("double_block", "joint_blocks", IMG),), ("forward_core_with_concat",)),
    Adapter("auraflow", (_LDM + "aura.mmdit.MMDiT",), Route.DIT,
            (Stack("double_block", "double_layers", IMG), Stack("single_block", "single_layers", TXT_FIRST)),
            ("_forward",)),
    Adapter("lens", (_LDM + "lens.model.LensTransformer2DModel",), Route.DIT,
            (Stack("double_block", "transformer_blocks", IMG),), ("_forward",)),
    Adapter("mage_flow", (_LDM + "mage_flow.model.MageFlowTransformer2DModel",), Route.DIT,
            (Stack("double_block", "transformer_blocks", IMG),), ("_forward",), notes="reference tokens cached too"),
    Adapter("joyimage", (_LDM + "joyimage.model.JoyImageTransformer3DModel",), Route.DIT,
            (Stack("double_block", "double_blocks", IMG),), ("_forward",), notes="reference tokens cached too"),
    Adapter("hunyuan_dit", (_LDM + "hydit.models.HunYuanDiT",), Route.DIT, (Stack("double_block", "blocks", IMG),),
            ("forward",), notes="long skip connections stay inside the stack"),
    Adapter("mochi", (_LDM + "genmo.joint_model.asymm_models_joint.AsymmDiTJoint",), Route.DIT,
            (Stack("double_block", "blocks", IMG),), ("forward",)),
    Adapter("minimax_h3", (_LDM + "minimax.model.MiniMaxH3Model",), Route.DIT,
            (Stack("double_block", "blocks", ALL, batched=False),), ("_forward",),
            notes="one packed [text, audio, video] stream per call, without a batch dimension; cached whole"),
    Adapter("lumina2", (_LDM + "lumina.model.NextDiT", _LDM + "lumina.model.NextDiTPixelSpace"), Route.OBJECT,
            (Stack("layer", "layers", ALL),), ("_forward",),
            notes="Lumina2, Z-Image and its pixel-space variant: joint [caption, image] stream cached whole"),
    Adapter("hidream", (_LDM + "hidream.model.HiDreamImageTransformer2DModel",), Route.OBJECT,
            (Stack("double_stream", "double_stream_blocks", IMG,
                   call=ObjectCall("image_tokens", returns_text="text_tokens")),
             Stack("single_stream", "single_stream_blocks", IMG_FIRST, call=ObjectCall("image_tokens"))),
            ("_forward",)),
    Adapter("cosmos_predict2", (_LDM + "cosmos.predict2.MiniTrainDIT", _LDM + "anima.model.Anima"), Route.OBJECT,
            (Stack("block", "blocks", ALL),), ("_forward",), notes="Cosmos Predict2, Anima"),
    Adapter("cosmos", (_LDM + "cosmos.model.GeneralDIT",), Route.OBJECT,
            (Stack("block", "blocks", ALL, call=ObjectCall(0, batch_dim=3)),), ("_forward",),
            notes="Cosmos 1 adds a position term before every block; it enters through δ on skipped steps"),
    Adapter("kandinsky5", (_LDM + "kandinsky5.model.Kandinsky5",), Route.OBJECT,
            (Stack("visual_block", "visual_transformer_blocks", IMG),), ("forward_orig",),
            notes="video and image; object patches: its dit hook calls the blocks with a keyword they don't take "
                  "(ComfyUI 0.33)"),
    Adapter("cogvideox", (_LDM + "cogvideo.model.CogVideoXTransformer3DModel",), Route.OBJECT,
            (Stack("block", "blocks", IMG, call=ObjectCall("hidden_states", returns_text="encoder_hidden_states")),),
            ("_forward",)),
    Adapter("krea2", (_LDM + "krea2.model.SingleStreamDiT",), Route.OBJECT, (Stack("block", "blocks", TXT_FIRST),),
            ("_forward",), notes="joint [text, image] stream; image tokens where ComfyUI's img_slice says"),
    Adapter("ernie_image", (_LDM + "ernie.model.ErnieImageModel",), Route.OBJECT, (Stack("layer", "layers", ALL),),
            ("forward",), notes="joint [image, text] stream cached whole"),
    Adapter("omnigen2", (_LDM + "omnigen.omnigen2.OmniGen2Transformer2DModel",), Route.OBJECT,
            (Stack("layer", "layers", ALL),), ("forward",), notes="joint [text, reference, image] stream cached whole"),
    Adapter("ideogram4", (_LDM + "ideogram4.model.Ideogram4Transformer2DModel",), Route.OBJECT,
            (Stack("layer", "layers", ALL),), ("_backbone",), notes="joint [text, image] stream cached whole"),
)

# Families whose model class GCache knows but does not cache by blocks: the whole-model fallback, and why.
NOT_BY_BLOCKS = {
    _LDM + "wan.ar_model.CausalWanModel": "autoregressive: its blocks keep a KV cache between the chunks of a video "
                                          "(ar_video sampler), so a block-stack residual from one step is not sound "
                                          "at another",
    _LDM + "hidream_o1.model.HiDreamO1Transformer": "its layers keep a text-prefix KV cache that block patches turn "
                                                    "off, and write into their input",
    _LDM + "boogu.model.BooguTransformer2DModel": "its double-stream layers take and return the text stream "
                                                  "positionally, which no block patch can pass through",
    _LDM + "pixeldit.model.PixDiT_T2I": "its two block stacks work on different token spaces (patches, then pixels)",
    _LDM + "seedvr.model.NaDiT": "its blocks take a video flattened over the batch with per-sample shapes",
}

FALLBACK = Adapter("whole-model fallback", (), Route.FALLBACK,
                   notes="unknown model: caches the whole model output difference (denoised − x)")


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# Class paths of the table that this ComfyUI does not have (family_paths.check, when the nodes load): path -> why.
# Their rows are not matched by them; a model of such a class, or of a class with the same name elsewhere, falls back
# loudly (choose_adapter). Empty until checked (headless, and before the nodes load: every path counts).
GONE: dict = {}


def set_gone(gone: dict) -> None:
    GONE.clear()
    GONE.update(gone)


def _gone_row(diffusion_model) -> Optional[tuple]:
    """(row, path, how) when the model's class is a class path this ComfyUI lacks (how="gone"), or has the same name
    as one (how="moved"): the family the class belongs to, which GCache can't use for it."""
    if not GONE:
        return None
    mro = [qualified_name(c) for c in type(diffusion_model).__mro__]
    for a in ADAPTERS:
        for path in a.classes:
            if path in GONE and path in mro:
                return a, path, "gone"
    names = {c.__qualname__ for c in type(diffusion_model).__mro__}
    for a in ADAPTERS:
        for path in a.classes:
            if path in GONE and path.rsplit(".", 1)[1] in names:
                return a, path, "moved"
    return None


@dataclass(frozen=True)
class Match:
    """The table's answer for one model class: which row, and whether the class itself was verified."""
    adapter: Adapter
    row_class: Optional[type] = None   # the class of the model's MRO the row names
    verified: bool = False             # the model's own class is named in the row


def find_adapter(diffusion_model) -> Match:
    """The row naming the first class of the model's MRO (module and class), else FALLBACK. Table lookup only:
    `choose_adapter` also checks an unverified subclass and the blocks."""
    for n, cls in enumerate(type(diffusion_model).__mro__):
        name = qualified_name(cls)
        if name in GONE:
            continue
        for a in ADAPTERS:
            if name in a.classes:
                return Match(a, cls, n == 0)
    return Match(FALLBACK)


def unverified_reason(match: Match, diffusion_model) -> Optional[str]:
    """Why a subclass the row does not name may not use it (None: it may). It may when it runs the row class's
    own block loop and its blocks take the arguments the patch passes."""
    model_cls, ad = type(diffusion_model), match.adapter
    own = [m for m in ad.loop if getattr(model_cls, m, None) is not getattr(match.row_class, m, None)]
    if own:
        return f"it overrides {', '.join(own)}, so it has a block loop of its own"
    if ad.route == Route.OBJECT:
        for st in ad.stacks:
            blocks = list(getattr(diffusion_model, st.attr, None).children()) \
                if getattr(diffusion_model, st.attr, None) is not None else []
            if blocks and not _takes(blocks[0], st.call.arg):
                return f"its {st.attr} blocks do not take {st.call.arg!r}"
    return None


def _takes(block, arg: Union[int, str]) -> bool:
    """Whether block.forward accepts the token argument the object patch passes (by name or position)."""
    import inspect
    try:
        params = list(inspect.signature(type(block).forward).parameters.values())[1:]  # without self
    except (TypeError, ValueError):
        return False
    if any(p.kind == p.VAR_KEYWORD for p in params) and isinstance(arg, str):
        return True
    if isinstance(arg, str):
        return any(p.name == arg for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) > arg or any(p.kind == p.VAR_POSITIONAL for p in params)


def choose_adapter(diffusion_model) -> Adapter:
    """The family adapter when the model's class was verified with it, or is a subclass that runs the same block
    loop, and its blocks are where the row says; else FALLBACK, loudly: an adapter that patches no block (or the
    wrong ones) would silently do nothing, or worse."""
    match = find_adapter(diffusion_model)
    ad, name = match.adapter, qualified_name(type(diffusion_model))
    why = next((w for cls in type(diffusion_model).__mro__ for c, w in NOT_BY_BLOCKS.items()
                if qualified_name(cls) == c), None)
    if why is not None:
        log.info("GCache: %s is cached as a whole model, not by blocks: %s; using the %s (%s).", name, why,
                 FALLBACK.name, FALLBACK.notes)
        return FALLBACK
    if ad.route == Route.FALLBACK:
        gone = _gone_row(diffusion_model)
        if gone is not None:
            row, path, how = gone
            where = (f"its class {path} could not be found on this ComfyUI when GCache loaded ({GONE[path]})"
                     if how == "gone" else f"its class name is that of {path}, which is not there on this ComfyUI "
                     f"({GONE[path]}): the class moved or was renamed")
            log.warning("GCache: %s belongs to the %s family, but %s; the %s adapter was verified on that class only, "
                        "so this model uses the %s (%s). Please report this ComfyUI version.", name, row.name, where,
                        row.name, FALLBACK.name, FALLBACK.notes)
            return ad
        log.info("GCache: %s has no family adapter; using the %s (%s).", name, ad.name, ad.notes)
        return ad
    if not match.verified:
        why = unverified_reason(match, diffusion_model)
        if why is not None:
            log.warning("GCache: %s is a subclass of %s, which the %s adapter was verified on, but %s; using the %s "
                        "instead. Please report this model.", name, qualified_name(match.row_class), ad.name, why,
                        FALLBACK.name)
            return FALLBACK
        log.info("GCache: %s was not verified with the %s adapter; it runs %s's own block loop with the same blocks, "
                 "so the adapter is used.", name, ad.name, qualified_name(match.row_class))
    if not block_slots(ad, diffusion_model):
        log.warning("GCache: %s looks like %s but has none of its blocks (%s); using the %s instead.",
                    name, ad.name, ", ".join(st.attr for st in ad.stacks), FALLBACK.name)
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
