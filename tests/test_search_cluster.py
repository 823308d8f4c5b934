"""The search on a local Ray cluster with 2 CPU workers (skipped without the optional `cluster` extra)."""
import os
import signal

import pytest

ray = pytest.importorskip("ray", reason="Ray is the optional 'cluster' extra: pip install -e '.[test,cluster]'")

from gcache.reference_model.cluster import ReferenceWorker  # noqa: E402
from gcache.search.config import SearchConfig  # noqa: E402
from gcache.search.infra.ray_executor import RayExecutor  # noqa: E402
from gcache.search.loop import run_batch_search  # noqa: E402

N, SEEDS = 8, [100, 101]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def profile():
    from gcache.reference_model.harness import ReferenceHarness
    return ReferenceHarness(N).profile(SEEDS)


def test_two_workers_finish_the_search_and_survive_a_killed_worker(cluster, profile, tmp_path):
    ex = RayExecutor.start(ReferenceWorker, 2, N, SEEDS, "ssim")
    pids = ex.pids()
    assert len(set(pids)) == 2 and os.getpid() not in pids  # two model-holding processes
    killed = []

    def kill_one(info):  # SIGKILL a worker after the 4th result: Ray restarts it and retries its evaluation
        if info["iteration"] == 4 and not killed:
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])
    try:
        res = run_batch_search(profile, SearchConfig(k=3, degree=2, budget=14, objective="ssim"), ex, q=2,
                                  state_path=str(tmp_path / "s.json"), provenance={"seeds": SEEDS}, progress=kill_one)
        after = ex.pids()
    finally:
        ex.close()
    assert killed and len(res.history) == 14 and res.state.done and res.state.pending == []
    assert pids[0] not in after  # the dead worker was replaced
    assert res.policy.n_computed == 3 and all(len(m.get("per_seed", [])) == 2 for m in res.state.masks.values())


def test_cluster_command_writes_policy_and_state(cluster, tmp_path, capsys):
    import json

    from gcache.core.policy import Policy
    from gcache.reference_model.cluster import main
    from gcache.reference_model.harness import ReferenceHarness
    assert main(["--workers", "2", "--steps", "8", "--k", "3", "--budget", "14", "--degree", "2",
                 "--search-seeds", "100-101", "--eval-seeds", "0-1", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "policy_N8_K3.json").exists() and (tmp_path / "search_state_N8_K3.json").exists()
    out = capsys.readouterr().out.strip().splitlines()
    pol = Policy.load(str(tmp_path / "policy_N8_K3.json"))
    held = ReferenceHarness(8).held_out(pol, [0, 1])  # the held-out figure, measured again here
    assert pol.metrics["eval_psnr"] == held["eval_psnr"] and pol.provenance["eval_seeds"] == [0, 1]
    assert f"held-out PSNR {held['eval_psnr']:.2f} dB" in "\n".join(out)
    assert json.loads(out[-1])["eval_psnr"] == round(held["eval_psnr"], 3)


def _closed_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connections are refused


def test_comfyui_mode_reports_a_dead_server_and_keeps_its_state_for_that_workflow(cluster, profile, tmp_path, capsys):
    """A server that is down fails the command with what to do; the state file stays, and belongs to the workflow:
    a changed workflow is another search and is refused, the same one resumes."""
    import json

    from gcache.reference_model.cluster import main
    wf = {"1": {"class_type": "GCacheApply", "inputs": {"policy_json": ""}},
          "2": {"class_type": "KSampler", "inputs": {"seed": 0, "cfg": 3.0}},
          "3": {"class_type": "SaveImage", "inputs": {}}}
    paths = {}
    for name, cfg in (("a", 3.0), ("b", 4.5)):
        wf["2"]["inputs"]["cfg"] = cfg
        paths[name] = tmp_path / f"wf_{name}.json"
        paths[name].write_text(json.dumps(wf))
    prof = tmp_path / "p.profile.safetensors"
    profile.save(str(prof))
    args = ["--comfyui", f"http://127.0.0.1:{_closed_port()}", "--profile", str(prof), "--k", "3", "--degree", "2",
            "--budget", "14", "--search-seeds", "100-101", "--out", str(tmp_path / "out")]
    assert main(args + ["--workflow", str(paths["a"])]) == 2
    assert "unreachable" in capsys.readouterr().err
    state = json.loads((tmp_path / "out" / f"search_state_N{N}_K3.json").read_text())
    assert state["history"] == [] and state["pending"] and "workflow_sha256" in state["provenance"]
    assert main(args + ["--workflow", str(paths["b"])]) == 2
    err = capsys.readouterr().err
    assert "belongs to another search" in err and "another ComfyUI workflow" in err
    assert main(args + ["--workflow", str(paths["a"])]) == 2  # same workflow: resumed, and the server still down
    err = capsys.readouterr().err
    assert "python -m gcache.reference_model.cluster: error: ComfyUI at http://127.0.0.1:" in err
    assert "unreachable" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "ray::" not in err  # the worker's own message, not Ray's wrapper with the remote traceback


def test_more_workers_than_the_cluster_can_place_is_reported_not_a_hang(cluster, profile, tmp_path, capsys):
    """Four ComfyUI servers on a 3-CPU cluster: one actor can't be placed; the command says so and stops."""
    import json

    from gcache.reference_model.cluster import main
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"1": {"class_type": "GCacheApply", "inputs": {}},
                              "2": {"class_type": "KSampler", "inputs": {"seed": 0}},
                              "3": {"class_type": "SaveImage", "inputs": {}}}))
    prof = tmp_path / "p.profile.safetensors"
    profile.save(str(prof))
    urls = ",".join(f"http://127.0.0.1:{_closed_port()}" for _ in range(4))
    assert main(["--comfyui", urls, "--workflow", str(wf), "--profile", str(prof), "--k", "3", "--degree", "2",
                 "--budget", "14", "--search-seeds", "100-101", "--out", str(tmp_path / "out"),
                 "--start-timeout", "8"]) == 2
    assert "of 4 search workers started within 8 s" in capsys.readouterr().err
    assert not (tmp_path / "out" / f"search_state_N{N}_K3.json").exists()  # nothing was dispatched


@pytest.mark.parametrize("content, says", [
    ('{"nodes": [], "links": []}', "API format"),                  # saved with the UI's "Save", not "Save (API)"
    ('{"1": {"class_type": "KSampler", "inputs": {"seed": 0}}}', "GCache Apply"),
    ("{not json", "Can't read the workflow"),
])
def test_a_bad_workflow_stops_before_any_worker_starts(profile, tmp_path, capsys, content, says):
    from gcache.reference_model.cluster import main
    wf = tmp_path / "wf.json"
    wf.write_text(content)
    prof = tmp_path / "p.profile.safetensors"
    profile.save(str(prof))
    assert main(["--comfyui", "http://127.0.0.1:9", "--workflow", str(wf), "--profile", str(prof), "--k", "3",
                 "--degree", "2", "--budget", "14", "--out", str(tmp_path / "out")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_worker_that_cannot_start_says_why(cluster):
    """A constructor error inside an actor (here an unknown objective) becomes a GCacheError with its message."""
    from gcache.core.errors import GCacheError
    ex = RayExecutor.start(ReferenceWorker, 1, N, SEEDS, "no-such-objective")
    try:
        with pytest.raises(GCacheError, match="could not start: .*Unknown objective 'no-such-objective'"):
            ex.pids(timeout_s=120)
    finally:
        ex.close()
