"""The scale-out search driving two real ComfyUI servers (CPU, tiny Flux) through their HTTP API: with the
thread-per-server pool, and with Ray actors (one per server) when the optional Ray extra is installed."""
import json

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

from comfy_server import _get, _post, comfy_server  # noqa: E402

from gcache.core.profile import Profile  # noqa: E402
from gcache.search.config import SearchConfig  # noqa: E402
from gcache.search.infra.comfyui_worker import ComfyUIWorker  # noqa: E402
from gcache.search.loop import run_batch_search  # noqa: E402

N = 6


def workflow(middle: dict) -> dict:
    """Tiny Flux → `middle` (GCache Apply or Profile, node "5") → KSampler → decode → SaveImage, API format."""
    return {
        "1": {"class_type": "GCacheTestTinyFlux", "inputs": {"seed": 0}},
        "2": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 1}},
        "3": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 2}},
        "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": middle,
        "6": {"class_type": "KSampler", "inputs": {"model": ["5", 0], "seed": 0, "steps": N, "cfg": 2.0,
                                                   "sampler_name": "euler", "scheduler": "simple",
                                                   "positive": ["2", 0], "negative": ["3", 0],
                                                   "latent_image": ["4", 0], "denoise": 1.0}},
        "7": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["8", 0]}},
        "8": {"class_type": "GCacheTestVAE", "inputs": {}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["7", 0], "filename_prefix": "gcache_eval"}},
    }


APPLY_WF = workflow({"class_type": "GCacheApply", "inputs": {
    "model": ["1", 0], "policy_file": "(auto)", "cache_device": "model device", "step_mismatch": "remap",
    "policy_json": ""}})


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two ComfyUI servers and a profile of the reference runs, recorded by GCache Profile on the first."""
    with comfy_server(tmp_path_factory.mktemp("node_a")) as a, comfy_server(tmp_path_factory.mktemp("node_b")) as b:
        prof_wf = workflow({"class_type": "GCacheProfile", "inputs": {"model": ["1", 0], "profile_name": "tiny",
                                                                      "history_device": "model device"}})
        for seed in (0, 1):
            prof_wf["6"]["inputs"]["seed"] = seed
            pid = _post(a["url"] + "/prompt", {"prompt": prof_wf})["prompt_id"]
            for _ in range(600):
                if _get(f"{a['url']}/history/{pid}").get(pid, {}).get("status", {}).get("completed"):
                    break
                __import__("time").sleep(0.2)
            else:
                pytest.fail(f"The profiling run (seed {seed}) did not complete within 120 s on {a['url']}; "
                            f"its log ends: {a['log'].read_text()[-2000:]}")
        profile = Profile.load(str(a["base"] / "models" / "gcache" / "tiny.profile.safetensors"))
        assert profile.n_steps == N
        yield a, b, profile


def _search_and_check(servers, ex, logged: str):
    a, b, profile = servers
    before = [srv["log"].read_text().count(logged) for srv in (a, b)]
    try:
        res = run_batch_search(profile, SearchConfig(k=3, degree=1, budget=9, objective="ssim"), ex, q=2,
                                  provenance={"seeds": [0, 1]})
    finally:
        ex.close()
    assert res.state.done and len(res.history) == 9 and res.policy.n_computed == 3
    assert all(len(m["per_seed"]) == 2 for m in res.state.masks.values())
    for srv, n0 in zip((a, b), before):  # both servers sampled evaluations, each with GCache Apply's inline policy
        log = srv["log"].read_text()
        assert log.count(logged) > n0, log[-2000:]
    assert json.loads(res.policy.to_json())["k"] == 3
    return res


def test_search_on_two_comfyui_servers_with_a_thread_pool(servers):
    a, b, _ = servers
    _search_and_check(servers, ComfyUIWorker.pool([a["url"], b["url"]], APPLY_WF, seeds=[0, 1], objective="ssim"),
                      "GCache: computed 3/6 steps")


def test_search_on_two_comfyui_servers_with_ray_actors(servers):
    """Each server is driven by its own Ray actor (the cluster command's --comfyui mode)."""
    ray = pytest.importorskip("ray", reason="Ray is the optional 'cluster' extra: pip install -e '.[test,cluster]'")
    from gcache.search.infra.ray_executor import RayExecutor
    a, b, _ = servers
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        ex = RayExecutor.start_each(ComfyUIWorker, [((srv["url"], APPLY_WF, [0, 1], "ssim"), {}) for srv in (a, b)])
        assert sorted(ex.pids()) == sorted([a["url"], b["url"]])  # one actor per server
        _search_and_check(servers, ex, "GCache: computed 3/6 steps")
    finally:
        ray.shutdown()


def test_cluster_command_drives_comfyui_servers(servers, tmp_path, capsys):
    """`python -m gcache.reference_model.cluster --comfyui URL,URL --workflow … --profile …`: a policy from the
    servers."""
    pytest.importorskip("ray", reason="Ray is the optional 'cluster' extra: pip install -e '.[test,cluster]'")
    import ray

    from gcache.core.policy import Policy
    from gcache.reference_model.cluster import main
    a, b, _ = servers
    wf = tmp_path / "wf_api.json"
    wf.write_text(json.dumps(APPLY_WF))
    prof = a["base"] / "models" / "gcache" / "tiny.profile.safetensors"
    try:
        assert main(["--comfyui", f"{a['url']},{b['url']}", "--workflow", str(wf), "--profile", str(prof),
                     "--k", "3", "--degree", "1", "--budget", "9", "--search-seeds", "0-1",
                     "--out", str(tmp_path / "out")]) == 0
    finally:
        ray.shutdown()
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    pol = Policy.load(summary["policy"])
    assert pol.n_computed == 3 and len(pol.mask) == N and summary["evaluations"] >= 3
