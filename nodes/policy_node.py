"""GCache Policy: an instant policy from a profile and a budget (the DP under an analytic weight, milliseconds)."""
from __future__ import annotations

import logging
import os
import time

from comfy_api.latest import io

from ..core.errors import GCacheError
from ..core.files import safe_name
from ..core.policy import Policy, check_budget, few_computed, k_for_speedup, out_of_reach
from ..core.user_text import quoted
from ..core.verdicts import checks_of, failed, stamp
from ..search.error_models import DEFAULT as DEFAULT_ERROR_MODEL
from ..search.error_models import ERROR_MODELS
from ..search.infra.plots import plot_policy
from ..search.instant import METHODS, instant_policy, propagation_weights
from . import artifacts
from . import comfy_common as cc
from .modes.verdicts import describe

log = logging.getLogger("gcache")
BUDGETS = ("speed-up", "K")


def parse_s(text: str) -> list[float]:
    """'2, 1, 0.5, 0' → [2.0, 1.0, 0.5, 0.0] (the Bernstein coefficients; the degree is their count − 1)."""
    try:
        return [float(v) for v in text.replace(";", ",").split(",") if v.strip()]
    except ValueError:
        raise GCacheError(f"bernstein_s must be numbers separated by commas (e.g. '2, 1, 0.5, 0'), got "
                          f"{quoted(text)}.") from None


def budget_k(profile, budget: str, k: int, speedup: float) -> int:
    """K from the node's budget: given directly, or the largest speed-up not above the target, with the io share
    the profile measured (or estimated; 0 for profiles without one: then speed-up = N / K). A target out of reach
    is said, not silently turned into K = 1."""
    if budget == "K":
        check_budget(k, profile.n_steps)
        return k
    why = out_of_reach(profile.n_steps, speedup, profile.io_share)
    if why:
        log.warning("GCache Policy: %s; using K = 1.", why)
    return k_for_speedup(profile.n_steps, speedup, profile.io_share)


def _save(policy, path) -> None:
    if path:
        try:
            policy.save(path)
        except OSError as e:  # the folder changed since the check above (or a full disk)
            raise GCacheError(f"GCache Policy could not save {os.path.basename(path)} ({e.strerror or e}): "
                              "empty save_name to use the policy without saving it.") from None
        log.info("GCache Policy: saved %s", os.path.basename(path))


def _every_step(profile, bad: dict, path, weights) -> io.NodeOutput:
    """The policy of a profile recorded where GCache's self-check failed: every step computed, and why."""
    why = (f"the profile was recorded where GCache's self-check failed ({bad['model']} ({bad['family']}) on ComfyUI "
           f"{bad['comfyui']}, GCache {bad['gcache']}: {describe(bad)}), so its residuals may be of the wrong tokens")
    log.warning("GCache Policy: %s; the policy computes every step. Profile again (under a new name) where the check "
                "passes.", why)
    policy = Policy.all_ones(profile.n_steps, times=[float(t) for t in profile.times],
                             sigmas=[float(v) for v in profile.sigmas],
                             provenance={"selfcheck": checks_of(profile.meta)})
    _save(policy, path)
    image = plot_policy(policy, weights, "GCache Policy: every step computed (the profile's self-check failed)")
    return io.NodeOutput(policy, cc.pil_to_image(image))


class GCachePolicy(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="GCachePolicy", display_name="GCache Policy", category=cc.CATEGORY,
            description="An instant policy from a profile: the exact DP picks the K steps to compute under an analytic "
                        "propagation weight (milliseconds, no sampling). GCache Search can improve on it.",
            inputs=[
                cc.ProfileSocket.Input("profile", tooltip="A profile from GCache Load Profile (one profiled batch is "
                                                          "enough)."),
                io.Combo.Input("budget", options=list(BUDGETS), default="speed-up",
                               tooltip="Give the budget as a target speed-up (turned into K with the model's io share "
                                       "recorded in the profile) or as K directly."),
                io.Float.Input("speedup", default=2.0, min=1.0, max=50.0, step=0.1, round=0.01,
                               tooltip="Target speed-up (budget = speed-up): the largest predicted speed-up not above "
                                       "it."),
                io.Int.Input("k", default=10, min=1, max=1000, tooltip="Steps that compute the block stack (budget = "
                                                                       "K)."),
                io.Combo.Input("method", options=list(METHODS), default="theory",
                               tooltip="theory: the paper's Theorem 3.3 weight (default); local: every error counts "
                                       "the same; bernstein: w(t; s) with the coefficients below.", **cc.ADVANCED),
                io.String.Input("bernstein_s", default="2, 1, 0.5, 0",
                                tooltip="Bernstein coefficients s for method = bernstein (degree = count − 1).",
                                **cc.ADVANCED),
                io.Combo.Input("forecast", options=list(cc.FORECAST), default="reuse (0)", optional=True,
                               tooltip="Skipped steps reuse the residual, or forecast it linearly, quadratically, "
                                       "with coefficients fitted to the profile, or with least-squares weights over "
                                       f"the last {cc.keeps('l2p')} residuals (l2p); the mask is then chosen for that "
                                       "forecaster (needs a profile recorded with record_forecast)."),
                io.Combo.Input("error_model", options=list(ERROR_MODELS), default=DEFAULT_ERROR_MODEL, optional=True,
                               tooltip="The errors the DP weighs: mean_abs, the forecaster's mean |error| (default); "
                                       "rms, its exact RMS error; ls_rms, the error of the best least-squares "
                                       "forecast from the last two computed residuals (rms and ls_rms need a profile "
                                       "recorded with record_forecast); reuse_abs, the reuse mask, applied with the "
                                       "forecaster. They can pick different masks; GCache Search measures each.",
                               **cc.ADVANCED),
                io.String.Input("save_name", default="",
                                tooltip="Save as models/gcache/<name>.json for GCache Apply's list (empty: not "
                                        "saved)."),
            ],
            outputs=[cc.PolicySocket.Output(tooltip="The policy, for GCache Apply."),
                     io.Image.Output(tooltip="The weight w_j per step and the mask timeline.")],
        )

    @classmethod
    @cc.shown_to_user
    def execute(cls, profile, budget, speedup, k, method, bernstein_s, save_name, forecast="reuse (0)",
                error_model=DEFAULT_ERROR_MODEL) -> io.NodeOutput:
        cc.check_choice("budget", budget, BUDGETS)
        cc.check_choice("method", method, METHODS)
        cc.check_choice("forecast", forecast, list(cc.FORECAST))
        cc.check_choice("error_model", error_model, list(ERROR_MODELS))
        profile.require_clean("GCache Policy")
        path = artifacts.policy_path(cc.folder(), safe_name(save_name, "policy name")) if save_name.strip() else None
        blocked = artifacts.cant_write(os.path.dirname(path)) if path else None
        if blocked:  # said before anything is made, and never as a PermissionError naming a temporary file
            raise GCacheError(f"GCache Policy can't save {os.path.basename(path)}: {blocked}. To fix it, "
                              f"{artifacts.FOLDER_FIX}; or empty save_name to use the policy without saving it.")
        t0 = time.perf_counter()
        s = parse_s(bernstein_s) if method == "bernstein" else None
        bad = failed(checks_of(profile.meta))
        if bad is not None:  # its residuals may be of the wrong tokens: no policy from it skips
            return _every_step(profile, bad, path, propagation_weights(profile, method, s))
        kk = budget_k(profile, budget, k, speedup)
        note = few_computed(profile.n_steps, kk)
        if note:
            log.warning("GCache Policy: %s.", note)
        policy = instant_policy(profile, kk, method, s, forecast=cc.FORECAST[forecast], error_model=error_model)
        stamp(policy.provenance, profile.meta)  # how the profile's runs were self-checked
        share = profile.io  # the io share the profile measured, with its range
        policy.metrics.update(share.metrics(profile.n_steps, kk))
        ms = (time.perf_counter() - t0) * 1e3
        log.info("GCache Policy: %s (%s), K = %d of %d, %s (%s), %.1f ms: %s", method, error_model, kk,
                 profile.n_steps, share.describe_speedup(profile.n_steps, kk), share.describe(), ms, policy.describe())
        _save(policy, path)
        image = plot_policy(policy, propagation_weights(profile, method, s),
                            f"w_j per step ({method}), K = {kk} of {profile.n_steps}, predicted "
                            f"{share.speedup_text(profile.n_steps, kk)}")
        return io.NodeOutput(policy, cc.pil_to_image(image))
