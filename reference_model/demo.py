"""Headless GCache demo on the bundled reference DiT: profile → policy → apply, with figures and files.

    python -m gcache.reference_model.demo [--steps 30] [--k 12] [--out demo_out]

1. Profile: full-compute runs on the profile seeds record E[i, j] = mean |δ_i − δ_j|.
2. Policy: the exact DP over the profile for K computed steps (local weights w = 0 here; GCache Search
   learns w(t; s) against the real image loss: `python -m gcache.reference_model.search`).
3. Apply: other seeds, full vs accelerated; prints N, K, predicted speed-up (from the io share the profiling runs
   measured, with its range) and measured speed-up (median of alternating full/GCache run pairs), PSNR/SSIM, and
   the line GCache Apply logs in ComfyUI for such a run (core/engine.py CacheStats.summary).
Writes profile.safetensors, policy.json and grid.png (top row full compute, bottom row GCache).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

from ..core.policy import check_budget
from ..search.dp import dp_mask
from ..search.infra.cli import (
    ArgumentParser,
    Problems,
    check_at_least,
    check_out_folder,
    check_steps,
    command_name,
    make_out_folder,
    run_command,
)
from ..search.infra.requirements import require
from .harness import ReferenceHarness


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a - b) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def ssim(a: torch.Tensor, b: torch.Tensor) -> float:
    from skimage.metrics import structural_similarity
    vals = [structural_similarity(x[0].numpy(), y[0].numpy(), data_range=1.0, gaussian_weights=True, sigma=1.5,
                                  use_sample_covariance=False) for x, y in zip(a, b)]
    return float(np.mean(vals))


def save_grid(rows: list[torch.Tensor], path: str, scale: int = 4) -> None:
    """Rows of [B, 1, H, W] images in [0, 1] → one PNG (nearest upscaling keeps the pixels honest)."""
    from PIL import Image
    pad = 2
    b, _, h, w = rows[0].shape
    H, W = h * scale, w * scale
    canvas = np.full(((H + pad) * len(rows) + pad, (W + pad) * b + pad), 255, dtype=np.uint8)
    for r, imgs in enumerate(rows):
        for c in range(b):
            tile = (imgs[c, 0].numpy() * 255).round().astype(np.uint8).repeat(scale, 0).repeat(scale, 1)
            y0, x0 = pad + r * (H + pad), pad + c * (W + pad)
            canvas[y0:y0 + H, x0:x0 + W] = tile
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    Image.fromarray(canvas).save(path)


def paired_ratios(full, fast, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of `repeats` full and fast runs, alternating (full, fast, full, …) so that load changes on a shared
    machine hit both alike, after one unmeasured pair (warm-up)."""
    full(), fast()
    t_full, t_fast = [], []
    for _ in range(repeats):
        for t, fn in ((t_full, full), (t_fast, fast)):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    return t_full, t_fast


PROG = command_name(__spec__.name)
EVAL_SEED0 = 1000  # the held-out seeds are 1000, 1001, …: never the profile seeds 0, 1, …


def main(argv=None) -> int:
    ap = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--k", type=int, default=12, help="computed steps (budget)")
    ap.add_argument("--profile-seeds", type=int, default=8)
    ap.add_argument("--eval-seeds", type=int, default=10)
    ap.add_argument("--cfg", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats (median)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="demo_out")
    a = ap.parse_args(argv)
    return run_command(PROG, lambda: _run(a))


def check_arguments(a) -> None:
    """Every argument, before the model loads: one GCacheError that names each problem."""
    problems = Problems()
    if check_steps(problems, a.steps):
        problems.check(check_budget, a.k, a.steps)
    problems.require(1 <= a.profile_seeds <= EVAL_SEED0,
                     f"--profile-seeds {a.profile_seeds}: profile on 1 to {EVAL_SEED0} seeds (the held-out seeds "
                     f"start at {EVAL_SEED0}).")
    check_at_least(problems, "--eval-seeds", a.eval_seeds, 1, "the number of held-out seeds")
    check_at_least(problems, "--repeats", a.repeats, 1, "the number of timed repeats")
    check_at_least(problems, "--threads", a.threads, 1, "the number of threads")
    problems.require(math.isfinite(a.cfg), f"--cfg {a.cfg}: the guidance scale must be a finite number (3 is usual).")
    problems.check(check_out_folder, a.out)
    problems.raise_any()
    # what the figures need (SSIM, the grid's PNG), before the minutes of sampling that precede them
    require("skimage", "PIL", what="The demo", in_comfyui=False)


def _run(a) -> int:
    check_arguments(a)
    make_out_folder(a.out)
    torch.set_num_threads(a.threads)
    harness = ReferenceHarness(n_steps=a.steps, cfg_scale=a.cfg)

    profile_seeds = list(range(a.profile_seeds))
    eval_seeds = list(range(EVAL_SEED0, EVAL_SEED0 + a.eval_seeds))  # never the profile seeds
    t0 = time.perf_counter()
    profile = None
    for c in range(0, len(profile_seeds), 4):  # small batches: every (run, branch) is one sample of E
        run = harness.profile(profile_seeds[c:c + 4])
        profile = run if profile is None else profile.merge(run)
    t_profile = time.perf_counter() - t0
    profile.save(os.path.join(a.out, "profile.safetensors"))

    mask, bound = dp_mask(profile.E, np.zeros(a.steps), a.k)
    io = profile.io  # measured while profiling: per-step shares, medians over steps and runs
    policy = harness.policy_from_mask(mask, "local_dp", profile_seeds=profile_seeds, bound=bound)
    policy.metrics.update(io.metrics(policy.n_steps, policy.n_computed))

    full = harness.full(eval_seeds)
    fast, stats = harness.run(eval_seeds, mask=mask)
    t_full, t_fast = paired_ratios(lambda: harness.run(eval_seeds), lambda: harness.run(eval_seeds, mask=mask),
                                   a.repeats)
    ratios = [f / q for f, q in zip(t_full, t_fast)]
    measured = statistics.median(ratios)  # the median of per-pair ratios: one slow run moves one ratio
    p, s = psnr(fast, full), ssim(fast, full)
    policy.metrics.update(psnr=round(p, 3), ssim=round(s, 4), measured_speedup=round(measured, 3),
                          measured_speedup_range=[round(min(ratios), 3), round(max(ratios), 3)], eval_seeds=eval_seeds)
    policy.save(os.path.join(a.out, "policy.json"))
    save_grid([full, fast], os.path.join(a.out, "grid.png"))

    print(f"profile   {len(profile_seeds)} seeds in {profile.meta['runs']} runs = {profile.count} samples of E "
          f"(runs × CFG branches), {profile.n_steps} steps, {t_profile:.1f}s")
    print(f"policy    {policy.describe()}  (█ compute, · reuse; DP bound {bound:.4g})")
    print(f"N = {a.steps}, K = {a.k}")
    print(f"speed-up  {io.describe_speedup(a.steps, policy.n_computed)} from the profile's {io.describe()}")
    print(f"          measured {measured:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}; median of {a.repeats} full/GCache "
          f"run pairs of {len(eval_seeds)} seeds: {statistics.median(t_full) * 1e3:.0f} ms → "
          f"{statistics.median(t_fast) * 1e3:.0f} ms)")
    print(f"quality   PSNR {p:.2f} dB, SSIM {s:.4f} vs full compute on {len(eval_seeds)} held-out seeds")
    print(f"engine    computed {stats.computed_steps}, skipped {stats.skipped_steps}, "
          f"block runs per branch {stats.block_runs}, cache peak {stats.peak_bytes / 1024:.1f} KiB")
    print(f"log       {stats.summary(io)}  (the line GCache Apply logs in ComfyUI, for the first GCache run)")
    print(f"wrote     {a.out}/profile.safetensors, {a.out}/policy.json, {a.out}/grid.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
