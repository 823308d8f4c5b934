"""The paired statistics over the seeds (search/paired.py) against hand-computed values, and the rules a search applies
with them: the polish guards, the final choice's noise rule and the registry of saved guard names."""
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gcache.search import paired
from gcache.search.paired import HALVES, MEAN, POLISH, beyond_z, halves, paired_difference


def m(*per_seed):
    return {"loss": float(np.mean(per_seed)), "per_seed": list(per_seed)}


def test_the_paired_difference_by_hand():
    # d = [-0.1, -0.3, 0.1, -0.1]: mean -0.1; sample s.d. sqrt((0 + 0.04 + 0.04 + 0) / 3) = 0.163299; s.e. 0.081650
    d = paired_difference([0.9, 0.7, 1.1, 0.9], [1.0, 1.0, 1.0, 1.0])
    assert d["seeds"] == 4 and d["mean"] == pytest.approx(-0.1)
    assert d["se"] == pytest.approx(math.sqrt(0.08 / 3) / 2)
    assert paired_difference([0.5], [0.7]) == {"mean": pytest.approx(-0.2), "se": None, "seeds": 1}  # one seed
    assert paired_difference([0.5, 0.6], [0.7]) is None and paired_difference(None, [0.7]) is None
    assert paired_difference([1.0, 2.0], [1.0, 2.0]) == {"mean": 0.0, "se": 0.0, "seeds": 2}


def test_halves_split_the_seeds_in_two():
    for n in (2, 3, 16):
        a, b = halves(n, seed=5)
        assert sorted(a + b) == list(range(n)) and len(a) == n // 2 and halves(n, seed=5) == (a, b)
    assert any(halves(16, s) != halves(16, 0) for s in range(1, 4))  # the search seed decides the split


def test_a_move_is_kept_under_halves_only_when_both_halves_improve():
    old = m(1.0, 1.0, 1.0, 1.0)
    for seed in range(4):
        a, b = halves(4, seed)
        one = [1.0] * 4
        for i in a:
            one[i] = 0.5  # half A falls a lot, half B rises a little: the mean falls
        for i in b:
            one[i] = 1.1
        assert not HALVES.decide(m(*one), old, seed) and MEAN.decide(m(*one), old, seed)
        both = [0.9 if i % 2 else 0.95 for i in range(4)]  # every seed better: both halves are
        assert HALVES.decide(m(*both), old, seed)
    assert HALVES.decide({"loss": 0.5}, {"loss": 0.6}) and HALVES.better({"loss": 0.5}, {"loss": 0.6}) is None


def test_the_z_guard_by_hand():
    old = m(1.0, 1.0, 1.0, 1.0)
    # d = [-0.4, 0.1, -0.4, 0.1]: mean -0.15, sample s.d. 0.2887, s.e. 0.1443: 1.039 standard errors
    assert POLISH.decide(m(0.6, 1.1, 0.6, 1.1), old)
    assert not beyond_z(1.05).decide(m(0.6, 1.1, 0.6, 1.1), old)
    # d = [-0.5, 0.2, -0.5, 0.2]: mean -0.15, s.e. 0.2021: 0.742 — beyond 0.674, not 0.75
    lopsided = m(0.5, 1.2, 0.5, 1.2)
    assert POLISH.decide(lopsided, old) and not beyond_z(0.75).decide(lopsided, old)
    # d = [-0.7, 0.3, -0.7, 0.3]: mean -0.2, s.e. 0.2887: 0.693; d = [-0.9, 0.5, -0.9, 0.5]: 0.5
    assert POLISH.decide(m(0.3, 1.3, 0.3, 1.3), old)
    assert not POLISH.decide(m(0.1, 1.5, 0.1, 1.5), old)
    assert POLISH.decide(m(*[0.9] * 4), old)  # the same gain on every seed: s.e. 0
    assert not POLISH.decide(m(*[1.0] * 4), old) and not POLISH.decide(m(*[1.1] * 4), old)
    assert POLISH.decide({"loss": 0.5}, {"loss": 0.6}) and not POLISH.decide({"loss": 0.7}, {"loss": 0.6})
    assert POLISH.better({"loss": 0.5, "per_seed": [0.5]}, {"loss": 0.6, "per_seed": [0.6]}) is None  # one seed
    assert paired.POLISH_Z == pytest.approx(0.6745, abs=1e-3)  # the normal's 75 % point


def test_the_final_choices_rule_and_a_noise_margin_by_hand():
    old = m(1.0, 1.0, 1.0, 1.0)
    z = 0.15 / (math.sqrt(1 / 12) / 2)  # d = [-0.4, 0.1, -0.4, 0.1]: mean -0.15, s.d. sqrt(1/12): 1.039 s.e.
    assert z == pytest.approx(1.039, abs=1e-3)
    choice, margin = paired.CHOICE, beyond_z(2.0)
    assert paired.CHOICE_Z == 0.0 and choice.name == "choice" and "beyond 0 paired" in choice.says
    assert choice.better(m(0.6, 1.1, 0.6, 1.1), old) and not margin.better(m(0.6, 1.1, 0.6, 1.1), old)
    assert choice.better(m(0.99, 1.0, 0.99, 1.0), old)  # any lower mean: d = [-0.01, 0, -0.01, 0]
    assert margin.better(m(0.9, 0.88, 0.9, 0.88), old)  # d = [-0.1, -0.12, -0.1, -0.12]: 19.05 s.e.
    assert not choice.better(m(1.0, 1.0, 1.0, 1.01), old) and not choice.better(m(*[1.0] * 4), old)  # no gain


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 8), data=st.data())
def test_the_final_choices_rule_says_what_the_means_say(n, data):
    """CHOICE_Z = 0: the paired test believes a gain exactly when the mean loss falls, so search/choice.py applies no
    test (its noise branches were unreachable); a stricter rule is the bench's (bench/choice_regret.py)."""
    floats = st.floats(0.0, 2.0, allow_nan=False, allow_subnormal=False)
    a, b = (data.draw(st.lists(floats, min_size=n, max_size=n)) for _ in range(2))
    gap = sum(a) / n - sum(b) / n
    assume(abs(gap) > 1e-9)  # a difference of the means that float rounding can't flip
    assert paired.CHOICE.better(m(*a), m(*b)) == (gap < 0)


def test_under_the_z_guard_a_null_move_passes_one_time_in_four():
    """Per-seed differences that are pure noise: the z guard passes about 1 in 4 of them, as both halves do (each
    half's mean falls with probability 1/2)."""
    rng = np.random.default_rng(0)
    old = m(*[1.0] * 16)
    z_pass = halves_pass = 0
    for _ in range(4000):
        new = m(*(1.0 + rng.standard_normal(16) * 0.1))
        z_pass += POLISH.decide(new, old)
        halves_pass += HALVES.decide(new, old, 0)
    assert abs(z_pass / 4000 - 0.25) < 0.03 and abs(halves_pass / 4000 - 0.25) < 0.03


def test_the_guard_names_a_config_and_a_state_file_may_hold():
    assert tuple(paired.GUARDS) == ("halves", "z") and paired.GUARD in paired.GUARDS
    assert set(paired.SAVED_GUARDS) == {"halves", "z", "mean"}
    assert all(paired.guard(name).name == name for name in paired.SAVED_GUARDS)
    with pytest.raises(KeyError):
        paired.guard("choice")  # the final choice's rule, no polish guard


def _stored(name: str) -> dict:
    import json
    import os

    from gcache.search import paired
    root = os.path.dirname(os.path.dirname(os.path.abspath(paired.__file__)))
    with open(os.path.join(root, "bench", "results", f"{name}.json"), encoding="utf-8") as f:
        rec = json.load(f)
    return rec.get("result", rec)  # bench/runs.py's records wrap the result; choice_regret.json is the bench's own


def _polish_guard_counts() -> tuple:
    """z against halves, search by search, from the runs themselves (held-out PSNR; equal: a tie)."""
    runs = [r for n in ("polish_guard_48", "polish_guard_64") for r in _stored(n)["runs"]]
    d = [r["guards"]["z"]["psnr"] - r["guards"]["halves"]["psnr"] for r in runs]
    return sum(v > 0 for v in d), sum(v < 0 for v in d), len(d)


def _choice_medians() -> tuple:
    import statistics
    rows = _stored("choice_regret")["rows"]
    return tuple(f"{statistics.median(r['regret'][z] for r in rows):.2f}" for z in ("z=0", "z=2"))


def _check_switches() -> tuple:
    runs = _stored("forecaster_check")["runs"]
    return sum(r["picks"]["halves"]["forecaster"] != r.get("searched_with", "fitted") for r in runs), len(runs)


def _fresh_mean() -> str:
    runs = _stored("fresh_choice")["runs"]
    return f"{sum(r['picks']['z=1']['regret_db'] for r in runs) / len(runs):.2f}"


# Each rule of paired.py's docstring: the figure it quotes (a pattern) and that figure computed from its stored result
CITED_FIGURES = {
    "polish guard": (r"better in (\d+), worse in (\d+) of (\d+)", lambda m: tuple(map(int, m)), _polish_guard_counts),
    "final choice (CHOICE": (r"median held-out regret ([\d.]+) dB at z = 0, ([\d.]+) at z = 2", tuple, _choice_medians),
    "forecaster check": (r"switched in (\d+) of (\d+)", lambda m: tuple(map(int, m)), _check_switches),
    "final choice on fresh": (r"mean held-out regret ([\d.]+) dB at z = 1", lambda m: m[0], _fresh_mean),
}


def cited_rules(doc: str) -> list:
    import re
    return re.split(r"\n    (?=\S)", doc.split("The rules of one search")[1].split("\nGone:")[0])[1:]


def citation_problems(doc: str) -> list:
    """What is wrong with the rules' citations in `doc` (paired.py's docstring): a rule that cites no stored result,
    a cited file that does not exist, a quoted figure missing or other than its stored result's."""
    import os
    import re

    from gcache.search import paired
    root = os.path.dirname(os.path.dirname(os.path.abspath(paired.__file__)))
    problems = []
    for rule in cited_rules(doc):
        text = " ".join(rule.split())
        cited = re.findall(r"bench/results/([\w.]+\.json)", text) + [
            f"{m}.json" for m in re.findall(r"\band (\w+)\.json", text)]
        if not cited:
            problems.append(f"no stored result: {text[:60]}")
        problems += [f"no file {f}" for f in cited if not os.path.exists(os.path.join(root, "bench", "results", f))]
        name = next((n for n in CITED_FIGURES if text.startswith(n)), None)
        if name is None:
            problems.append(f"no figure registered for: {text[:60]}")
            continue
        pattern, parse, stored = CITED_FIGURES[name]
        m = re.search(pattern, text)
        if m is None:
            problems.append(f"{name}: quotes no figure like {pattern!r}")
        elif parse(m.groups()) != stored():
            problems.append(f"{name}: quotes {m.group(0)!r}, its stored result says {stored()}")
    return problems


def test_every_rule_cites_a_stored_result_and_quotes_a_figure_of_it():
    """Each rule of a search (paired.py's docstring) names the file in bench/results/ its measurement is stored in,
    and one figure it quotes is that file's (computed here from the stored runs); the rules nothing measured are
    gone."""
    from gcache.search import paired
    doc = paired.__doc__
    assert [r.split()[0:2] for r in cited_rules(doc)] == [["polish", "guard"], ["final", "choice"],
                                                          ["forecaster", "check"], ["final", "choice"]]
    assert citation_problems(doc) == []
    assert not any(hasattr(paired, gone) for gone in ("CHAIN", "CHAIN_Z", "CHECK_NEAR", "CHECK_Z"))


@pytest.mark.parametrize("quoted, wrong", [("better in 4, worse in 2 of 30", "better in 5, worse in 2 of 30"),
                                           ("regret 0.36 dB at z = 0", "regret 0.35 dB at z = 0"),
                                           ("switched in 2 of 15", "switched in 3 of 15"),
                                           ("regret 0.09 dB at z = 1", "regret 0.19 dB at z = 1"),
                                           ("polish_guard_64.json", "polish_guard_65.json")])
def test_the_citation_check_fails_on_a_wrong_figure_or_file(quoted, wrong):
    """The negative control: paired.py's docstring with one figure (or file name) changed fails the check."""
    from gcache.search import paired
    assert quoted in paired.__doc__
    assert citation_problems(paired.__doc__.replace(quoted, wrong))
