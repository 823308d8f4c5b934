"""Instant policies: the exact DP on a profile under an analytic propagation weight, in milliseconds.

No sampling is needed, so a user gets a speed-up from the first profiled run (GCache Policy, GCache Apply
"auto"); the search (bilevel.py) starts from these masks and only keeps something else where it measures better.

    theory     w from Theorem 3.3 (w_j = ln(h_j L_out) + Σ_{m>j} h_m L): the default
    local      w = 0: every reuse error counts the same wherever it happens
    bernstein  w(t; s) with given coefficients s (e.g. an s a search found for a similar model)

With forecast = 1 (or 2) the mask is the one that is best when skipped steps forecast their residual
(dp_forecast.py), which differs from the best mask for reuse.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..core.errors import GCacheError
from ..core.policy import Policy
from ..core.profile import Profile
from ..core.weights import analytic_w, bernstein_w
from .dp import dp_mask
from .dp_forecast import dp_mask_forecast

METHODS = ("theory", "local", "bernstein")


def propagation_weights(profile: Profile, method: str = "theory", s: Optional[Sequence[float]] = None) -> np.ndarray:
    """w_j for each of the profile's N steps under `method`."""
    times = [float(t) for t in profile.times]
    if method == "theory":
        return analytic_w(times + [0.0])
    if method == "local":
        return np.zeros(profile.n_steps)
    if method == "bernstein":
        if s is None or len(s) == 0:
            raise GCacheError("The Bernstein method needs its coefficients s (e.g. '2, 1, 0.5, 0').")
        return bernstein_w(times, s)
    raise GCacheError(f"Unknown instant method {method!r}: use one of {', '.join(METHODS)}.")


def instant_policy(profile: Profile, k: int, method: str = "theory", s: Optional[Sequence[float]] = None,
                   forecast: int = 0) -> Policy:
    """The K-step mask the DP picks for this profile under `method`'s weights, as a Policy applied with the
    forecast order `forecast`. Orders 1 and 2 pick the mask with the order-1 forecast DP (needs the profile's E1;
    there is no order-2 DP: order 2 is applied on the order-1 mask)."""
    w = propagation_weights(profile, method, s)
    if forecast:
        mask, bound = dp_mask_forecast(profile.E, profile.E1, w, k)
    else:
        mask, bound = dp_mask(profile.E, w, k)
    prov = {"k": k, "instant": method, "bound": bound, "profile_samples": int(profile.count)}
    if forecast:
        prov["mask_dp"] = "order-1 forecast DP"
    if s is not None and method == "bernstein":
        prov["s"] = [float(v) for v in s]
    return Policy(mask=list(mask), times=[float(t) for t in profile.times], sigmas=[float(v) for v in profile.sigmas],
                  method=f"{method}_dp" + ("_forecast" if forecast else ""), provenance=prov, forecast=forecast)
