"""The search on a local Ray cluster with 2 CPU workers (skipped without the optional `cluster` extra)."""
import os
import signal

import pytest

ray = pytest.importorskip("ray", reason="Ray is the optional 'cluster' extra: pip install -e '.[test,cluster]'")

from gcache.search.bilevel import SearchConfig  # noqa: E402
from gcache.search.cluster import RayExecutor, ReferenceWorker  # noqa: E402
from gcache.search.parallel import run_search_parallel  # noqa: E402

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
        res = run_search_parallel(profile, SearchConfig(k=3, degree=2, budget=14, objective="ssim"), ex, q=2,
                                  state_path=str(tmp_path / "s.json"), provenance={"seeds": SEEDS}, progress=kill_one)
        after = ex.pids()
    finally:
        ex.close()
    assert killed and len(res.history) == 14 and res.state["done"] and res.state["pending"] == []
    assert pids[0] not in after  # the dead worker was replaced
    assert res.policy.n_computed == 3 and all(len(m.get("per_seed", [])) == 2 for m in res.state["masks"].values())


def test_cluster_command_writes_policy_and_state(cluster, tmp_path, capsys):
    from gcache.search.cluster import main
    assert main(["--workers", "2", "--steps", "8", "--k", "3", "--budget", "14", "--degree", "2",
                 "--search-seeds", "100-101", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "policy_N8_K3.json").exists() and (tmp_path / "search_state_N8_K3.json").exists()
    assert '"evaluations"' in capsys.readouterr().out.strip().splitlines()[-1]
