"""GCache Search: the bilevel search (search/loop.py) with real sampling inside the node, in the foreground or in
background slices (search_jobs/)."""
from __future__ import annotations

import logging
import os
from typing import Callable

import comfy.model_management
import comfy.samplers
import comfy.utils
from comfy_api.latest import io

from ..core.errors import GCacheError
from ..core.files import safe_name
from ..core.policy import Policy
from ..search import end_game
from ..search.budget import minimum_budgets, start_range
from ..search.config import POLISH_SHARE, SearchConfig
from ..search.infra.objectives import OBJECTIVES, make_objective
from ..search.infra.plots import plot_policy, plot_search
from ..search.infra.requirements import require, search_modules
from ..search.loop import SearchInterrupted
from ..search.paired import LEAST_SEEDS
from . import comfy_common as cc
from .modes import verdicts
from .search_jobs import background
from .search_jobs.job import NothingToSearch, SearchJob, run_slice

log = logging.getLogger("gcache")
MODES = ("background", "foreground")
# mode when a prompt has no mode input (API prompts written before it existed): they ran the whole search in the
# foreground, and still do; the widget's default, what the frontend sends, is background
MODE_WITHOUT_INPUT = "foreground"


def budget_tooltip(degree: int = 3) -> str:
    """The budget input's tooltip, its numbers from search/budget.py (where the search computes them)."""
    fewest, most = start_range()
    least = minimum_budgets(degree)
    return (f"Search iterations (sampling runs per seed): the start masks (the instant masks of each error model, "
            f"{fewest} to {most}) and the 2^(degree+1) start grid included, so at least {least['reuse']} for degree "
            f"{degree} ({least['forecasting']} when forecasting, on a profile with forecast statistics); after the "
            f"GP-LCB phase, local moves of the best mask get {POLISH_SHARE:.0%} of the rest. The paper uses 500.")


class GCacheSearch(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="GCacheSearch", display_name="GCache Search", category=cc.CATEGORY, is_output_node=True,
            description="Finds the K steps to compute: GP-LCB over the propagation weights outside, the exact DP "
                        "inside, each candidate sampled and compared with the full run. In the background (the "
                        "default) it samples the reference runs, returns the best policy so far and goes on in "
                        "slices queued behind your own prompts; the GCache panel shows it. Resumes from its state "
                        "file when queued again; saves models/gcache/<policy_name>.json.",
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
            inputs=[
                io.Model.Input("model", tooltip="The model to search a policy for (without GCache Apply)."),
                io.Conditioning.Input("positive", tooltip="Positive conditioning of the reference runs."),
                io.Conditioning.Input("negative", tooltip="Negative conditioning (unused when cfg is 1)."),
                io.Latent.Input("latent", tooltip="Latent of the reference runs (size, frames, batch)."),
                io.Vae.Input("vae", tooltip="Decodes latents to images for the objective."),
                io.Int.Input("seed", default=0, min=0, max=0xffffffffffffffff, control_after_generate=False,
                             tooltip="First noise seed of the reference runs (also seeds the search)."),
                io.Int.Input("seeds", default=LEAST_SEEDS, min=1, max=64,
                             tooltip="Number of reference runs (seed, seed+1, …); the loss is their mean. Every "
                                     "evaluation samples each seed once, so the search's sampling time grows with "
                                     "the seeds (2 seeds: twice that of 1). A search with a profile-fitted "
                                     "forecaster also samples as many fresh seeds (seed+seeds, …) at the end, to "
                                     "choose among its finalists on seeds it never judged a mask on. With 1 seed the "
                                     "polish guard, the forecaster check and that final choice decide by a lower "
                                     "mean loss alone, with no test against the seed noise (the log says so)."),
                io.Int.Input("steps", default=20, min=2, max=1000, tooltip="Sampler steps N."),
                io.Float.Input("cfg", default=1.0, min=0.0, max=100.0, step=0.1, round=0.01,
                               tooltip="Classifier-free guidance scale, as in your KSampler."),
                io.Combo.Input("sampler_name", options=comfy.samplers.KSampler.SAMPLERS, default="euler",
                               tooltip="Sampler, as in your KSampler."),
                io.Combo.Input("scheduler", options=comfy.samplers.KSampler.SCHEDULERS, default="simple",
                               tooltip="Scheduler, as in your KSampler."),
                io.Int.Input("k", default=10, min=1, max=1000,
                             tooltip="Budget K: steps that compute the block stack (K < steps). Speed-up ≈ steps/K."),
                io.Int.Input("budget", default=64, min=2, max=10000, tooltip=budget_tooltip()),
                io.Int.Input("degree", default=3, min=1, max=4,
                             tooltip="Degree of the Bernstein polynomial w(t; s) (the paper uses 3).", **cc.ADVANCED),
                io.Combo.Input("objective", options=list(OBJECTIVES), default="lpips_ssim",
                               tooltip="Loss vs. the full run: LPIPS + (1 − SSIM) (the paper's; torchvision's AlexNet, "
                                       "233 MB, is downloaded on first use), 1 − SSIM, or −PSNR (no weights)."),
                io.Combo.Input("forecast", options=list(cc.FORECAST), default="reuse (0)", optional=True,
                               tooltip="The forecaster every candidate mask is judged with (forecast masks differ "
                                       "from reuse masks). With a profile-fitted one, every profile-fitted "
                                       "forecaster's masks are searched too, and the finalists are compared on fresh "
                                       "seeds. "
                                       "Forecasting records the reference runs' forecast errors too (a connected "
                                       "profile needs them).", **cc.ADVANCED),
                io.String.Input("policy_name", default="my_policy",
                                tooltip="Saved as models/gcache/<name>.json; <name>.search.json keeps the state."),
                io.Combo.Input("mode", options=list(MODES), default="background", optional=True,
                               tooltip="background: return at once and search in slices queued behind your own "
                                       "prompts (ComfyUI stays usable); foreground: search until done inside this "
                                       f"prompt (API prompts without this input run in the {MODE_WITHOUT_INPUT}).",
                               **cc.ADVANCED),
                io.Int.Input("slice_seconds", default=60, min=1, max=3600, optional=True,
                             tooltip="background: evaluations per slice until this many seconds are spent (at least "
                                     "one). A prompt you queue meanwhile waits at most one slice.", **cc.ADVANCED),
                cc.ProfileSocket.Input("profile", optional=True,
                                       tooltip="A profile from GCache Load Profile; without one the node profiles "
                                               "its own full-compute reference runs."),
            ],
            outputs=[cc.PolicySocket.Output(tooltip="The policy, for GCache Apply."),
                     io.Image.Output(tooltip="Loss per iteration, learned w(t) and the mask as a timeline.")],
        )

    @classmethod
    def fingerprint_inputs(cls, **kwargs):
        return float("nan")  # never served from ComfyUI's cache: each queue starts, continues or reports the search

    @classmethod
    @cc.shown_to_user
    def execute(cls, model, positive, negative, latent, vae, seed, seeds, steps, cfg, sampler_name, scheduler, k,
                budget, degree, objective, policy_name, profile=None, forecast="reuse (0)", mode=MODE_WITHOUT_INPUT,
                slice_seconds=60) -> io.NodeOutput:
        cc.check_choice("forecast", forecast, list(cc.FORECAST))
        cc.check_choice("mode", mode, MODES)
        cc.check_choice("objective", objective, OBJECTIVES)  # 0.3.64 passes V3 combo values unchecked
        config = SearchConfig(k=k, degree=degree, budget=budget, seed=seed, objective=objective,
                              forecast=cc.FORECAST[forecast])
        job = SearchJob(model, positive, negative, latent, vae, [seed + i for i in range(seeds)], steps, cfg,
                        sampler_name, scheduler, config, cc.folder(), safe_name(policy_name, "policy name"), profile)
        job.check_config()  # K and the budget, before any sampling (on the profile the reference runs will record)
        require(*search_modules(objective))  # before any sampling: names a missing package and its pip command
        make_objective(objective)  # fails early, with a message, when LPIPS weights are missing
        job.check_profile()  # before the reference runs
        hidden = getattr(cls, "hidden", None)
        prompt, node_id = getattr(hidden, "prompt", None), getattr(hidden, "unique_id", None)
        job.node_id = node_id
        slice_of = background.marker(prompt, node_id)
        try:  # a model whose self-check failed, recorded before or found by the reference runs: nothing searched
            job.check_selfcheck()
            return _dispatch(job, prompt, node_id, slice_of, mode, slice_seconds)
        except NothingToSearch as e:
            return _nothing(job, str(e), slice_of)


def _dispatch(job: SearchJob, prompt, node_id, slice_of, mode: str, slice_seconds: int) -> io.NodeOutput:
    """The search this queue asks for: a background slice, a background start, or the foreground search."""
    try:
        job.check_files()  # an unwritable folder, a damaged state file or another search's: before any sampling
    except GCacheError as e:
        bg = background.JOBS.of_marker(slice_of) if slice_of is not None else None
        if bg is not None and bg.mode == "background":  # the tab says why it ended (unless it had ended)
            background.JOBS.update(bg, status="failed", message=str(e), refs=None)
        raise
    if slice_of is not None:
        return _slice(job, slice_of, slice_seconds)
    live = background.JOBS.get(job.name)
    if live is not None and live.status in background.ACTIVE and live.identity != job.identity():
        # another search of this name (another model, other inputs) is queued or running: its state file and profile
        # are its own; nothing of it is touched, nothing is sampled
        raise GCacheError(background.another_search(live))
    if mode == "background" and prompt is not None and node_id is not None:
        return _start(job, prompt, node_id, slice_seconds)
    return _foreground(job, node_id)


def _nothing(job: SearchJob, why: str, slice_of=None) -> io.NodeOutput:
    """No search on a model whose self-check failed: a policy that computes every step (not saved), and why."""
    log.warning("%s.", why)
    verdicts.show(job.node_id or "", why)
    own = background.JOBS.of_marker(slice_of) if slice_of is not None else None  # this slice's job
    for bg in (own, background.JOBS.of_search(job.name, job.identity())):  # never another search of the name
        if bg is not None:  # the tab says why it ended (a paused or ended search is left as it is)
            background.JOBS.update(bg, status="failed", message=why, refs=None)
    policy = Policy.all_ones(job.steps, provenance={"search": "nothing searched: GCache's self-check failed"})
    image = plot_policy(policy, [1.0] * job.steps, f"GCache Search {job.name}: nothing searched (self-check failed)")
    return io.NodeOutput(policy, cc.pil_to_image(image))


def _is_finished(job: SearchJob, state) -> bool:
    """Whether this queue finds its search finished: done, at this budget (a larger one continues it, as
    SearchState.open does: its evaluations need the reference images, which _finished samples none of), with its
    end game complete (one stopped in its forecaster check or on its fresh seeds measures the rest with them)."""
    return state is not None and state.done and len(state.history) >= job.config.budget and \
        end_game.complete(state, job.load_profile(), job.config.forecast)


def _finished(job: SearchJob) -> io.NodeOutput:
    """A search whose state file says it is done: its policy, with no sampling (as the foreground search ends)."""
    profile = job.load_profile()
    result = job.search(profile, [], lambda: False)  # a finished state evaluates nothing
    policy = job.finish(result, profile)
    ended = background.JOBS.of_search(job.name, job.identity())
    if ended is not None and ended.status not in background.ACTIVE:  # the tab's row of it (failed, say) says so
        background.JOBS.put(background.Job(
            job.name, job.state_path, job.config.budget, ended.node_id, {}, status="done",
            evaluations=len(result.history), best_loss=float(policy.metrics["loss"]), mode=ended.mode,
            message=f"done: {job.name}.json saved", identity=ended.identity))
    return io.NodeOutput(policy, cc.pil_to_image(plot_search(result, [float(t) for t in profile.times])))


def _foreground(job: SearchJob, node_id=None) -> io.NodeOutput:
    """The whole search inside this prompt. The GCache tab lists it as running in the foreground; its Cancel stops
    the search before its next image (after the reference runs), and the prompt goes on with the best policy so far
    (the state file is kept, as for a background search)."""
    state = _state(job)
    if _is_finished(job, state):
        return _finished(job)
    done = len(state.history) if state is not None else 0
    fg = background.JOBS.put(background.Job(
        job.name, job.state_path, job.config.budget, str(node_id or ""), {}, status="running",
        message="running in the foreground (this prompt): the reference runs", evaluations=done,
        client_id=background.current_client(), mode="foreground", identity=job.identity()))
    try:
        refs = job.references(_reference_progress(len(job.seeds)))  # all of them: they are its profile too
        job.cancelled = lambda: fg.cancelled  # from here on a Cancel samples nothing more
        profile = job.load_profile()
        background.JOBS.update(fg, message="running in the foreground (this prompt): evaluating")
        bar = _evaluation_progress(job.config.budget, done)

        def progress(info):
            best = info.get("best_loss")
            background.JOBS.update(fg, evaluations=int(info.get("iteration", fg.evaluations)),
                                   best_loss=fg.best_loss if best is None else float(best))
            bar(info.get("iteration", 0))

        def should_stop() -> bool:
            return comfy.model_management.processing_interrupted() or fg.cancelled

        try:
            result = job.search(profile, refs, should_stop, progress)
        except SearchInterrupted:
            comfy.model_management.throw_exception_if_processing_interrupted()  # ComfyUI's own Interrupt
            if not fg.cancelled:
                raise
            log.info("GCache Search %s: cancelled after %d of %d evaluations; the state file is kept (queue it again "
                     "to resume) and the prompt goes on with the best policy so far.", job.name, fg.evaluations,
                     job.config.budget)
            background.JOBS.update(fg, message=f"cancelled after {fg.evaluations} of {fg.budget} evaluations; the "
                                               "prompt went on with the best policy so far; its state file is kept: "
                                               "queue GCache Search again to resume")
            return _report(job, profile, fg)
        policy = job.finish(result, profile)
    except comfy.model_management.InterruptProcessingException:  # a BaseException in 0.33
        background.JOBS.update(fg, status="paused", message="interrupted: queue GCache Search again to resume")
        raise
    except Exception as e:
        background.JOBS.update(fg, status="failed", message=str(e))  # refused when it was cancelled
        raise
    if not background.JOBS.update(fg, status="done", evaluations=len(result.history),
                                  best_loss=float(policy.metrics["loss"]), message=f"done: {job.name}.json saved"):
        log.info("GCache Search %s: cancelled as it finished; its policy is saved.", job.name)
    return io.NodeOutput(policy, cc.pil_to_image(plot_search(result, [float(t) for t in profile.times])))


def _reference_progress(n: int) -> Callable[[], None]:
    """ComfyUI's progress bar on this node while the reference runs sample: runs done of n."""
    pbar = comfy.utils.ProgressBar(n)
    pbar.update_absolute(0, n)
    done = [0]

    def tick():
        done[0] += 1
        pbar.update_absolute(done[0], n)
    return tick


def _evaluation_progress(budget: int, done: int) -> Callable[[int], None]:
    """ComfyUI's progress bar on this node while the search evaluates: evaluations done (the state file's history,
    resumed ones included) of the budget."""
    pbar = comfy.utils.ProgressBar(budget)
    pbar.update_absolute(min(done, budget), budget)
    return lambda evaluations: pbar.update_absolute(min(int(evaluations), budget), budget)


def _start(job: SearchJob, prompt: dict, node_id: str, slice_seconds: int) -> io.NodeOutput:
    """The user queued GCache Search: references (once), then the best policy so far, and a slice queued."""
    running, key = background.JOBS.of_search(job.name, job.identity()), job.refs_key()
    if running is not None and running.status in background.ACTIVE and running.mode == "background":
        log.info("GCache Search %s runs in the background (%d of %d evaluations): its best policy so far.", job.name,
                 running.evaluations, running.budget)
        if job.config.budget > running.budget:  # its slices run to the budget it started with
            why = (f"GCache Search {job.name} runs in the background to its budget of {running.budget} evaluations; "
                   f"the budget of {job.config.budget} queued now is not applied to it. Queue GCache Search again "
                   f"with budget {job.config.budget} after this search finishes: it then continues to "
                   f"{job.config.budget} evaluations")
            log.warning("%s.", why)
            verdicts.show(str(node_id), why + ".")
        background.JOBS.update(running, client_id=background.current_client())  # its next slices report to it
        return _report(job, job.load_profile(), running)
    state = _state(job)
    if _is_finished(job, state):  # finished before: its policy, as the foreground search gives it
        return _finished(job)
    refs = running.refs if running is not None and running.refs is not None and running.refs_key == key \
        else job.references(_reference_progress(len(job.seeds)))
    profile = job.load_profile()
    bg = background.Job(job.name, job.state_path, job.config.budget, str(node_id), {}, refs=refs, refs_key=key,
                        evaluations=len(state.history) if state is not None else 0,
                        client_id=background.current_client(), identity=job.identity())
    bg.prompt = background.slice_prompt(prompt, node_id, bg.marker)  # its slices name this job, not just its name
    background.JOBS.put(bg)
    _queue_next(bg, f"started; {bg.evaluations} of {bg.budget} evaluations done" if state is not None else "started")
    return _report(job, profile, bg)


def _slice(job: SearchJob, marker: str, seconds: int) -> io.NodeOutput:
    """A slice prompt of the job `marker` names (Job.marker): evaluations for `seconds`, then the next slice (or the
    end). Its first act is the move queued → running (Jobs, under its lock): a slice whose search was cancelled, has
    ended or is already running does nothing, and so does one whose job is no longer its name's (a newer search of
    that name, in the foreground or in the background, replaced it). A Cancel after that stops it before its next
    image (job.cancelled)."""
    bg = background.JOBS.of_marker(marker)
    if bg is not None and bg.mode != "background":
        bg = None
    if bg is None or not background.JOBS.update(bg, status="running", message="evaluating"):
        log.info("GCache Search %s: %s; this slice does nothing.", job.name,
                 "not running (or replaced by a newer search of that name)" if bg is None else bg.status)
        profile = job.load_profile() if bg is not None else None
        return _report(job, profile, bg) if profile is not None else io.NodeOutput(None, None)
    job.cancelled = lambda: bg.cancelled
    refs = bg.refs  # (a Cancel drops the job's own)
    try:
        if refs is None or bg.refs_key != job.refs_key():
            refs, key = job.references(_reference_progress(len(job.seeds))), job.refs_key()
            background.JOBS.keep_refs(bg, refs, key)
        else:  # no reference run checks the model in this slice: a first fail recorded since refuses too
            job.check_selfcheck(first_fail_too=True)
        profile = job.load_profile()
        state = _state(job)
        bar = _evaluation_progress(job.config.budget, len(state.history) if state is not None else 0)

        def progress(info):
            best = info.get("best_loss")
            background.JOBS.update(bg, evaluations=int(info.get("iteration", bg.evaluations)),
                                   best_loss=None if best is None else float(best))
            bar(bg.evaluations)

        result, why = run_slice(job, profile, refs, seconds, lambda: bg.cancelled, progress)
        # the end inside the guard: a policy that can't be saved ends the job as failed, never leaves it running
        policy = job.finish(result, profile) if why == "done" else None
    except SearchInterrupted:  # cancelled while it sampled its reference images: nothing more is sampled
        log.info("GCache Search %s: cancelled; this slice stops.", job.name)
        return io.NodeOutput(None, None)
    except comfy.model_management.InterruptProcessingException:  # Interrupt mid-evaluation (a BaseException in 0.33)
        background.JOBS.update(bg, status="paused", message="interrupted: queue GCache Search again to resume")
        raise
    except Exception as e:
        background.JOBS.update(bg, status="failed", message=str(e), refs=None)
        raise
    if why == "done":
        if not background.JOBS.update(bg, status="done", evaluations=len(result.history), refs=None,
                                      best_loss=float(policy.metrics["loss"]),
                                      message=f"done: {os.path.basename(job.state_path)[:-len('.search.json')]}"
                                              ".json saved"):
            log.info("GCache Search %s: cancelled as it finished; its policy is saved.", job.name)
        else:
            log.info("GCache Search %s: done in the background; the policy is saved.", job.name)
        return io.NodeOutput(policy, cc.pil_to_image(plot_search(result, [float(t) for t in profile.times])))
    if why == "interrupted":
        background.JOBS.update(bg, status="paused", message="interrupted: queue GCache Search again to resume")
        comfy.model_management.throw_exception_if_processing_interrupted()
    if why == "time":
        _queue_next(bg, f"{bg.evaluations} of {bg.budget} evaluations")
    return _report(job, profile, bg)


def _queue_next(bg: background.Job, what: str) -> None:
    """The next slice at the end of ComfyUI's queue, then the move to queued. A Cancel that lands meanwhile stands:
    the move is refused, and the slice just queued finds the search cancelled and does nothing."""
    if bg.status not in background.ACTIVE:  # cancelled (or ended) already: queue nothing
        return
    try:
        pid = background.queue_prompt(bg.prompt, bg.client_id)
    except (OSError, RuntimeError, KeyError, ValueError) as e:
        if background.JOBS.update(bg, status="paused", message=f"could not queue the next slice ({e}): queue "
                                                                 "GCache Search again to resume"):
            log.error("GCache Search %s: could not queue the next slice (%s); queue GCache Search again to resume.",
                      bg.id, e)
        return
    if not background.JOBS.update(bg, status="queued", queued_prompt=pid, message=f"{what}; next slice queued"):
        log.info("GCache Search %s: cancelled while its next slice was queued; that slice will do nothing.", bg.id)


def _state(job: SearchJob):
    """The job's state file as it is (search/state.py SearchState), None when there is none or it can't be read."""
    from ..search.state import SearchState
    return SearchState.peek(job.state_path)


def _report(job: SearchJob, profile, bg) -> io.NodeOutput:
    """The best policy so far and a picture of the search as it stands."""
    from ..search.infra.plots import plot_policy
    from ..search.instant import propagation_weights
    policy = job.best_so_far(profile)
    state = _state(job)
    status = f"{bg.status}: {bg.evaluations} of {bg.budget} evaluations" if bg is not None else "not running"
    if state is not None and state.history:
        image = plot_search(state, [float(t) for t in profile.times])
    else:
        image = plot_policy(policy, propagation_weights(profile, "theory"),
                            f"GCache Search {job.name} ({status}): the instant policy until the first evaluations")
    return io.NodeOutput(policy, cc.pil_to_image(image))
