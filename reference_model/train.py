"""Train the reference DiT on scikit-learn's digits (shipped inside the package: nothing is downloaded).

Rectified flow / flow matching: x_t = (1 − t)·x + t·n, target velocity n − x, t ~ logit-normal (as SD3),
10 % label dropout for classifier-free guidance, AdamW, EMA of the weights. Saves fp16 safetensors.

    python -m gcache.reference_model.train --minutes 14 --batch 64
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from .model import HERE, WEIGHTS, TinyDiT, TinyDiTConfig, save_model

SAMPLES = os.path.join(HERE, "samples.png")


PROGRESS_S = 10.0  # seconds between progress lines


def digits_16() -> tuple[torch.Tensor, torch.Tensor]:
    """1,797 digits, upsampled 8×8 → 16×16 (bilinear) and scaled to [-1, 1]."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    x = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False).clamp(0, 1)
    return x * 2 - 1, torch.tensor(d.target, dtype=torch.long)


def write_sample_grid(path: str = SAMPLES) -> None:
    """README's picture: digits 0-9 (columns) for three seeds (rows), 30 Euler steps, CFG 3."""
    from .demo import save_grid
    from .model import load_model
    from .sampler import sample, to_unit
    model = load_model()
    rows = [to_unit(sample(model, list(range(10)), [100 * r + c for c in range(10)], 30, 3.0)) for r in range(3)]
    save_grid(rows, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=12.0, help="wall-clock budget")
    ap.add_argument("--max-steps", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=WEIGHTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", default=None, help="continue from these weights (the EMA restarts from them)")
    ap.add_argument("--samples-only", action="store_true", help="only redraw samples.png from the saved weights")
    a = ap.parse_args(argv)
    if a.samples_only:
        write_sample_grid()
        return
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x_all, y_all = digits_16()
    model = TinyDiT(TinyDiTConfig())
    prior = {"train_steps": 0, "train_seconds": 0.0}
    if a.init:
        from .model import load_model, load_training_info
        model = load_model(a.init).train()
        prior = {k: float(v) for k, v in load_training_info(a.init).items() if k in prior}
    ema = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"TinyDiT {n_params / 1e6:.2f} M parameters, {len(x_all)} digits", flush=True)
    start = time.time()
    budget = a.minutes * 60
    step, losses, shown = 0, [], start
    while step < a.max_steps and time.time() - start < budget:
        frac = min(1.0, (time.time() - start) / budget)
        for g in opt.param_groups:  # warm-up, then cosine over the time budget
            g["lr"] = a.lr * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        idx = torch.randint(0, len(x_all), (a.batch,))
        x, y = x_all[idx], y_all[idx].clone()
        y[torch.rand(a.batch) < 0.1] = model.cfg.num_classes
        t = torch.sigmoid(torch.randn(a.batch))
        n = torch.randn_like(x)
        xt = (1 - t[:, None, None, None]) * x + t[:, None, None, None] * n
        loss = F.mse_loss(model(xt, t, y), n - x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - decay)
        losses.append(loss.item())
        step += 1
        if time.time() - shown >= PROGRESS_S:  # a line every ~10 s, whatever the machine's speed
            shown = time.time()
            print(f"step {step}  loss {np.mean(losses[-250:]):.4f}  {shown - start:.0f}s of {budget:.0f}s",
                  flush=True)
    secs = time.time() - start
    save_model(ema, a.out, extra={"train_steps": int(prior["train_steps"]) + step,
                                  "train_seconds": round(prior["train_seconds"] + secs, 1), "batch": a.batch,
                                  "final_loss": round(float(np.mean(losses[-250:])), 4), "data": "sklearn digits"})
    if a.out == WEIGHTS:
        write_sample_grid()
    print(f"saved {a.out}: {step} steps in {secs:.0f}s, final loss {np.mean(losses[-250:]):.4f}", flush=True)


if __name__ == "__main__":
    main()
