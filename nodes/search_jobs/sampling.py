"""Sampling and decoding inside a node (GCache Search), as KSampler + VAE Decode do it. Imports ComfyUI."""
from __future__ import annotations

import comfy.model_management
import comfy.sample
import torch


def sample(model, seed: int, steps: int, cfg: float, sampler_name: str, scheduler: str, positive, negative,
           latent: dict) -> torch.Tensor:
    latent_image = comfy.sample.fix_empty_latent_channels(model, latent["samples"])
    noise = comfy.sample.prepare_noise(latent_image, seed, latent.get("batch_index"))

    def callback(step, x0, x, total):  # lets Interrupt stop a long search between steps
        comfy.model_management.throw_exception_if_processing_interrupted()

    return comfy.sample.sample(model, noise, steps, cfg, sampler_name, scheduler, positive, negative, latent_image,
                               noise_mask=latent.get("noise_mask"), callback=callback, disable_pbar=True, seed=seed)


def decode(vae, samples: torch.Tensor) -> torch.Tensor:
    """Latent → images [B·frames, 3, H, W] in [0, 1] on the CPU (the objectives' layout)."""
    img = vae.decode(samples)
    img = img.reshape(-1, *img.shape[-3:])  # video: frames into the batch
    return img[..., :3].movedim(-1, 1).clamp(0, 1).float().cpu()
