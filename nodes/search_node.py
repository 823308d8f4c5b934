"""GCache Search: the bilevel search (search/bilevel.py) with real sampling inside the node."""
from __future__ import annotations

import os

import comfy.model_management
import comfy.samplers
import comfy.utils
from comfy_api.latest import io

from ..core.errors import GCacheError
from ..core.files import safe_name
from ..core.policy import Policy
from ..core.profile import Profile
from ..search.bilevel import SearchConfig, SearchInterrupted, run_search
from ..search.objectives import OBJECTIVES, make_objective
from ..search.plots import plot_search
from . import comfy_common as cc
from . import artifacts, hooks
from .apply_mode import apply_config
from .profile_mode import profile_config
from .fingerprint import content_hash
from .sampling import decode, sample


class GCacheSearch(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="GCacheSearch", display_name="GCache Search", category=cc.CATEGORY, is_output_node=True,
            description="Finds the K steps to compute: GP-LCB over the propagation weights outside, the exact DP "
                        "inside, each candidate sampled and compared with the full run. Resumes from its state file "
                        "when queued again; saves models/gcache/<policy_name>.json.",
            inputs=[
                io.Model.Input("model", tooltip="The model to search a policy for (without GCache Apply)."),
                io.Conditioning.Input("positive", tooltip="Positive conditioning of the reference runs."),
                io.Conditioning.Input("negative", tooltip="Negative conditioning (unused when cfg is 1)."),
                io.Latent.Input("latent", tooltip="Latent of the reference runs (size, frames, batch)."),
                io.Vae.Input("vae", tooltip="Decodes latents to images for the objective."),
                io.Int.Input("seed", default=0, min=0, max=0xffffffffffffffff, control_after_generate=False,
                             tooltip="First noise seed of the reference runs (also seeds the search)."),
                io.Int.Input("seeds", default=1, min=1, max=64,
                             tooltip="Number of reference runs (seed, seed+1, …); the loss is their mean."),
                io.Int.Input("steps", default=20, min=2, max=1000, tooltip="Sampler steps N."),
                io.Float.Input("cfg", default=1.0, min=0.0, max=100.0, step=0.1, round=0.01,
                               tooltip="Classifier-free guidance scale, as in your KSampler."),
                io.Combo.Input("sampler_name", options=comfy.samplers.KSampler.SAMPLERS, default="euler",
                               tooltip="Sampler, as in your KSampler."),
                io.Combo.Input("scheduler", options=comfy.samplers.KSampler.SCHEDULERS, default="simple",
                               tooltip="Scheduler, as in your KSampler."),
                io.Int.Input("k", default=10, min=1, max=1000,
                             tooltip="Budget K: steps that compute the block stack (K ≤ steps). Speed-up ≈ steps/K."),
                io.Int.Input("budget", default=64, min=2, max=10000,
                             tooltip="Search iterations (sampling runs per seed): the 3 instant masks and the "
                                     "2^(degree+1) start grid included, so at least 20 for degree 3. The paper "
                                     "uses 500."),
                io.Int.Input("degree", default=3, min=1, max=4,
                             tooltip="Degree of the Bernstein polynomial w(t; s) (the paper uses 3)."),
                io.Combo.Input("objective", options=list(OBJECTIVES), default="lpips_ssim",
                               tooltip="Loss vs. the full run: LPIPS + (1 − SSIM) (the paper's; torchvision's AlexNet, "
                                       "233 MB, is downloaded on first use), 1 − SSIM, or −PSNR (no weights)."),
                io.Combo.Input("forecast", options=list(cc.FORECAST), default="reuse (0)", optional=True,
                               tooltip="The order the policy is applied with; every candidate mask is judged with it "
                                       "(forecast masks differ from reuse masks). Forecasting records the reference "
                                       "runs' forecast errors too (a connected profile needs them)."),
                io.String.Input("policy_name", default="my_policy",
                                tooltip="Saved as models/gcache/<name>.json; <name>.search.json keeps the state."),
                cc.GCacheProfile.Input("profile", optional=True,
                                       tooltip="A profile from GCache Load Profile; without one the node profiles "
                                               "its own full-compute reference runs."),
            ],
            outputs=[cc.GCachePolicy.Output(tooltip="The policy, for GCache Apply."),
                     io.Image.Output(tooltip="Loss per iteration, learned w(t) and the mask as a timeline.")],
        )

    @classmethod
    def execute(cls, model, positive, negative, latent, vae, seed, seeds, steps, cfg, sampler_name, scheduler, k,
                budget, degree, objective, policy_name, profile=None, forecast="reuse (0)") -> io.NodeOutput:
        cc.check_choice("forecast", forecast, list(cc.FORECAST))
        order = cc.FORECAST[forecast]
        folder = cc.folder()
        name = safe_name(policy_name, "policy name")
        state_file = artifacts.state_path(folder, name)
        own_profile = os.path.join(folder, name + ".search" + artifacts.PROFILE_SUFFIX)
        seed_list = [seed + i for i in range(seeds)]
        config = SearchConfig(k=k, degree=degree, budget=budget, seed=seed, objective=objective, forecast=order)
        config.validate(steps)  # K and the budget are refused before any sampling, not after the references
        loss_fn = make_objective(objective)  # fails early, with a message, when LPIPS weights are missing
        pbar = comfy.utils.ProgressBar(budget + 1 + len(seed_list))
        done = [0]

        def tick():
            done[0] += 1
            pbar.update_absolute(done[0])

        def run(m, s):
            return decode(vae, sample(m, s, steps, cfg, sampler_name, scheduler, positive, negative, latent))

        # Reference (full-compute) runs; they are also the profile when none is given, recorded through the
        # same file path GCache Profile uses (<name>.search.profile.safetensors).
        record = profile is None and not (os.path.isfile(state_file) and os.path.isfile(own_profile))
        ref_model = model
        if record:
            if os.path.isfile(own_profile):
                os.remove(own_profile)  # left by a search whose state is gone: it is recorded again now
            ref_model = hooks.patch_model(model, profile_config(model, own_profile, forecast=bool(order)))
        refs = []
        for s in seed_list:
            refs.append(run(ref_model, s))
            tick()
        if profile is None:
            if not os.path.isfile(own_profile):
                raise GCacheError("The reference runs recorded no profile (was sampling interrupted?).")
            profile = Profile.load(own_profile)
        if profile.n_steps != steps:
            raise GCacheError(f"The profile has {profile.n_steps} steps but steps = {steps}: set steps to "
                              f"{profile.n_steps} or profile this step count.")

        def evaluate(mask):
            pol = Policy(list(mask), times=[float(t) for t in profile.times],
                         sigmas=[float(s) for s in profile.sigmas], method="search-candidate", forecast=order)
            m = hooks.patch_model(model, apply_config(model, pol, on_mismatch="error"))
            return [loss_fn(run(m, s), r) for s, r in zip(seed_list, refs)]  # per seed: paired comparisons

        def progress(info):
            pbar.update_absolute(len(seed_list) + min(int(info.get("iteration", 0)), budget), budget + 1 + len(seed_list))

        # What the references depend on, so that a state file made with another prompt/LoRA is not resumed.
        provenance = {"model": type(model.get_model_object("diffusion_model")).__name__, "seeds": seed_list,
                      "inputs": content_hash(positive, negative, latent["samples"], sorted(map(str, model.patches)),
                                             type(vae.first_stage_model).__name__ if hasattr(vae, "first_stage_model") else ""),
                      "steps": steps, "cfg": cfg, "sampler": sampler_name, "scheduler": scheduler,
                      "latent_shape": list(latent["samples"].shape)}
        try:
            result = run_search(profile, config, evaluate, state_path=state_file, progress=progress,
                                should_stop=comfy.model_management.processing_interrupted, provenance=provenance)
        except SearchInterrupted:
            comfy.model_management.throw_exception_if_processing_interrupted()  # ComfyUI's own Interrupt
            raise
        policy = result.policy
        policy.save(artifacts.policy_path(folder, name))
        pbar.update_absolute(budget + 1 + len(seed_list))
        return io.NodeOutput(policy, cc.pil_to_image(plot_search(result, [float(t) for t in profile.times])))

