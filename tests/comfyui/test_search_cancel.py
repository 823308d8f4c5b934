"""A Cancel from the server thread in every window of a background slice (in-process, deterministic): before the
slice's status check, between that check and the status write (a slice that samples its reference images again,
and one that does not), in the middle of an evaluation, and in `_queue_next`. Each time the search stays cancelled,
nothing is sampled after the Cancel (no reference image, no evaluation) and the slice prompt already queued samples
nothing when it runs.

The slice code is GCache Search's own (search_node._slice, run_slice, _queue_next, Jobs, the real search loop and
its state file); only the sampling is counted instead of run (SearchJob.sample_image), the profile is synthetic and
ComfyUI's queue is a list. The Cancel lands where a barrier holds the slice's thread: the test's thread (as the
server's would) cancels there, then lets the slice go on; no sleep and no timing decides anything."""
import os
import threading

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

from test_search_bilevel import CFG, Evaluator, make_profile  # noqa: E402

from gcache.nodes import search_node  # noqa: E402
from gcache.nodes.search_jobs import background  # noqa: E402
from gcache.nodes.search_jobs.job import SearchJob  # noqa: E402
from gcache.search.config import SearchConfig  # noqa: E402
from gcache.search.loop import run_search  # noqa: E402
from gcache.search.state import SearchState  # noqa: E402

NAME = "w"


class Barrier:
    """Holds the slice's thread at one point until the test's thread has done its part."""

    def __init__(self):
        self.reached, self.go = threading.Event(), threading.Event()

    def __call__(self):
        self.reached.set()
        assert self.go.wait(120), "the test never released the barrier"


class CountedJob(SearchJob):
    """GCache Search's job with its sampling counted (`sampled`: "ref" or "eval" per image) and barriers at named
    points ("load_profile", "ref1" = after the first reference image, "eval1" = after the first evaluation image)."""

    def __init__(self, folder, barriers=None):
        super().__init__(None, None, None, {}, None, [0, 1], make_profile().n_steps, 1.0, "euler", "simple",
                         SearchConfig(**CFG), folder, NAME)
        self.synthetic = make_profile()
        self.loss = Evaluator(self.synthetic)
        self.sampled: list[str] = []
        self.barriers = barriers or {}

    def _at(self, point):
        if point in self.barriers:
            self.barriers[point]()

    def sample_image(self, m, seed):
        kind = "ref" if m == "ref" else "eval"
        self.sampled.append(kind)
        self._at(f"{kind}{self.sampled.count(kind)}")
        return 0.0

    def refs_key(self):
        self._at("refs_key")
        return "k"

    def references(self, tick=lambda: None):
        return [self.run("ref", s) for s in self.seeds]

    def check_selfcheck(self, first_fail_too=False):
        """No model here to have a self-check verdict: the stand-in references above are no model's runs."""
        return None

    def load_profile(self):
        self._at("load_profile")
        return self.synthetic

    def search(self, profile, refs, should_stop, progress=None):
        def evaluate(mask):
            return [self.loss(mask) + 0 * self.run(mask, s) for s in self.seeds]
        return run_search(profile, self.config, evaluate, state_path=self.state_path, progress=progress,
                          should_stop=should_stop)


@pytest.fixture()
def slices(monkeypatch, tmp_path):
    """A fresh Jobs, ComfyUI's queue as a list of the slice prompts queued, _report as a marker."""
    jobs, queued, at_queue = background.Jobs(), [], {}
    monkeypatch.setattr(background, "JOBS", jobs)
    monkeypatch.setattr(search_node, "_report", lambda job, profile, bg: "report")

    def queue_prompt(prompt, client_id=None):
        queued.append(prompt)
        if "barrier" in at_queue:
            at_queue["barrier"]()
        return f"p{len(queued)}"
    monkeypatch.setattr(background, "queue_prompt", queue_prompt)
    return jobs, queued, at_queue, str(tmp_path)


def start(jobs, job, refs=("r0", "r1")):
    """The job as GCache Search's start leaves it: references kept, one slice queued (status queued)."""
    bg = background.Job(NAME, job.state_path, job.config.budget, "6", {"6": {"inputs": {}}},
                        refs=list(refs) if refs is not None else None, refs_key="k")
    jobs.put(bg)
    jobs.update(bg, status="queued", message="started; next slice queued")
    return bg


def marker() -> str:
    """What the slice prompts of the search started last carry (its Job.marker)."""
    return background.JOBS.get(NAME).marker


def slice_in_thread(job, mark=None) -> threading.Thread:
    t = threading.Thread(target=search_node._slice, args=(job, mark or marker(), 0), daemon=True)
    t.start()
    return t


def cancel_at(jobs, barrier: Barrier, t: threading.Thread) -> int:
    """Cancel from this thread once the slice's thread waits at the barrier; returns what was sampled by then."""
    assert barrier.reached.wait(120), "the slice never reached the barrier"
    assert jobs.cancel(NAME).status == "cancelled"
    return t


def settle(t: threading.Thread) -> None:
    t.join(120)
    assert not t.is_alive()


def evaluations_in_state(job) -> int:
    state = SearchState.peek(job.state_path)
    return len(state.history) if state is not None else 0


def cancelled_at(slices, point: str, **start_kw):
    """A slice run in a thread until it reaches `point` (a barrier of CountedJob), cancelled there from this thread,
    then let go: (jobs, the queued slice prompts, the job), once the slice's thread has ended."""
    jobs, queued, _, folder = slices
    barrier = Barrier()
    job = CountedJob(folder, {point: barrier})
    start(jobs, job, **start_kw)
    t = slice_in_thread(job)
    cancel_at(jobs, barrier, t)
    barrier.go.set()
    settle(t)
    return jobs, queued, job


def the_queued_slice_samples_nothing(jobs, queued, job, before):
    """Every slice prompt in the queue runs: the search stays cancelled and nothing more is sampled."""
    for _ in range(len(queued)):
        search_node._slice(job, marker(), 0)
    assert job.sampled == before and jobs.get(NAME).status == "cancelled"


def test_a_cancel_before_the_slices_status_check(slices):
    jobs, queued, _, folder = slices
    job = CountedJob(folder)
    start(jobs, job)
    barrier = Barrier()
    mark = marker()  # what the slice prompt carries
    real_get = jobs.get

    def get(job_id):  # the slice prompt has started; its first look at the job is held here
        if not barrier.reached.is_set():
            barrier()
        return real_get(job_id)
    jobs.get = get
    t = slice_in_thread(job, mark)
    cancel_at(jobs, barrier, t)
    barrier.go.set()
    settle(t)
    jobs.get = real_get
    assert job.sampled == [] and jobs.get(NAME).status == "cancelled" and queued == []
    assert evaluations_in_state(job) == 0


def test_a_cancel_between_the_status_check_and_the_status_write(slices):
    """The old slice checked the status, then loaded its profile, then set running unconditionally: a Cancel there
    was overwritten, and the slice evaluated and queued the next one."""
    jobs, queued, job = cancelled_at(slices, "load_profile")
    assert job.sampled == [] and jobs.get(NAME).status == "cancelled" and queued == []
    assert evaluations_in_state(job) == 0
    the_queued_slice_samples_nothing(jobs, queued, job, [])


def test_a_cancel_while_a_slice_samples_its_reference_images_again(slices):
    """A slice without the references (dropped, or sampled from another prompt): a Cancel after the first image
    stops it there; no second image, no evaluation."""
    jobs, queued, job = cancelled_at(slices, "ref1", refs=None)
    assert job.sampled == ["ref"] and jobs.get(NAME).status == "cancelled" and queued == []
    assert evaluations_in_state(job) == 0
    the_queued_slice_samples_nothing(jobs, queued, job, ["ref"])


def test_a_cancel_in_the_middle_of_an_evaluation(slices):
    """Between two seeds of one evaluation: the second seed is not sampled (the evaluation is redone on resume)."""
    jobs, queued, job = cancelled_at(slices, "eval1")
    assert job.sampled == ["eval"] and jobs.get(NAME).status == "cancelled" and queued == []
    the_queued_slice_samples_nothing(jobs, queued, job, ["eval"])


def test_a_cancel_while_the_next_slice_is_queued(slices):
    """The old _queue_next set queued after queueing the next slice: a Cancel that landed while it queued was
    overwritten, and the next slice searched on."""
    jobs, queued, at_queue, folder = slices
    job = CountedJob(folder)
    start(jobs, job)
    barrier = Barrier()
    at_queue["barrier"] = barrier
    t = slice_in_thread(job)
    cancel_at(jobs, barrier, t)
    barrier.go.set()
    settle(t)
    del at_queue["barrier"]
    sampled = list(job.sampled)
    assert sampled == ["eval", "eval"] and len(queued) == 1  # one evaluation of two seeds, before the Cancel
    assert jobs.get(NAME).status == "cancelled" and evaluations_in_state(job) == 1
    the_queued_slice_samples_nothing(jobs, queued, job, sampled)
    assert evaluations_in_state(job) == 1


def test_slices_without_a_cancel_go_on_until_the_search_is_done(slices):
    """The control: the same job, no Cancel, its slices run one after the other until the budget is spent."""
    jobs, queued, _, folder = slices
    job = CountedJob(folder)
    start(jobs, job)
    finished = []
    job.finish = lambda result, profile: finished.append(result) or result.policy
    for _ in range(CFG["budget"] + 5):
        if jobs.get(NAME).status != "queued":
            break
        search_node._slice(job, marker(), 0)
    bg = jobs.get(NAME)
    assert bg.status == "done" and finished and evaluations_in_state(job) == CFG["budget"]
    assert job.sampled.count("ref") == 0 and job.sampled.count("eval") % 2 == 0
    assert os.path.isfile(job.state_path)
