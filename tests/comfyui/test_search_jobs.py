"""A GCache Search job is known by what it searches, not by its name only, inside real ComfyUI (in process, tiny
models): two searches of one policy name on two models (the Flux and the Lumina2 class) never touch each other's job,
profile or state, and a slice prompt left from an earlier job of a name does nothing to a newer one (each job has its
own token, which its slice prompts carry).

Background slices run as ComfyUI would run them: the slice prompt the start queued, executed through the node (its
queue is a list here)."""
from types import SimpleNamespace

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import tiny_models as tm  # noqa: E402

from gcache.core.errors import GCacheError  # noqa: E402
from gcache.core.selfcheck import Outcome  # noqa: E402
from gcache.nodes.modes.base import ModeConfig  # noqa: E402
from gcache.nodes.search_jobs import background  # noqa: E402
from gcache.nodes.search_node import GCacheSearch  # noqa: E402
from gcache.search.state import SearchState  # noqa: E402

N, NAME = 8, "shared"


@pytest.fixture(scope="module")
def models():
    return {"flux": tm.flux(), "lumina2": tm.lumina2(), "other flux weights": tm.flux(seed=1)}


def execute(model, monkeypatch, prompt=None, name=NAME):
    """GCache Search on `model` (model, positive, negative, latent) queued in the background, or run as the slice
    prompt `prompt`."""
    from gcache_test_pack import FakeVAE
    m, pos, neg, lat = model
    monkeypatch.setattr(GCacheSearch, "hidden", SimpleNamespace(prompt=prompt or {"6": {"inputs": {}}},
                                                                unique_id="6"), raising=False)
    return GCacheSearch.execute(m, pos, neg, {"samples": lat}, FakeVAE(), 7, 1, N, 1.0, "euler", "simple", 3, 8, 1,
                                "psnr", name, mode="background", slice_seconds=3600).result[0]


def history(folder) -> int:
    state = SearchState.peek(str(folder / f"{NAME}.search.json"))
    return len(state.history) if state is not None else 0


def test_a_self_check_fail_on_another_model_does_not_stop_a_search_of_the_same_name(models, gcache_dir, monkeypatch,
                                                                                  queue):
    execute(models["flux"], monkeypatch)  # started: references sampled, its first slice queued
    flux_job = background.JOBS.get(NAME)
    assert flux_job.status == "queued" and len(queue) == 1
    subject = ModeConfig.of_model(models["lumina2"][0], str(gcache_dir))["subject"]
    for _ in range(2):  # a fail stands once it repeats (verdicts.recorded_fail); a first one is checked again
        subject.record(Outcome("fail", "the skip path's output differs from the computed step's", 0.61, 8.5e-6,
                               "float32"))
    nothing = execute(models["lumina2"], monkeypatch)  # its self-check failed: nothing searched on it
    assert nothing.mask == [1] * N
    assert background.JOBS.get(NAME) is flux_job and flux_job.status == "queued"  # the Flux search goes on
    execute(models["flux"], monkeypatch, prompt=queue.pop(0))
    assert flux_job.status == "done" and history(gcache_dir) == 8


@pytest.mark.parametrize("other", ["lumina2", "other flux weights"])
def test_a_start_on_another_model_never_takes_over_a_running_search_of_the_name(models, gcache_dir, monkeypatch,
                                                                               queue, other):
    """Two searches of one name on the Flux and the Lumina2 model queued back to back: the second start deleted and
    re-recorded the first one's profile and took over its job. It is refused now, before it samples anything (also
    on another checkpoint of the same class: the weights are part of what a search is)."""
    execute(models["flux"], monkeypatch)
    flux_job = background.JOBS.get(NAME)
    own_profile = gcache_dir / f"{NAME}.search.profile.safetensors"
    recorded = own_profile.read_bytes()
    with pytest.raises(GCacheError, match=f"GCache Search {NAME} is queued in this ComfyUI for another model"):
        execute(models[other], monkeypatch)
    assert own_profile.read_bytes() == recorded and background.JOBS.get(NAME) is flux_job and len(queue) == 1
    execute(models["flux"], monkeypatch, prompt=queue.pop(0))  # the Flux search runs to its end
    assert flux_job.status == "done" and history(gcache_dir) == 8 and queue == []


def test_a_stale_slice_does_nothing_to_a_newer_job_of_its_name(models, gcache_dir, monkeypatch, queue):
    """A slice prompt left in ComfyUI's queue by a cancelled job ran the newer job of the same name."""
    execute(models["flux"], monkeypatch)
    stale = queue.pop(0)
    background.JOBS.cancel(NAME)
    execute(models["flux"], monkeypatch)  # queued again: a new job, its own slice
    newer = background.JOBS.get(NAME)
    assert newer.status == "queued" and len(queue) == 1
    execute(models["flux"], monkeypatch, prompt=stale)
    assert newer.status == "queued" and history(gcache_dir) == 0  # nothing evaluated, the newer job as it was
    execute(models["flux"], monkeypatch, prompt=queue.pop(0))
    assert newer.status == "done" and history(gcache_dir) == 8



def test_a_finished_search_of_the_name_is_not_another_checkpoint_s(models, gcache_dir, monkeypatch, queue):
    """A search of one name finished on the Flux model; the same name queued on another checkpoint of the Flux class
    with the same prompt and settings was handed the Flux search's policy (no sampling) and saved it as that
    checkpoint's GCache Apply (auto) policy: the state file knew the model's class, not its weights. Refused now,
    before any sampling, and nothing of the finished search changes."""
    execute(models["flux"], monkeypatch)
    execute(models["flux"], monkeypatch, prompt=queue.pop(0))
    assert background.JOBS.get(NAME).status == "done"
    state = gcache_dir / f"{NAME}.search.json"
    files = {p.name: p.read_bytes() for p in gcache_dir.rglob("*") if p.is_file()}
    other = (models["other flux weights"][0],) + tuple(models["flux"][1:])  # the same prompt, latent and settings
    with pytest.raises(GCacheError, match="belongs to another search .*weights"):
        execute(other, monkeypatch)
    assert {p.name: p.read_bytes() for p in gcache_dir.rglob("*") if p.is_file()} == files and state.exists()
    assert queue == []
