"""Family adapters: where the block stack starts and ends, and which tokens carry the image. Data first.

No ComfyUI import: a diffusion model is recognised by the exact name of a class in its MRO (so Wan's
VACE/Camera/S2V subclasses find the Wan entry), never by substrings. Facts per family:
research/comfyui-internals.md §4.

Routes:
- "dit":    ComfyUI's `patches_replace["dit"]` block patches (the block loop asks for them).
- "object": models whose loop has no replace hook get each block's `forward` swapped by an object patch
            (ModelPatcher.add_object_patch, restored when the model is unpatched).
- fallback: any other model caches the whole model output difference (denoised − x) at APPLY_MODEL.

Layouts: where a block's image tokens sit in the tensor it passes on —
"img" the tensor is image tokens only; "txt_first" cat(txt, img) (Flux/Chroma single blocks);
"img_first" cat(img, txt) (HunyuanVideo/HiDream single blocks); "all" every token is cached (Lumina2's
joint [caption, image] stream, Cosmos): caching more tokens than needed costs memory, not correctness.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

Arg = Union[int, str]  # where an object-patched block finds its tokens: positional index or keyword


@dataclass(frozen=True)
class Stack:
    key: str                 # dit replace name ("double_block") or, for object patches, a label
    attr: str                # attribute of the diffusion model holding the blocks (ModuleList/ModuleDict)
    layout: str              # where the image tokens are in what these blocks pass on
    arg: Arg = 0             # object route: the blocks' token argument
    skip_attr: Optional[str] = None  # blocks listed here are never called (Chroma's skip_mmdit/skip_dit)
    returns_text: Optional[str] = None  # object route: the block returns (image, <this keyword's tensor>)


@dataclass(frozen=True)
class Adapter:
    name: str
    classes: tuple
    route: str                       # "dit" | "object" | "fallback"
    stacks: tuple = ()
    batch_dim: int = 0               # Cosmos 1 keeps tokens as T H W B D
    notes: str = ""


_FLUX = (Stack("double_block", "double_blocks", "img"), Stack("single_block", "single_blocks", "txt_first"))
_CHROMA = (Stack("double_block", "double_blocks", "img", skip_attr="skip_mmdit"),
           Stack("single_block", "single_blocks", "txt_first", skip_attr="skip_dit"))

ADAPTERS = (
    Adapter("flux", ("Flux",), "dit", _FLUX, notes="Kontext reference latents are image tokens too"),
    Adapter("chroma", ("Chroma", "ChromaRadiance"), "dit", _CHROMA),
    Adapter("hunyuan_video", ("HunyuanVideo",), "dit",
            (Stack("double_block", "double_blocks", "img"), Stack("single_block", "single_blocks", "img_first"))),
    Adapter("wan", ("WanModel",), "dit", (Stack("double_block", "blocks", "img"),),
            notes="VACE hints / S2V audio are added between blocks; on skipped steps they enter through δ"),
    Adapter("ltxv", ("LTXVModel",), "dit", (Stack("double_block", "transformer_blocks", "img"),)),
    Adapter("qwen_image", ("QwenImageTransformer2DModel",), "dit",
            (Stack("double_block", "transformer_blocks", "img"),)),
    Adapter("sd3", ("MMDiT",), "dit", (Stack("double_block", "joint_blocks", "img"),)),
    Adapter("lumina2", ("NextDiT",), "object", (Stack("layer", "layers", "all", arg=0),),
            notes="Lumina2 / Z-Image: joint [caption, image] stream cached whole"),
    Adapter("hidream", ("HiDreamImageTransformer2DModel",), "object",
            (Stack("double_stream", "double_stream_blocks", "img", arg="image_tokens", returns_text="text_tokens"),
             Stack("single_stream", "single_stream_blocks", "img_first", arg="image_tokens"))),
    Adapter("cosmos_predict2", ("MiniTrainDIT",), "object", (Stack("block", "blocks", "all", arg=0),)),
    Adapter("cosmos", ("GeneralDIT",), "object", (Stack("block", "blocks", "all", arg=0),), batch_dim=3,
            notes="Cosmos 1 adds a position term before every block; it enters through δ on skipped steps"),
)

FALLBACK = Adapter("whole-model fallback", (), "fallback",
                   notes="unknown model: caches the whole model output difference (denoised − x)")


def find_adapter(diffusion_model) -> Adapter:
    """The adapter of the first class in the model's MRO that the table names exactly, else FALLBACK."""
    for cls in type(diffusion_model).__mro__:
        for a in ADAPTERS:
            if cls.__name__ in a.classes:
                return a
    return FALLBACK


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


def io_share(adapter: Adapter, diffusion_model) -> float:
    """Share of a step's cost outside the block stack, estimated by parameter count (0 for the fallback)."""
    if adapter.route == "fallback":
        return 0.0
    total = sum(p.numel() for p in diffusion_model.parameters())
    inside = sum(p.numel() for st in adapter.stacks if getattr(diffusion_model, st.attr, None) is not None
                 for p in getattr(diffusion_model, st.attr).parameters())
    return max(0.0, min(1.0, 1.0 - inside / total)) if total else 0.0


# ---------------------------------------------------------------------------------------------- token layout
def take_image(t: torch.Tensor, layout: str, n_img: int) -> torch.Tensor:
    """The image tokens of a block stream (n_img = image tokens at the stack's entry)."""
    if layout == "txt_first":
        return t[:, t.shape[1] - n_img:]
    if layout == "img_first":
        return t[:, :n_img]
    return t


def put_image(t: torch.Tensor, layout: str, z: torch.Tensor) -> torch.Tensor:
    """`t` with its image tokens replaced by z (text tokens kept as they are)."""
    n = z.shape[1]
    if layout == "txt_first":
        return torch.cat((t[:, :t.shape[1] - n], z), 1)
    if layout == "img_first":
        return torch.cat((z, t[:, n:]), 1)
    return z
