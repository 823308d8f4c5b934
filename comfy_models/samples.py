"""Sample grid of the two trained tiny models, drawn through ComfyUI's own sampler (common_ksampler: euler, simple).

Flux: one column per class, three seeds as rows. Wan: one row per class and seed, its frames side by side.
Each model is loaded as `families.load` loads it (ComfyUI's loader on 0.33).

    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.comfy_models.samples       # writes docs/comfy_models_samples.png
"""
from __future__ import annotations

import argparse
import os

import torch

from . import data
from .families import FLUX, WAN, comfy_cond, load, use_comfyui

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "comfy_models_samples.png")
STEPS = 20
CFG = {"flux": 3.5, "wan": 5.0}


def sample(loaded, label: int, seed: int, steps: int = STEPS, cfg: float = None) -> torch.Tensor:
    """Pixels (3, [T,] 32, 32) in [-1, 1] of one sample of class `label`."""
    import nodes
    fam = loaded.family
    lat = torch.zeros(1, *fam.latent_shape)
    out = nodes.common_ksampler(loaded.patcher, seed, steps, cfg or CFG[fam.name], "euler", "simple",
                                comfy_cond(fam, label), comfy_cond(fam, -1), {"samples": lat})[0]["samples"]
    z = loaded.patcher.model.process_latent_in(out)  # back to the model-space latent that data.decode inverts
    return data.decode(z)[0].clamp(-1, 1)


def grid(seeds=(0, 1, 2)) -> torch.Tensor:
    flux, wan = load(FLUX), load(WAN)
    tiles = [sample(flux, k, s) for s in seeds for k in range(len(FLUX.classes))]  # rows: seeds
    flux_rows = [torch.cat(tiles[r * len(FLUX.classes):(r + 1) * len(FLUX.classes)], dim=2) for r in range(len(seeds))]
    wan_rows = [torch.cat(list(sample(wan, k, s).unbind(1)), dim=2) for k in range(len(WAN.classes)) for s in seeds[:2]]
    width = max(r.shape[2] for r in flux_rows + wan_rows)
    pad = [torch.nn.functional.pad(r, (0, width - r.shape[2]), value=1.0) for r in flux_rows + wan_rows]
    return torch.cat(pad, dim=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    use_comfyui()
    torch.set_num_threads(1)
    from PIL import Image
    img = grid()
    arr = ((img * 0.5 + 0.5) * 255).round().byte().permute(1, 2, 0).numpy()
    Image.fromarray(arr).resize((arr.shape[1] * 3, arr.shape[0] * 3), Image.NEAREST).save(a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
