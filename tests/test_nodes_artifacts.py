"""The nodes' artifact files (headless): names, lists, accumulation, files beside, no unpickling."""
import functools
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gcache.core.errors import GCacheError
from gcache.core.profile import Profile
from gcache.nodes import artifacts as files


def test_paths_and_unsafe_names(tmp_path):
    assert files.profile_path(str(tmp_path), "flux 30").endswith("flux 30.profile.safetensors")
    assert files.state_path(str(tmp_path), "p").endswith("p.search.json")
    for bad in ("../x", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(GCacheError):
            files.policy_path(str(tmp_path), bad)


def test_lists_separate_policies_states_and_profiles():
    names = ["a.json", "a.search.json", "b.profile.safetensors", "a.search.profile.safetensors", "c.txt",
             "selfcheck.json", "selfcheck.damaged-1.json", "selfchecked.json"]
    assert files.list_policies(names) == ["a.json", "selfchecked.json"]  # the self-check's record is no policy
    assert files.list_profiles(names) == ["a.search", "b"]


def _run_profile(value):
    p = Profile.empty([1.0, 0.5], meta={"family": "flux"})
    p.e_sum[:] = value
    np.fill_diagonal(p.e_sum, 0.0)  # E[i, i] = 0 always: a profile file with another diagonal is refused
    p.count = 1
    p.meta["runs"] = 1
    return p


def test_merge_into_file_accumulates_and_keeps_file_on_bad_merge(tmp_path):
    path = str(tmp_path / "x.profile.safetensors")
    files.merge_into_file(path, _run_profile(1.0))
    total = files.merge_into_file(path, _run_profile(3.0))
    assert total.count == 2 and total.meta["runs"] == 2 and np.allclose(Profile.load(path).E, [[0, 2.0], [2.0, 0]])
    before = open(path, "rb").read()
    other = Profile.empty([1.0, 0.6, 0.3], meta={"family": "flux"})
    other.count = 1
    with pytest.raises(GCacheError):
        files.merge_into_file(path, other)
    assert open(path, "rb").read() == before
    assert files.load_profile_opt(str(tmp_path / "none.profile.safetensors")) is None


def test_no_file_name_is_ever_unpickled(tmp_path):
    (tmp_path / "evil.json").write_bytes(b"\x80\x04K\x01.")  # a pickle, not JSON
    with pytest.raises(GCacheError):
        files.read_policy(str(tmp_path / "evil.json"))
    assert os.path.exists(tmp_path / "evil.json")


def test_unique_beside_never_overwrites(tmp_path):
    path = str(tmp_path / "x.profile.safetensors")
    first = files.unique_beside(path, "unmerged")
    assert first.endswith("x.unmerged-1.profile.safetensors")
    open(first, "wb").close()
    assert files.unique_beside(path, "unmerged").endswith("x.unmerged-2.profile.safetensors")


def test_duplicate_run_keys_merge_as_a_set(tmp_path):
    a, b = _run_profile(1.0), _run_profile(3.0)
    a.meta["sample_keys"], b.meta["sample_keys"] = ["k1"], ["k2", "k1"]
    path = str(tmp_path / "x.profile.safetensors")
    files.merge_into_file(path, a)
    assert Profile.load(path).sample_keys == ["k1"]
    assert files.merge_into_file(path, b).sample_keys == ["k1", "k2"]


def _add_runs(path, n, value, start):
    start.wait(60)  # both processes begin together, so their read-merge-writes overlap
    for _ in range(n):
        files.merge_into_file(path, _run_profile(value))


def test_two_processes_adding_runs_at_once_lose_none(tmp_path):
    """Two ComfyUI processes sharing models/gcache: every run lands (without the lock, read-merge-write races)."""
    import multiprocessing as mp
    path = str(tmp_path / "shared.profile.safetensors")
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_add_runs, args=(path, 12, v, start)) for v in (1.0, 3.0)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
    assert [p.exitcode for p in procs] == [0, 0]
    total = Profile.load(path)
    assert total.count == 24 and total.meta["runs"] == 24
    assert np.allclose(total.E[0, 1], 2.0)  # the mean of 12 runs at 1.0 and 12 at 3.0
    assert files.list_profiles(os.listdir(tmp_path)) == ["shared"]  # the lock file is not a profile


def test_a_profile_locked_too_long_is_left_unchanged(tmp_path):
    from gcache.core.files import exclusive
    path = str(tmp_path / "p.profile.safetensors")
    files.merge_into_file(path, _run_profile(1.0))
    with exclusive(path):  # held here; a second open file description (or handle) can't take it meanwhile
        with pytest.raises(GCacheError, match="locked by another process"):
            files.merge_into_file(path, _run_profile(3.0), lock_timeout_s=0.2)
    assert Profile.load(path).count == 1  # the run that could not get the lock was not written
    assert files.merge_into_file(path, _run_profile(3.0)).count == 2  # released: the next one lands


# ------------------------------------------------------------------------------ the searched policy auto applies
def _searched(loss, seeds=(0, 1), state="s1", objective="ssim", steps=6):
    from gcache.core.policy import Policy
    prov = {"model": "Flux", "seeds": list(seeds), "inputs": "abc", "steps": steps, "cfg": 1.0, "sampler": "euler",
            "scheduler": "simple", "latent_shape": [1, 16, 8, 8], "state": state}
    return Policy([1, 0, 1, 0, 0, 1], method="gcache", provenance=prov, metrics={"loss": loss, "objective": objective})


# GCache Search's provenance (nodes/search_jobs/job.py SearchJob.provenance) for the fixture's four seeds
NODE_PROVENANCE = {"model": "Flux", "seeds": [11, 12, 13, 14], "inputs": "abc", "steps": 10, "cfg": 1.0,
                   "sampler": "euler", "scheduler": "simple", "latent_shape": [1, 16, 8, 8]}


@functools.lru_cache(maxsize=None)
def _fresh_search() -> str:
    """The policy (as JSON) of a real search on tests/search_fixture.py whose final choice sampled fresh seeds: made by
    search.result.build, with the provenance GCache Search gives it."""
    import search_fixture as fx

    from gcache.search.config import SearchConfig
    from gcache.search.loop import run_search

    class Fresh(fx.Evaluator):
        can_sample_fresh = True  # as GCache Search's Evaluation: the fresh seeds' losses are another draw

        def __call__(self, mask, forecast=None, fresh=False):
            return [v * (0.8 if fresh else 1.0) for v in super().__call__(mask, forecast)]
    res = run_search(fx.make_profile(), SearchConfig(**{**fx.CONFIG, "budget": 26}), Fresh(),
                     provenance=NODE_PROVENANCE)
    assert isinstance(res.policy.provenance["fresh_seeds"]["seeds"], int)  # what end_game.py writes: a count
    return res.policy.to_json()


def _fresh_searched(loss, fresh, state):
    """The real search's policy as another search on the same seeds and references would have saved it: its id, loss
    on the search seeds and loss on the fresh seeds replaced."""
    from gcache.core.policy import Policy
    pol = Policy.from_json(_fresh_search())
    pol.provenance["state"] = state
    pol.metrics["loss"], pol.metrics["fresh_loss"] = loss, fresh
    return pol


def test_a_finished_search_saved_again_compares_on_its_fresh_seeds(tmp_path):
    """Every re-queue of a finished fitted search saves its policy again: the second save read the provenance the
    search writes (the fresh seeds' count) as a list of seeds and failed with TypeError."""
    from gcache.core.policy import Policy
    from gcache.search.end_game import fresh_seeds
    pol = Policy.from_json(_fresh_search())
    assert files.fresh_evidence(pol) == (fresh_seeds(NODE_PROVENANCE["seeds"]), pol.metrics["fresh_loss"])
    assert fresh_seeds(NODE_PROVENANCE["seeds"]) == [15, 16, 17, 18]  # by hand: the next four after 14
    path = str(tmp_path / "auto_Flux-1234abcd_10steps_simple_K4_searched.json")
    assert files.save_searched(path, pol).ours
    again = files.save_searched(path, Policy.from_json(_fresh_search()))
    assert not again.ours and "ranked on the 4 fresh seeds its final choice sampled" in again.note


def test_auto_ranks_two_searched_policies_by_their_fresh_seed_loss_as_the_search_does(tmp_path):
    """A pair whose two losses disagree: the earlier policy has the lower search-seed loss (the figure the fresh-seed
    choice calls the most flattered), the new one the lower fresh-seed loss: the new one replaces it. Without a fresh
    loss on both, the search-seed loss ranks them, and the note says which evidence."""
    from gcache.core.policy import Policy
    path = str(tmp_path / "auto_Flux-1234abcd_10steps_simple_K4_searched.json")
    files.save_searched(path, _fresh_searched(0.10, 0.40, "a"))
    won = files.save_searched(path, _fresh_searched(0.20, 0.30, "b"))
    assert won.ours and Policy.load(path).provenance["state"] == "b"
    assert won.note == "it replaces the policy an earlier search saved there: on the same seeds and reference " \
        "images, ranked on the 4 fresh seeds its final choice sampled, its loss 0.3 is lower than that one's 0.4"
    lost = files.save_searched(path, _fresh_searched(0.05, 0.35, "c"))  # lower search loss, higher fresh loss
    assert not lost.ours and Policy.load(path).provenance["state"] == "b"
    assert "ranked on the 4 fresh seeds its final choice sampled, its loss 0.3 is not higher than this search's " \
        "0.35" in lost.note
    # only one of the two has a fresh loss (a search with a fixed rule samples none): the search-seed loss, said so
    plain = _fresh_searched(0.15, 0.0, "d")
    del plain.provenance["fresh_seeds"], plain.metrics["fresh_loss"]
    one = files.save_searched(path, plain)
    assert one.ours and "ranked on the search seeds (only one has a loss on fresh seeds to rank them by)" in one.note


def test_a_searched_policy_never_silently_replaces_a_better_one_on_the_same_seeds(tmp_path):
    from gcache.core.policy import Policy
    path = str(tmp_path / "auto_Flux-1234abcd_6steps_simple_K3_searched.json")
    first = files.save_searched(path, _searched(0.20, state="a"))
    assert first.ours and first.note == "" and Policy.load(path).metrics["loss"] == 0.20
    worse = files.save_searched(path, _searched(0.30, state="b"))  # same seeds and references: worse, not saved
    assert not worse.ours and worse.policy.metrics["loss"] == 0.20 and Policy.load(path).metrics["loss"] == 0.20
    assert worse.note == "kept the policy an earlier search saved as " \
        "auto_Flux-1234abcd_6steps_simple_K3_searched.json: on the same seeds and reference images, ranked on the " \
        "search seeds (neither has a loss on fresh seeds to rank them by), its loss 0.2 is not higher than this " \
        "search's 0.3"
    tie = files.save_searched(path, _searched(0.20, state="c"))  # a tie keeps what is there
    assert not tie.ours and Policy.load(path).provenance["state"] == "a"
    better = files.save_searched(path, _searched(0.10, state="d"))
    assert better.ours and Policy.load(path).metrics["loss"] == 0.10
    assert better.note == "it replaces the policy an earlier search saved there: on the same seeds and reference " \
        "images, ranked on the search seeds (neither has a loss on fresh seeds to rank them by), its loss 0.1 is " \
        "lower " \
        "than that one's 0.2"
    again = files.save_searched(path, _searched(0.15, state="d"))  # the same search resumed: the lower loss still
    assert not again.ours and Policy.load(path).metrics["loss"] == 0.10
    # other seeds (or another objective): the losses don't compare; the earlier one is kept beside, in Apply's list
    other = files.save_searched(path, _searched(0.50, seeds=(5, 6), state="e"))
    side = "auto_Flux-1234abcd_6steps_simple_K3_searched.replaced-1.json"
    assert other.ours and Policy.load(path).metrics["loss"] == 0.50
    assert other.note == f"the policy an earlier search saved there was measured on another seeds, so the two " \
        f"losses don't compare: it was moved to {side} (pick it in policy_file to apply it)"
    assert Policy.load(str(tmp_path / side)).metrics["loss"] == 0.10
    assert side in files.list_policies(os.listdir(tmp_path))
    files.save_searched(path, _searched(0.05, seeds=(5, 6), state="f", objective="psnr"))
    assert (tmp_path / "auto_Flux-1234abcd_6steps_simple_K3_searched.replaced-2.json").is_file()
    # a damaged file is set aside, not overwritten
    (tmp_path / "x_K3_searched.json").write_text("{ not json")
    kept = files.save_searched(str(tmp_path / "x_K3_searched.json"), _searched(0.3))
    assert kept.ours and kept.note.startswith("the policy there can't be read (x_K3_searched.json is not valid JSON")
    assert kept.note.endswith("it was moved to x_K3_searched.damaged-1.json")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0.0, 1.0), st.integers(0, 3)), min_size=1, max_size=12))
def test_the_searched_file_holds_the_best_of_the_latest_references(saves):
    """Against a fold by hand: within one set of references the lowest loss stays (a tie keeps the earlier); another
    set of references takes the file and the one there is kept beside it."""
    import tempfile

    from gcache.core.policy import Policy
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "auto_K3_searched.json")
        held, moved = None, 0  # (group, loss, search) the file should hold
        for group, loss, search in saves:
            # a search's id comes from its config and references (search/state.py): one id, one set of references
            files.save_searched(path, _searched(loss, seeds=(group,), state=f"g{group}s{search}"))
            if held is None or held[0] != group:
                moved += held is not None
                held = (group, loss, search)
            elif loss < held[1]:
                held = (group, loss, search)
        pol = Policy.load(path)
        assert (pol.provenance["seeds"], pol.metrics["loss"], pol.provenance["state"]) == \
            ([held[0]], held[1], f"g{held[0]}s{held[2]}")
        assert len([f for f in os.listdir(d) if ".replaced-" in f]) == moved
