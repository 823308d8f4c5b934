"""Train one tiny ComfyUI model (Flux or Wan 2.1 class) on procedural data, on the CPU, and save it as safetensors.

Rectified flow as ComfyUI samples the family: u ~ logit-normal (as SD3) or uniform (--u), sigma =
model_sampling.sigma(u) (Flux: ModelSamplingFlux's shift; Wan: ModelSamplingDiscreteFlow's shift 8), x_t = (1 - sigma)
x0 + sigma n, target n - x0; 10 % of the prompts dropped to the empty prompt (for classifier-free guidance); AdamW,
warm-up then cosine over the time budget, EMA of the weights (the EMA is saved). Data, prompts and latents:
comfy_models/data.py.

    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.comfy_models.train --family flux --minutes 10
    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.comfy_models.train --family wan --minutes 10 --u uniform
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import time

import torch

from . import data
from .families import FAMILIES, comfyui_version, heldout_loss, save, use_comfyui, velocity_loss

PROGRESS_SECONDS = 10.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(FAMILIES), required=True)
    ap.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=None, help="default: 16 (flux), 8 (wan)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--u", choices=("logit-normal", "uniform"), default="logit-normal",
                    help="where on the schedule to train, before the family's shift: logit-normal (SD3's: the middle) "
                         "or uniform (as a sampler's simple schedule spends its steps; a large shift such as Wan's 8 "
                         "leaves the low noise levels almost untrained under logit-normal)")
    ap.add_argument("--out", default=None, help="default: comfy_models/<family>_tiny.safetensors")
    a = ap.parse_args(argv)
    use_comfyui()
    import comfy.model_management as mm

    from .families import build

    family = FAMILIES[a.family]
    batch = a.batch or {"flux": 16, "wan": 8}[a.family]
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    patcher = build(family, a.seed)
    net = patcher.model.diffusion_model
    net.requires_grad_(True).train()
    ema = copy.deepcopy(net).eval().requires_grad_(False)
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr, weight_decay=0.0)
    random_loss = heldout_loss(patcher, family)
    print(f"{family.name}: {type(patcher.model.model_config).__name__}, "
          f"{sum(p.numel() for p in net.parameters()) / 1e6:.2f} M parameters, batch {batch}, "
          f"held-out loss at init {random_loss:.4f}", flush=True)
    # ComfyUI's flag for training: its fused RoPE kernel (0.33) has no backward; the in-place residual adds of its
    # blocks would invalidate saved activations, so autograd keeps its own copies (saved_tensors_hooks below)
    mm.in_training = True
    g = torch.Generator().manual_seed(a.seed)
    start = last = time.time()
    budget = a.minutes * 60
    step, losses = 0, []
    while step < a.max_steps and time.time() - start < budget:
        frac = min(1.0, (time.time() - start) / budget)
        for grp in opt.param_groups:  # warm-up, then cosine over the time budget
            grp["lr"] = a.lr * min(1.0, (step + 1) / 100) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        pixels, labels = family.make(batch, a.seed * 10 ** 6 + step)  # fresh data each step; held-out seeds >= 1e9
        labels = torch.where(torch.rand(batch, generator=g) < 0.1, torch.full_like(labels, -1), labels)
        x0 = data.encode(pixels)
        u = torch.sigmoid(torch.randn(batch, generator=g)) if a.u == "logit-normal" else torch.rand(batch, generator=g)
        noise = torch.randn(x0.shape, generator=g)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
            loss = velocity_loss(patcher, family, x0, labels, u, noise).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        decay = min(0.998, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), net.parameters()):
                pe.lerp_(pm, 1 - decay)
        losses.append(loss.item())
        step += 1
        if time.time() - last >= PROGRESS_SECONDS:
            last = time.time()
            recent = losses[-50:]
            print(f"step {step}  loss {sum(recent) / len(recent):.4f}  {last - start:.0f}s / {budget:.0f}s", flush=True)
    secs = time.time() - start
    mm.in_training = False
    net.load_state_dict(ema.state_dict())
    net.requires_grad_(False).eval()
    final = sum(losses[-100:]) / len(losses[-100:])
    held = heldout_loss(patcher, family)
    out = a.out or family.path
    save(patcher, family, out, {
        "command": "COMFYUI_PATH=<ComfyUI> python -m gcache.comfy_models.train "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "data": f"procedural {'images' if family.make is data.images else 'videos'} ({', '.join(family.classes)}), "
                "comfy_models/data.py, a fresh batch per step from seed <seed> * 1e6 + step",
        "latent": "gain * Q . (2x2 RGB patch), Q 16x12 orthonormal columns (comfy_models/data.py)",
        "prompts": f"{len(family.classes)} class contexts + 1 empty, {family.tokens} x {family.context_width} "
                   f"from seeds {data.PROMPT_SEED}+k",
        "seed": a.seed, "u": a.u, "steps": step, "batch": batch, "lr": a.lr, "seconds": round(secs, 1),
        "threads": a.threads,
        "final_train_loss": round(final, 4), "heldout_loss": round(held, 4),
        "heldout_loss_at_init": round(random_loss, 4),
        "comfyui": comfyui_version(), "torch": torch.__version__})
    print(f"saved {out}: {step} steps in {secs:.0f}s, final train loss {final:.4f}, held-out {held:.4f} "
          f"(at init {random_loss:.4f})", flush=True)


if __name__ == "__main__":
    main()
