"""Step attribution from sigma lists and callbacks (headless: no ComfyUI)."""
import pytest

from gcache.core.errors import GCacheError
from gcache.core.policy import Policy
from gcache.nodes.patching.steps import Schedule, StepTracker, find_schedule, normalized_times, offset_in, place_policy

SIG = [1.0, 0.8, 0.6, 0.4, 0.2, 0.0]  # 5 steps


def drive(tracker, events):
    """events: ("call", sigma) or ("cb", i); returns the step of every call."""
    steps = []
    for kind, v in events:
        if kind == "cb":
            tracker.completed(v)
        else:
            steps.append(tracker.step(v))
    return steps


def test_euler_one_call_per_step_cfg_calls_share_it():
    ev = []
    for i in range(5):
        ev += [("call", SIG[i]), ("call", SIG[i]), ("cb", i)]  # cond and uncond as separate calls
    assert drive(StepTracker(SIG), ev) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_heun_corrector_counts_as_the_step_it_evaluates():
    # k-diffusion heun: eval σ_i, callback i, corrector at σ_{i+1} (none on the last step)
    ev = []
    for i in range(5):
        ev += [("call", SIG[i]), ("cb", i)] + ([("call", SIG[i + 1])] if SIG[i + 1] > 0 else [])
    assert drive(StepTracker(SIG), ev) == [0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_midpoint_evaluation_after_callback_belongs_to_its_step():
    # dpm_2 / dpmpp_2s_ancestral: eval σ_i, callback i, intermediate eval inside (σ_{i+1}, σ_i)
    ev = []
    for i in range(5):
        ev += [("call", SIG[i]), ("cb", i)] + ([("call", (SIG[i] + SIG[i + 1]) / 2)] if SIG[i + 1] > 0 else [])
    assert drive(StepTracker(SIG), ev) == [0, 0, 1, 1, 2, 2, 3, 3, 4]


def test_no_callback_falls_back_to_sigma_interval():
    t = StepTracker(SIG)
    assert [t.step(s) for s in (1.0, 0.9, 0.8, 0.41, 0.2, 0.05)] == [0, 0, 1, 2, 4, 4]


def test_offset_makes_steps_global():
    t = StepTracker(SIG[2:], offset=2)
    assert drive(t, [("call", 0.6), ("cb", 0), ("call", 0.4), ("cb", 1), ("call", 0.2)]) == [2, 3, 4]


def test_locate_slices_and_forced_zero_end():
    full = [1.0, 0.9, 0.7, 0.5, 0.3, 0.1, 0.0]
    assert offset_in(full[:4], full) == 0                 # high-noise expert, leftover noise returned
    assert offset_in(full[3:], full) == 3                 # low-noise expert
    assert offset_in([0.9, 0.7, 0.0], full) == 1          # force_full_denoise sets the end to 0
    assert offset_in([0.95, 0.7], full) is None
    assert offset_in(full, full) == 0


def test_find_schedule_prefers_policy_then_model_candidates():
    full = [1.0, 0.9, 0.7, 0.5, 0.3, 0.1, 0.0]
    s = find_schedule(full[3:], policy_sigmas=full[:-1])
    assert (s.offset, s.n_global, s.source, s.is_slice) == (3, 6, "policy", True)
    s = find_schedule(full[:4], None, [("short", [1.0, 0.5, 0.0]), ("simple", full)])
    assert (s.offset, s.n_global, s.source) == (0, 6, "model:simple")
    s = find_schedule([0.8, 0.4, 0.0], None, [("simple", full)])
    assert (s.offset, s.n_global, s.source, s.is_slice) == (0, 2, "run", False)
    with pytest.raises(GCacheError):
        find_schedule([1.0])


def test_place_policy_same_count_remap_and_refuse():
    pol = Policy([1, 0, 1, 0, 1, 0], times=[1 - i / 6 for i in range(6)])
    sched = Schedule([1 - i / 6 for i in range(7)], 0, 6, "run")
    assert place_policy(pol, sched, sched.sigmas[:-1]).mask == pol.mask
    sched12 = Schedule([1 - i / 12 for i in range(13)], 0, 12, "run")
    p = place_policy(pol, sched12, sched12.sigmas[:-1])
    assert len(p.mask) == 12 and sum(p.mask) == 6 and p.mask[0] == 1 and "remapped 6→12" in p.note
    with pytest.raises(GCacheError, match="made for 6 sampler steps but this sampler runs 12"):
        place_policy(pol, sched12, sched12.sigmas[:-1], on_mismatch="error")


def test_normalized_times_clamped():
    assert normalized_times([2.0, 0.5, -1.0], lambda s: s) == [1.0, 0.5, 0.0]


def test_schedule_catalog_scans_once_and_place_run_follows_the_tail_rule():
    from gcache.nodes.patching.steps import ScheduleCatalog, place_run
    calls = []

    def calculate(name, n):
        calls.append((name, n))
        if name == "broken":
            raise ValueError("cannot make this schedule")
        return [1.0 - i / n for i in range(n + 1)]  # a linear schedule 1 → 0

    cat = ScheduleCatalog(["broken", "linear"], calculate)
    full = [1.0 - i / 6 for i in range(7)]
    # a full run (σ_max … 0) is its own schedule: no scan at all
    assert place_run(full, 1.0, None, cat, lambda s: False).source == "run" and not calls
    second_half = full[3:]
    s = place_run(second_half, 1.0, None, cat, lambda s: False)  # the rest of a split: global steps 3-5
    assert (s.source, s.offset, s.n_global) == ("model:linear", 3, 6)
    scanned = len(calls)
    s = place_run(second_half, 1.0, None, cat, lambda s: True)   # a tail of its own (denoise < 1): own steps
    assert (s.source, s.offset, s.n_global) == ("tail", 0, 3)
    assert len(calls) == scanned  # the second placement reused every computed (and failed) schedule
    odd = [0.9, 0.55, 0.1]  # in no standard schedule: a miss, remembered too
    assert place_run(odd, 1.0, None, cat, lambda s: False).source == "run"
    scanned = len(calls)
    assert place_run(odd, 1.0, None, cat, lambda s: False).source == "run" and len(calls) == scanned
    # a standard schedule of its own length that starts below σ_max (ddim_uniform) is a full run, not a slice
    assert place_run([0.8, 0.4, 0.0], 1.0, None, ScheduleCatalog(["low"], lambda name, n: [0.8 * (1 - i / n)
                                                                                           for i in range(n + 1)]),
                     lambda s: False).source == "run"


def test_same_step_count_on_another_schedule_is_remapped_by_time_not_by_index():
    sched = Schedule([1 - i / 6 for i in range(7)], 0, 6, "run")
    pol = Policy([1, 0, 0, 1, 0, 1], times=[1 - i / 6 for i in range(6)])
    karras_like = [1.0, 0.6, 0.35, 0.2, 0.1, 0.04]  # another scheduler: the same index is another time
    p = place_policy(pol, sched, karras_like)
    assert "another schedule" in p.note and sum(p.mask) == 3 and p.mask[0] == 1
    with pytest.raises(GCacheError, match="another schedule of 6 steps"):
        place_policy(pol, sched, karras_like, on_mismatch="error")
    assert place_policy(pol, sched, [t + 1e-5 for t in pol.times]).note == ""  # float32 noise is the same schedule


def test_scheduler_of_names_the_schedule_also_when_the_sampler_dropped_its_penultimate_sigma():
    from gcache.nodes.patching.steps import ScheduleCatalog

    def calculate(name, n):
        if name == "broken":
            raise ValueError("cannot make this schedule")
        if name == "square":
            return [(1.0 - i / n) ** 2 for i in range(n + 1)]
        return [1.0 - i / n for i in range(n + 1)]

    cat = ScheduleCatalog(["broken", "linear", "square"], calculate)
    linear6 = calculate("linear", 6)
    assert cat.scheduler_of(linear6) == "linear"
    assert cat.scheduler_of(calculate("square", 6)) == "square"
    # dpm_2 / uni_pc sample 6 steps from a 7-step schedule with its penultimate sigma removed
    square7 = calculate("square", 7)
    dropped = square7[:-2] + square7[-1:]
    assert len(dropped) == 7 and cat.scheduler_of(dropped) == "square-penultimate-dropped"
    assert cat.name_of(dropped) is None  # not a full schedule of its own length
    # float32 noise is the same schedule; sigmas from no scheduler are None, never a near guess
    assert cat.scheduler_of([v + 1e-6 for v in linear6]) == "linear"
    assert cat.scheduler_of([1.0, 0.7, 0.31, 0.0]) is None
