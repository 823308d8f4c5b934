"""The ComfyUI search worker's offline parts (no server, no Ray): workflow checks and the workflow's identity."""
import pytest

from gcache.core.errors import GCacheError
from gcache.search.infra.comfyui_worker import ComfyUIWorker


def api_workflow(cfg=3.0, seed=0, prefix="gcache_eval"):
    return {"1": {"class_type": "GCacheApply", "inputs": {"policy_json": "", "policy_file": "(auto)"}},
            "2": {"class_type": "KSampler", "inputs": {"seed": seed, "cfg": cfg, "model": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"filename_prefix": prefix, "images": ["2", 0]}}}


def test_nodes_of_finds_apply_sampler_and_output():
    assert ComfyUIWorker.nodes_of(api_workflow()) == ("1", "2", "3")


@pytest.mark.parametrize("bad, says", [
    ({"nodes": [], "links": []}, "API format"),                     # the UI's save format
    ({}, "API format"),
    ({k: v for k, v in api_workflow().items() if k != "1"}, "GCache Apply"),
    ({**api_workflow(), "4": {"class_type": "KSampler", "inputs": {"seed": 1}}}, "exactly one sampler"),
    ({k: v for k, v in api_workflow().items() if k != "3"}, "image output"),
])
def test_bad_workflows_are_named(bad, says):
    with pytest.raises(GCacheError, match=says):
        ComfyUIWorker.nodes_of(bad)


def test_identity_ignores_what_each_evaluation_sets_but_not_the_rest():
    base = ComfyUIWorker.workflow_identity(api_workflow())
    assert ComfyUIWorker.workflow_identity(api_workflow(seed=123, prefix="other")) == base
    changed = api_workflow()
    changed["1"]["inputs"]["policy_json"] = '{"mask": [1, 0]}'
    assert ComfyUIWorker.workflow_identity(changed) == base
    assert ComfyUIWorker.workflow_identity(api_workflow(cfg=4.5)) != base
