"""Speed of GCache Apply and Profile at real model sizes, with random weights (speed does not depend on them).

    python -m gcache.bench.speed --quick                  # tiny sizes, CPU float32, about 2 minutes on one core
    python -m gcache.bench.speed --memory-formula         # the Profile memory formula at real sizes, seconds
    python -m gcache.bench.speed --device cuda            # Flux-dev and Wan 2.1-1.3B at real sizes, bf16
    python -m gcache.bench.speed --device cuda --model wan --steps 12 --reps 5

Files: speed_models.py (the torch definitions and sizes), speed_comfy.py (ComfyUI's own classes),
speed_harness.py (the step, the variants, timing, memory, one model's report), this file (the command line).

Models (one torch definition per family, a size config each; `COMFYUI_PATH` set and importable → ComfyUI's own
comfy.ldm.flux.model.Flux / comfy.ldm.wan.model.WanModel are built instead, block stack swapped for a hook;
that path ran on the CPU at --quick sizes with ComfyUI a125cd84 (2025-10-12), never at real sizes or on a GPU):
  flux: Flux-dev transformer, 19 double + 38 single blocks, width 3072, 24 heads, 1024² image = 128² latent
        = 4096 image tokens (2×2 patches of 16 channels) + 512 T5 tokens, guidance embedding, batch 1 (cfg 1).
        RoPE is simplified: 1-D positions in rotate-half form; same elementwise work per block as Flux's 3-axis
        RoPE. Text tokens pass through unchanged on skipped steps (f_out reads image tokens only).
  wan:  Wan 2.1-1.3B, 30 blocks, width 1536, 12 heads, FFN 8960, self-attn + cross-attn to 512 text tokens,
        81 frames 480×832 → latent 21×60×104 → 1×2×2 patches → 32,760 tokens; CFG as a batch of 2 (branches
        cond/uncond). Same simplified RoPE.
  f_in = patch/text/time embedding; f_out = final adaLN layer + unpatchify; GCache wraps the block stack only:
  `z = cache.run(h_img, branches, blocks)`. A step = one model forward + an Euler update.

Measured, in one process, after warm-up, over --reps repetitions of N-step runs; each repetition runs every
variant once in a freshly shuffled order, ratios are taken within a repetition and the median over repetitions
is reported (drift on a shared machine cancels); CUDA events on a GPU, perf_counter on the CPU:
  none     no GCache                                  T    = time / N
  ones     ResidualCache, all-ones mask               overhead_all_ones = T(ones)/T(none) − 1   (goal ≤ 1 %),
           T per step as the median of single steps of the two variants in random order (the finest ABAB; whole
           runs vary ±3-5 % on a shared CPU, which hides 1 %); the whole-run ratio is printed too
  io       blocks replaced by the identity            T_io = time / N  (f_in + f_out + update)
  skip     mask 1,0,0,…: the real skip path           T_skip = (t(skip) − T) / (N − 1)
  half     K = N/2 computed, spread uniformly, step 0 computed
  third    K = N/3
  profile  all-ones mask + ProfileRecorder (+ finish()) profile_step_overhead = t(profile)/t(none) − 1
speedup = t(none)/t(K); ideal = N·T / (K·T + (N−K)·T_io); speedup_ratio = speedup / ideal (goal ≥ 0.95).

Profile memory model (core/recorder.py), per branch b of B branches, S = numel(δ_b)·itemsize(δ):
  held for the whole run: the history N·S on the model's device (on the CPU with --history cpu) + one copy of
  the previous h, S;
  transient, on each recorded step, after the blocks have run: the full-batch δ = z − h the engine forms (B·S),
  and r·S for (hist_rows − δ) plus r·S for its abs(), r = min(N, max(1, chunk_elems // numel)).
  predicted: B·(N+1)·S <= peak extra <= B·(N+1)·S + B·S + 2·r·S  (the transients only count where they rise
  above the peak of the blocks' own activations, which they follow in time).
Measured peak extra = peak allocation of a profile run − that of an all-ones run: torch.cuda.max_memory_allocated
on a GPU, the torch profiler's allocation events (profile_memory=True, summed in time order) on the CPU;
ProfileRecorder.peak_bytes (history + previous h only) is reported too. The cache Apply holds is
CacheStats.peak_bytes of the K = N/2 run (one δ per branch: B·S).

Output: human-readable lines, then exactly one JSON line (the last stdout line), {"models": [...]}, one object per
model measured: {"device", "model", "overhead_all_ones", "speedup_ratio_half", "speedup_ratio_third",
"profile_step_overhead", "profile_peak_extra_gb"} followed by extra keys (definition, sizes, T, T_io, …).
Threads: torch is pinned to --threads, default 1 (not 2): on the shared 2-core development machine a second
thread competing with other jobs made runs of the same variant vary 3-4x (OpenMP barriers; bench/RESULTS.md),
which no median repairs. Numbers from a shared machine are still noisy; read the per-repetition ratios.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from .cli import BenchParser, Progress, check_optional_comfyui, run_main, whole
from .speed_harness import measure, real_size_predictions, tune_malloc


def print_memory_formula(rows: list[dict]) -> None:
    print("profile memory formula at real sizes (predicted from the formula, not measured):")

    def gib(x: float) -> float:  # binary units, as the docs' table
        return x / 2**30
    for r in rows:
        p = r["profile"]
        low = p["history"] + p["prev_h"]
        kept = "every element" if p["stride"] == 1 else f"1 element in {p['stride']}"
        print(f"  {r['name']}, N={r['N']}, {r['branches']} branch(es), S={r['residual_bytes'] / 2**20:.1f} MiB "
              f"({kept} kept): held history {gib(p['history']):.3f} GiB + prev h {gib(p['prev_h']):.3f} GiB = "
              f"{gib(low):.3f} GiB; upper bound with δ {gib(p['delta_batch']):.3f} GiB + row temporaries "
              f"{gib(p['row_temps']):.3f} GiB = {gib(p['total']):.3f} GiB on the device (--history cpu: "
              f"{gib(p['history']):.3f} GiB host RAM, device <= "
              f"{gib(p['total'] - p['history'] + p['row_temps'] / 2):.3f} GiB incl. the streamed rows); every element "
              f"kept: {gib(r['profile_unsampled']['total']):.3f} GiB; Apply's cache {gib(r['apply_cache_bytes']):.3f} "
              "GiB")


def main(argv=None):
    ap = BenchParser("gcache.bench.speed", __doc__)
    ap.add_argument("--quick", action="store_true", help="tiny sizes on the CPU in float32 (about 2 minutes)")
    ap.add_argument("--memory-formula", action="store_true",
                    help="only print the memory formula at real sizes (seconds) and end with its JSON line")
    ap.add_argument("--model", choices=("flux", "wan", "all"), default="all")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available and not --quick)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--steps", type=whole(6), default=12, help="N sampler steps per run (K = N/2 and N/3; at least 6)")
    ap.add_argument("--reps", type=whole(1), default=5, help="timed repetitions per variant (medians)")
    ap.add_argument("--threads", type=whole(1), default=1, help="torch CPU threads (default 1, see the docstring)")
    ap.add_argument("--history", choices=("device", "cpu"), default="device", help="ProfileRecorder history_device")
    args = ap.parse_args(argv)
    if args.memory_formula:
        rows = real_size_predictions()
        print_memory_formula(rows)
        print(json.dumps({"memory_formula": rows}))
        return rows
    check_optional_comfyui(ap)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        ap.error(f"--device {args.device}: name cuda, cuda:N or cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA GPU; use --device cpu")
    if device.type not in ("cuda", "cpu"):
        ap.error(f"--device {args.device}: name cuda, cuda:N or cpu")
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    if not args.device.startswith("cuda"):
        print(f"glibc malloc tuned for stable CPU timings: {tune_malloc()}")
    if os.environ.get("COMFYUI_PATH"):
        print(f"models: ComfyUI's classes from COMFYUI_PATH={os.environ['COMFYUI_PATH']} (checked at --quick sizes on "
              "CPU only)")
    else:
        print("models: bench/speed.py's own torch definitions (COMFYUI_PATH not set)")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print_memory_formula(real_size_predictions())
    lines = []
    families = ("flux", "wan") if args.model == "all" else (args.model,)
    progress = Progress(len(families), "speed: models", expected_s=50.0 * len(families) if args.quick else None)
    for fam in families:
        lines.append(measure(fam, args))
        progress.step(f"{fam} measured")
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(json.dumps({"models": lines}))  # one JSON line, as every bench/ script ends
    return lines


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.speed"))
