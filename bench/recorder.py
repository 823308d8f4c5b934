"""The profile recorder's cost per recorded step, this tree's against another revision's, side by side.

    python -m gcache.bench.recorder --against <git revision> [--steps 16] [--elems 65536 1048576] [--repeats 7]
    python -m gcache.bench.recorder --against <git revision> --ops   # the torch operations each runs, counted
    python -m gcache.bench.recorder --kernels     # bfloat16 rows − float32 δ: in the kernel vs converted first

Each case records N steps of one branch (random δ and h of `elems` elements) with ProfileRecorder from this tree
and from core/ at the given revision (its whole folder, loaded from git as a package of its own: the recorder, its
statistics and the profile as they were then), variants interleaved and shuffled every repetition. Prints
per-step milliseconds (medians) and the ratio new/old (median of per-repetition ratios). On a shared machine those
move by tens of percent from run to run; `--ops` counts the torch operations each recorder runs for the same
residuals instead (torch.profiler, one run per case), which timing noise doesn't move. The recorder's
temporaries' peak is not measured: on the CPU the largest single allocation seen is not observable, so the memory
model is stated in core/recorder.py instead.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import pkgutil
import random
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import torch

from ..core import recorder as current
from .cli import BenchParser, Progress, own_inductor_cache, run_main, whole

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def core_at(rev: str):
    """core/ as it was at `rev`, imported as a package of its own (core/ imports nothing outside itself). Its
    recorder is in core/recorder.py since the profile statistics got files of their own, in core/profile.py before.
    Every module of it is imported before the extracted folder is removed: nothing is left in the temp folder."""
    archive = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", rev, "core"], check=True,
                             capture_output=True).stdout
    name = "_gcache_core_at_" + "".join(ch if ch.isalnum() else "_" for ch in rev)[:40]
    with tempfile.TemporaryDirectory(prefix="gcache-recorder-") as folder:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        root = os.path.join(folder, "core")
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, "__init__.py"),
                                                      submodule_search_locations=[root])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        for info in pkgutil.walk_packages([root], prefix=name + "."):  # the lazily imported ones too, while they exist
            importlib.import_module(info.name)
    return mod


def profile_module_at(rev: str):
    """core/profile.py of core/ at `rev` (core_at): the profile file format as it was then."""
    return importlib.import_module(core_at(rev).__name__ + ".profile")


def recorder_module_at(rev: str):
    """The module of core/ at `rev` that holds ProfileRecorder, whose recorder the bench times: core/recorder.py, or
    core/profile.py before the recorder had a file of its own."""
    name = core_at(rev).__name__
    rec = sys.modules.get(name + ".recorder")
    return rec if rec is not None and hasattr(rec, "ProfileRecorder") else importlib.import_module(name + ".profile")


def revision_problem(rev: str) -> "str | None":
    """Why `rev` names no core/ to compare against (None: it does)."""
    try:
        out = subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{rev}:core/profile.py"], capture_output=True,
                             timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"git cannot be run ({e}): this bench needs git and a clone of the repository"
    if out.returncode != 0:
        return (f"--against {rev}: no core/ at that revision of {REPO} (it needs a git clone and a revision such "
                "as HEAD~1)")
    return None


def record_run(mod, n: int, hs, ds, forecast: bool) -> float:
    times = [1.0 - k / n for k in range(n)]
    rec = mod.ProfileRecorder(times, forecast=forecast)
    t0 = time.perf_counter()
    for j in range(n):
        rec.record(j, "all", hs[j], ds[j])
    dt = time.perf_counter() - t0
    rec.finish()
    return dt / n


# What torch.profiler's C++ side (Kineto) writes to the process's stderr at every start and stop, and on a machine
# without a GPU; the environment's log level does not silence all of it. Other lines pass through.
KINETO_NOISE = re.compile(r"^(USDT|STAGE|ERROR|WARNING|INFO):\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ \w+\.cpp:\d+\] "
                          r"(profiler_start|profiler_stop|Completed Stage|gpuGetDeviceCount failed)")


@contextlib.contextmanager
def quiet_profiler_log():
    """Hold file descriptor 2 (C++ writes there, not to sys.stderr) while profiling; then write back what was not
    the profiler's own noise."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines() if not KINETO_NOISE.match(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


def op_counts(mod, n: int, hs, ds, forecast: bool) -> dict:
    """How many times each torch operation ran while `mod`'s recorder recorded the run (finish() included)."""
    from torch.profiler import ProfilerActivity, profile
    with own_inductor_cache(), quiet_profiler_log(), profile(activities=[ProfilerActivity.CPU]) as prof:
        record_run(mod, n, hs, ds, forecast)
    counts: dict = {}
    for e in prof.events():
        counts[e.name] = counts.get(e.name, 0) + 1
    return counts


def ops_row(elems: int, dtype, forecast: bool, old: dict, new: dict) -> dict:
    """The two recorders' operation counts side by side (printed), and the operations whose counts differ."""
    diff = {op: (old.get(op, 0), new.get(op, 0)) for op in sorted(set(old) | set(new))
            if old.get(op, 0) != new.get(op, 0)}
    row = {"elems": elems, "dtype": str(dtype).replace("torch.", ""), "forecast": forecast,
           "old_ops": sum(old.values()), "new_ops": sum(new.values()), "differ": diff}
    print(f"m={elems:8d} {row['dtype']:8s} forecast={forecast!s:5s}: old {row['old_ops']} torch operations, new "
          f"{row['new_ops']}; differing counts (old, new): {diff or 'none'}", flush=True)
    return row


def kernels(repeats: int, device: str = "cpu") -> None:
    """The subtraction of core/recorder.py's CONVERT_FIRST choice, side by side: bfloat16 rows − a float32 δ by type
    promotion inside the kernel, converted to float32 first, and bfloat16 − bfloat16 (the old, rounded one)."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(8, 1 << 20, generator=g).bfloat16().to(device)
    d = torch.randn(1 << 20, generator=g).bfloat16().to(device)
    df = d.float()
    variants = {"promote_in_kernel": lambda: rows - df, "convert_first": lambda: rows.float().sub_(df),
                "bf16_minus_bf16": lambda: rows - d}
    t = {k: [] for k in variants}
    for _ in range(repeats):
        for k, fn in variants.items():
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if device != "cpu":
                torch.cuda.synchronize()
            t[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in t.items()}
    print(f"{device}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items()) +
          f"; promote/convert {med['promote_in_kernel'] / med['convert_first']:.2f}, "
          f"promote/bf16 {med['promote_in_kernel'] / med['bf16_minus_bf16']:.2f}")


def main(argv=None):
    ap = BenchParser("gcache.bench.recorder", __doc__)
    ap.add_argument("--against", help="git revision whose core/ is the baseline")
    ap.add_argument("--kernels", action="store_true", help="only time the subtraction variants (CONVERT_FIRST)")
    ap.add_argument("--steps", type=whole(2), default=16)
    ap.add_argument("--elems", type=whole(64), nargs="+", default=[1 << 16, 1 << 20])
    ap.add_argument("--repeats", type=whole(1), default=7)
    ap.add_argument("--threads", type=whole(1), default=1)
    ap.add_argument("--ops", action="store_true", help="count the torch operations of each recorder instead of timing")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.kernels:
        kernels(a.repeats, "cuda" if torch.cuda.is_available() else "cpu")
        return None
    if not a.against:
        ap.error("--against <git revision> is needed (or --kernels)")
    why = revision_problem(a.against)
    if why:
        ap.error(why)
    old = recorder_module_at(a.against)
    rows = []
    cases = sum(2 * (1 + (e <= 1 << 18)) for e in a.elems)
    progress = Progress(cases, "recorder: cases (elements, dtype, forecast)",
                        expected_s=sum(2e-6 * e * a.steps * a.repeats * 2 * 2 for e in a.elems))
    for elems in a.elems:
        for dtype in (torch.float32, torch.bfloat16):
            for forecast in (False, True):
                if forecast and elems > 1 << 18:
                    continue  # O(N³·m): the small size shows the ratio
                g = torch.Generator().manual_seed(0)
                ds = [torch.randn(1, elems // 64, 64, generator=g).to(dtype) for _ in range(a.steps)]
                hs = [torch.randn(1, elems // 64, 64, generator=g).to(dtype) for _ in range(a.steps)]
                variants = {"old": old, "new": current}
                if a.ops:
                    c = {k: op_counts(mod, a.steps, hs, ds, forecast) for k, mod in variants.items()}
                    rows.append(ops_row(elems, dtype, forecast, c["old"], c["new"]))
                    continue
                for mod in variants.values():  # warm-up
                    record_run(mod, a.steps, hs, ds, forecast)
                t = {k: [] for k in variants}
                order = list(variants)
                rng = random.Random(0)
                for _ in range(a.repeats):
                    rng.shuffle(order)
                    for k in order:
                        t[k].append(record_run(variants[k], a.steps, hs, ds, forecast))
                ratio = statistics.median(x / y for x, y in zip(t["new"], t["old"]))
                row = {"elems": elems, "dtype": str(dtype).replace("torch.", ""), "forecast": forecast,
                       "old_ms": round(statistics.median(t["old"]) * 1e3, 3),
                       "new_ms": round(statistics.median(t["new"]) * 1e3, 3),
                       "spread_new_ms": round((max(t["new"]) - min(t["new"])) * 1e3, 3),
                       "new_over_old": round(ratio, 3)}
                rows.append(row)
                progress.step(f"m={elems:8d} {row['dtype']:8s} forecast={forecast!s:5s}: old {row['old_ms']:8.3f} "
                              f"ms/step, new {row['new_ms']:8.3f} ms/step (spread {row['spread_new_ms']:.3f}), new/old "
                              f"{ratio:.3f}")
    out = {"against": a.against, "steps": a.steps, "threads": a.threads, "rows": rows}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.recorder"))
