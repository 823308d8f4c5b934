"""`pip install .` works: the wheel holds every module of the package (setup.py finds the packages; no list kept by
hand), the reference model's weights, and neither tests/ nor setup.py; installed into a fresh venv, every module that
does not need ComfyUI imports and the demo runs.

Offline throughout: the wheel is built by this interpreter's setuptools (--no-build-isolation --no-index) from a copy
of the files a clone has, and installed with --no-deps. What it needs at run time (torch, numpy, ...) comes from this
interpreter's site-packages, which a .pth file appends to the fresh venv's path: after the venv's own site-packages,
so `import gcache` finds the installed wheel, and without running the .pth files in those folders (such as an
editable install's finder, which would find the source tree instead).
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_IN_PACKAGE = ("tests/", "setup.py")  # in the repository's root folder, which is the package, but not shipped
# top-level modules of ComfyUI: nodes/ imports them at module level (only ComfyUI runs those modules)
COMFYUI_MODULES = {"comfy", "comfy_api", "comfy_execution", "comfy_extras", "folder_paths", "server", "nodes",
                   "execution", "latent_preview", "node_helpers"}


def pack_files() -> list[str]:
    """The files a clone has: tracked plus untracked-but-not-ignored. Without git: the tree minus build outputs
    (as tests/comfyui/install_helpers.pack_files)."""
    try:
        out = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True, timeout=60).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "__pycache__", ".pytest_cache", "build", "dist"}
        files = []
        for root, dirs, names in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
            files += [os.path.relpath(os.path.join(root, n), REPO) for n in names if not n.endswith(".pyc")]
    return sorted(f for f in files if os.path.isfile(os.path.join(REPO, f)))


def _run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the wheel's path, the copied source's files); the copy keeps build/ and *.egg-info out of the work tree."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    files = pack_files()
    for f in files:
        os.makedirs(os.path.dirname(src / f), exist_ok=True)
        shutil.copy2(os.path.join(REPO, f), src / f)
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index",
          "--disable-pip-version-check", "-q", "-w", str(dist)])
    wheels = sorted(dist.glob("comfyui_gcache-*.whl"))  # the distribution comfyui-gcache; its package is gcache
    assert len(wheels) == 1, wheels
    return wheels[0], files


def test_wheel_holds_every_module_and_the_weights_but_no_tests(built):
    wheel, files = built
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        shipped = [f for f in files if not f.startswith(NOT_IN_PACKAGE)]
        modules = {f"gcache/{f}" for f in shipped if f.endswith(".py")}
        weights = [f for f in shipped if f.startswith("reference_model/") and f.endswith(".safetensors")]
        assert "reference_model/tiny_dit_digits.safetensors" in weights
        assert "core/forecasters/__init__.py" in shipped  # the subpackage the hand-kept list once missed
        assert sorted(modules - names) == []
        for f in weights:  # byte for byte (not a Git LFS pointer, not truncated)
            with open(os.path.join(REPO, f), "rb") as fh:
                assert z.read(f"gcache/{f}") == fh.read()
    dist_info = {n.split("/")[0] for n in names if ".dist-info/" in n}
    assert len(dist_info) == 1
    assert all(n.startswith("gcache/") or n.split("/")[0] in dist_info for n in names)
    assert not [n for n in names if n.startswith(("gcache/tests/", "gcache/setup.py"))]


IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
import gcache
imported, comfy_only, failed = [], [], []
for m in pkgutil.walk_packages(gcache.__path__, "gcache.", onerror=lambda name: failed.append([name, "walk"])):
    try:
        importlib.import_module(m.name)
        imported.append(m.name)
    except ImportError as e:
        top = (getattr(e, "name", None) or "").split(".")[0]
        (comfy_only if top in set(sys.argv[1].split(",")) else failed).append([m.name, repr(e)])
print(json.dumps({"file": gcache.__file__, "imported": imported, "comfy_only": comfy_only, "failed": failed}))
"""


def test_installed_wheel_imports_and_runs_the_demo(built, tmp_path):
    wheel, files = built
    env_dir = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = str(env_dir / "bin" / "python")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "--disable-pip-version-check", "-q", str(wheel)])
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    ours |= {p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")}
    with open(os.path.join(site, "test-interpreter-packages.pth"), "w") as f:
        f.write("".join(f"{p}\n" for p in sorted(ours) if os.path.isdir(p)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["OMP_NUM_THREADS"] = "1"
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    res = json.loads(_run([python, "-c", IMPORT_ALL, ",".join(sorted(COMFYUI_MODULES))], cwd=run_dir,
                          env=env).stdout.splitlines()[-1])
    assert res["file"] == os.path.join(site, "gcache", "__init__.py")  # the wheel, not the source tree
    assert res["failed"] == []
    assert all(name.startswith("gcache.nodes.") for name, _ in res["comfy_only"]), res["comfy_only"]
    modules = {f"gcache.{f[:-3].replace('/', '.')}".removesuffix(".__init__") for f in files
               if f.endswith(".py") and not f.startswith(NOT_IN_PACKAGE) and f != "__init__.py"}
    assert modules == set(res["imported"]) | {name for name, _ in res["comfy_only"]}

    out = _run([python, "-m", "gcache.reference_model.demo", "--steps", "6", "--k", "3", "--profile-seeds", "1",
                "--eval-seeds", "1", "--repeats", "1", "--out", "demo"], cwd=run_dir, env=env).stdout
    assert "N = 6, K = 3" in out
    assert sorted(os.listdir(run_dir / "demo")) == ["grid.png", "policy.json", "profile.safetensors"]
