"""Profile-fitted: for a skipped step j after computed steps p < i, δ̂_j = δ_i + α[p, i, j]·(δ_i − δ_p), with α the
pooled least-squares fit over the profile's samples (core/fit_stats.py). α = 0 is reuse and α = (t_j − t_i)/
(t_i − t_p) the linear forecast, so on the profile it is never worse than either (in the squared error it is
fitted to). The policy stores the α of each skipped step for the (p, i) the mask gives it, and a step whose branch
kept other steps (a forced computation) forecasts linearly. Its DP errors are the linear forecast's mean |errors|
scaled by the fitted-to-linear RMS ratio (dp_errors)."""
from __future__ import annotations

import math

import numpy as np

from ..errors import GCacheError
from . import register
from .lagrange import lagrange_weights


class Fitted:
    name = "fitted"
    keeps = 2
    needs = ("e1", "fit")  # its DP errors: E1 scaled by the fit statistics' RMS ratio; α from the fit statistics
    label, rank = "fitted (profile)", 3
    needs_profile = True
    auto_candidate = True

    def weights(self, kept, j, times, params):
        if len(kept) < 2:
            return [1.0]
        fit = (params or {}).get("alpha", {}).get(str(j))
        if fit is None or [int(fit[0]), int(fit[1])] != list(kept[-2:]):
            return lagrange_weights([float(times[i]) for i in kept[-2:]], float(times[j]))
        a = float(fit[2])
        return [-a, 1.0 + a]

    def dp_errors(self, profile):
        # The DP's errors are mean |errors| (E, E1), which a pooled fit can't give exactly (α is known only once
        # every sample is in); the fitted forecast's is estimated as the linear one's, E1, scaled by the exact
        # ratio of their RMS errors. (The RMS errors themselves as the DP's input picked masks 0.2-2.5 dB worse
        # at K = 10/15 of N = 30 on the reference model; bench/RESULTS.md.)
        st = profile.fit_stats()
        fit, lin = st.rms(st.alpha()), st.rms(st.linear_c(profile.times))
        ratio = np.where(lin > 0, fit / np.where(lin > 0, lin, 1.0), 1.0)
        return profile.E, profile.E1 * ratio

    def fit(self, profile, mask):
        alpha = profile.fit_stats().alpha()
        out, computed = {}, []
        for j, m in enumerate(mask):
            if m:
                computed.append(j)
            elif len(computed) >= 2:
                p, i = computed[-2:]
                out[str(j)] = [p, i, round(float(alpha[p, i, j]), 6)]
        return {"alpha": out}

    def check_params(self, params, mask):
        """{"alpha": {"<skipped step j>": [p, i, α]}} with computed p < i < j, α finite."""
        alpha = params.get("alpha", {})
        ok = isinstance(alpha, dict)
        for j, v in (alpha.items() if ok else ()):
            ok = (isinstance(j, str) and j.isdigit() and isinstance(v, list) and len(v) == 3
                  and all(isinstance(x, int) and not isinstance(x, bool) for x in v[:2])
                  and isinstance(v[2], (int, float)) and math.isfinite(v[2]) and 0 <= v[0] < v[1] < int(j) < len(mask)
                  and mask[int(j)] == 0 and mask[v[0]] == 1 and mask[v[1]] == 1)
            if not ok:
                break
        if not ok:
            raise GCacheError("The policy's fitted forecast coefficients are inconsistent with its mask (each skipped "
                              "step j needs [p, i, α] with computed steps p < i < j): make the policy again.")

    def two_step_c(self, profile, st, fold=None):
        return st.alpha(fold)


register(Fitted())
