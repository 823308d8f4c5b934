"""Content hashes of sampling inputs (tensors, conditioning lists, plain values). No ComfyUI import.

Used to recognise the same inputs again: GCache Search's state belongs to one prompt/latent/LoRA set, GCache
Profile does not add a re-queued identical run (same seed, conditioning, latent) to its profile twice, and a model's
weights have a short key (model_key: GCache Apply (auto)'s file names, the self-check's verdicts).
"""
from __future__ import annotations

import hashlib

import torch

MAX_HASHED = 1 << 20  # elements hashed per tensor; larger ones are hashed on an evenly strided sample plus sums


def content_hash(*items) -> str:
    """A short hex digest of `items`. Objects that are not tensors, containers or plain values (control nets,
    hooks) count by type only: their repr holds memory addresses that differ between runs."""
    h = hashlib.sha256()

    def feed(x):
        if torch.is_tensor(x):
            x = x.detach()
            h.update(str((tuple(x.shape), x.dtype)).encode())
            flat = x.reshape(-1)
            if flat.numel() > MAX_HASHED:  # a video latent: sample it, and pin the rest by its sums
                stride = -(-flat.numel() // MAX_HASHED)
                h.update(repr((flat.double().sum().item(), flat.double().abs().sum().item())).encode())
                flat = flat[::stride]
            h.update(flat.float().cpu().contiguous().numpy().tobytes())
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for y in x:
                feed(y)
            h.update(b"]")
        elif isinstance(x, dict):
            h.update(b"{")
            for k in sorted(x, key=str):
                h.update(str(k).encode())
                feed(x[k])
            h.update(b"}")
        elif x is None or isinstance(x, (bool, int, float, str)):
            h.update(repr(x).encode())
        else:
            h.update(type(x).__name__.encode())

    for item in items:
        feed(item)
    return h.hexdigest()[:16]


def model_key(model) -> str:
    """A short name for the weights a ModelPatcher samples with (checkpoint and LoRAs): shapes, a few values
    and the patches, hashed. Two checkpoints of one family get different keys; batch and resolution don't count."""
    dm = model.get_model_object("diffusion_model")
    params = list(dm.named_parameters())
    picks = sorted({0, len(params) // 2, len(params) - 1}) if params else []
    patches = sorted((str(k), [(float(p[0]), _tensor_samples(p[1])) for p in v if isinstance(p[0], (int, float))])
                     for k, v in getattr(model, "patches", {}).items())
    return content_hash(type(dm).__name__, sum(p.numel() for _, p in params),
                        [(n, tuple(p.shape)) for n, p in params[:16]],
                        [params[i][1].detach().reshape(-1)[:256] for i in picks], patches)[:8]


def _tensor_samples(obj, depth: int = 0) -> list:
    """The first values of every tensor in a patch (a LoRA's up/down weights, an adapter's .weights): two LoRAs on
    the same layers at the same strength must not share a key."""
    if torch.is_tensor(obj):
        return [obj.detach().reshape(-1)[:64]]
    if depth < 3 and isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensor_samples(o, depth + 1)]
    if depth < 3 and hasattr(obj, "weights"):
        return _tensor_samples(getattr(obj, "weights"), depth + 1)
    return []
