"""The search state files under tests/data/, written by the search of 2026-11-27 (format 3) before search/ was
restructured, and the deterministic problem they come from: a later GCache must read, resume and finish them.

    PYTHONPATH=<a checkout's parent, as gcache> python tests/search_fixture.py   # writes tests/data/search_v3_*

writes the problem's profile (search_v3.profile.safetensors), a finished search with its forecaster check
(search_v3_done.search.json) and its policy (search_v3.policy.json), and the same search stopped by a crash in its
polish stage (search_v3_crashed.search.json: one evaluation pending). The files were written by the code of commit
2656f64 (the search in search/bilevel.py, the final choice's margin of 2 standard errors); written again by later code
they would test nothing, so leave them as they are.
"""
import hashlib
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
PROFILE = os.path.join(DATA, "search_v3.profile.safetensors")
DONE = os.path.join(DATA, "search_v3_done.search.json")
CRASHED = os.path.join(DATA, "search_v3_crashed.search.json")
POLICY = os.path.join(DATA, "search_v3.policy.json")
CONFIG = dict(k=4, degree=2, budget=30, seed=5, objective="ssim", n_candidates=256, acq_polish=2, forecast="fitted")
PROVENANCE = {"seeds": [11, 12, 13, 14], "model": "synthetic"}
TARGET = "1100010010"
CRASH_AT = 15  # evaluate() calls before the crash: in the polish stage


def _noise(key: str, salt: str) -> float:
    """A fixed number in [-1, 1) per (mask, salt)."""
    return int(hashlib.sha256(f"{key}|{salt}".encode()).hexdigest()[:8], 16) / 2 ** 31 - 1.0


class Evaluator:
    """Per-seed losses of 4 seeds for (mask, forecaster): a smooth function of where the computed steps lie, bumped
    per mask, with per-seed noise; the l2p forecaster is better on some masks, worse on others. Records its calls."""

    can_apply_forecaster = True  # evaluate(mask, forecast=name): the forecaster check runs

    def __init__(self, crash_at=None):
        self.calls, self.crash_at = [], crash_at

    def __call__(self, mask, forecast=None):
        if self.crash_at is not None and len(self.calls) == self.crash_at:
            raise RuntimeError("simulated crash")
        key = "".join(str(int(m)) for m in mask)
        self.calls.append((key, forecast))
        gaps = [j - i for i, j in zip([i for i, m in enumerate(key) if m == "1"],
                                      [i for i, m in enumerate(key) if m == "1"][1:] + [len(key)])]
        off = sum(a != b for a, b in zip(key, TARGET))  # a mask no DP picks is best: the polish has work to do
        base = (0.01 * sum(g * g * (1.0 + 0.1 * i) for i, g in enumerate(gaps)) + 0.02 * off) \
            * (1 + 0.05 * _noise(key, "bump"))
        if forecast == "l2p":
            base *= 1.0 + 0.2 * _noise(key, "l2p")
        return [base * (1 + 0.05 * _noise(key, f"seed{s}")) for s in range(4)]


def make_profile():
    sys.path.insert(0, HERE)
    from test_forecaster_l2p import profile_of, trajectories
    samples, times = trajectories()
    return profile_of(samples, times)


def main():
    from gcache.search.config import SearchConfig
    from gcache.search.loop import run_search
    os.makedirs(DATA, exist_ok=True)
    prof = make_profile()
    prof.save(PROFILE)
    for path in (DONE, CRASHED):
        if os.path.exists(path):
            os.remove(path)
    res = run_search(prof, SearchConfig(**CONFIG), Evaluator(), state_path=DONE, provenance=PROVENANCE)
    res.policy.save(POLICY)
    try:
        run_search(prof, SearchConfig(**CONFIG), Evaluator(crash_at=CRASH_AT), state_path=CRASHED,
                   provenance=PROVENANCE)
    except RuntimeError:
        pass
    print(res.policy.describe(), res.policy.forecast, res.policy.provenance["won"],
          res.policy.provenance["polish"], math.isfinite(res.policy.metrics["loss"]))


if __name__ == "__main__":
    main()
