"""The harness of bench/speed.py: one step, the timed variants, memory, pieces, and the report of one model
(speed.py's docstring says what is measured and how)."""
from __future__ import annotations

import contextlib
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict
from typing import Callable, Optional

import torch

from ..core import ProfileRecorder, ResidualCache, StackClock, StepClock
from ..core.recorder import MAX_ELEMS, sample_stride
from ..search.baselines import uniform_mask
from .cli import own_inductor_cache
from .speed_comfy import ComfyModel
from .speed_models import FULL, QUICK, FluxLike, FluxSize, WanLike, WanSize


# ============================================================================ the step and the runs
def forward(model, x, t, inp, stack: Callable):
    """One model call: f_in → stack(h, branches, blocks) → f_out."""
    if isinstance(model, ComfyModel):
        return model.step(x, t, inp, stack)
    extra = {k: v for k, v in inp.items() if k != "x"}
    h, st = model.f_in(x, t, **extra)
    z = stack(h, model.branches, lambda hh: model.blocks(hh, st))
    return model.f_out(z, st)


VARIANTS = ("none", "ones", "profile", "io", "skip", "half", "third")


class Bench:
    def __init__(self, model, device, dtype, n_steps: int, history: Optional[str]):
        self.model, self.device, self.dtype, self.n = model, device, dtype, n_steps
        self.history = history
        self.inp = model.inputs(device, dtype)
        self.times = torch.linspace(1.0, 0.0, n_steps + 1).tolist()
        self.masks = {"ones": [1] * n_steps, "profile": [1] * n_steps, "skip": [1] + [0] * (n_steps - 1),
                      "half": uniform_mask(n_steps, n_steps // 2), "third": uniform_mask(n_steps, n_steps // 3)}
        self.last_stats = {}
        self.last_recorder = None

    def run(self, variant: str) -> None:
        """N sampler steps (Euler, flow matching) of one variant, including the cache's close()/finish()."""
        x = self.inp["x"]
        cache = rec = None
        if variant == "none":
            stack = lambda h, b, blocks: blocks(h)  # noqa: E731
        elif variant == "io":
            stack = lambda h, b, blocks: h  # noqa: E731
        else:
            if variant == "profile":
                rec = ProfileRecorder(self.times[:-1], history_device=self.history)
            # the observers GCache Profile and Apply plug in: the recorder and a clock of steps and stack, or the clock
            cache = ResidualCache(self.masks[variant],
                                  observers=(rec, StackClock()) if rec is not None else (StepClock(),))
            stack = cache.run
        for i in range(self.n):
            t0, t1 = self.times[i], self.times[i + 1]
            if cache is not None:
                cache.set_step(i)
            v = forward(self.model, x, torch.full((x.shape[0],), t0, device=self.device), self.inp, stack)
            x = x + (t1 - t0) * v
        if cache is not None:
            self.last_stats[variant] = cache.close()
        if rec is not None:
            self.last_recorder = rec
            rec.finish()
        self._sink = x

    def timed(self, variant: str) -> float:
        if self.device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            self.run(variant)
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1000.0
        t = time.perf_counter()
        self.run(variant)
        return time.perf_counter() - t

    def step_ab(self, count: int, seed: int = 1) -> dict:
        """Single steps, no GCache vs all-ones, in random order (the finest ABAB): median seconds per step."""
        rng = random.Random(seed)
        cache = ResidualCache([1] * count, observers=(StepClock(),))
        none = lambda h, b, blocks: blocks(h)  # noqa: E731
        x, t = self.inp["x"], torch.full((self.inp["x"].shape[0],), 0.5, device=self.device)
        out = {"none": [], "ones": []}
        for i in range(count):
            v = rng.choice(("none", "ones"))
            sync(self.device)
            t0 = time.perf_counter()
            if v == "ones":
                cache.set_step(i)
            self._sink = x + 0.1 * forward(self.model, x, t, self.inp, none if v == "none" else cache.run)
            sync(self.device)
            out[v].append(time.perf_counter() - t0)
        cache.close()
        return {v: statistics.median(ts) for v, ts in out.items()}

    def peak_alloc(self, variant: str) -> int:
        """Peak bytes allocated above the level at the start of one run of `variant`."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            self.run(variant)
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - base
        from torch.profiler import ProfilerActivity, profile
        with own_inductor_cache(), quiet_native_output(), profile(activities=[ProfilerActivity.CPU],
                                                                  profile_memory=True) as p:
            self.run(variant)
        evs = sorted((e.start_ns(), e.nbytes()) for e in p.profiler.kineto_results.events() if e.name() == "[memory]")
        cur = peak = 0
        for _, nb in evs:
            cur += nb
            peak = max(peak, cur)
        return peak

    def pieces(self, reps: int) -> dict:
        """Median seconds of the parts of one step (synchronised per piece): where the time goes."""
        m, x, inp = self.model, self.inp["x"], self.inp
        if isinstance(m, ComfyModel):
            return {}
        t = torch.full((x.shape[0],), 0.5, device=self.device)
        extra = {k: v for k, v in inp.items() if k != "x"}
        h, st = m.f_in(x, t, **extra)
        z = m.blocks(h, st)
        delta = z - h
        ones = ResidualCache([1] * 2, observers=(StepClock(),))
        ones.set_step(0)
        skip = ResidualCache([1, 0], observers=(StepClock(),))
        skip.set_step(0)
        skip.run(h, m.branches, lambda hh: z)  # stores δ (next step is skipped)
        skip.set_step(1)
        # a computed step whose δ is kept: snapshot of h, δ into it, store
        store = ResidualCache([1, 0], observers=(StepClock(),))
        store.set_step(0)
        fns = {"f_in": lambda: m.f_in(x, t, **extra), "blocks": lambda: m.blocks(h, st),
               "f_out": lambda: m.f_out(z, st),
               "update": lambda: x + 0.1 * x,
               "engine_all_ones_call": lambda: ones.run(h, m.branches, lambda hh: z),
               "engine_skip_call": lambda: skip.run(h, m.branches, lambda hh: z),
               "engine_store_call": lambda: store.run(h, m.branches, lambda hh: z),
               "h_snapshot": lambda: h.clone(),
               "delta_z_minus_h": lambda: z - h, "h_plus_delta": lambda: h + delta,
               "profile_record_mean": lambda: self._record_all(h, delta)}
        out = {}
        for k, fn in fns.items():
            fn()
            ts = []
            for _ in range(reps):
                sync(self.device)
                t0 = time.perf_counter()
                fn()
                sync(self.device)
                ts.append(time.perf_counter() - t0)
            out[k] = statistics.median(ts)
        out["profile_record_mean"] /= self.n  # that piece recorded all N steps
        ones.close()
        skip.close()
        store.close()
        return out

    def _record_all(self, h, delta) -> None:
        """A fresh ProfileRecorder fed N steps of every branch, then finish()."""
        rec = ProfileRecorder(self.times[:-1], history_device=self.history)
        br = self.model.branches
        hs, ds = h.chunk(len(br), 0), delta.chunk(len(br), 0)
        for i in range(self.n):
            for k, hp, dp in zip(br, hs, ds):
                rec.record(i, k, hp, dp)
        rec.finish()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ============================================================================ building and reporting
def build(family: str, size, device, dtype, use_comfy: bool):
    torch.manual_seed(0)
    if use_comfy:  # ComfyUI's layers are created uninitialised on the device in the model's dtype
        model = ComfyModel(family, size, device, dtype)
        definition = "ComfyUI " + ("comfy.ldm.flux.model.Flux" if family == "flux" else "comfy.ldm.wan.model.WanModel")
    else:  # on the meta device first: a 12B model is never materialised in float32
        with torch.device("meta"):
            model = FluxLike(size) if family == "flux" else WanLike(size)
        model = model.to(dtype=dtype).to_empty(device=device)
        definition = "bench/speed.py torch definition (simplified 1-D RoPE)"
    with torch.no_grad():  # random weights (speed does not depend on them), scaled to keep activations finite
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5 / math.sqrt(p[0].numel() if p.dim() > 2 else p.shape[-1]))
            elif "norm" in name or name.endswith(("qn.weight", "kn.weight")):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model.eval(), definition


def predicted_profile_bytes(numel_branch: int, itemsize: int, n: int, branches: int, chunk_elems: int = 1 << 25,
                            width: int = 1, max_elems: Optional[int] = MAX_ELEMS) -> dict:
    """core/recorder.py's memory model for a residual of numel_branch elements per branch whose last dimension is
    `width`: the history and the previous h of the m elements the recorder keeps (all of them up to max_elems, else
    every stride-th, core/recorder.py sample_stride: the stride depends on the width), the batch's δ, and the row
    temporaries. "history" + "prev_h" is what ProfileRecorder.peak_bytes counts."""
    stride = sample_stride(numel_branch, width, max_elems)
    m = len(range(0, numel_branch, stride))
    s, full = m * itemsize, numel_branch * itemsize
    r = min(max(1, chunk_elems // max(1, m)), n)
    hist = branches * n * s
    # Row temporaries: the float32 difference block, its copy from the host (δ's dtype) when the history is
    # offloaded, and δ in float32 when δ is not float32 (differences are formed in float32).
    temps = r * m * 4 + r * s + (0 if itemsize == 4 else m * 4)
    return {"history": hist, "prev_h": branches * s, "delta_batch": branches * full, "row_temps": temps,
            "total": hist + branches * s + branches * full + temps, "kept_elements": m, "stride": stride}


def profile_formula(h: torch.Tensor, n: int, branches: int, recorder: ProfileRecorder) -> dict:
    """predicted_profile_bytes for a block input h of the whole batch (its branches stacked on dim 0), as `recorder`
    keeps it (its max_elems; the sample's stride depends on h's last dimension)."""
    return predicted_profile_bytes(h.numel() // branches, h.element_size(), n, branches,
                                   chunk_elems=recorder.chunk_elems, width=h.shape[-1], max_elems=recorder.max_elems)


def real_size_predictions() -> list[dict]:
    """The memory formula at real sizes (bf16): Profile's bytes as recorded (sampled above MAX_ELEMS) and as they
    would be without sampling, and the cache Apply holds (one residual per branch)."""
    rows = []
    f, w = FluxSize(), WanSize()
    flux_numel = (f.lat_h // 2) * (f.lat_w // 2) * f.width
    wan_numel = w.frames * (w.lat_h // 2) * (w.lat_w // 2) * w.width
    for model, name, numel, width, b, n in (
            ("flux", "Flux-dev 1024², batch 1", flux_numel, f.width, 1, 30),
            ("wan", "Wan 2.1 1.3B 81f 480p, CFG", wan_numel, w.width, 2, 30),
            ("wan", "Wan 2.1 1.3B 81f 480p, CFG", wan_numel, w.width, 2, 50)):
        p = predicted_profile_bytes(numel, 2, n, b, width=width)
        exact = predicted_profile_bytes(numel, 2, n, b, width=width, max_elems=None)
        rows.append({"model": model, "name": name, "N": n, "branches": b, "elements_per_branch": numel,
                     "residual_bytes": numel * 2, "apply_cache_bytes": b * numel * 2, "profile": p,
                     "profile_unsampled": exact})
    return rows


@contextlib.contextmanager
def quiet_native_output():
    """Silence what native code writes to stdout and stderr (the torch profiler's own lines on a CPU-only machine:
    'profiler_start', 'gpuGetDeviceCount failed', allocator warnings) for the duration; Python's output is flushed
    first and is not affected afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def tune_malloc() -> str:
    """Keep freed CPU memory in the process (like CUDA's caching allocator). With glibc's defaults, large
    activations are returned to the OS and page-faulted back each step, and a run that holds more memory (the
    Profile history) changes that pattern: it measured 2-8 % *faster* than no GCache (bench/RESULTS.md)."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        ok = (libc.mallopt(-1, 1 << 30), libc.mallopt(-3, 32 << 20))  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD (max)
        return "M_TRIM_THRESHOLD=1 GiB, M_MMAP_THRESHOLD=32 MiB" if all(ok) else f"mallopt refused ({ok})"
    except (OSError, AttributeError) as e:
        return f"not glibc ({e})"


def gb(x: float) -> float:
    return x / 1e9


def paired(samples: dict, n: int) -> dict:
    """Per repetition (its variants ran back to back, so slow drift cancels), then the median over repetitions."""
    reps = len(samples["none"])
    per = {k: [] for k in ("over", "prof", "sp_half", "ideal_half", "ratio_half", "sp_third", "ideal_third",
                           "ratio_third")}
    for r in range(reps):
        t = {v: samples[v][r] for v in VARIANTS}
        T, T_io = t["none"] / n, t["io"] / n
        per["over"].append(t["ones"] / t["none"] - 1)
        per["prof"].append(t["profile"] / t["none"] - 1)
        for key, k in (("half", n // 2), ("third", n // 3)):
            ideal = n * T / (k * T + (n - k) * T_io)
            sp = t["none"] / t[key]
            per[f"sp_{key}"].append(sp)
            per[f"ideal_{key}"].append(ideal)
            per[f"ratio_{key}"].append(sp / ideal)
    return {k: (statistics.median(v), v) for k, v in per.items()}


def measure(family: str, args) -> dict:
    device = torch.device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    size = (QUICK if args.quick else FULL)[family]
    use_comfy = bool(os.environ.get("COMFYUI_PATH"))
    model, definition = build(family, size, device, dtype, use_comfy)
    n, reps = args.steps, args.reps
    bench = Bench(model, device, dtype, n, None if args.history == "device" else "cpu")
    print(f"\n== {family}: {definition}; {asdict(size)}; device {device}, {dtype}, N={n}, reps={reps}", flush=True)

    with torch.inference_mode():
        for v in VARIANTS:  # warm-up (allocator, kernels, caches)
            bench.run(v)
        samples = {v: [] for v in VARIANTS}
        rng = random.Random(0)
        for r in range(reps):
            order = list(VARIANTS)
            rng.shuffle(order)  # a fixed cyclic order left a position bias of a few % (bench/RESULTS.md)
            for v in order:
                samples[v].append(bench.timed(v))
        ab = bench.step_ab(max(40, 2 * n * reps))
        pieces = bench.pieces(max(reps, 5))
        peak_ones = bench.peak_alloc("ones")
        peak_prof = bench.peak_alloc("profile")
        rec_peak = bench.last_recorder.peak_bytes
        bench.run("half")
        apply_bytes = bench.last_stats["half"].peak_bytes
        x = bench.inp["x"]
        formula = None
        if not isinstance(model, ComfyModel):
            h, _ = model.f_in(x, torch.zeros(x.shape[0], device=device),
                              **{k: v for k, v in bench.inp.items() if k != "x"})
            formula = profile_formula(h, n, len(model.branches), bench.last_recorder)

    med = {v: statistics.median(s) for v, s in samples.items()}
    pr = paired(samples, n)
    T, T_io = med["none"] / n, med["io"] / n
    T_skip = (med["skip"] - T) / (n - 1)
    extra = peak_prof - peak_ones
    fmt = lambda v: ",".join(f"{x:.3f}" for x in v)  # noqa: E731
    print(f"per step (median of {reps} N-step runs / N):  T={T * 1e3:.2f} ms  T_io(f_in+f_out+update)={T_io * 1e3:.2f} "
          f"ms  T_skip(real skip path)={T_skip * 1e3:.2f} ms  all-ones={med['ones'] / n * 1e3:.2f} ms"
          f"  profile={med['profile'] / n * 1e3:.2f} ms")
    print("runs (s): " + "  ".join(f"{v}={fmt(samples[v])}" for v in VARIANTS))
    over_steps = ab["ones"] / ab["none"] - 1
    print(f"overhead all-ones: {over_steps * 100:+.2f} % from {max(40, 2 * n * reps)} single steps in random order "
          f"(median {ab['ones'] * 1e3:.3f} vs {ab['none'] * 1e3:.3f} ms; goal <= 1 %); from whole runs "
          f"{pr['over'][0] * 100:+.2f} % (per repetition {fmt(pr['over'][1])})")
    for key in ("half", "third"):
        k = sum(bench.masks[key])
        print(f"K={k}/{n} mask {''.join(map(str, bench.masks[key]))}: speed-up {pr['sp_' + key][0]:.3f}x, ideal "
              f"{pr['ideal_' + key][0]:.3f}x, ratio {pr['ratio_' + key][0]:.3f} (per repetition "
              f"{fmt(pr['ratio_' + key][1])}; goal >= 0.95)")
    print(f"profile overhead per step: {pr['prof'][0] * 100:+.2f} % vs no GCache (per repetition {fmt(pr['prof'][1])})")
    if pieces:
        print("where the time goes (median per piece, synchronised): " +
              "  ".join(f"{k}={v * 1e3:.3f}ms" for k, v in pieces.items()))
        print(f"  engine cost per all-ones step / T = {pieces['engine_all_ones_call'] / T * 100:.4f} %; "
              f"profile record cost per step (mean over N) / T = {pieces['profile_record_mean'] / T * 100:.3f} %; "
              f"skip call (enter + cat + h+δ) {pieces['engine_skip_call'] * 1e3:.3f} ms vs one add h+δ "
              f"{pieces['h_plus_delta'] * 1e3:.3f} ms")
        print(f"  snapshot of h on entry (in-place-safe δ, on computed steps whose δ is kept): "
              f"{pieces['h_snapshot'] * 1e3:.3f} ms = {pieces['h_snapshot'] / T * 100:.3f} % of T; such a step's "
              f"engine call {pieces['engine_store_call'] * 1e3:.3f} ms vs z − h alone "
              f"{pieces['delta_z_minus_h'] * 1e3:.3f} ms")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if formula is not None:
        b, p = len(model.branches), formula
        numel = h.numel() // h.shape[0]
        low = p["history"] + p["prev_h"]
        kept = "every element" if p["stride"] == 1 else f"1 element in {p['stride']}"
        held = ("history", "prev_h", "delta_batch", "row_temps")
        print(f"profile memory, measured: peak extra {extra / 2**20:.3f} MiB (profile run {peak_prof / 2**20:.2f} MiB "
              f"− all-ones run {peak_ones / 2**20:.2f} MiB), recorder.peak_bytes {rec_peak / 2**20:.3f} MiB; predicted "
              f"from the formula ({kept} of the residual kept): held B·(N+1)·S = {low / 2**20:.3f} MiB <= extra <= "
              f"upper bound {p['total'] / 2**20:.3f} MiB ("
              f"{', '.join(f'{k} {v / 2**20:.3f}' for k, v in p.items() if k in held)}"
              f" MiB) -> {'MET' if low <= extra <= p['total'] else 'NOT MET'}")
        print(f"Apply cache held (K=N/2), measured: {apply_bytes / 2**20:.3f} MiB; predicted B·S = "
              f"{b * numel * itemsize / 2**20:.3f} MiB")
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {"device": dev, "model": family + ("-quick" if args.quick else ""),
            "overhead_all_ones": round(over_steps, 4), "speedup_ratio_half": round(pr["ratio_half"][0], 4),
            "speedup_ratio_third": round(pr["ratio_third"][0], 4), "profile_step_overhead": round(pr["prof"][0], 4),
            "profile_peak_extra_gb": round(gb(extra), 6),
            "definition": definition, "dtype": args.dtype, "steps": n, "reps": reps, "history": args.history,
            "overhead_all_ones_runs": round(pr["over"][0], 4), "T_ms": round(T * 1e3, 3),
            "T_io_ms": round(T_io * 1e3, 3), "T_skip_ms": round(T_skip * 1e3, 3),
            "speedup_half": round(pr["sp_half"][0], 4), "ideal_half": round(pr["ideal_half"][0], 4),
            "speedup_third": round(pr["sp_third"][0], 4), "ideal_third": round(pr["ideal_third"][0], 4),
            "recorder_peak_gb": round(gb(rec_peak), 6), "apply_cache_gb": round(gb(apply_bytes), 6),
            **({"profile_predicted_low_gb": round(gb(low), 6), "profile_predicted_high_gb": round(gb(p["total"]), 6),
                "profile_formula_met": low <= extra <= p["total"], "profile_sample_stride": p["stride"]}
               if formula is not None else {}),
            **({"snapshot_ms": round(pieces["h_snapshot"] * 1e3, 4),
                "snapshot_share": round(pieces["h_snapshot"] / T, 6)} if pieces else {}),
            "date": time.strftime("%Y-%m-%d")}
