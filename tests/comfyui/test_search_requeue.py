"""A finished GCache Search stays usable, inside real ComfyUI (in process, the tiny Flux): queued again unchanged it
gives its policy (a forecasting search's file holds every profile-fitted forecaster's start masks, which the re-queue
once left out: "belongs to another search (start masks …)"), twice, in the foreground and in the background; saved
again it no longer fails on its fresh seeds; and a larger budget continues it on the first queue (a reuse search once
failed with "returned [], not a finite loss": the re-queue took it for finished and evaluated without references).

Background slices run as ComfyUI would run them: the slice prompt the start queued, executed through the node (its
queue is a list here; tests/comfyui/test_background_search.py runs the real server's)."""
from types import SimpleNamespace

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import tiny_models as tm  # noqa: E402

from gcache.core.policy import Policy  # noqa: E402
from gcache.nodes.search_jobs import background  # noqa: E402
from gcache.nodes.search_node import GCacheSearch  # noqa: E402
from gcache.search.state import SearchState  # noqa: E402

N, K, DEGREE = 8, 3, 1
BUDGET = {"fitted (profile)": 20, "l2p (profile)": 20, "reuse (0)": 8}  # the least budgets at degree 1


@pytest.fixture(scope="module")
def flux():
    return tm.flux()


def execute(flux, monkeypatch, name, forecast, mode, budget=None, prompt=None):
    """GCache Search queued with these inputs (`prompt`: the prompt ComfyUI runs it in, a slice prompt included;
    `flux`: the model with its conditioning and latent)."""
    from gcache_test_pack import FakeVAE
    m, pos, neg, lat = flux
    monkeypatch.setattr(GCacheSearch, "hidden", SimpleNamespace(prompt=prompt or {"6": {"inputs": {}}},
                                                                unique_id="6"), raising=False)
    return GCacheSearch.execute(m, pos, neg, {"samples": lat}, FakeVAE(), 7, 2, N, 1.0, "euler", "simple", K,
                                budget or BUDGET[forecast], DEGREE, "psnr", name, forecast=forecast, mode=mode,
                                slice_seconds=3600).result[0]


def run_slices(flux, monkeypatch, queued, name, forecast, budget=None):
    """Every slice prompt queued, run in turn as ComfyUI runs them, until none is left."""
    while queued:
        execute(flux, monkeypatch, name, forecast, "background", budget, prompt=queued.pop(0))


def state(gcache_dir, name) -> SearchState:
    return SearchState.peek(str(gcache_dir / f"{name}.search.json"))


@pytest.mark.parametrize("forecast", ["fitted (profile)", "l2p (profile)"])
def test_a_finished_forecasting_search_queued_again_gives_its_policy(flux, gcache_dir, monkeypatch, queue, forecast):
    name = forecast.split()[0]
    first = execute(flux, monkeypatch, name, forecast, "foreground")
    done = state(gcache_dir, name)
    assert done.done and len(done.history) == BUDGET[forecast]
    other = "l2p" if name == "fitted" else "fitted"
    assert f"theory_dp_{other}" in done.starts_names  # the other forecaster's start masks: the re-queue must keep them
    saved = (gcache_dir / f"{name}.json").read_text()
    for mode in ("foreground", "background", "foreground", "background"):  # each re-queued twice
        again = execute(flux, monkeypatch, name, forecast, mode)
        assert again.to_dict() == first.to_dict(), mode
        assert queue == []  # a finished search queues no slice
    assert Policy.from_json(saved).to_dict() == Policy.load(str(gcache_dir / f"{name}.json")).to_dict()
    assert state(gcache_dir, name).history == done.history  # nothing evaluated again


@pytest.mark.parametrize("forecast", ["reuse (0)", "fitted (profile)"])
def test_a_larger_budget_continues_a_finished_search_on_the_first_queue(flux, gcache_dir, monkeypatch, queue,
                                                                        forecast):
    name = "grown_" + forecast.split()[0]
    execute(flux, monkeypatch, name, forecast, "background")
    run_slices(flux, monkeypatch, queue, name, forecast)
    assert state(gcache_dir, name).done
    more = BUDGET[forecast] + 4
    execute(flux, monkeypatch, name, forecast, "background", more)  # the first queue starts the continuation
    assert len(queue) == 1 and background.JOBS.get(name).status == "queued"
    run_slices(flux, monkeypatch, queue, name, forecast, more)
    grown = state(gcache_dir, name)
    assert grown.done and len(grown.history) == more and background.JOBS.get(name).status == "done"
    policy = execute(flux, monkeypatch, name, forecast, "foreground", more)  # and it is finished now
    assert policy.provenance["iterations"] == more


def test_a_larger_budget_queued_while_the_search_runs_says_it_is_not_applied(flux, gcache_dir, monkeypatch, queue,
                                                                           caplog):
    """A larger budget queued while the same search runs in the background was reported as the running job, with the
    new budget as if it were the job's ("0 of 12 evaluations") and not a word that it was not applied. The log and
    the node say it now, and what to do: queue it again once the search finished, which then continues to it."""
    from gcache.nodes.modes import verdicts
    name, forecast = "larger", "reuse (0)"
    more = BUDGET[forecast] + 4
    shown = []
    monkeypatch.setattr(verdicts, "show", lambda node_id, text: shown.append(text))
    execute(flux, monkeypatch, name, forecast, "background")
    with caplog.at_level("INFO", logger="gcache"):
        execute(flux, monkeypatch, name, forecast, "background", more)  # while its first slice is queued
    running = background.JOBS.get(name)
    assert running.status == "queued" and running.budget == BUDGET[forecast] and len(queue) == 1
    text = caplog.text
    assert f"runs in the background (0 of {BUDGET[forecast]} evaluations)" in text
    assert f"the budget of {more} queued now is not applied" in text and "after this search finishes" in text
    assert [t for t in shown if "queued now is not applied" in t] == [shown[-1]]  # on the node
    run_slices(flux, monkeypatch, queue, name, forecast)
    assert len(state(gcache_dir, name).history) == BUDGET[forecast]  # the running search kept its budget
    execute(flux, monkeypatch, name, forecast, "background", more)  # queued again after it finished: continued
    run_slices(flux, monkeypatch, queue, name, forecast, more)
    assert len(state(gcache_dir, name).history) == more


def test_a_policy_that_cant_be_saved_fails_the_job_and_queueing_again_saves_it(flux, gcache_dir, monkeypatch, queue):
    """The slice's end (saving the policy) sat outside the guard that moves a job to failed: a save that failed left
    the job "running" for good (the tab showed it, with a Cancel button, while ComfyUI's queue was empty)."""
    name, forecast = "unsaved", "reuse (0)"
    execute(flux, monkeypatch, name, forecast, "background")
    (gcache_dir / f"{name}.json").mkdir()  # the policy file can't be written: a directory is in its place
    with pytest.raises(OSError):
        run_slices(flux, monkeypatch, queue, name, forecast)  # one slice: it finishes the search (slice_seconds)
    bg = background.JOBS.get(name)
    assert bg.status == "failed" and queue == [] and state(gcache_dir, name).done
    (gcache_dir / f"{name}.json").rmdir()
    policy = execute(flux, monkeypatch, name, forecast, "background")  # queued again: its policy, saved
    assert Policy.load(str(gcache_dir / f"{name}.json")).to_dict() == policy.to_dict() and queue == []
    row = next(r for r in background.JOBS.listing([str(gcache_dir)]) if r["id"] == name)
    assert row["status"] == "done" and row["message"] == f"done: {name}.json saved"


def test_a_search_interrupted_on_its_fresh_seeds_finishes_its_end_game_when_queued_again(flux, gcache_dir, monkeypatch,
                                                                                         queue):
    """An Interrupt while the end game sampled its fresh seeds left the state done; queued again, the search was
    taken for finished and its policy saved without the final choice ("did not run"), for good. Now the queue
    samples the references and measures what the end game had left."""
    import comfy.model_management

    from gcache.nodes.search_jobs.job import Evaluation
    real = Evaluation.__call__

    def interrupted(self, mask, forecast=None, fresh=False):
        if fresh:
            raise comfy.model_management.InterruptProcessingException()
        return real(self, mask, forecast, fresh)
    monkeypatch.setattr(Evaluation, "__call__", interrupted)
    name, forecast = "cut", "fitted (profile)"
    with pytest.raises(comfy.model_management.InterruptProcessingException):
        execute(flux, monkeypatch, name, forecast, "foreground")
    state = SearchState.peek(str(gcache_dir / f"{name}.search.json"))
    assert state.done and not state.fresh  # stopped before any fresh seed was measured
    assert tab_row(background.JOBS, gcache_dir, name)["status"] == "paused"  # this process's job: interrupted
    row = tab_row(background.Jobs(), gcache_dir, name)  # after a restart: from the state file (old code: "done")
    assert row["status"] == "paused" and row["message"].startswith("end game unfinished"), row
    monkeypatch.setattr(Evaluation, "__call__", real)
    policy = execute(flux, monkeypatch, name, forecast, "foreground")
    fresh = policy.provenance.get("fresh_seeds") or {}
    assert "skipped" not in fresh and len(fresh.get("losses", {})) >= 2, fresh  # old code: skipped
    assert len(SearchState.peek(str(gcache_dir / f"{name}.search.json")).fresh) >= 2
    for jobs in (background.JOBS, background.Jobs()):
        row = tab_row(jobs, gcache_dir, name)
        assert row["status"] == "done" and row["message"] == f"done: {name}.json saved", row


def tab_row(jobs, gcache_dir, name) -> dict:
    """The GCache tab's row of search `name` (GET /gcache/searches lists Jobs.listing)."""
    return next(r for r in jobs.listing([str(gcache_dir)]) if r["id"] == name)
