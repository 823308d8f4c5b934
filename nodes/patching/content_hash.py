"""Content hashes of sampling inputs (tensors, conditioning lists, plain values). No ComfyUI import.

Used to recognise the same inputs again: GCache Search's state belongs to one prompt/latent/LoRA set, and GCache
Profile does not add a re-queued identical run (same seed, conditioning, latent) to its profile twice.
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
