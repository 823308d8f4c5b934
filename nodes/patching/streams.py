"""Where the image tokens of a block's stream are, and how to put new ones back. No ComfyUI import.

A block stack passes on a *stream*: a tensor of tokens (batch first), or a tuple of such tensors when a model
runs several streams through one block (LTX-2: video and audio). GCache caches the tokens that reach the
output head. Two sources say where they are in a joint [text, image] stream:

- ComfyUI itself, where it says so: since 2026 its single-block loops set `transformer_options["img_slice"]`
  = [start, end] of the image tokens (Flux, Chroma, HunyuanVideo, Krea 2). ComfyUI wins: HunyuanVideo's single
  stream was cat(img, txt) in 0.3.64 and is cat(txt, img) in 0.33;
- else the adapter's layout (core of the family table): image only, text first, image first, or everything.

A tuple stream is packed into one [B, Σ numel per sample] tensor, so that each stream keeps its own residual
element by element (the same reuse and forecast weights) and the engine sees one tensor.
"""
from __future__ import annotations

import logging
from enum import Enum
from typing import Any, Optional, Sequence

import torch

from ...core.errors import GCacheError

log = logging.getLogger("gcache")


class Layout(str, Enum):
    """Where a block's image tokens sit in the tensor it passes on (when ComfyUI does not say)."""
    IMG = "img"              # image tokens only
    TXT_FIRST = "txt_first"  # cat(txt, img): Flux/Chroma/AuraFlow single blocks
    IMG_FIRST = "img_first"  # cat(img, txt): HunyuanVideo (ComfyUI 0.3.64) / HiDream single blocks
    ALL = "all"              # every token is cached (Lumina2's joint stream, Cosmos): more memory, still correct


JOINT = (Layout.TXT_FIRST, Layout.IMG_FIRST)
_SAID: set = set()  # (where, layout) pairs whose disagreement with ComfyUI's img_slice was logged


def is_stream(x: Any) -> bool:
    """A tensor with a batch and a token dimension, or a non-empty tuple/list of them."""
    if torch.is_tensor(x):
        return x.dim() >= 2
    return isinstance(x, (tuple, list)) and len(x) > 0 and all(torch.is_tensor(t) and t.dim() >= 2 for t in x)


def clone(stream):
    return type(stream)(t.clone() for t in stream) if isinstance(stream, (tuple, list)) else stream.clone()


def image_range(length: int, layout: Layout, n_img: Optional[int], img_slice: Optional[Sequence[int]],
                where: str = "") -> tuple[int, int]:
    """[a, b) of the image tokens in a stream of `length` tokens. n_img: image tokens at the stack's entry (None
    at the entry itself). ComfyUI's img_slice wins over the layout; a disagreement is logged once."""
    if layout not in JOINT:
        return 0, length
    mine = None
    if n_img is not None:
        mine = (length - n_img, length) if layout == Layout.TXT_FIRST else (0, n_img)
    if img_slice is not None:
        a, b = int(img_slice[0]), min(int(img_slice[1]), length)
        if mine is not None and (a, b) != mine and (where, layout) not in _SAID:
            _SAID.add((where, layout))
            log.info("GCache: ComfyUI puts the image tokens of the %s stream at [%d, %d) of %d; the family table's "
                     "layout (%s) would take [%d, %d). Using ComfyUI's (its img_slice).", where or "block", a, b,
                     length, layout.value, mine[0], mine[1])
        return a, b
    if mine is None:
        raise ValueError(f"the image tokens of a {layout.value} stream are unknown at the stack's entry")
    return mine


def take_image(stream, layout: Layout, n_img: Optional[int], img_slice=None, where: str = "") -> torch.Tensor:
    """The image tokens of a stream, batch first (a view for a tensor; packed for a tuple)."""
    if isinstance(stream, (tuple, list)):
        return torch.cat([t.reshape(t.shape[0], -1) for t in stream], 1)
    a, b = image_range(stream.shape[1], layout, n_img, img_slice, where)
    return stream if (a, b) == (0, stream.shape[1]) else stream[:, a:b]


def put_image(stream, layout: Layout, z: torch.Tensor, img_slice=None, where: str = ""):
    """`stream` with its image tokens replaced by z (text tokens kept as they are)."""
    if isinstance(stream, (tuple, list)):
        parts, at = [], 0
        for t in stream:
            n = t[0].numel()
            parts.append(z[:, at:at + n].reshape(t.shape).contiguous())
            at += n
        return type(stream)(parts)
    a, b = image_range(stream.shape[1], layout, z.shape[1], img_slice, where)
    if b - a != z.shape[1]:
        raise GCacheError(f"The {where or 'block'} stream has {b - a} image tokens at [{a}, {b}) but the cached ones "
                          f"are {z.shape[1]}: the image tokens changed within one step. Please report this model.")
    if (a, b) == (0, stream.shape[1]):
        return z
    return torch.cat((stream[:, :a], z, stream[:, b:]), 1)
