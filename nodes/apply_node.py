"""GCache Apply: a MODEL clone that skips the block stack on the policy's reuse steps."""
from __future__ import annotations

from comfy_api.latest import io

from ..core.errors import GCacheError
from . import comfy_common as cc
from . import artifacts, hooks
from .configs import CACHE_DEVICES, STEP_MISMATCH, apply_config


class GCacheApply(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="GCacheApply", display_name="GCache Apply", category=cc.CATEGORY,
            description="Skip the transformer block stack on the steps a GCache policy marks 0 and reuse the "
                        "cached residual of the last computed step. Logs computed/skipped steps and speed-ups.",
            inputs=[
                io.Model.Input("model", tooltip="The diffusion model to accelerate (Flux, Wan, HunyuanVideo, …)."),
                io.Combo.Input("policy_file", options=cc.policy_choices(),
                               tooltip="A saved policy from models/gcache/ (made by GCache Search). Ignored when a "
                                       "policy is connected."),
                io.Combo.Input("cache_device", options=list(CACHE_DEVICES), default="model device",
                               tooltip="Where cached residuals live: the model's device (fastest) or CPU (saves "
                                       "GPU memory, costs a copy per skipped step)."),
                io.Combo.Input("step_mismatch", options=list(STEP_MISMATCH), default="remap",
                               tooltip="When the sampler runs another step count than the policy was made for: "
                                       "remap the policy by normalized time, or stop with an error."),
                cc.GCachePolicy.Input("policy", optional=True,
                                      tooltip="A policy from GCache Search; overrides policy_file."),
            ],
            outputs=[io.Model.Output(tooltip="The model with GCache; connect it to your sampler.")],
        )

    @classmethod
    def validate_inputs(cls, cache_device, step_mismatch):
        # named inputs only: a **kwargs here would make ComfyUI skip its own checks of every other input
        try:
            cc.check_choice("cache_device", cache_device, list(CACHE_DEVICES))
            cc.check_choice("step_mismatch", step_mismatch, STEP_MISMATCH)
        except GCacheError as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, model, policy_file, cache_device, step_mismatch, policy=None) -> io.NodeOutput:
        cc.check_choice("cache_device", cache_device, list(CACHE_DEVICES))
        if policy is None:
            if policy_file == cc.NO_FILE:
                raise GCacheError("No policy: connect GCache Search's policy output, or pick a policy file from "
                                  "models/gcache/ (run GCache Search once to make one).")
            policy = artifacts.read_policy(cc.find_file(policy_file))
        config = apply_config(model, policy, on_mismatch=step_mismatch, cache_device=CACHE_DEVICES[cache_device])
        return io.NodeOutput(hooks.patch_model(model, config))
