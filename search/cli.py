"""What the command-line tools share (the reference model's search and cluster commands, bench/): seed lists and
thread pinning."""
from __future__ import annotations

from ..core.errors import GCacheError


def parse_seeds(text: str) -> list[int]:
    """'0-15' or '1,2,3' → list of ints."""
    try:
        if "-" in text:
            a, b = text.split("-", 1)
            return list(range(int(a), int(b) + 1))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise GCacheError(f"Seeds must look like '0-15' or '1,2,3', got {text!r}.") from None


def set_threads(n: int) -> None:
    """Pin every thread pool (torch, BLAS): on a busy 2-core machine 2 threads collapse 10-100x."""
    import torch
    from threadpoolctl import threadpool_limits
    torch.set_num_threads(n)
    threadpool_limits(n)
