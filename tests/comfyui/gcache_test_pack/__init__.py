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


class FakeVAE:
    """Latent → image by a fixed projection, enough for the search's objective."""

    def decode(self, samples):
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
        return {"required": {}}
    RETURN_TYPES = ("VAE",)
    FUNCTION = "make"
    CATEGORY = "GCache/tests"

    def make(self):
        return (FakeVAE(),)


NODE_CLASS_MAPPINGS = {"GCacheTestTinyFlux": GCacheTestTinyFlux, "GCacheTestTinyWan": GCacheTestTinyWan,
                       "GCacheTestCond": GCacheTestCond, "GCacheTestVAE": GCacheTestVAE}
