"""L2P-like (after L2P, CVPR'26): a skipped step j forecasts δ̂_j = Σ_k w_k δ_k over the last KEEPS computed residuals
before it, with w the pooled least-squares fit of δ_j on them over the profile's samples (the Gram statistics,
core/fit_stats.py FitStats.lstsq_weights). The policy stores each skipped step's kept steps and weights,
{"w": {"<j>": [[k, …], [w_k, …]]}}; a step whose branch kept other steps (a forced computation) forecasts linearly,
and one with a single computed step before it reuses it (the engine does).

KEEPS is small because each kept residual is a full latent stream held for the whole run. bench/rivals.py's
'l2p_all' is the variant over every computed residual (what bench/quality.py measured beating the profile-fitted
forecaster at K = 15, 20 of 30 on GCache's searched mask).

Its DP errors are the two-step least-squares RMS (FitStats.two_step_rms: δ̂_j = a·δ_i + b·δ_p fitted per (p, i, j))
and, while one step is computed, the reuse RMS √sq. They bound its in-sample RMS error from above: its own fit uses
the same last two residuals and up to KEEPS − 2 more, and more residuals can only lower a least-squares error. It
is not an auto candidate: it has no two-step form δ_i + c·(δ_i − δ_p) to score held out, and nothing measured yet
says auto would gain by it.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import GCacheError
from . import register
from .lagrange import lagrange_weights

KEEPS = 4  # bench/l2p_keeps.py: 4 residuals were no worse than all of them (median +0.18 vs −0.01 dB over fitted)


def _stats(profile):
    """The profile's fit statistics with the Gram statistics the weights come from, or what to do without them."""
    st = profile.fit_stats() if profile.has_fit_stats() else None
    if st is None or st.gram is None:
        raise GCacheError("The l2p forecaster fits its weights to the profile's Gram statistics, which this profile "
                          "lacks (made without forecast recording, or before they were recorded): profile again with "
                          "forecast recording on (GCache Profile's record_forecast).")
    return st


class L2P:
    name = "l2p"
    keeps = KEEPS
    needs = ("fit", "gram")  # its DP errors: √sq and the two-step least-squares RMS; its weights: the Gram statistics
    label, rank = "l2p (profile)", 4
    needs_profile = True

    def weights(self, kept, j, times, params):
        fit = (params or {}).get("w", {}).get(str(j))
        if fit is not None and [int(k) for k in fit[0]] == list(kept):
            return [float(v) for v in fit[1]]
        linear = lagrange_weights([float(times[i]) for i in kept[-2:]], float(times[j]))
        return [0.0] * (len(kept) - 2) + linear

    def dp_errors(self, profile):
        st = _stats(profile)
        return np.sqrt(np.maximum(st.sq_of(), 0.0)), st.two_step_rms()

    def fit(self, profile, mask):
        st = _stats(profile)
        out = {}
        for j, ks in _kept_steps(mask, self.keeps).items():
            out[str(j)] = [ks, [float(v) for v in st.lstsq_weights(j, ks)]]
        return {"w": out}

    def check_params(self, params, mask):
        """{"w": {"<skipped step j>": [[its kept steps], [a finite weight each]]}}, the kept steps being the last
        KEEPS computed ones before j (two at least)."""
        w = params.get("w", {})
        kept = _kept_steps(mask, self.keeps)
        ok = set(params) <= {"w"} and isinstance(w, dict)
        for j, v in (w.items() if ok else ()):
            ok = (isinstance(j, str) and j.isdigit() and int(j) in kept and isinstance(v, list) and len(v) == 2
                  and isinstance(v[0], list) and isinstance(v[1], list) and v[0] == kept[int(j)]
                  and all(isinstance(k, int) and not isinstance(k, bool) for k in v[0]) and len(v[1]) == len(v[0])
                  and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v[1]))
            if not ok:
                break
        if not ok:
            raise GCacheError("The policy's l2p forecast weights are inconsistent with its mask (each skipped step j "
                              f"needs [[the last {self.keeps} computed steps before j], [a weight each]]): make the "
                              "policy again.")


def _kept_steps(mask, keeps: int) -> dict[int, list[int]]:
    """Skipped step j → the last `keeps` computed steps before it, for the skipped steps with two or more."""
    out, computed = {}, []
    for j, m in enumerate(mask):
        if m:
            computed.append(j)
        elif len(computed) >= 2:
            out[j] = computed[-keeps:]
    return out


register(L2P())
