"""Shared test setup: one thread everywhere (2-thread BLAS collapses 10-100x on a busy 2-core machine)."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

try:
    from threadpoolctl import threadpool_limits  # comes with scikit-learn
except ImportError:  # a venv with only ComfyUI's requirements (tests/comfyui/test_install.py's bare phase)
    threadpool_limits = None

torch.set_num_threads(1)
_limits = threadpool_limits(1) if threadpool_limits else None


@pytest.fixture(scope="session")
def tiny_model():
    """A small random-weight TinyDiT (fast; for plumbing tests that need no trained weights)."""
    from gcache.reference_model.model import TinyDiT, TinyDiTConfig
    torch.manual_seed(0)
    model = TinyDiT(TinyDiTConfig(width=32, depth=3, heads=2))
    with torch.no_grad():  # adaLN-Zero starts as the identity; give the blocks something to do
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.fixture(scope="session")
def reference_model():
    """The trained, shipped reference model."""
    from gcache.reference_model.model import load_model
    return load_model()
