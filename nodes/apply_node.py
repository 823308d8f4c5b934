"""GCache Apply: a MODEL clone that skips the block stack on the policy's reuse steps."""
from __future__ import annotations

from comfy_api.latest import io

from ..core.policy import Policy
from . import artifacts
from . import comfy_common as cc
from .modes import verdicts
from .modes.apply import apply_config
from .modes.auto import auto_config
from .modes.base import CACHE_DEVICES, STEP_MISMATCH
from .patching import companions, hooks


class GCacheApply(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="GCacheApply", display_name="GCache Apply", category=cc.CATEGORY,
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
            description="Skip the transformer block stack on the steps a GCache policy marks 0 and reuse the "
                        "cached residual of the last computed step. With policy_file (auto) and no policy connected, "
                        "the first run profiles and saves an instant policy for this model, steps, scheduler and "
                        "speed-up, and every later run applies it. Logs computed/skipped steps and speed-ups.",
            inputs=[
                io.Model.Input("model", tooltip="The diffusion model to accelerate (Flux, Wan, HunyuanVideo, …)."),
                io.Combo.Input("policy_file", options=cc.policy_choices(),
                               tooltip="(auto): find or make a policy for this model by itself (the first run "
                                       "computes every step and profiles it). Or a saved policy from models/gcache/ "
                                       "(GCache Policy or GCache Search). Ignored when a policy is connected."),
                io.Combo.Input("cache_device", options=list(CACHE_DEVICES), default="model device",
                               tooltip="Where cached residuals live: the model's device (fastest) or CPU (saves "
                                       "GPU memory, costs a copy per skipped step).", **cc.ADVANCED),
                io.Combo.Input("step_mismatch", options=list(STEP_MISMATCH), default="remap",
                               tooltip="When the sampler runs another step count than the policy was made for: "
                                       "remap the policy by normalized time, or stop with an error.", **cc.ADVANCED),
                io.Float.Input("auto_speedup", default=2.0, min=1.0, max=20.0, step=0.1, round=0.01, optional=True,
                               tooltip="(auto) only: the target speed-up; K is the fewest computed steps whose "
                                       "predicted speed-up does not exceed it. A policy GCache Search found for this "
                                       "model, steps and scheduler is applied instead when it computes no more "
                                       "steps than that. Optional, so that API prompts written before it existed "
                                       "still run."),
                io.Combo.Input("forecast", options=["policy's"] + list(cc.FORECAST), default="policy's", optional=True,
                               tooltip="On skipped steps: the policy's choice ((auto): the forecaster its profile "
                                       "says is best), reuse the last residual, forecast it from the last "
                                       f"{cc.keeps('linear')} (linear) or {cc.keeps('quadratic')} (quadratic) computed "
                                       "steps, with coefficients fitted to the profile (fitted), or with least-squares "
                                       f"weights over the last {cc.keeps('l2p')} (l2p); fitted and l2p need a policy "
                                       "made for them. Each kept residual costs one more latent-sized tensor per "
                                       "branch.", **cc.ADVANCED),
                io.String.Input("policy_json", default="", multiline=True, optional=True,
                                tooltip="A policy as JSON text (what a policy file holds), for API clients such as the "
                                        "cluster search's ComfyUI workers; overrides policy_file. Empty: unused.",
                                **cc.ADVANCED),
                cc.PolicySocket.Input("policy", optional=True,
                                      tooltip="A policy from GCache Policy or GCache Search; overrides policy_file."),
            ],
            outputs=[io.Model.Output(tooltip="The model with GCache; connect it to your sampler.")],
        )

    @classmethod
    @cc.shown_to_user
    def execute(cls, model, policy_file, cache_device, step_mismatch, auto_speedup=2.0, forecast="policy's",
                policy_json="", policy=None) -> io.NodeOutput:
        # Combo values are checked here, not in a validate_inputs: ComfyUI reports a validate_inputs message under
        # every input that function takes (an unknown cache_device was reported under step_mismatch too); 0.33
        # checks combo values itself at validation, 0.3.64 does not (V3 combos), so this check is the one there.
        cc.check_choice("cache_device", cache_device, list(CACHE_DEVICES))
        cc.check_choice("step_mismatch", step_mismatch, STEP_MISMATCH)
        cc.check_choice("forecast", forecast, ["policy's"] + list(cc.FORECAST))
        device = CACHE_DEVICES[cache_device]
        hidden = getattr(cls, "hidden", None)
        node_id = getattr(hidden, "unique_id", None)
        if policy is None and policy_json and policy_json.strip():
            policy = Policy.from_json(policy_json, source="policy_json")
        if policy is None and policy_file in (cc.AUTO, cc.NO_FILE):
            config = auto_config(model, cc.folder(), auto_speedup, on_mismatch=step_mismatch, cache_device=device,
                                 forecast=cc.FORECAST.get(forecast), node_id=node_id)
        else:
            if policy is None:
                policy = artifacts.read_policy(cc.find_file(policy_file))
            config = apply_config(model, policy, on_mismatch=step_mismatch, cache_device=device,
                                  forecast=cc.FORECAST.get(forecast), folder=cc.folder(), node_id=node_id)
        failed = verdicts.recorded_fail(config.subject)  # shown now: sampling says it again when it runs
        if failed is not None:
            verdicts.show(config.subject.node_id, f"GCache Apply: {verdicts.refusal(failed, config.subject)}.")
        # TorchCompileModel / EasyCache after this node: refused here
        companions.check_prompt(getattr(hidden, "prompt", None), node_id, "GCache Apply")
        return io.NodeOutput(hooks.patch_model(model, config, "GCache Apply"))
