"""Tiny models written as GGUF files, as city96's ComfyUI-GGUF loads them (test helper; needs the `gguf` package).

gguf-py quantizes Q8_0 but not the K-quants; q4_k() below packs Q4_K blocks by ggml's layout (a plain min/max
quantizer, enough for a test: gguf-py's own dequantizer reads them back).
"""
from __future__ import annotations

import numpy as np

QK_K = 256


def q4_k(x: np.ndarray) -> np.ndarray:
    """float32 rows (length a multiple of 256) -> Q4_K blocks: per 256 values d, dmin (fp16), 12 bytes of 6-bit
    sub-block scales and mins, 128 bytes of 4-bit quants."""
    blocks = x.astype(np.float32).reshape(-1, 8, 32)
    lo = np.minimum(blocks.min(-1), 0.0)
    hi = blocks.max(-1)
    scale, mins = (hi - lo) / 15.0, -lo
    d = np.maximum(scale.max(-1), 1e-12) / 63.0
    dmin = np.maximum(mins.max(-1), 1e-12) / 63.0
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)
    sc = np.clip(np.round(scale / d16.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    mq = np.clip(np.round(mins / dmin16.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    d1 = d16.astype(np.float32)[:, None] * sc
    m1 = dmin16.astype(np.float32)[:, None] * mq
    q = np.where(d1[..., None] > 0, np.round((blocks + m1[..., None]) / np.where(d1 > 0, d1, 1.0)[..., None]), 0)
    q = np.clip(q, 0, 15).astype(np.uint8)                               # [n, 8 sub-blocks, 32]
    scales = np.zeros((len(sc), 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (mq[:, 0:4] & 0x3F) | ((mq[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mq[:, 4:8] & 0x0F) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(len(sc), 128)   # sub-blocks 2g (low), 2g + 1 (high)
    out = np.concatenate([d16.view(np.uint8).reshape(-1, 2), dmin16.view(np.uint8).reshape(-1, 2), scales, qs], 1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * 144)


def write(path: str, state_dict: dict, arch: str, quant: str) -> dict:
    """A GGUF file of `state_dict` for ComfyUI-GGUF (arch as its loader knows it, e.g. "wan"): 2-D weights in
    `quant` ("Q8_0" or "Q4_K") where their rows allow it, the rest F32. Returns {tensor type: count}."""
    import gguf
    w = gguf.GGUFWriter(path, arch)
    counts: dict = {}
    for k, t in state_dict.items():
        a = t.detach().float().cpu().numpy()
        qtype = None
        if a.ndim == 2 and quant == "Q4_K" and a.shape[-1] % QK_K == 0:
            qtype, data = gguf.GGMLQuantizationType.Q4_K, q4_k(a)
        elif a.ndim == 2 and a.shape[-1] % 32 == 0 and quant in ("Q8_0", "Q4_K"):
            qtype = gguf.GGMLQuantizationType.Q8_0
            data = gguf.quants.quantize(a, qtype)
        if qtype is None:
            w.add_tensor(k, a.astype(np.float32))
            counts["F32"] = counts.get("F32", 0) + 1
        else:
            w.add_tensor(k, data, raw_shape=data.shape, raw_dtype=qtype)
            counts[qtype.name] = counts.get(qtype.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts
