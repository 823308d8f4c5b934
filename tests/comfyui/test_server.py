"""GCache in a running ComfyUI server (loopback only): node list, bundled workflows, queued runs.

The server gets a throwaway --base-directory whose custom_nodes/ holds this repository under the name
ComfyUI-GCache (so the package's relative imports are exercised under a foreign name) and a test-only node
pack (tiny Flux, random conditioning).
"""
import json
import os
import time
import uuid

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FRONTEND_ONLY = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}
FILE_COMBOS = {"unet_name", "clip_name", "clip_name1", "clip_name2", "vae_name", "policy_file", "profile"}
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}

from comfy_server import _get, _post, comfy_server  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with comfy_server(tmp_path_factory.mktemp("comfy_base")) as srv:
        yield srv


def test_nodes_listed_in_one_category_with_tooltips(server):
    info = server["info"]
    for node in ("GCacheApply", "GCacheProfile", "GCacheSearch", "GCacheLoadProfile"):
        assert node in info, server["log"].read_text()[-3000:]
        d = info[node]
        assert d["category"] == "GCache"
        for group in ("required", "optional"):
            for name, spec in d["input"].get(group, {}).items():
                assert spec[1].get("tooltip"), f"{node}.{name} has no tooltip"
    assert info["GCacheSearch"]["output"] == ["GCACHE_POLICY", "IMAGE"]
    assert info["GCacheLoadProfile"]["output"] == ["GCACHE_PROFILE", "IMAGE"]


def _widgets(spec: dict) -> list[tuple[str, str, dict]]:
    out = []
    for group in ("required", "optional"):
        for name in spec["input_order"].get(group, []):
            t, opts = spec["input"][group][name][0], (spec["input"][group][name] + [{}])[1]
            kind = "COMBO" if isinstance(t, list) else t
            if kind in WIDGET_TYPES:
                out.append((name, kind, dict(opts, options=t if isinstance(t, list) else opts.get("options"))))
                if kind == "INT" and opts.get("control_after_generate"):
                    out.append((name + ":control", "CONTROL", {}))
    return out


@pytest.mark.parametrize("wf", sorted(f for f in os.listdir(os.path.join(REPO, "workflows")) if f.endswith(".json")))
def test_bundled_workflow_matches_object_info(server, wf):
    info = server["info"]
    data = json.load(open(os.path.join(REPO, "workflows", wf)))
    ids = {n["id"] for n in data["nodes"]}
    for link in data["links"]:
        assert link[1] in ids and link[3] in ids
    for node in data["nodes"]:
        if node["type"] in FRONTEND_ONLY:
            continue
        assert node["type"] in info, f"{wf}: missing node type {node['type']}"
        widgets = _widgets(info[node["type"]])
        values = node.get("widgets_values", [])
        assert len(values) == len(widgets), \
            f"{wf}: {node['type']} has {len(values)} widget values, needs {len(widgets)}"
        for (name, kind, o), v in zip(widgets, values):
            where = f"{wf}: {node['type']}.{name} = {v!r}"
            if kind == "CONTROL":
                assert v in ("fixed", "increment", "decrement", "randomize"), where
            elif kind == "COMBO" and name not in FILE_COMBOS:
                assert v in o["options"], where
            elif kind in ("INT", "FLOAT"):
                assert isinstance(v, (int, float)) and not isinstance(v, bool), where
                assert o.get("min", v) <= v <= o.get("max", v), where
            elif kind == "BOOLEAN":
                assert isinstance(v, bool), where
            elif kind == "STRING":
                assert isinstance(v, str), where
        link_inputs = [i["name"] for i in node.get("inputs", []) if "widget" not in i]
        sockets = [n for g in ("required", "optional") for n in info[node["type"]]["input_order"].get(g, [])
                   if n not in {w[0] for w in widgets}]
        assert set(link_inputs) <= set(sockets), f"{wf}: {node['type']} inputs {link_inputs} vs {sockets}"


def _run(server, prompt):
    pid = _post(server["url"] + "/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})["prompt_id"]
    for _ in range(600):
        h = _get(f"{server['url']}/history/{pid}")
        if pid in h and h[pid].get("status", {}).get("completed") is not None:
            st = h[pid]["status"]
            errors = [m[1] for m in st.get("messages", []) if m[0] == "execution_error"]
            assert st["status_str"] == "success", "; ".join(
                f"{e.get('node_type')}: {e.get('exception_type')}: {e.get('exception_message')} "
                f"{''.join(e.get('traceback') or [])[-1500:]}" for e in errors) or json.dumps(st)[-2000:]
            return h[pid]
        time.sleep(0.5)
    pytest.fail("prompt did not finish: " + server["log"].read_text()[-3000:])


def test_profile_accumulates_queued_runs_once_each_then_apply_uses_the_policy(server):
    prompt = {
        "1": {"class_type": "GCacheTestTinyFlux", "inputs": {"seed": 0}},
        "2": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 1}},
        "3": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 2}},
        "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {"class_type": "GCacheProfile", "inputs": {"model": ["1", 0], "profile_name": "tiny_flux",
                                                         "history_device": "cpu"}},
        "6": {"class_type": "KSampler", "inputs": {"model": ["5", 0], "seed": 3, "steps": 6, "cfg": 2.0,
                                                   "sampler_name": "euler", "scheduler": "simple",
                                                   "positive": ["2", 0], "negative": ["3", 0],
                                                   "latent_image": ["4", 0], "denoise": 1.0}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": "gcache_test"}},
    }
    from safetensors import safe_open
    path = server["base"] / "models" / "gcache" / "tiny_flux.profile.safetensors"
    # The same prompt twice: Profile is not served from ComfyUI's cache (it samples again) but recognises the
    # identical run (seed, conditioning, latent) and does not count it twice; another seed is a new sample.
    for seed, runs in ((3, 1), (3, 1), (4, 2)):
        prompt["6"]["inputs"]["seed"] = seed
        _run(server, prompt)
        with safe_open(str(path), "pt") as f:
            meta = json.loads(f.metadata()["meta"])
            assert meta["runs"] == runs and int(f.metadata()["count"]) == 2 * runs  # cond + uncond branches
    assert server["log"].read_text().count("is already in tiny_flux.profile.safetensors") == 1
    os.makedirs(server["base"] / "models" / "gcache", exist_ok=True)
    pol = {"format": "gcache.policy", "version": 1, "mask": [1, 0, 1, 0, 1, 0]}
    (server["base"] / "models" / "gcache" / "tiny.json").write_text(json.dumps(pol))
    prompt["5"] = {"class_type": "GCacheApply", "inputs": {"model": ["1", 0], "policy_file": "tiny.json",
                                                           "cache_device": "model device", "step_mismatch": "remap"}}
    _run(server, prompt)
    assert "GCache: computed 3/6 steps, skipped 3" in server["log"].read_text()


def _post_status(url, data) -> tuple[int, dict]:
    """POST that returns ComfyUI's answer whatever its status (a refused prompt says why per node)."""
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, json.dumps(data).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_an_unknown_combo_value_is_reported_once_under_its_own_input(server):
    """An unknown cache_device was once reported twice, the second time under step_mismatch: ComfyUI reports a
    validate_inputs message under every input that function takes."""
    prompt = {
        "1": {"class_type": "GCacheTestTinyFlux", "inputs": {"seed": 0}},
        "2": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 1}},
        "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {"class_type": "GCacheApply", "inputs": {"model": ["1", 0], "policy_file": "(auto)",
                                                       "cache_device": "gpu", "step_mismatch": "remap"}},
        "6": {"class_type": "KSampler", "inputs": {"model": ["5", 0], "seed": 3, "steps": 6, "cfg": 1.0,
                                                   "sampler_name": "euler", "scheduler": "simple",
                                                   "positive": ["2", 0], "negative": ["2", 0],
                                                   "latent_image": ["4", 0], "denoise": 1.0}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": "bad_combo"}},
    }
    version = _get(server["url"] + "/system_stats")["system"]["comfyui_version"]
    code, body = _post_status(server["url"] + "/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    if tuple(int(v) for v in version.split(".")[:2]) >= (0, 33):  # ComfyUI checks combo values at validation
        assert code == 400, body
        errors = [e for node in body["node_errors"].values() for e in node["errors"]]
        assert [e["extra_info"]["input_name"] for e in errors] == ["cache_device"], errors
        reports = [e["details"] for e in errors]
    else:  # 0.3.64 does not check V3 combo values: GCache Apply refuses it when it runs, before any sampling
        assert code == 200, body
        pid = body["prompt_id"]
        for _ in range(600):
            h = _get(f"{server['url']}/history/{pid}").get(pid)
            if h and h.get("status", {}).get("completed") is not None:
                break
            time.sleep(0.5)
        reports = [m[1]["exception_message"] for m in h["status"]["messages"] if m[0] == "execution_error"]
        assert len(reports) == 1 and reports[0].startswith("cache_device must be one of"), h["status"]
        assert not (server["base"] / "output" / "bad_combo_00001_.latent").exists()
    assert not any("step_mismatch" in r for r in reports), reports


# ------------------------------------------------------------------------------ bundled workflows, queued
# The tiny stand-ins for the workflows' loaders and encoders, and smaller sizes and budgets so they run in seconds.
TINY_COND = {"flux": {"tokens": 6, "dim": 32, "pooled": 24}, "wan": {"tokens": 8, "dim": 4096, "pooled": 0}}
SHRINK = {"EmptySD3LatentImage": {"width": 64, "height": 64, "batch_size": 1},
          "EmptyHunyuanLatentVideo": {"width": 64, "height": 64, "length": 5, "batch_size": 1},
          "KSampler": {"steps": 6},
          "GCacheSearch": {"steps": 6, "k": 3, "seeds": 1, "budget": 32, "objective": "ssim", "mode": "foreground"}}


def to_api(wf: dict, info: dict) -> dict:
    """A workflow in ComfyUI's UI format → its API prompt (what the frontend's "Save (API)" writes)."""
    nodes = {n["id"]: n for n in wf["nodes"] if n.get("mode", 0) == 0 and n["type"] not in FRONTEND_ONLY}
    links = {link[0]: link for link in wf["links"]}
    prompt = {}
    for nid, n in nodes.items():
        inputs = {name: v for (name, kind, _), v in zip(_widgets(info[n["type"]]), n.get("widgets_values", []))
                  if kind != "CONTROL"}
        for i in n.get("inputs", []):
            if i.get("link") is not None and links[i["link"]][1] in nodes:
                inputs[i["name"]] = [str(links[i["link"]][1]), links[i["link"]][2]]
        prompt[str(nid)] = {"class_type": n["type"], "inputs": inputs}
    return prompt


def with_tiny_models(prompt: dict, family: str) -> dict:
    out = {}
    for nid, node in prompt.items():
        kind, inputs = node["class_type"], dict(node["inputs"])
        if kind in ("DualCLIPLoader", "CLIPLoader"):
            continue  # only the text encoders used them
        if kind == "UNETLoader":
            kind, inputs = {"flux": "GCacheTestTinyFlux", "wan": "GCacheTestTinyWan"}[family], {"seed": 0}
        elif kind == "VAELoader":
            kind, inputs = "GCacheTestVAE", {}
        elif kind == "CLIPTextEncode":
            kind, inputs = "GCacheTestCond", dict(TINY_COND[family], seed=int(nid))
        inputs.update(SHRINK.get(kind, {}))
        out[nid] = {"class_type": kind, "inputs": inputs}
    return out


@pytest.mark.parametrize("wf", sorted(f for f in os.listdir(os.path.join(REPO, "workflows")) if f.endswith(".json")))
def test_bundled_workflow_runs_with_no_gcache_files(server, wf):
    import shutil
    folder = server["base"] / "models" / "gcache"
    shutil.rmtree(folder, ignore_errors=True)  # zero pre-made files: nothing from earlier tests either
    data = json.load(open(os.path.join(REPO, "workflows", wf)))
    assert not [n["id"] for n in data["nodes"] if n.get("mode", 0) != 0], f"{wf} ships muted or bypassed nodes"
    prompt = with_tiny_models(to_api(data, server["info"]), "wan" if "wan" in wf else "flux")
    _run(server, prompt)
    made = sorted(os.listdir(folder))
    if any(n["class_type"] == "GCacheApply" and n["inputs"].get("policy_file") == "(auto)"
           and "policy" not in n["inputs"] for n in prompt.values()):
        assert any(f.startswith("auto_") and f.endswith(".json") for f in made), made  # auto made its policy


# ------------------------------------------------------------------------------ expert inputs, errors in the browser
EXPERT = {"GCacheApply": {"cache_device", "step_mismatch", "forecast", "policy_json"},
          "GCacheSearch": {"degree", "forecast", "mode", "slice_seconds"},
          "GCacheProfile": {"history_device"}, "GCachePolicy": {"method", "bernstein_s", "error_model"},
          "GCacheLoadProfile": set()}


def test_expert_inputs_are_marked_advanced_where_comfyui_supports_it(server):
    """ComfyUI's frontend folds inputs marked advanced under "Show advanced" (0.33: EasyCache marks 4 of its 5); the
    basic path (Apply's policy_file and auto_speedup, Search's sampling inputs, K and budget) stays visible."""
    info = server["info"]
    marked = {node: {name for g in ("required", "optional") for name, spec in info[node]["input"].get(g, {}).items()
                     if (spec + [{}])[1].get("advanced")} for node in EXPERT}
    easycache = [spec for spec in info["EasyCache"]["input"]["required"].values() if (spec + [{}])[1].get("advanced")]
    if not easycache:  # 0.3.64: its inputs take no `advanced`; GCache passes none there
        assert marked == {node: set() for node in EXPERT}
        pytest.skip("this ComfyUI marks no input advanced (EasyCache has none): nothing to fold")
    assert marked == EXPERT
    assert {"model", "policy_file", "auto_speedup", "policy"} <= set(info["GCacheApply"]["input_order"]["required"] +
                                                                     info["GCacheApply"]["input_order"]["optional"])
    assert not {"policy_file", "auto_speedup", "k", "budget", "steps", "seed", "policy_name"} & \
        (marked["GCacheApply"] | marked["GCacheSearch"])


def _error_of(server, prompt) -> str:
    """The message of the one execution error a prompt ends with, as ComfyUI sends it to the browser."""
    pid = _post(server["url"] + "/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})["prompt_id"]
    for _ in range(600):
        h = _get(f"{server['url']}/history/{pid}").get(pid)
        if h and h.get("status", {}).get("completed") is not None:
            errors = [m[1] for m in h["status"]["messages"] if m[0] == "execution_error"]
            assert len(errors) == 1, h["status"]
            return errors[0]["exception_message"]
        time.sleep(0.5)
    pytest.fail("prompt did not finish: " + server["log"].read_text()[-3000:])


def _lock(folder, on: bool) -> None:
    """A folder nothing can be written in, for real: immutable for root (whom modes don't stop), else by mode."""
    import subprocess
    if os.geteuid() == 0:
        r = subprocess.run(["chattr", "+i" if on else "-i", str(folder)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"chattr is not allowed here ({r.stderr.strip()}): no read-only folder for root")
    else:
        os.chmod(folder, 0o555 if on else 0o755)


def test_an_error_in_the_browser_cuts_a_long_name_and_names_no_server_path(server):
    from test_background_search import search_prompt
    prompt = search_prompt("p" * 5000, "foreground")
    msg = _error_of(server, prompt)
    assert msg.startswith("The policy name '" + "p" * 78 + "… cannot be used as a file name"), msg
    assert len(msg) < 400
    folder = server["base"] / "models" / "gcache"
    folder.mkdir(parents=True, exist_ok=True)
    profile = {"1": {"class_type": "GCacheTestTinyFlux", "inputs": {"seed": 0}},
               "5": {"class_type": "GCacheProfile", "inputs": {"model": ["1", 0], "profile_name": "locked",
                                                                "history_device": "cpu"}},
               "6": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 1}},
               "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
               "7": {"class_type": "KSampler", "inputs": {"model": ["5", 0], "seed": 3, "steps": 6, "cfg": 1.0,
                                                          "sampler_name": "euler", "scheduler": "simple",
                                                          "positive": ["6", 0], "negative": ["6", 0],
                                                          "latent_image": ["4", 0], "denoise": 1.0}},
               "8": {"class_type": "SaveLatent", "inputs": {"samples": ["7", 0], "filename_prefix": "locked"}}}
    _lock(folder, True)
    try:
        msg = _error_of(server, profile)
    finally:
        _lock(folder, False)
    assert msg.startswith("GCache Profile can't add runs to locked.profile.safetensors: the gcache folder "
                          "models/gcache can't be written ("), msg
    assert str(server["base"]) not in msg and "/tmp" not in msg
