"""Baseline policies for the same budget K (exactly K computed steps, step 0 computed), to compare with GCache.

- uniform:   compute every N/K-th step (FORA / Δ-DiT style fixed interval);
- teacache:  TeaCache-like: accumulate the rel-L1 change of the block input h step by step and compute when
             the sum passes a threshold (then reset); the threshold is bisected to give exactly K;
- local_dp:  the exact DP with w = 0 (every reuse error counts the same wherever it happens);
- theory_dp: the exact DP with Theorem 3.3's analytic exponent w_j = ln(h_j L_out) + Σ_{m>j} h_m L.
The two DP baselines are instant.py's policies of those names: one definition for the baselines, the nodes and
the search's start masks.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..core.errors import GCacheError
from ..core.policy import Policy, check_budget
from ..core.profile import Profile
from .instant import instant_policy


def _policy(mask: Sequence[int], profile: Optional[Profile], method: str, **prov) -> Policy:
    if profile is not None:
        return Policy.for_mask(profile, mask, "reuse", method=method, provenance=dict(prov))
    return Policy(mask=list(mask), method=method, provenance=dict(prov))


def uniform_mask(n: int, k: int) -> list[int]:
    check_budget(k, n)
    mask = [0] * n
    for i in range(k):
        mask[(i * n) // k] = 1  # distinct because n / k ≥ 1; i = 0 gives step 0
    return mask


def uniform_policy(n: int, k: int, profile: Optional[Profile] = None) -> Policy:
    if profile is not None and profile.n_steps != n:
        raise GCacheError(f"uniform_policy: the profile has {profile.n_steps} steps, not {n}.")
    return _policy(uniform_mask(n, k), profile, "uniform", k=k)


def _teacache_run(rel: np.ndarray, thr: float) -> tuple[list[int], list[float]]:
    mask, trig, acc = [1], [np.inf], 0.0
    for j in range(1, len(rel)):
        acc += rel[j]
        if acc >= thr:
            mask.append(1)
            trig.append(acc)
            acc = 0.0
        else:
            mask.append(0)
            trig.append(0.0)
    return mask, trig


def teacache_mask(rel_h: Sequence[float], k: int) -> tuple[list[int], float]:
    """(mask, threshold). The count of computed steps falls as the threshold grows; bisect for K."""
    rel = np.asarray(rel_h, dtype=np.float64)
    n = rel.size
    check_budget(k, n)
    if not np.all(np.isfinite(rel)) or np.any(rel < 0):
        raise GCacheError("The profile's rel-L1 indicators are negative or NaN: profile again.")
    lo, hi = 0.0, float(rel.sum()) + 1.0  # count(lo) = N ≥ K (for rel ≥ 0), count(hi) = 1 ≤ K
    if sum(_teacache_run(rel, hi)[0]) == k:
        return _teacache_run(rel, hi)[0], hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        c = sum(_teacache_run(rel, mid)[0])
        if c == k:
            return _teacache_run(rel, mid)[0], mid
        lo, hi = (mid, hi) if c > k else (lo, mid)
    # The count jumps past K at one threshold (ties): from the smallest count above K, drop the computed
    # steps whose accumulated change was smallest when they triggered.
    mask, trig = _teacache_run(rel, lo)
    extra = sum(mask) - k
    for j in sorted((j for j in range(1, n) if mask[j]), key=lambda j: (trig[j], j))[:extra]:
        mask[j] = 0
    return mask, lo


def teacache_policy(profile: Profile, k: int) -> Policy:
    mask, thr = teacache_mask(profile.rel_h, k)
    return _policy(mask, profile, "teacache", k=k, threshold=thr, indicator="rel_l1_block_input")


def local_dp_policy(profile: Profile, k: int) -> Policy:
    return instant_policy(profile, k, "local")


def theory_dp_policy(profile: Profile, k: int) -> Policy:
    return instant_policy(profile, k, "theory")


def all_baselines(profile: Profile, k: int) -> dict[str, Policy]:
    return {"uniform": uniform_policy(profile.n_steps, k, profile), "teacache": teacache_policy(profile, k),
            "local_dp": local_dp_policy(profile, k), "theory_dp": theory_dp_policy(profile, k)}
