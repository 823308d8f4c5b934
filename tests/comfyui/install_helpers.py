"""GCache installed the way ComfyUI users install it (test helper for test_install.py; loopback only).

Imports neither gcache nor ComfyUI: the first phase of test_install.py runs in a venv that holds only ComfyUI's
own requirements, where gcache and its dependencies are not installed.
"""
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from comfy_server import _free_port, _get, _post  # noqa: F401  (loopback HTTP helpers; no gcache, no ComfyUI)
from conftest import COMFY

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PACK_NAME = "ComfyUI-GCache-install"  # the folder name a clone would get: not a valid module name, on purpose
GCACHE_NODES = ("GCacheApply", "GCacheProfile", "GCachePolicy", "GCacheSearch", "GCacheLoadProfile")
# what requirements.txt adds to ComfyUI's own requirements and the search imports lazily: import name -> pip name
OPTIONAL = {"sklearn": "scikit-learn", "skimage": "scikit-image", "lpips": "lpips"}
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", "build", "demo_out", "out", "search_out"}


def missing_optional() -> list[str]:
    """The pip names of GCache's optional packages that this Python (the server's: sys.executable) lacks."""
    return [pip for mod, pip in OPTIONAL.items() if importlib.util.find_spec(mod) is None]


def pack_files(repo: str = REPO) -> list[str]:
    """The files a `git clone` of the repository has: tracked plus untracked-but-not-ignored (what the next
    commit holds), minus files deleted in the work tree. Without git: the tree minus build and cache folders."""
    try:
        out = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True, timeout=60).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = []
        for root, dirs, names in os.walk(repo):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            files += [os.path.relpath(os.path.join(root, n), repo) for n in names if not n.endswith(".pyc")]
    return sorted({f for f in files if os.path.isfile(os.path.join(repo, f))})


def copy_pack(dest, repo: str = REPO) -> list[str]:
    files = pack_files(repo)
    for f in files:
        os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
        shutil.copy2(os.path.join(repo, f), os.path.join(dest, f))
    return files


@contextlib.contextmanager
def installed_server(base):
    """A ComfyUI server (--cpu, free loopback port, --base-directory `base`) whose custom_nodes/ holds a copy of
    the repository as a clone has it, under PACK_NAME, and the test-only pack (tiny Flux, conditioning, VAE)."""
    nodes = base / "custom_nodes"
    nodes.mkdir()
    copy_pack(nodes / PACK_NAME)
    os.symlink(os.path.join(HERE, "gcache_test_pack"), nodes / "gcache_test_pack")
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    log_path = base / "server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                             "--base-directory", str(base), "--disable-auto-launch"],
                            cwd=COMFY, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    info = None
    try:
        for _ in range(480):
            if proc.poll() is not None:
                break
            try:
                info = _get(url + "/object_info")
                break
            except OSError:
                time.sleep(0.5)
        if proc.poll() is not None or info is None:
            pytest.fail("ComfyUI did not start: " + log_path.read_text()[-3000:])
        yield {"url": url, "info": info, "base": base, "log": log_path, "pack": nodes / PACK_NAME}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def queue(server, prompt: dict, polls: int = 1200) -> dict:
    """Queue `prompt`, wait until it finishes (success or error), return its /history entry."""
    pid = _post(server["url"] + "/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})["prompt_id"]
    for _ in range(polls):
        h = _get(f"{server['url']}/history/{pid}")
        if pid in h and h[pid].get("status", {}).get("completed") is not None:
            return h[pid]
        time.sleep(0.5)
    pytest.fail("prompt did not finish: " + server["log"].read_text()[-3000:])


def execution_error(entry: dict):
    """ComfyUI's execution_error message of a finished prompt (node_type, exception_message, exception_type,
    traceback, ...): what the frontend shows the user; None if the prompt had none."""
    for event, data in entry.get("status", {}).get("messages", []):
        if event == "execution_error":
            return data
    return None


def describe(entry: dict) -> str:
    """A finished prompt's status for an assertion message: the error without the (large) node inputs."""
    status = entry.get("status", {})
    err = execution_error(entry)
    if err is None:
        return json.dumps(status)[-3000:]
    keep = {k: err.get(k) for k in ("node_type", "exception_type", "exception_message")}
    return json.dumps(dict(keep, status=status.get("status_str"), traceback="".join(err.get("traceback", []))[-2000:]))


def search_prompt(objective: str, policy_name: str = "install_test") -> dict:
    """GCache Search on the test pack's tiny Flux (6 steps, K = 3, 1 seed, the minimum budget 20), its plot
    previewed (the output that makes ComfyUI run it)."""
    return {
        "1": {"class_type": "GCacheTestTinyFlux", "inputs": {"seed": 0}},
        "2": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 1}},
        "3": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 2}},
        "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {"class_type": "GCacheTestVAE", "inputs": {}},
        "6": {"class_type": "GCacheSearch", "inputs": {
            "model": ["1", 0], "positive": ["2", 0], "negative": ["3", 0], "latent": ["4", 0], "vae": ["5", 0],
            "seed": 0, "seeds": 1, "steps": 6, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple", "k": 3,
            "budget": 20, "degree": 3, "objective": objective, "policy_name": policy_name}},
        "7": {"class_type": "PreviewImage", "inputs": {"images": ["6", 1]}},
    }
