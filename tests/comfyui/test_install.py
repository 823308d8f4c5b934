"""GCache installed as ComfyUI users install it, in a real ComfyUI server (loopback only).

ComfyUI-Manager ("Install via Git URL", the Comfy Registry) and comfy-cli (`comfy node install`) clone the pack
into custom_nodes/ and run `pip install -r requirements.txt` in ComfyUI's Python; a plain `git clone` installs
nothing. The server gets a throwaway --base-directory whose custom_nodes/ holds a copy of this repository's files
(as a clone has them; install_helpers.pack_files) under ComfyUI-GCache-install, and the test-only pack.

Two phases, chosen by what the running Python (the server's) has; each skips the other with its reason, so the
file runs in any venv with ComfyUI's requirements, pytest and requests:
- bare (only ComfyUI's requirements; scikit-learn / scikit-image / lpips missing): every node loads, and GCache
  Search stops at once with a message naming the missing packages and the pip command, no traceback text;
- requirements (after `pip install -r requirements.txt`): the bundled Flux workflow runs with an empty
  models/gcache (GCache Apply's (auto) writes its profile and policy), and GCache Search runs.

It never imports gcache: in the bare phase neither gcache nor its dependencies are installed.
"""
import json
import os

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

from install_helpers import (  # noqa: E402
    GCACHE_NODES,
    PACK_NAME,
    REPO,
    describe,
    execution_error,
    installed_server,
    missing_optional,
    queue,
    search_prompt,
)
from test_server import to_api, with_tiny_models  # noqa: E402  (imports no gcache)

MISSING = missing_optional()
BARE = pytest.mark.skipif(not MISSING, reason="bare phase: scikit-learn, scikit-image and lpips are all installed "
                                              "in this Python (run it in a venv with only ComfyUI's requirements)")
WITH_REQUIREMENTS = pytest.mark.skipif(bool(MISSING), reason=f"requirements phase: {', '.join(MISSING)} not "
                                                             "installed (pip install -r requirements.txt first)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with installed_server(tmp_path_factory.mktemp("comfy_install_base")) as srv:
        yield srv


def _gcache_folder(server):
    return server["base"] / "models" / "gcache"


def test_the_copied_pack_loads_every_node(server):
    log = server["log"].read_text()
    assert (server["pack"] / "requirements.txt").is_file() and (server["pack"] / "__init__.py").is_file()
    assert not [line for line in log.splitlines() if "IMPORT FAILED" in line and PACK_NAME in line], log[-3000:]
    for node in GCACHE_NODES:
        assert node in server["info"], f"{node} not in /object_info; server log:\n{log[-3000:]}"
        assert server["info"][node]["category"] == "GCache"


@BARE
def test_without_requirements_search_names_the_missing_packages_and_the_pip_command(server):
    entry = queue(server, search_prompt("lpips_ssim"))  # the objective that needs all three
    assert entry["status"]["status_str"] == "error", describe(entry)
    err = execution_error(entry)
    assert err and err["node_type"] == "GCacheSearch", describe(entry)
    msg, typ = err["exception_message"], err["exception_type"]
    assert "Traceback" not in msg and "ModuleNotFoundError" not in msg and "ImportError" not in msg, msg
    assert not typ.endswith(("ModuleNotFoundError", "ImportError")), (typ, msg)
    for pip_name in MISSING:
        assert pip_name in msg, f"{pip_name} is missing but the message does not name it: {msg}"
    assert "pip install -r" in msg, msg
    assert os.path.join(PACK_NAME, "requirements.txt") in msg, f"not this pack's requirements.txt: {msg}"
    folder = _gcache_folder(server)
    made = sorted(os.listdir(folder)) if folder.is_dir() else []
    assert not made, f"the search sampled before it checked its packages: {made}"


@WITH_REQUIREMENTS
def test_with_requirements_the_bundled_flux_workflow_runs_with_no_files(server):
    folder = _gcache_folder(server)
    assert not folder.exists() or not os.listdir(folder), "a fresh install has no GCache files"
    data = json.load(open(os.path.join(REPO, "workflows", "flux_t2i_gcache_apply.json")))
    prompt = with_tiny_models(to_api(data, server["info"]), "flux")
    apply = [n for n in prompt.values() if n["class_type"] == "GCacheApply"]
    assert len(apply) == 1 and apply[0]["inputs"]["policy_file"] == "(auto)", apply
    entry = queue(server, prompt)
    assert entry["status"]["status_str"] == "success", describe(entry)
    made = sorted(os.listdir(folder))
    assert any(f.startswith("auto_") and f.endswith(".json") for f in made), made
    assert any(f.startswith("auto_") and f.endswith(".profile.safetensors") for f in made), made


@WITH_REQUIREMENTS
def test_with_requirements_search_runs(server):
    entry = queue(server, search_prompt("ssim", policy_name="install_search"))  # ssim: no AlexNet download
    assert entry["status"]["status_str"] == "success", describe(entry)
    assert (_gcache_folder(server) / "install_search.json").is_file()
