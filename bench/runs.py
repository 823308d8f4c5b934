"""The bench runs whose figures the docs quote: each one's command, what its figures depend on, how long it takes and
what it needs; and the command that runs them and stores their results in bench/results/<name>.json.

    python -m gcache.bench.runs                    # every run: fresh, stale or missing, its command and duration
    python -m gcache.bench.runs few_steps demo     # run these and store their results
    python -m gcache.bench.runs --stale            # what is stale or missing, why, and its estimated minutes
    python -m gcache.bench.runs --refresh          # rerun every stale run this machine can run (the rest are listed)
    python -m gcache.bench.runs --fast             # the runs CI repeats (deterministic, under a minute each)
    python -m gcache.bench.runs --import gpu_check DIR [--commit C]   # bench/gpu_check.sh's output folder

Then `python -m gcache.bench.render_docs` writes the figures into README.md and docs/.

A run executes its command as a user does (`python -m <module> <args>`, a subprocess, in a temporary folder that is
removed afterwards, one thread per pool), prints its output as it comes, and stores what it returned: the JSON line
every bench ends with, or for the demo and the headless search what they wrote and printed. Kinds:
- deterministic: the figures depend on the code only (PSNR, masks); CI repeats the `fast` ones and compares;
- timing: speed figures of the machine that ran them (the date and machine are stored beside them);
- and what a run needs beyond README's venv: `comfyui` (COMFYUI_PATH), `ray` (the cluster extra), `gpu`.
"""
from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional

from . import store
from .cli import BenchParser, one_line

# What the figures depend on (bench/store.py hashes the code of these files; folders: every .py file in them)
REFERENCE = ("reference_model/model.py", "reference_model/sampler.py", "reference_model/harness.py",
             "reference_model/tiny_dit_digits.safetensors")
CODE = ("core", "search")
QUALITY = CODE + REFERENCE
# ComfyUI's runs: the tree and venv docs/development.md sets up beside the clone
COMFYUI_ENV, COMFYUI_PYTHON = (("COMFYUI_PATH", "../comfyui-0.33.0"),), "../venv-0.33.0/bin/python"
# the oldest ComfyUI CI tests, made the same way (docs/development.md: the same steps without the torchaudio line)
COMFYUI_0364_ENV, COMFYUI_0364_PYTHON = (("COMFYUI_PATH", "../comfyui-0.3.64"),), "../venv-0.3.64/bin/python"
# What GCache Apply with a connected policy runs, and the other nodes as the composition tests apply them
COMPOSITION = ("bench/composition.py", "tests/comfyui/composition_cases.py", "tests/comfyui/tiny_models.py",
               "nodes/patching", "nodes/apply_node.py", "nodes/modes/apply.py", "nodes/modes/base.py",
               "core/engine.py", "core/policy.py", "core/forecasters")
# What the self-check's margins depend on: the check, the patches it replays through, the tiny models
SELFCHECK = ("bench/selfcheck_margins.py", "core", "nodes/patching", "nodes/modes", "tests/comfyui/tiny_models.py",
             "tests/comfyui/tiny_image_models.py", "tests/comfyui/tiny_video_models.py",
             "tests/comfyui/tiny_image_models_033.py", "tests/comfyui/tiny_video_models_033.py")
PEERS = ("bench/peers.py", "bench/peers_compare.py", "comfy_models", "comfy_models/flux_tiny.safetensors",
         "comfy_models/wan_tiny.safetensors", "core", "search", "nodes")
# bench/auto_ranking.py on the trained models: reuse, linear and fitted on 35 or more masks a K (random ones coincide)
RANKING_COMFY = ("--random", "36", "--per-label", "2", "--forecasters", "reuse", "linear", "fitted", "--ks", "3", "4",
                 "5", "6", "8")  # at least 100 (mask, forecaster) pairs per K
RANKING_SOURCES = ("bench/auto_ranking.py", "bench/peers.py", "comfy_models", "comfy_models/flux_tiny.safetensors",
                   "comfy_models/wan_tiny.safetensors", "core", "search", "nodes")
SPEED = ("bench/speed.py", "bench/speed_harness.py", "bench/speed_models.py", "bench/speed_comfy.py", "core",
         "search/baselines.py")


@dataclass(frozen=True)
class Run:
    name: str
    module: str
    args: tuple = ()
    sources: tuple = ()
    minutes: float = 1.0     # on one CPU core (the GPU run: on one H100-class card)
    kind: str = "deterministic"  # or "timing"
    needs: str = ""          # "", "comfyui", "ray", "gpu"
    fast: bool = False       # CI repeats it and compares (deterministic, under a minute)
    collect: str = "json"    # how the result is read: "json" (last stdout line), "demo", "search", "gpu_check"
    env: tuple = ()          # (name, value as the docs write it) pairs set before the command
    python: str = ".venv/bin/python"  # README's venv; ComfyUI's runs: the venv docs/development.md makes for it

    def command(self) -> str:
        """The command as the docs print it."""
        prefix = "".join(f"{k}={v} " for k, v in self.env)
        if self.module.endswith(".sh"):
            return f"{prefix}bash {self.module}"
        return f"{prefix}{self.python} -m {self.module}" + "".join(f" {shlex.quote(a)}" for a in self.args)


RUNS = {r.name: r for r in (
    Run("few_steps", "gcache.bench.few_steps", ("--io-share", "0.05"),
        ("bench/few_steps.py",) + QUALITY, minutes=1.0, fast=True),
    Run("memory_formula", "gcache.bench.speed", ("--memory-formula",), ("bench/speed_harness.py", "bench/speed.py",
                                                                       "bench/speed_models.py", "core/profile.py"),
        minutes=0.1, fast=True),
    Run("demo", "gcache.reference_model.demo", (), ("reference_model/demo.py",) + QUALITY, minutes=0.3,
        fast=True, collect="demo"),
    Run("search_excerpt", "gcache.reference_model.search",
        ("--steps", "30", "--k", "10", "--budget", "64", "--objective", "ssim", "--out", "search_out"),
        ("reference_model/search.py",) + QUALITY, minutes=0.6, fast=True, collect="search"),
    Run("dp_speed", "gcache.bench.dp_speed", (), ("bench/dp_speed.py",) + CODE, minutes=0.2, kind="timing"),
    Run("engine", "gcache.bench.engine", ("--repeats", "15"), ("bench/engine.py",) + CODE + REFERENCE, minutes=3,
        kind="timing"),
    Run("speed_quick", "gcache.bench.speed", ("--quick",), SPEED, minutes=2, kind="timing"),
    Run("gpu_check", "bench/gpu_check.sh", (), ("bench/gpu_check.sh",) + SPEED, minutes=5, kind="timing",
        needs="gpu", collect="gpu_check"),
    Run("quality_quick", "gcache.bench.quality", ("--quick",), ("bench/quality.py", "bench/rivals.py") + QUALITY,
        minutes=20),
    Run("quality_64", "gcache.bench.quality", ("--quick", "--budget", "64", "--gp-seeds", "0"),
        ("bench/quality.py", "bench/rivals.py") + QUALITY, minutes=14),
    Run("auto_error_models", "gcache.bench.auto_error_models", (), ("bench/auto_error_models.py", "bench/quality.py")
        + QUALITY, minutes=6),
    Run("auto_ranking", "gcache.bench.auto_ranking", ("--random", "20"), ("bench/auto_ranking.py",) + QUALITY,
        minutes=5),
    Run("auto_ranking_flux", "gcache.bench.auto_ranking",
        RANKING_COMFY + ("--models", "flux"), RANKING_SOURCES, minutes=25, needs="comfyui", env=COMFYUI_ENV,
        python=COMFYUI_PYTHON),
    Run("auto_ranking_wan", "gcache.bench.auto_ranking", RANKING_COMFY + ("--models", "wan"), RANKING_SOURCES,
        minutes=20, needs="comfyui", env=COMFYUI_ENV, python=COMFYUI_PYTHON),
    Run("auto_seeds_wan", "gcache.bench.auto_seeds", ("--model", "wan", "--runs", "8", "--own-alpha"),
        ("bench/auto_seeds.py",) + RANKING_SOURCES, minutes=20, needs="comfyui", env=COMFYUI_ENV,
        python=COMFYUI_PYTHON),
    Run("auto_seeds_flux", "gcache.bench.auto_seeds", ("--model", "flux", "--runs", "8", "--own-alpha"),
        ("bench/auto_seeds.py",) + RANKING_SOURCES, minutes=20, needs="comfyui", env=COMFYUI_ENV,
        python=COMFYUI_PYTHON),
    Run("l2p_keeps", "gcache.bench.l2p_keeps", (), ("bench/l2p_keeps.py", "bench/rivals.py") + QUALITY, minutes=2),
    Run("forecaster_check", "gcache.bench.forecaster_check", (), ("bench/forecaster_check.py",
                                                                 "bench/search_setup.py") + QUALITY, minutes=8),
    Run("fresh_choice", "gcache.bench.fresh_choice", (), ("bench/fresh_choice.py", "bench/search_setup.py")
        + QUALITY, minutes=30),
    Run("polish_guard_48", "gcache.bench.polish_guard", (), ("bench/polish_guard.py", "bench/search_setup.py")
        + QUALITY, minutes=10),
    Run("polish_guard_64", "gcache.bench.polish_guard", ("--budget", "64"), ("bench/polish_guard.py",
                                                                            "bench/search_setup.py") + QUALITY,
        minutes=14),
    Run("cluster_64", "gcache.bench.cluster", (), ("bench/cluster.py", "reference_model/cluster.py") + QUALITY,
        minutes=15, kind="timing", needs="ray"),
    Run("cluster_48", "gcache.bench.cluster", ("--budget", "48"), ("bench/cluster.py", "reference_model/cluster.py")
        + QUALITY, minutes=12, kind="timing", needs="ray"),
    Run("route_quality", "gcache.bench.route_quality", (), ("bench/route_quality.py", "core", "search", "nodes",
                                                           "tests/comfyui/tiny_image_models_033.py"),
        minutes=4, needs="comfyui", env=COMFYUI_ENV, python=COMFYUI_PYTHON),
    Run("selfcheck_margins", "gcache.bench.selfcheck_margins", (), SELFCHECK, minutes=6, needs="comfyui",
        env=COMFYUI_ENV, python=COMFYUI_PYTHON),
    Run("selfcheck_margins_0.3.64", "gcache.bench.selfcheck_margins", (), SELFCHECK, minutes=4, needs="comfyui",
        env=COMFYUI_0364_ENV, python=COMFYUI_0364_PYTHON),
    Run("composition", "gcache.bench.composition", ("--comfyui", "0.33.0"), COMPOSITION, minutes=0.5,
        needs="comfyui", env=COMFYUI_ENV, python=COMFYUI_PYTHON),
    Run("composition_0.3.64", "gcache.bench.composition", ("--comfyui", "0.3.64"), COMPOSITION, minutes=0.5,
        needs="comfyui", env=COMFYUI_0364_ENV, python=COMFYUI_0364_PYTHON),
    Run("speedup_prediction", "gcache.bench.speedup_prediction", (), ("bench/speedup_prediction.py", "core", "search",
                                                                     "nodes", "tests/comfyui/tiny_models.py")
        + REFERENCE, minutes=25, kind="timing", needs="comfyui", env=COMFYUI_ENV, python=COMFYUI_PYTHON),
    # auto's K rests on its measured io share, and wall clock is beside every row: a timing run
    # 63 min each on a 2-core machine shared with other work (both at once); --search-budget 64 adds GCache Search's
    # rows (about as long again)
    Run("peers", "gcache.bench.peers", (), PEERS, minutes=65, kind="timing", needs="comfyui", env=COMFYUI_ENV,
        python=COMFYUI_PYTHON),
    Run("peers_0.3.64", "gcache.bench.peers", (), PEERS, minutes=65, kind="timing", needs="comfyui",
        env=COMFYUI_0364_ENV, python=COMFYUI_0364_PYTHON),
    # predicted against measured speed-up is wall clock: a timing run
    Run("trained_figures", "gcache.bench.trained_figures", (),
        ("bench/trained_figures.py", "bench/peers.py", "comfy_models", "comfy_models/flux_tiny.safetensors",
         "comfy_models/wan_tiny.safetensors", "core", "search", "nodes"),
        minutes=2, kind="timing", needs="comfyui", env=COMFYUI_ENV, python=COMFYUI_PYTHON),
)}

NEEDS = {"comfyui": "the ComfyUI tree and venv its command names, as docs/development.md sets them up beside the "
                    "clone (COMFYUI_PATH set; run with that venv's python)",
         "ray": "the cluster extra: .venv/bin/pip install -e \".[cluster]\"",
         "gpu": "a CUDA GPU (bash bench/gpu_check.sh on the GPU machine, then --import gpu_check DIR here)"}


def missing_need(run: Run) -> Optional[str]:
    """What this machine lacks for the run (None: nothing)."""
    if run.needs == "comfyui":
        from .cli import comfyui_problem
        default = dict(run.env).get("COMFYUI_PATH")
        path = os.environ.get("COMFYUI_PATH") or (default and os.path.normpath(os.path.join(store.REPO, default)))
        python = os.path.normpath(os.path.join(store.REPO, run.python))
        return comfyui_problem(path) or (None if os.path.exists(python) else
                                         f"{run.python} does not exist: {NEEDS['comfyui']}")
    if run.needs == "ray":
        import importlib.util
        return None if importlib.util.find_spec("ray") else f"Ray is not installed: {NEEDS['ray']}"
    if run.needs == "gpu":
        return f"it runs on a GPU: {NEEDS['gpu']}"
    return None


# ---------------------------------------------------------------------------------------------- running a command
def execute(run: Run, echo=sys.stdout, python: Optional[str] = None) -> tuple[dict, list, float]:
    """Run the command in a temporary folder: (the result, the stdout lines, seconds). Raises RuntimeError when the
    command fails. `python`: the interpreter to run it with instead of the one the command names (this one for
    README's venv, else the run's own, relative to the clone)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in run.env:  # the environment's own value, else the docs' (a path beside the clone)
        env.setdefault(k, os.path.normpath(os.path.join(store.REPO, v)))
    if python is None:
        python = sys.executable
    if run.python != Run.python and python == sys.executable:  # ComfyUI's venv, as docs/development.md makes it
        python = os.path.normpath(os.path.join(store.REPO, run.python))
        if not os.path.exists(python):
            raise RuntimeError(f"{run.name} runs with {run.python}, which does not exist: {NEEDS.get(run.needs, '')}")
    folder = tempfile.mkdtemp(prefix=f"gcache-run-{run.name}-")
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen([python, "-m", run.module, *run.args], cwd=folder, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if echo is not None:
                print(line, end="", file=echo, flush=True)
        rc = proc.wait()
        seconds = time.monotonic() - t0
        if rc != 0:
            raise RuntimeError(f"{run.command()} exited with {rc}: " + " | ".join(lines[-3:]))
        return COLLECTORS[run.collect](run, lines, folder), lines, seconds
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def last_json(lines: list) -> dict:
    for line in reversed(lines):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("the command printed no JSON line")


def collect_json(run: Run, lines: list, folder: str) -> dict:
    return last_json(lines)


def collect_demo(run: Run, lines: list, folder: str) -> dict:
    """What the demo wrote (its policy's metrics and mask) and printed."""
    out = os.path.join(folder, "demo_out")
    with open(os.path.join(out, "policy.json"), encoding="utf-8") as f:
        pol = json.load(f)
    return {"policy": pol, "stdout": lines}


def collect_search(run: Run, lines: list, folder: str) -> dict:
    """What the headless search wrote (its policy) and printed from its summary on."""
    out = os.path.join(folder, run.args[run.args.index("--out") + 1])
    policy = glob.glob(os.path.join(out, "policy_*.json"))
    with open(policy[0], encoding="utf-8") as f:
        pol = json.load(f)
    start = next(i for i, line in enumerate(lines) if line.startswith("GCache search "))
    return {"policy": pol, "stdout": lines[start:]}


def collect_gpu_check(run: Run, lines: list, folder: str) -> dict:
    raise RuntimeError("the GPU check runs on a GPU machine: `bash bench/gpu_check.sh` there, then "
                       "`python -m gcache.bench.runs --import gpu_check <its output folder>` here")


def gpu_check_result(folder: str) -> dict:
    """bench/gpu_check.sh's output folder (machine.txt, speed.jsonl) as a result."""
    with open(os.path.join(folder, "machine.txt"), encoding="utf-8") as f:
        machine = [line.strip() for line in f if line.strip()]
    models = []
    with open(os.path.join(folder, "speed.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                models += json.loads(line)["models"]
    summary = []
    if os.path.exists(os.path.join(folder, "summary.txt")):
        with open(os.path.join(folder, "summary.txt"), encoding="utf-8") as f:
            summary = [line.strip() for line in f if line.strip() and not line.startswith("{")]
    return {"machine": machine, "models": models, "summary": summary,
            "folder": os.path.relpath(os.path.realpath(folder), os.path.realpath(store.REPO))}


COLLECTORS: dict[str, Callable] = {"json": collect_json, "demo": collect_demo, "search": collect_search,
                                    "gpu_check": collect_gpu_check}


def run_and_store(run: Run, python: Optional[str] = None) -> str:
    result, lines, seconds = execute(run, python=python)
    return store.write(run.name, run.command(), result, run.sources, wall_s=seconds,
                       # relative to the clone: an absolute path names this machine, and results are committed
                       extra={"python": os.path.relpath(python, store.REPO)} if python else None)


# ------------------------------------------------------------------------------------------- what CI compares
def deterministic_part(run: Run, result: dict):
    """The part of a result that depends on the code only (what CI's rerun compares)."""
    if run.collect == "demo":
        m = result["policy"]["metrics"]
        return {"mask": result["policy"]["mask"], "psnr": m["psnr"], "ssim": m["ssim"]}
    if run.collect == "search":
        p = result["policy"]
        return {"mask": p["mask"], "loss": p["metrics"]["loss"], "psnr": p["metrics"]["eval_psnr"],
                "ssim": p["metrics"]["eval_ssim"], "won": p["provenance"]["won"]}
    return result


def differences(stored, fresh, path: str = "", tol: float = 0.015) -> list[str]:
    """Where two results differ (numbers within tol of each other count as equal)."""
    if isinstance(stored, dict) and isinstance(fresh, dict):
        out = [f"{path}.{k}: only in the stored result" for k in stored if k not in fresh]
        out += [f"{path}.{k}: only in the fresh result" for k in fresh if k not in stored]
        for k in stored:
            if k in fresh:
                out += differences(stored[k], fresh[k], f"{path}.{k}", tol)
        return out
    if isinstance(stored, list) and isinstance(fresh, list):
        if len(stored) != len(fresh):
            return [f"{path}: {len(stored)} entries stored, {len(fresh)} now"]
        return [d for i, (a, b) in enumerate(zip(stored, fresh)) for d in differences(a, b, f"{path}[{i}]", tol)]
    if isinstance(stored, (int, float)) and isinstance(fresh, (int, float)) and not isinstance(stored, bool):
        if abs(stored - fresh) <= tol:  # figures are stored rounded (PSNR to 0.01 dB): a last digit may differ
            return []
    elif stored == fresh:
        return []
    return [f"{path}: stored {stored!r}, now {fresh!r}"]


# ---------------------------------------------------------------------------------------------- the command
def status(run: Run) -> str:
    if not os.path.exists(store.result_path(run.name)):
        return "missing"
    why = store.staleness(store.load(run.name), run.sources)
    return "fresh" if why is None else "stale"


def stale_listing() -> str:
    """Every stale or missing run: why, its estimated minutes, whether this machine can run it; and the total."""
    rows, total = [], 0.0
    for run in RUNS.values():
        if not os.path.exists(store.result_path(run.name)):
            why = "no stored result"
        else:
            why = store.staleness(store.load(run.name), run.sources)
            if why is None:
                continue
        lack = missing_need(run)
        total += 0 if lack else run.minutes
        rows.append(f"{run.name:<20} ~{run.minutes:g} min  {why}" + (f"\n    not here: {lack}" if lack else ""))
    if not rows:
        return "every stored result is fresh"
    return "\n".join(rows + [f"{len(rows)} stale or missing; about {total:g} min to refresh what this machine can "
                             "run: .venv/bin/python -m gcache.bench.runs --refresh"])


def listing() -> str:
    rows = []
    for run in RUNS.values():
        needs = f", needs {run.needs}" if run.needs else ""
        rows.append(f"{run.name:<20} {status(run):<8} ~{run.minutes:g} min{needs}, "
                    f"{run.kind}{', CI' if run.fast else ''}\n    {run.command()}")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = BenchParser("gcache.bench.runs", __doc__)
    ap.add_argument("names", nargs="*", help="runs to execute and store (default: list them)")
    ap.add_argument("--stale", action="store_true", help="list the stale or missing runs, why, and their minutes")
    ap.add_argument("--refresh", action="store_true", help="rerun every stale or missing run this machine can run")
    ap.add_argument("--fast", action="store_true", help="the runs CI repeats")
    ap.add_argument("--import", dest="import_", nargs=2, metavar=("NAME", "FOLDER"),
                    help="store the output folder of a run made elsewhere (gpu_check)")
    ap.add_argument("--commit", help="with --import: the git commit the run was made at (its sources are hashed "
                                     "as they were there)")
    ap.add_argument("--python", help="run the named runs with this Python instead of the one their command names "
                                     "(ComfyUI's venv kept elsewhere than docs/development.md puts it)")
    a = ap.parse_args(argv)
    unknown = [n for n in a.names if n not in RUNS]
    if unknown:
        ap.error(f"no run named {', '.join(unknown)}; the runs are {', '.join(RUNS)}")
    if a.import_:
        name, folder = a.import_
        if name not in RUNS or RUNS[name].collect != "gpu_check":
            ap.error(f"--import takes gpu_check, not {name}")
        if not os.path.isfile(os.path.join(folder, "speed.jsonl")):
            ap.error(f"{folder} holds no speed.jsonl: name the folder bench/gpu_check.sh wrote ($OUT or gpu_check_out)")
        if a.commit and store.git("rev-parse", "--verify", f"{a.commit}^{{commit}}") is None:
            ap.error(f"--commit {a.commit} is no commit of this repository")
        run, result = RUNS[name], gpu_check_result(folder)
        made = {"date": result["machine"][0],
                "machine": {"gpu": result["machine"][1:2], "software": result["machine"][2:]}}
        print(store.write(name, run.command(), result, run.sources, commit=a.commit, extra=made))
        return 0
    if a.stale:
        print(stale_listing())
        return 0
    if not (a.names or a.refresh or a.fast):
        print(listing())
        return 0
    todo = [RUNS[n] for n in a.names] or [r for r in RUNS.values() if (r.fast if a.fast else status(r) != "fresh")]
    skipped, failed = [], []
    runnable = []
    for run in todo:
        lack = None if a.python and run.needs == "comfyui" and os.environ.get("COMFYUI_PATH") else missing_need(run)
        if lack:
            skipped.append(f"{run.name}: {lack}")
        else:
            runnable.append(run)
    t0, left = time.monotonic(), sum(r.minutes for r in runnable)
    for i, run in enumerate(runnable, 1):
        print(f"== [{i}/{len(runnable)}] {run.name} (about {run.minutes:g} min; {(time.monotonic() - t0) / 60:.1f} min "
              f"elapsed, about {left:g} min left): {run.command()}", flush=True)
        left -= run.minutes
        try:
            print(f"stored {run_and_store(run, a.python)}", flush=True)
        except RuntimeError as e:
            failed.append(f"{run.name}: {one_line(e)}")
    for line in skipped:
        print(f"not run here: {line}")
    for line in failed:
        print(f"failed: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
