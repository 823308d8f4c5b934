"""Procedural training data, "prompts" and the pixel <-> latent projection of the tiny trained ComfyUI models.

Nothing here imports ComfyUI: the images, videos and embeddings are plain torch tensors made from fixed seeds.

- Images (3 x 32 x 32, values in [-1, 1]): one shape or texture per class on a two-colour gradient background.
- Videos (3 x T x 32 x 32): one shape per class moving in a straight line (random start, direction and speed).
- Prompts: each class label is a fixed random context (tokens x the family's context width), drawn from a seed, as a
  text encoder would give for a fixed prompt; one more fixed context is the empty ("negative") prompt.
- Latents: the model-space latent is gain * Q . patch, where patch is the 2 x 2 x RGB pixel patch (12 numbers) and
  Q a fixed 16 x 12 matrix with orthonormal columns. Q^T inverts it exactly on every image, so no VAE is needed and
  quality is measured on pixels. (ComfyUI's LATENT holds latent_format.process_out of it; see families.py.)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SIDE = 32  # pixels per side (latent 16 x 16)
FRAMES = 4  # video frames (one latent frame each: the projection is per frame)
LATENT_CHANNELS = 16
GAIN = 2.0  # puts the model-space latent at roughly unit spread per used direction
IMAGE_CLASSES = ("circle", "square", "triangle", "stripes", "checkerboard", "rings")
VIDEO_CLASSES = ("circle", "square", "triangle", "bar")
PROMPT_SEED = 1000  # class k's context comes from seed PROMPT_SEED + k; the empty prompt from PROMPT_SEED - 1
TRAIN_SEED, HELDOUT_SEED = 0, 1  # data seeds: held-out images never appear in training


def projection() -> torch.Tensor:
    """Q: 16 x 12 with orthonormal columns (Q^T Q = I), from a fixed seed."""
    g = torch.Generator().manual_seed(7)
    q, _ = torch.linalg.qr(torch.randn(LATENT_CHANNELS, 12, generator=g, dtype=torch.float64))
    return q.float()


def encode(pixels: torch.Tensor) -> torch.Tensor:
    """Pixels (B, 3, H, W) or (B, 3, T, H, W) in [-1, 1] -> model-space latent (B, 16, [T,] H/2, W/2)."""
    if pixels.dim() == 5:
        b, c, t, h, w = pixels.shape
        z = encode(pixels.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        return z.reshape(b, t, *z.shape[1:]).permute(0, 2, 1, 3, 4)
    patches = F.pixel_unshuffle(pixels, 2)  # (B, 12, H/2, W/2)
    return GAIN * torch.einsum("ck,bkhw->bchw", projection().to(patches), patches)


def decode(latent: torch.Tensor) -> torch.Tensor:
    """The inverse of encode (exact on encode's range; other latents are projected onto it first)."""
    if latent.dim() == 5:
        b, c, t, h, w = latent.shape
        x = decode(latent.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        return x.reshape(b, t, *x.shape[1:]).permute(0, 2, 1, 3, 4)
    patches = torch.einsum("ck,bchw->bkhw", projection().to(latent), latent) / GAIN
    return F.pixel_shuffle(patches, 2)


def prompts(n_classes: int, tokens: int, width: int, pooled: int = 0):
    """(contexts (n_classes + 1, tokens, width), pooled (n_classes + 1, pooled) or None); the last row is the
    empty prompt (the negative, and the unconditional of classifier-free guidance)."""
    ctx, pool = [], []
    for k in list(range(n_classes)) + [-1]:
        g = torch.Generator().manual_seed(PROMPT_SEED + k)
        ctx.append(torch.randn(tokens, width, generator=g))
        pool.append(torch.randn(max(pooled, 1), generator=g))
    return torch.stack(ctx), (torch.stack(pool) if pooled else None)


# ------------------------------------------------------------------------------------------------------ images
def _grid(n: int, side: int):
    c = (torch.arange(side, dtype=torch.float32) + 0.5) / side
    yy, xx = torch.meshgrid(c, c, indexing="ij")
    return xx.expand(n, side, side), yy.expand(n, side, side)


def _u(g, n, lo, hi):
    return lo + (hi - lo) * torch.rand(n, generator=g)


def _colors(g, n):
    """A foreground and a background colour pair far enough apart to read."""
    fg = torch.rand(n, 3, generator=g) * 0.8 + 0.2
    bg = torch.rand(n, 3, generator=g) * 0.5
    return fg, bg, torch.rand(n, 3, generator=g) * 0.5


def _background(g, n, side, bg1, bg2):
    xx, yy = _grid(n, side)
    ang = _u(g, n, 0, 2 * math.pi)
    s = (xx - 0.5) * torch.cos(ang)[:, None, None] + (yy - 0.5) * torch.sin(ang)[:, None, None] + 0.5
    s = s.clamp(0, 1)[:, None]
    return bg1[:, :, None, None] * (1 - s) + bg2[:, :, None, None] * s


def _mask(kind: str, xx, yy, cx, cy, r, extra):
    """Soft (anti-aliased) mask of one shape centred at (cx, cy) of size r, in [0, 1]."""
    px = 1.0 / xx.shape[-1]
    dx, dy = xx - cx[:, None, None], yy - cy[:, None, None]
    r_ = r[:, None, None]
    if kind == "circle":
        d = torch.sqrt(dx ** 2 + dy ** 2) - r_
    elif kind == "square":
        d = torch.maximum(dx.abs(), dy.abs()) - r_ * 0.85
    elif kind == "triangle":  # apex down (image rows grow downwards), equilateral-ish
        d = torch.maximum(torch.maximum(-dy - r_ * 0.6, dy * 0.5 + dx * 0.866 - r_ * 0.5),
                          dy * 0.5 - dx * 0.866 - r_ * 0.5)
    elif kind == "bar":  # a horizontal bar
        d = torch.maximum(dx.abs() - r_ * 1.2, dy.abs() - r_ * 0.4)
    elif kind == "rings":
        d = (torch.sin(torch.sqrt(dx ** 2 + dy ** 2) * extra[:, None, None]) * 0.05)
    else:
        raise ValueError(kind)
    return torch.sigmoid(-d / px * 2)


def images(n: int, seed: int, classes=None):
    """(pixels (n, 3, 32, 32) in [-1, 1], labels (n,)): class k draws IMAGE_CLASSES[k]."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, len(IMAGE_CLASSES), (n,), generator=g) if classes is None else torch.as_tensor(classes)
    n = len(labels)
    fg, bg1, bg2 = _colors(g, n)
    img = _background(g, n, SIDE, bg1, bg2)
    xx, yy = _grid(n, SIDE)
    cx, cy, r = _u(g, n, 0.3, 0.7), _u(g, n, 0.3, 0.7), _u(g, n, 0.14, 0.26)
    ang, freq = _u(g, n, 0, math.pi), _u(g, n, 2.5, 5.0)
    for k, kind in enumerate(IMAGE_CLASSES):
        sel = labels == k
        if not sel.any():
            continue
        if kind in ("circle", "square", "triangle"):
            m = _mask(kind, xx[sel], yy[sel], cx[sel], cy[sel], r[sel], None)
        elif kind == "stripes":
            s = xx[sel] * torch.cos(ang[sel])[:, None, None] + yy[sel] * torch.sin(ang[sel])[:, None, None]
            m = torch.sigmoid(torch.sin(2 * math.pi * freq[sel][:, None, None] * s) * 6)
        elif kind == "checkerboard":
            f = freq[sel][:, None, None]
            m = torch.sigmoid(torch.sin(math.pi * f * xx[sel]) * torch.sin(math.pi * f * yy[sel]) * 12)
        else:  # rings around the shape's centre
            d = torch.sqrt((xx[sel] - cx[sel][:, None, None]) ** 2 + (yy[sel] - cy[sel][:, None, None]) ** 2)
            m = torch.sigmoid(torch.sin(2 * math.pi * freq[sel][:, None, None] * d * 1.5) * 6)
        m = m[:, None]
        img[sel] = img[sel] * (1 - m) + fg[sel][:, :, None, None] * m
    return img * 2 - 1, labels


def videos(n: int, seed: int, classes=None, frames: int = FRAMES):
    """(pixels (n, 3, frames, 32, 32) in [-1, 1], labels (n,)): class k moves VIDEO_CLASSES[k] in a straight line
    over a still gradient background."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, len(VIDEO_CLASSES), (n,), generator=g) if classes is None else torch.as_tensor(classes)
    n = len(labels)
    fg, bg1, bg2 = _colors(g, n)
    bg = _background(g, n, SIDE, bg1, bg2)
    xx, yy = _grid(n, SIDE)
    cx, cy, r = _u(g, n, 0.3, 0.7), _u(g, n, 0.3, 0.7), _u(g, n, 0.13, 0.22)
    ang, speed = _u(g, n, 0, 2 * math.pi), _u(g, n, 0.04, 0.09)
    vx, vy = torch.cos(ang) * speed, torch.sin(ang) * speed
    out = torch.empty(n, 3, frames, SIDE, SIDE)
    for f in range(frames):
        fx, fy = cx + vx * (f - (frames - 1) / 2), cy + vy * (f - (frames - 1) / 2)
        frame = bg.clone()
        for k, kind in enumerate(VIDEO_CLASSES):
            sel = labels == k
            if sel.any():
                m = _mask(kind, xx[sel], yy[sel], fx[sel], fy[sel], r[sel], None)[:, None]
                frame[sel] = frame[sel] * (1 - m) + fg[sel][:, :, None, None] * m
        out[:, :, f] = frame
    return out * 2 - 1, labels
