"""Every bench/ command answers a bad argument, a docs placeholder or a missing requirement before any work: exit code
2, one line on stderr that says what to do, no traceback, nothing on stdout, nothing written (bench/cli.py).

Each case runs the command as a user does (a subprocess, `python -m ...`, in a folder of its own, with a temporary
folder of its own that must be empty afterwards)."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = "gcache.bench."
# (id, module, arguments, extra environment, what stderr must say, modules that cannot be imported in that run)
CASES = [
    ("engine-repeats", B + "engine", ["--repeats", "-3"], {}, ["--repeats", "-3 is below 1"], ()),
    ("engine-not-a-number", B + "engine", ["--batch", "x"], {}, ["'x' is not a whole number"], ()),
    ("few-steps", B + "few_steps", ["--steps", "1"], {}, ["--steps", "below 2"], ()),
    ("few-steps-io-share", B + "few_steps", ["--io-share", "1.5"], {}, ["--io-share", "outside"], ()),
    ("auto-error-models", B + "auto_error_models", ["--eval-seeds", "5-3"], {}, ["names no seed"], ()),
    ("auto-ranking-ks", B + "auto_ranking", ["--ks", "3", "20"], {}, ["--ks 3 20", "below the 20 steps"], ()),
    ("auto-ranking-forecaster", B + "auto_ranking", ["--forecasters", "cubic"], {}, ["--forecasters cubic"], ()),
    ("auto-ranking-comfyui", B + "auto_ranking", ["--models", "wan"], {"COMFYUI_PATH": ""}, ["COMFYUI_PATH is not set"],
     ()),
    ("auto-seeds-ks", B + "auto_seeds", ["--ks", "4", "20"], {}, ["--ks 4 20", "below the 20 steps"], ()),
    ("auto-seeds-io-share", B + "auto_seeds", ["--io-share", "2"], {}, ["--io-share", "outside"], ()),
    ("auto-seeds-comfyui", B + "auto_seeds", [], {"COMFYUI_PATH": ""}, ["COMFYUI_PATH is not set"], ()),
    ("quality", B + "quality", ["--budget", "0"], {}, ["--budget"], ()),
    ("quality-objective", B + "quality", ["--objective", "lpips"], {}, ["invalid choice: 'lpips'"], ()),
    ("forecaster-check", B + "forecaster_check", ["--ks", "40"], {}, ["--ks 40", "below --steps 30"], ()),
    ("fresh-choice", B + "fresh_choice", ["--seed-sets", "x"], {}, ["--seed-sets", "must look like"], ()),
    ("polish-guard", B + "polish_guard", ["--gp-seeds", "x"], {}, ["--gp-seeds", "must look like"], ()),
    ("polish-ceiling", B + "polish_ceiling", ["--climb", "-1"], {}, ["--climb"], ()),
    ("polish-split", B + "polish_split", ["--shares", "2"], {}, ["--shares", "outside [0, 1]"], ()),
    ("l2p-keeps", B + "l2p_keeps", ["--k", "30"], {}, ["below --steps 30"], ()),
    ("cluster-k", B + "cluster", ["--k", "40"], {}, ["--k 40", "below --steps 30"], ()),
    ("cluster-no-ray", B + "cluster", [], {}, ["needs ray", '.venv/bin/pip install -e ".[cluster]"'], ("ray",)),
    ("cluster-budget", B + "cluster", ["--budget", "5"], {}, ["minimum useful budget"], ()),
    ("recorder-revision", B + "recorder", ["--against", "no-such-revision"], {}, ["--against no-such-revision"], ()),
    ("recorder-nothing", B + "recorder", [], {}, ["--against <git revision> is needed"], ()),
    ("route-quality-placeholder", B + "route_quality", [], {"COMFYUI_PATH": "/path/to/ComfyUI"},
     ["COMFYUI_PATH=/path/to/ComfyUI is the docs' placeholder"], ()),
    ("route-quality-unset", B + "route_quality", [], {"COMFYUI_PATH": ""}, ["COMFYUI_PATH is not set"], ()),
    ("route-quality-missing", B + "route_quality", [], {"COMFYUI_PATH": "no/such/folder"}, ["does not exist"], ()),
    ("selfcheck-margins-unset", B + "selfcheck_margins", [], {"COMFYUI_PATH": ""}, ["COMFYUI_PATH is not set"], ()),
    ("selfcheck-margins-family", B + "selfcheck_margins", ["--families", "sdxl"], {"COMFYUI_PATH": ""},
     ["invalid choice: 'sdxl'"], ()),
    ("choice-regret-seeds", B + "choice_regret", ["--gp-seeds", "x"], {}, ["--gp-seeds must look like"], ()),
    ("selfcheck-cost-steps", B + "selfcheck_cost", ["--steps", "2"], {"COMFYUI_PATH": ""}, ["--steps", "2 is below 3"],
     ()),
    ("selfcheck-cost-placeholder", B + "selfcheck_cost", [], {"COMFYUI_PATH": "/path/to/ComfyUI"},
     ["COMFYUI_PATH=/path/to/ComfyUI is the docs' placeholder"], ()),
    ("composition-placeholder", B + "composition", [], {"COMFYUI_PATH": "/path/to/ComfyUI"},
     ["COMFYUI_PATH=/path/to/ComfyUI is the docs' placeholder"], ()),
    ("composition-unset", B + "composition", [], {"COMFYUI_PATH": ""}, ["COMFYUI_PATH is not set"], ()),
    ("composition-not-comfyui", B + "composition", [], {"COMFYUI_PATH": "."}, ["is no ComfyUI folder"], ()),
    ("composition-family", B + "composition", ["--families", "sd15"], {"COMFYUI_PATH": ""},
     ["invalid choice: 'sd15'"], ()),
    ("speedup-prediction-placeholder", B + "speedup_prediction", [], {"COMFYUI_PATH": "/path/to/ComfyUI"},
     ["is the docs' placeholder"], ()),
    ("speedup-prediction-not-comfyui", B + "speedup_prediction", [], {"COMFYUI_PATH": "."}, ["is no ComfyUI folder"],
     ()),
    ("speedup-prediction-reruns", B + "speedup_prediction", ["--reruns", "0"], {"COMFYUI_PATH": ""}, ["--reruns"], ()),
    ("peers-placeholder", B + "peers", [], {"COMFYUI_PATH": "/path/to/ComfyUI"},
     ["COMFYUI_PATH=/path/to/ComfyUI is the docs' placeholder"], ()),
    ("peers-targets", B + "peers", ["--targets", "2", "1"], {"COMFYUI_PATH": ""}, ["--targets 2 1", "above 1"], ()),
    ("trained-figures-few-steps", B + "trained_figures", ["--few-steps", "8", "1"], {"COMFYUI_PATH": ""},
     ["--few-steps", "1 is below 2"], ()),
    ("trained-figures-placeholder", B + "trained_figures", [], {"COMFYUI_PATH": "/path/to/ComfyUI"},
     ["COMFYUI_PATH=/path/to/ComfyUI is the docs' placeholder"], ()),
    ("speed-steps", B + "speed", ["--steps", "3"], {}, ["--steps", "below 6"], ()),
    ("speed-no-gpu", B + "speed", ["--device", "cuda"], {}, ["sees no CUDA GPU"], ()),
    ("dp-speed", B + "dp_speed", ["--repeats", "0"], {}, ["--repeats"], ()),
    ("runs-unknown", B + "runs", ["no_such_run"], {}, ["no run named no_such_run"], ()),
    ("runs-import", B + "runs", ["--import", "gpu_check", "no/such/folder"], {}, ["holds no speed.jsonl"], ()),
    ("render-docs", B + "render_docs", ["--no-such-flag"], {}, ["unrecognized arguments: --no-such-flag"], ()),
]


def run_in_process(case, tmp_path, monkeypatch, capsys):
    """main(args) of the case's module, in this process (as `python -m` runs it, through run_main): (exit code,
    stdout, stderr)."""
    import importlib

    from gcache.bench.cli import run_main
    name, module, args, env, _, blocked = case
    for k, v in env.items():
        if v:
            monkeypatch.setenv(k, v)
        else:
            monkeypatch.delenv(k, raising=False)
    for m in blocked:
        monkeypatch.setitem(sys.modules, m, None)
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    main = importlib.import_module(module).main
    try:
        code = run_main(lambda: main(list(args)), module)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    assert os.listdir(folder) == [] and os.listdir(tmp) == [], "the command wrote files"
    return code, out.out, out.err


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_bad_command_ends_in_one_line_before_any_work(case, tmp_path, monkeypatch, capsys):
    name, module, _, _, says, _ = case
    code, out, err = run_in_process(case, tmp_path, monkeypatch, capsys)
    lines = err.splitlines()
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert lines[0].startswith(f"python -m {module}: error: "), lines[0]
    for text in says:
        assert text in lines[0], lines[0]
    assert out == ""


AS_A_USER = ["engine-repeats", "route-quality-placeholder", "cluster-no-ray", "speed-no-gpu"]


def command(module, args, blocked):
    if blocked:  # those modules behave as not installed (sys.modules[name] = None)
        code = ("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
                + f"from {module} import main\nfrom gcache.bench.cli import run_main\n"
                f"sys.exit(run_main(main, {module!r}))\n")
        return [sys.executable, "-c", code, *args]
    return [sys.executable, "-m", module, *args]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """A few cases as a user runs them (a subprocess, in a folder of its own, with a temporary folder of its own),
    two at a time: case id -> (result, the folder's entries afterwards, the temporary folder's)."""
    def one(case):
        name, module, args, env, _, blocked = case
        folder, tmp = tmp_path_factory.mktemp(name), tmp_path_factory.mktemp(name + "-tmp")
        run_env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp), **env)
        if run_env.get("COMFYUI_PATH") == "":
            run_env.pop("COMFYUI_PATH")
        res = subprocess.run(command(module, args, blocked), cwd=folder, env=run_env, capture_output=True, text=True,
                             timeout=300)
        return name, (res, sorted(os.listdir(folder)), sorted(os.listdir(tmp)))
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, [c for c in CASES if c[0] in AS_A_USER]))


@pytest.mark.parametrize("name", AS_A_USER)
def test_as_a_user_runs_it(name, outcomes):
    case = next(c for c in CASES if c[0] == name)
    res, left, tmp_left = outcomes[name]
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert lines[0].startswith(f"python -m {case[1]}: error: ") and all(t in lines[0] for t in case[4]), lines[0]
    assert res.stdout == "" and left == [] and tmp_left == []


def test_every_bench_command_has_a_case():
    """A new bench/ script gets a case here (a module with a main() and a __main__ guard)."""
    scripts = {f[:-3] for f in os.listdir(os.path.join(REPO, "bench")) if f.endswith(".py")
               and "def main(" in open(os.path.join(REPO, "bench", f), encoding="utf-8").read()}
    assert scripts - {c[1][len(B):] for c in CASES} == set()


def test_gpu_check_without_a_gpu_says_so_and_leaves_nothing(tmp_path):
    """bash bench/gpu_check.sh on a machine whose torch sees no GPU: one line, exit 2, no output folder, and its
    temporary folder (made only after the checks, removed on exit) is not left behind."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    env = dict(os.environ, TMPDIR=str(tmp), OUT=str(out), PYTHON=sys.executable)
    res = subprocess.run(["bash", os.path.join(REPO, "bench", "gpu_check.sh")], env=env, capture_output=True,
                         text=True, timeout=300)
    if res.returncode == 0:
        pytest.skip("this machine has a CUDA GPU: the check ran")
    assert res.returncode == 2 and res.stderr.splitlines() == [
        f"bash bench/gpu_check.sh: error: {sys.executable}'s torch sees no CUDA GPU: run this on the GPU machine"]
    assert not out.exists() and os.listdir(tmp) == []
    env["PYTHON"] = os.path.join(str(tmp_path), "no-such-python")
    res = subprocess.run(["bash", os.path.join(REPO, "bench", "gpu_check.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "cannot import torch" in res.stderr and len(res.stderr.splitlines()) == 1


def test_composition_stops_on_another_comfyui_version(tmp_path, monkeypatch, capsys):
    """bench/runs.py stores a composition result per ComfyUI version: `--comfyui V` on a tree of another version (or
    of none) ends in one line before any work."""
    from gcache.bench.cli import run_main
    from gcache.bench.composition import main
    tree = tmp_path / "ComfyUI"
    (tree / "comfy").mkdir(parents=True)
    (tree / "main.py").write_text("")
    (tree / "nodes.py").write_text("")
    monkeypatch.setenv("COMFYUI_PATH", str(tree))
    said = []
    for version_file in ('__version__ = "0.3.64"\n', None):
        if version_file:
            (tree / "comfyui_version.py").write_text("# generated\n" + version_file)
        else:
            (tree / "comfyui_version.py").unlink()
        try:
            code = run_main(lambda: main(["--comfyui", "0.33.0"]), "gcache.bench.composition")
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and len(err.splitlines()) == 1 and "--comfyui 0.33.0" in err, err
        said.append(err)
    assert "holds ComfyUI 0.3.64" in said[0] and "of no known version" in said[1]
