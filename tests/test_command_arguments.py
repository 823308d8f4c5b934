"""The demo, search and cluster commands check their arguments before any model loads or any sampling starts.

Each case runs the command as a user does (a subprocess, `python -m ...`, in a folder of its own) and wants: exit
code 2, exactly one line on stderr, `<prog>: error: ...` naming every problem given, no traceback, and the folder
exactly as it was (no profile, no output folder). LPIPS' backbone can never be found or downloaded here: TORCH_HOME
names a folder whose checkpoints/ is a file, so a download fails before it reaches the network.
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from gcache.core.errors import GCacheError
from gcache.search.infra import cli

DEMO, SEARCH, CLUSTER = "gcache.reference_model.demo", "gcache.reference_model.search", "gcache.reference_model.cluster"
# (id, module, arguments, what stderr must say, what it must not say, modules that cannot be imported in that run)
CASES = [
    ("demo-k-above-steps", DEMO, ["--k", "40"], ["K = 40", "between 1 and 30"], [], ()),
    ("demo-out-is-a-file", DEMO, ["--out", "afile.txt"], ["--out afile.txt is a file"], [], ()),
    ("demo-several", DEMO, ["--k", "0", "--profile-seeds", "0", "--eval-seeds", "0", "--repeats", "0", "--cfg", "nan",
                            "--out", "afile.txt/sub"],
     ["K = 0", "--profile-seeds 0", "--eval-seeds 0", "--repeats 0", "--cfg nan",
      "--out afile.txt/sub cannot be made", "afile.txt is a file"], [], ()),
    ("demo-out-not-writable", DEMO, ["--out", "locked/sub"], ["cannot be written"], [], ()),
    ("demo-not-a-number", DEMO, ["--k", "abc"], ["argument --k: invalid int value: 'abc'"], ["usage"], ()),
    ("search-k-before-lpips", SEARCH, ["--k", "40"], ["K = 40"], ["LPIPS"], ()),
    ("search-k-equals-steps", SEARCH, ["--k", "30"], ["K = 30 computes every one of the 30 steps"], ["LPIPS"], ()),
    ("search-forecast-unknown", SEARCH, ["--forecast", "cubic"], ["argument --forecast: invalid choice: 'cubic'"],
     ["usage"], ()),
    ("search-fitted-budget", SEARCH, ["--forecast", "fitted", "--budget", "31", "--objective", "ssim"],
     ["minimum useful budget is 32"], ["LPIPS"], ()),
    ("search-several", SEARCH, ["--steps", "1", "--budget", "3", "--search-seeds", "abc", "--eval-seeds", "5-3",
                                "--seed", "-1", "--out", "afile.txt"],
     ["--steps 1", "minimum useful budget", "--search-seeds must look like", "--eval-seeds '5-3' names no seed",
      "--seed -1", "--out afile.txt is a file"], ["LPIPS"], ()),
    ("search-seeds-overlap", SEARCH, ["--search-seeds", "0-3", "--eval-seeds", "2-5"], ["overlap (seeds 2, 3)"],
     ["LPIPS"], ()),
    ("search-lpips-backbone-missing", SEARCH, [], ["LPIPS needs", "cannot be written", "'ssim' or 'psnr'"], [], ()),
    ("search-lpips-package-missing", SEARCH, ["--k", "10"], ["needs lpips", "-m pip install lpips"], [], ("lpips",)),
    ("cluster-several", CLUSTER, ["--k", "40", "--workers", "0", "--search-seeds", "x", "--out", "afile.txt"],
     ["K = 40", "--workers 0", "--search-seeds must look like", "--out afile.txt is a file"], ["Ray"], ()),
    ("cluster-k-equals-steps", CLUSTER, ["--k", "30", "--eval-seeds", "1000"],
     ["K = 30 computes every one of the 30 steps", "--search-seeds and --eval-seeds overlap"], ["Ray"], ()),
    ("cluster-ray-and-lpips-backbone-missing", CLUSTER, ["--objective", "lpips_ssim"],
     ["needs Ray", "-m pip install ray==2.60.0", "cluster extra of comfyui-gcache", "LPIPS needs"], [], ("ray",)),
    ("cluster-comfyui-files-missing", CLUSTER,
     ["--comfyui", "http://127.0.0.1:9", "--workflow", "none.json", "--profile", "none.profile.safetensors",
      "--k", "3"],
     ["Can't read the workflow none.json", "none.profile.safetensors"], [], ()),
]


def snapshot(folder) -> list:
    """Every path under folder with its size and modification time."""
    out = []
    for root, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            st = os.lstat(os.path.join(root, name))
            out.append((os.path.relpath(os.path.join(root, name), folder), st.st_size, st.st_mtime_ns))
    return sorted(out)


@pytest.fixture(scope="module")
def torch_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("torch_home")
    (home / "hub").mkdir()
    (home / "hub" / "checkpoints").write_text("a file where torch.hub's checkpoint folder would be")
    return home


def run(module, args, cwd, torch_home, unimportable=()):
    """The command as a user runs it; `unimportable` modules behave as not installed (sys.modules[name] = None)."""
    if unimportable:
        blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in unimportable)
        command = [sys.executable, "-c", f"import sys; {blocked}; from {module} import main; sys.exit(main())", *args]
    else:
        command = [sys.executable, "-m", module, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_HOME=str(torch_home))
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


CAN_LOCK = os.geteuid() != 0  # root writes any folder: test_out_folder_checks covers that message instead


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, torch_home):
    """Every case run once, two at a time (most of each run is importing torch; CI has 2 cores): case id ->
    (result, the case's folder before, after)."""
    def one(case):
        name, module, args, _, _, unimportable = case
        folder = tmp_path_factory.mktemp(name)
        (folder / "afile.txt").write_text("a file, not a folder")
        (folder / "locked").mkdir(mode=0o500)
        before = snapshot(folder)
        res = run(module, args, folder, torch_home, unimportable)
        return name, (res, before, snapshot(folder))
    todo = [c for c in CASES if CAN_LOCK or c[0] != "demo-out-not-writable"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, todo))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_arguments_end_in_one_line_before_any_work(case, outcomes):
    name, module, args, says, never, unimportable = case
    if name == "demo-out-not-writable" and not CAN_LOCK:
        pytest.skip("root writes any folder; test_out_folder_checks covers the message")
    res, before, after = outcomes[name]
    lines = res.stderr.splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"python -m {module}: error: "), lines[0]
    for text in says:
        assert text in lines[0], lines[0]
    for text in never:
        assert text not in lines[0], lines[0]
    assert res.stdout == ""
    assert after == before  # no profile, no output folder


def test_an_error_during_the_run_is_one_line_too(tmp_path, torch_home):
    """Arguments that pass: the search profiles the reference model, then finds its state file damaged (a
    GCacheError of the run) and says so in one line, leaving the file as it was."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "search_state_N4_K2.json").write_text("{not json")
    before = snapshot(tmp_path)
    res = run(SEARCH, ["--steps", "4", "--k", "2", "--budget", "8", "--degree", "1", "--objective", "psnr",
                       "--search-seeds", "100", "--eval-seeds", "0", "--out", "out"], tmp_path, torch_home)
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"python -m {SEARCH}: error: The search state ") and "damaged" in lines[0]
    assert snapshot(tmp_path) == before


def test_out_folder_checks(tmp_path, monkeypatch):
    """check_out_folder makes nothing; a folder it may not write (here os.access says so: tests may run as root) is
    refused whether it exists or would be made in it."""
    cli.check_out_folder(str(tmp_path / "new" / "deeper"))
    assert not (tmp_path / "new").exists()
    monkeypatch.setattr(cli.os, "access", lambda path, mode: False)
    with pytest.raises(GCacheError, match="this folder cannot be written"):
        cli.check_out_folder(str(tmp_path))
    with pytest.raises(GCacheError, match=f"cannot be made: {tmp_path} cannot be written"):
        cli.check_out_folder(str(tmp_path / "new"))


@pytest.mark.parametrize("text, seeds", [("0-3", [0, 1, 2, 3]), ("7", [7]), ("1,5, 2", [1, 5, 2]), ("4-4", [4])])
def test_seed_lists(text, seeds):
    assert cli.parse_seeds(text) == seeds


@pytest.mark.parametrize("text, says", [("", "names no seed"), ("5-3", "names no seed"), ("1,1", "twice"),
                                        ("a-b", "must look like"), ("-3", "must look like"), ("1;2", "must look like")])
def test_bad_seed_lists(text, says):
    with pytest.raises(GCacheError, match=says):
        cli.parse_seeds(text, "--seeds")
