"""Test-only ComfyUI nodes (loaded only by the real-ComfyUI suite): tiny Flux and Wan, random conditioning, a fake
VAE.

Flux cannot come through UNETLoader at a tiny width (detection fixes it at 3072), and the suite has no
text encoder or VAE weights; these stand in for CheckpointLoader/CLIPTextEncode/VAELoader.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
import tiny_models  # noqa: E402


class Gate:
    """A file a test holds a search with, at a known decode (GCache Search decodes every reference run and every
    evaluation's images once per seed): `<path>` holds how many decodes may run in all, `<path>.count` (written by the
    decoder only) how many have, `<path>.waiting` the count a decode is waiting at. The test raises the limit to let
    it go on; `held(n)` is true once the decoder waits after exactly n decodes."""

    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def _read(path: str, default: int = 0) -> int:
        try:
            with open(path) as f:
                return int(f.read() or default)
        except (OSError, ValueError):
            return default

    @staticmethod
    def _write(path: str, n: int) -> None:
        with open(path + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(path + ".tmp", path)

    def allow(self, n: int) -> None:
        """Decodes may run until n have run in all."""
        self._write(self.path, n)

    def held(self, n: int) -> bool:
        return self._read(self.path + ".count") == n and self._read(self.path + ".waiting", -1) == n

    def pass_one(self, timeout: float = 600.0) -> None:
        import time
        done, deadline = self._read(self.path + ".count"), time.monotonic() + timeout
        while self._read(self.path) <= done:
            self._write(self.path + ".waiting", done)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test never let decode {done + 1} run ({self.path})")
            time.sleep(0.01)
        self._write(self.path + ".count", done + 1)


class FakeVAE:
    """Latent → image by a fixed projection, enough for the search's objective; with a gate file, each decode waits
    until the gate lets it run (Gate)."""

    def __init__(self, gate: str = ""):
        self.gate = Gate(gate) if gate else None

    def decode(self, samples):
        if self.gate is not None:
            self.gate.pass_one()
        x = samples if samples.ndim == 4 else samples.movedim(1, 2).flatten(0, 1)
        img = torch.sigmoid(torch.nn.functional.interpolate(x[:, :3].float(), scale_factor=4))
        return img.movedim(1, -1)


class GCacheTestTinyFlux:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "GCache/tests"

    def load(self, seed):
        return (tiny_models.flux(seed)[0],)


class GCacheTestTinyWan:
    """A tiny Wan 2.1, written as safetensors and loaded by the stock UNETLoader's loader."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "GCache/tests"

    def load(self, seed):
        import tempfile
        return (tiny_models.wan(tempfile.mkdtemp(prefix="gcache_test_wan_"), seed)[0],)


class GCacheTestCond:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tokens": ("INT", {"default": 6}), "dim": ("INT", {"default": 32}),
                             "pooled": ("INT", {"default": 24}), "seed": ("INT", {"default": 0})}}
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "GCache/tests"

    def make(self, tokens, dim, pooled, seed):
        g = torch.Generator().manual_seed(seed)
        extra = {"pooled_output": torch.randn(1, pooled, generator=g)} if pooled else {}
        return ([[torch.randn(1, tokens, dim, generator=g), extra]],)


class GCacheTestVAE:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}, "optional": {"gate": ("STRING", {"default": ""})}}
    RETURN_TYPES = ("VAE",)
    FUNCTION = "make"
    CATEGORY = "GCache/tests"

    def make(self, gate=""):
        return (FakeVAE(gate),)


NODE_CLASS_MAPPINGS = {"GCacheTestTinyFlux": GCacheTestTinyFlux, "GCacheTestTinyWan": GCacheTestTinyWan,
                       "GCacheTestCond": GCacheTestCond, "GCacheTestVAE": GCacheTestVAE}
