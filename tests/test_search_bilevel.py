"""The bilevel loop: de-duplication, resume after a crash, interruption, and every bad input."""
import json

import numpy as np
import pytest

from gcache.core.errors import GCacheError
from gcache.core.profile import Profile
from gcache.core.weights import bernstein_w
from gcache.search.config import SearchConfig
from gcache.search.dp import mask_cost
from gcache.search.loop import SearchInterrupted, mask_key, run_search
from gcache.search.state import check_state, load_state

N = 14


def make_profile(n=N, seed=0):
    rng = np.random.default_rng(seed)
    a = np.cumsum(rng.random(n))
    E = np.abs(a[:, None] - a[None, :]) * (1 + 0.3 * rng.random((n, n)))
    np.fill_diagonal(E, 0.0)
    times = np.linspace(1.0, 0.0, n + 1)[:-1]
    z = np.zeros(n)
    return Profile(n, E, 1, z + 1, z + 0.1, np.r_[0, rng.random(n - 1)], times, times.copy(), {"model": "synthetic"})


class Evaluator:
    """A deterministic 'sampling' loss: the bound under a hidden s*; counts calls; can crash at call m."""

    def __init__(self, profile, crash_at=None, value=None):
        self.E, self.t = profile.E, profile.times
        self.calls, self.crash_at, self.value = [], crash_at, value

    def __call__(self, mask):
        if self.crash_at is not None and len(self.calls) == self.crash_at:
            raise RuntimeError("simulated crash")
        self.calls.append(mask_key(mask))
        if self.value is not None:
            return self.value
        return mask_cost(self.E, bernstein_w(self.t, [1.0, 6.0, 2.0]), mask) / 100.0


CFG = dict(k=5, degree=2, budget=16, seed=1, objective="ssim", n_candidates=256, acq_polish=2)


def test_search_dedups_masks_and_returns_a_policy(tmp_path):
    prof = make_profile()
    ev = Evaluator(prof)
    seen = []
    res = run_search(prof, SearchConfig(**CFG), ev, state_path=str(tmp_path / "s.json"), progress=seen.append,
                     provenance={"seeds": [1, 2, 3]})
    assert len(ev.calls) == len(set(ev.calls)) == res.evaluations == len(res.state.masks)
    reused = [h for h in res.history if h["reused"]]
    for h in reused:  # a reused mask carries the loss of its first evaluation
        assert h["loss"] == res.state.masks[h["mask"]]["loss"]
    assert len(res.history) == 16 and len(seen) == 17
    assert len(res.history) + 1 == res.evaluations + len(reused) + int(res.state.final["reused"])
    pol = res.policy
    assert pol.method == "gcache" and pol.n_computed == 5 and pol.mask[0] == 1 and pol.n_steps == N
    assert pol.metrics["loss"] == min(res.best_loss, res.mu_loss)
    for key in ("s", "degree", "objective", "evaluations", "seeds"):
        assert key in pol.provenance
    assert pol.provenance["seeds"] == [1, 2, 3] and pol.provenance["objective"] == "ssim"
    assert res.best_loss == min(h["loss"] for h in res.history)
    assert res.mu_loss == res.state.masks[mask_key(res.mu_mask)]["loss"]
    on_disk = load_state(str(tmp_path / "s.json"))
    assert on_disk["done"] and on_disk["history"] == json.loads(json.dumps(res.history))


def test_resume_after_crash_gives_the_same_policy(tmp_path):
    prof = make_profile()
    full = run_search(prof, SearchConfig(**CFG), Evaluator(prof), state_path=str(tmp_path / "a.json"))
    path = str(tmp_path / "b.json")
    crashing = Evaluator(prof, crash_at=6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_search(prof, SearchConfig(**CFG), crashing, state_path=path)
    assert len(load_state(path)["masks"]) == 6  # every finished evaluation is on disk
    rest = Evaluator(prof)
    resumed = run_search(prof, SearchConfig(**CFG), rest, state_path=path)
    assert resumed.policy.mask == full.policy.mask and resumed.s_best == full.s_best
    assert [h["s"] for h in resumed.history] == [h["s"] for h in full.history]
    assert len(crashing.calls) + len(rest.calls) == full.evaluations  # only the running evaluation was lost
    # a finished search resumes to its result without evaluating again
    again = Evaluator(prof)
    assert run_search(prof, SearchConfig(**CFG), again, state_path=path).policy.mask == full.policy.mask
    assert again.calls == []


def test_should_stop_saves_and_raises(tmp_path):
    prof = make_profile()
    path = str(tmp_path / "s.json")
    ev = Evaluator(prof)
    with pytest.raises(SearchInterrupted):
        run_search(prof, SearchConfig(**CFG), ev, state_path=path, should_stop=lambda: len(ev.calls) >= 3)
    assert len(load_state(path)["history"]) >= 3
    res = run_search(prof, SearchConfig(**CFG), Evaluator(prof), state_path=path)
    full = run_search(prof, SearchConfig(**CFG), Evaluator(prof), state_path=None)
    assert res.policy.mask == full.policy.mask


@pytest.mark.parametrize("k", [0, N + 1, 2.5])
def test_budget_k_outside_range(tmp_path, k):
    path = tmp_path / "s.json"
    with pytest.raises(GCacheError):
        run_search(make_profile(), SearchConfig(**dict(CFG, k=k)), Evaluator(make_profile()), state_path=str(path))
    assert not path.exists()


@pytest.mark.parametrize("change", [dict(degree=0), dict(degree=5), dict(budget=3), dict(s_min=5.0, s_max=1.0)])
def test_bad_config(change):
    with pytest.raises(GCacheError):
        run_search(make_profile(), SearchConfig(**dict(CFG, **change)), Evaluator(make_profile()))


def _partial_state(tmp_path):
    prof = make_profile()
    path = str(tmp_path / "s.json")
    with pytest.raises(RuntimeError):
        run_search(prof, SearchConfig(**CFG), Evaluator(prof, crash_at=4), state_path=path)
    with open(path, "rb") as f:
        return prof, path, f.read()


def _unchanged(path, before):
    with open(path, "rb") as f:
        return f.read() == before


def test_profile_of_another_step_count_is_refused_and_file_kept(tmp_path):
    prof, path, before = _partial_state(tmp_path)
    other = make_profile(n=N + 2)
    with pytest.raises(GCacheError, match="another search"):
        run_search(other, SearchConfig(**CFG), Evaluator(other), state_path=path)
    assert _unchanged(path, before)


def test_different_config_or_profile_is_refused_and_file_kept(tmp_path):
    prof, path, before = _partial_state(tmp_path)
    for cfg, p in ((dict(CFG, k=6), prof), (dict(CFG, seed=2), prof), (dict(CFG, objective="psnr"), prof),
                   (CFG, make_profile(seed=5))):
        with pytest.raises(GCacheError, match="another search"):
            run_search(p, SearchConfig(**cfg), Evaluator(p), state_path=path)
        assert _unchanged(path, before)
    with pytest.raises(GCacheError, match="another search"):
        run_search(prof, SearchConfig(**CFG), Evaluator(prof), state_path=path, provenance={"seeds": [9]})
    assert _unchanged(path, before)


def test_another_search_is_named_by_what_differs_only(tmp_path):
    """The forecaster is compared by name: a state file holds 'reuse' where the config's identity says 0 (the
    message once read "k: file 5, now 6; forecast: file 'reuse', now 0")."""
    prof, path, before = _partial_state(tmp_path)
    with pytest.raises(GCacheError) as e:
        run_search(prof, SearchConfig(**dict(CFG, k=6)), Evaluator(prof), state_path=path)
    assert "(k: file 5, now 6)" in str(e.value) and "forecast" not in str(e.value)
    # before any sampling (no profile yet): config and provenance, each difference once, forecasters by name
    with pytest.raises(GCacheError) as e:
        check_state(path, SearchConfig(**dict(CFG, k=6, forecast=1)), {})
    assert "(k: file 5, now 6; forecast: file 'reuse', now 'linear')" in str(e.value)
    with pytest.raises(GCacheError, match=r"another search \(provenance differs in seeds\)"):
        check_state(path, SearchConfig(**CFG), {"seeds": [9]})
    assert check_state(path, SearchConfig(**dict(CFG, budget=40)), {})["fingerprint"]  # a larger budget continues
    assert check_state(str(tmp_path / "none.json"), SearchConfig(**CFG), {}) is None
    data = json.loads(before)
    data["config"]["forecast"] = 0  # as a GCache that stored forecast orders wrote it
    with open(path, "w") as f:
        json.dump(data, f)
    assert check_state(path, SearchConfig(**CFG), {}) is not None
    with open(path, "w") as f:
        f.write("{")
    with pytest.raises(GCacheError, match="s.json is unreadable or damaged"):
        check_state(path, SearchConfig(**CFG), {})


def test_a_state_file_of_the_previous_version_is_refused_with_what_to_do(tmp_path):
    """Version-2 files had three start masks and no polish: resuming one would propose other masks than it recorded."""
    prof, path, _ = _partial_state(tmp_path)
    with open(path) as f:
        state = json.load(f)
    state["version"] = 2
    for key in ("polish", "starts"):
        state.pop(key)
    with open(path, "w") as f:
        json.dump(state, f)
    with open(path, "rb") as f:
        before = f.read()
    with pytest.raises(GCacheError, match="version 2; this GCache reads 3, 4 and 5. Delete it to search again"):
        run_search(prof, SearchConfig(**CFG), Evaluator(prof), state_path=path)
    assert _unchanged(path, before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None, "x"])
def test_non_finite_loss_is_an_error_and_state_is_kept(tmp_path, bad):
    prof, path, before = _partial_state(tmp_path)

    def evaluate(mask):
        return bad
    with pytest.raises(GCacheError, match="not a finite loss"):
        run_search(prof, SearchConfig(**CFG), evaluate, state_path=path)
    assert _unchanged(path, before)


@pytest.mark.parametrize("content", [b"{\"format\": \"gcache.search_state\", \"vers", b"\x00\xff garbage",
                                     b"{\"format\": \"something.else\", \"version\": 1}", b"[1, 2, 3]",
                                     b"{\"format\": \"gcache.search_state\", \"version\": 99}",
                                     b"{\"format\": \"gcache.search_state\", \"version\": 1, \"history\": 5}"])
def test_corrupted_or_foreign_state_is_refused_and_kept(tmp_path, content):
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(GCacheError):
        run_search(make_profile(), SearchConfig(**CFG), Evaluator(make_profile()), state_path=str(path))
    assert path.read_bytes() == content
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temp files left behind


def test_same_mask_from_two_s_shares_one_evaluation():
    prof = make_profile()
    ev = Evaluator(prof, value=0.5)  # a flat objective: the GP keeps proposing, masks repeat
    res = run_search(prof, SearchConfig(**CFG), ev)
    assert len(ev.calls) == len(set(ev.calls)) == res.evaluations
    assert sum(h["reused"] for h in res.history) == len(res.history) - len({h["mask"] for h in res.history})


def test_gp_fits_log_loss_for_positive_losses_only():
    from gcache.search.loop import gp_targets
    assert np.allclose(gp_targets([1e-4, 1e-2], True), np.log([1e-4, 1e-2]))
    assert np.allclose(gp_targets([-30.0, -40.0], True), [-30.0, -40.0])  # −PSNR stays as it is
    assert np.allclose(gp_targets([1e-4, 1e-2], False), [1e-4, 1e-2])


def test_larger_budget_continues_a_finished_search(tmp_path):
    prof = make_profile()
    path = str(tmp_path / "s.json")
    run_search(prof, SearchConfig(**CFG), Evaluator(prof), state_path=path)
    ev = Evaluator(prof)
    res = run_search(prof, SearchConfig(**dict(CFG, budget=20)), ev, state_path=path)
    assert len(res.history) == 20 and len(ev.calls) <= 5 and res.state.done


@pytest.mark.parametrize("edit", [
    lambda st: st["gp"].__setitem__("theta", [0.1]),                  # wrong number of hyperparameters
    lambda st: st.pop("gp"),
    lambda st: st["history"][0].__setitem__("s", [1.0]),              # s of another degree
    lambda st: st["history"][1].pop("i"),
    lambda st: st["history"][0].__setitem__("loss", "0.5"),
    lambda st: st["history"][0].__setitem__("mask", "01"),
    lambda st: st.__setitem__("masks", []),
    lambda st: st.__setitem__("history", {}),
    lambda st: st.update(done=True, final=None),
    lambda st: st.__setitem__("pending", {}),
    lambda st: st.__setitem__("pending", [{"kind": "gp", "s": [1.0], "mask": st["history"][0]["mask"]}]),
    lambda st: st.__setitem__("pending", [{"kind": "grid", "s": [1.0, 2.0, 3.0], "mask": "1"}]),
    lambda st: st.__setitem__("pending", [{"kind": "magic", "s": [1.0, 2.0, 3.0], "mask": st["history"][0]["mask"]}]),
    # no parent
    lambda st: st.__setitem__("pending", [{"kind": "polish", "s": None, "mask": st["history"][0]["mask"]}]),
    lambda st: st["polish"].__setitem__("guard", "magic"),
    lambda st: st["polish"].__setitem__("incumbent", "01"),
    lambda st: st.pop("starts"),
])
def test_hand_edited_state_is_refused_and_kept(tmp_path, edit):
    """The search id still matches, so only the content check stands between a bad edit and a crash."""
    prof, path, _ = _partial_state(tmp_path)
    with open(path) as f:
        state = json.load(f)
    edit(state)
    with open(path, "w") as f:
        json.dump(state, f)
    with open(path, "rb") as f:
        before = f.read()
    with pytest.raises(GCacheError, match="damaged"):
        run_search(prof, SearchConfig(**CFG), Evaluator(prof), state_path=path)
    assert _unchanged(path, before)


def test_instant_masks_come_first_and_the_search_never_returns_worse(caplog):
    from gcache.search.starts import instant_masks
    prof = make_profile()
    first = {nm: m for nm, m, _ in instant_masks(prof, CFG["k"])}
    theory = mask_key(first["theory_dp"])

    def evaluate(mask):  # the theory mask is unbeatable; everything else is worse, per seed
        return [0.001, 0.002] if mask_key(mask) == theory else [0.5 + 0.01 * sum(mask[:3]), 0.6]
    with caplog.at_level("INFO", logger="gcache"):
        res = run_search(prof, SearchConfig(**CFG), evaluate, provenance={"seeds": [1, 2]})
    assert [h.get("method") for h in res.history[:3]] == ["theory_dp", "local_dp", "teacache"]
    assert all(h["s"] is None and h["kind"] == "instant" for h in res.history[:3])
    assert res.policy.mask == [int(c) for c in theory] and res.policy.provenance["won"] == "theory_dp"
    assert res.policy.metrics["loss_minus_instant"] == {"mean": 0.0, "se": 0.0, "seeds": 2}
    assert res.state.masks[theory]["per_seed"] == [0.001, 0.002]
    text = caplog.text
    assert "N = 14, K = 5, budget 16 (3 start masks, 8 start grid, 3 GP, 2 polish), 2 seeds, objective ssim; " \
        "starting" in text
    assert text.count("best loss so far") >= 8 and "won by theory_dp" in text


def test_a_better_searched_mask_wins_with_its_paired_difference():
    """Two seeds with losses v and 1.1 v: a mask better by Δ < 0 has paired differences Δ, 1.1 Δ, so mean 1.05 Δ and
    standard error 0.05 |Δ| (a gain of 21 s.e.: beyond the noise check)."""
    from gcache.search.starts import instant_masks
    prof = make_profile()
    ev = Evaluator(prof)
    res = run_search(prof, SearchConfig(**CFG), lambda mask: [ev(mask), ev(mask) * 1.1])
    theory = {nm: m for nm, m, _ in instant_masks(prof, CFG["k"])}["theory_dp"]
    gain = ev(res.policy.mask) - ev(theory)  # recomputed from the hidden loss, not read from the search
    assert gain < 0 and res.policy.provenance["won"] in ("gcache start grid", "gcache GP-LCB", "gcache argmin mu")
    assert res.policy.metrics["loss_minus_instant"] == {"mean": pytest.approx(1.05 * gain),
                                                        "se": pytest.approx(0.05 * -gain), "seeds": 2}


# Recorded from the search before its sequential and batch loops became one: the same problem must give the same
# proposals, the same reuses and the same choice.
RECORDED_MASKS = [
    "11000101001000", "10000101001010", "10001001010100", "10000101001010", "11001010010000", "10000101011000",
    "11001101000000", "10000001011010", "10000101001010", "10000001011010", "10000101001010", "11001101000000",
    "11001101000000", "10001101010000", "11001101000000", "10000111010000", "10000101010010", "10000111010000",
    "10000101011000", "10000111010000", "11001101000000", "10000001011010", "10000111010000", "11001101000000"]
RECORDED_REUSED = "...r....rrrrr.r..rrrrrrr"


def test_the_search_proposes_and_chooses_what_it_did_before_its_loops_were_merged():
    import math
    prof = make_profile()

    def bumpy(mask):  # the DP's cost under a hidden s*, made bumpy so that the GP has something to find
        base = mask_cost(prof.E, bernstein_w(prof.times, [1.0, 6.0, 2.0]), mask) / 100.0
        return base * (1 + 0.5 * math.sin(sum((i + 1) ** 2 * m for i, m in enumerate(mask))))
    res = run_search(prof, SearchConfig(**dict(CFG, budget=24, polish_share=0.0)), bumpy)  # the GP-only search
    assert [h["mask"] for h in res.history] == RECORDED_MASKS
    assert "".join("r" if h["reused"] else "." for h in res.history) == RECORDED_REUSED
    assert [h["kind"] for h in res.history] == ["instant"] * 3 + ["grid"] * 8 + ["gp"] * 13
    assert res.state.final["mask"] == "10000111010000" and res.state.final["reused"]
    assert res.policy.mask == [int(c) for c in "10000111010000"] and res.evaluations == 10
    assert (res.policy.provenance["won"], res.policy.provenance["chosen"]) == ("gcache GP-LCB", "best_evaluated")


@pytest.mark.parametrize("per_seed, says", [(False, True), (True, False)])
def test_an_unchecked_searched_winner_is_logged(caplog, per_seed, says):
    """Without per-seed losses the noise check can't run: the log says so when a searched mask won."""
    prof = make_profile()
    ev = Evaluator(prof)
    with caplog.at_level("INFO", logger="gcache"):
        res = run_search(prof, SearchConfig(**CFG), (lambda m: [ev(m), ev(m) * 1.1]) if per_seed else ev,
                         provenance={"seeds": [7]})
    assert res.s_best is not None  # a searched mask won
    assert ("searched mask was kept without checking its gain" in caplog.text) == says
    assert "1 seed, objective" in caplog.text
    # a one-seed search says once, at its start, which rules decide by the mean alone (a reuse search: the polish's)
    assert caplog.text.count("1 seed: the polish guard decides by a lower mean loss alone") == 1


def test_a_search_of_two_seeds_or_an_unknown_count_says_nothing_of_one_seed(caplog):
    prof = make_profile()
    ev = Evaluator(prof)
    for prov in ({"seeds": [7, 8]}, {}):
        with caplog.at_level("INFO", logger="gcache"):
            run_search(prof, SearchConfig(**dict(CFG, budget=14)), lambda m: [ev(m), ev(m) * 1.1], provenance=prov)
    assert "1 seed:" not in caplog.text


def test_a_profile_fitted_one_seed_search_names_every_rule_it_skips():
    from gcache.search import paired
    assert paired.LEAST_SEEDS == 2  # the halves (the forecaster check) need two seeds
    says = paired.one_seed_fallbacks(True)
    assert says.startswith("1 seed: the polish guard, the forecaster check and the final choice on fresh seeds decide "
                           "by a lower mean loss alone") and says.endswith("use 2 or more seeds")
    assert "forecaster check" not in paired.one_seed_fallbacks(False)


def test_an_instant_winner_is_not_called_unchecked(caplog):
    from gcache.search.starts import instant_masks
    prof = make_profile()
    theory = mask_key({nm: m for nm, m, _ in instant_masks(prof, CFG["k"])}["theory_dp"])
    with caplog.at_level("INFO", logger="gcache"):
        res = run_search(prof, SearchConfig(**CFG), lambda mask: 0.001 if mask_key(mask) == theory else 0.5)
    assert res.policy.provenance["won"] == "theory_dp"
    assert "without checking its gain" not in caplog.text


def test_budget_covering_only_the_start_grid_names_the_minimum():
    with pytest.raises(GCacheError, match="minimum useful budget is 12"):
        run_search(make_profile(), SearchConfig(**dict(CFG, budget=11)), Evaluator(make_profile()))


def test_resumed_search_says_so(tmp_path, caplog):
    prof = make_profile()
    path = str(tmp_path / "s.json")
    with pytest.raises(SearchInterrupted):
        run_search(prof, SearchConfig(**CFG), Evaluator(prof), state_path=path, should_stop=lambda: len(
            json.load(open(path))["history"]) >= 5 if __import__("os").path.exists(path) else False)
    with caplog.at_level("INFO", logger="gcache"):
        run_search(prof, SearchConfig(**CFG), Evaluator(prof), state_path=path)
    assert "resumed at evaluation 5" in caplog.text


@pytest.mark.parametrize("spread", [0.055, 0.0])
def test_a_searched_mask_with_a_lower_loss_wins_and_a_noise_margin_is_a_rule_option(spread):
    """The final choice takes a lower mean loss (paired.CHOICE_Z = 0, measured by bench/choice_regret.py); a margin of
    2 standard errors over the seeds (the rule before it) keeps the start mask when the gain is within the noise."""
    from gcache.bench.choice_regret import choose_under
    from gcache.search import paired
    from gcache.search.starts import instant_masks
    prof = make_profile()
    inst = {mask_key(m) for _, m, _ in instant_masks(prof, CFG["k"])}

    def evaluate(mask):  # searched masks are 0.005 better on average, with (or without) a large seed spread
        if mask_key(mask) in inst:
            return [0.5, 0.5, 0.5, 0.5]
        return [0.495 - spread, 0.495 + spread, 0.495 - spread, 0.495 + spread]
    res = run_search(prof, SearchConfig(**CFG), evaluate)
    assert mask_key(res.policy.mask) not in inst and res.policy.provenance["chosen"] == "best_evaluated"
    strict = choose_under(res.state, paired.beyond_z(2.0))
    assert (strict["mask"] in inst) == (spread > 0)  # 0.005 within a spread of ±0.055: 0.09 standard errors


def test_the_best_entry_is_the_lowest_loss_and_the_earliest_on_a_tie():
    from gcache.search.state import SearchState
    hist = [{"i": 0, "kind": "instant", "loss": 0.3, "mask": "a"}, {"i": 1, "kind": "grid", "loss": 0.2, "mask": "b"},
            {"i": 2, "kind": "gp", "loss": 0.2, "mask": "c"}, {"i": 3, "kind": "instant", "loss": 0.25, "mask": "d"}]
    st = SearchState({"history": hist, "final": {"mask": "e", "loss": 0.2}}, None)
    assert st.best()["mask"] == "b" and st.best(upto=1)["mask"] == "a"
    assert st.best(kinds=("instant",))["mask"] == "d" and st.best(kinds=("polish",)) is None
    assert st.best(with_final=True)["mask"] == "b"  # the final entry loses a tie to every history entry
    st = SearchState({"history": hist, "final": {"mask": "e", "loss": 0.1}}, None)
    assert st.best(with_final=True)["mask"] == "e" and st.best()["mask"] == "b"
