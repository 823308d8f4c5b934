"""GCache Profile (record during normal sampling) and GCache Load Profile (look at one)."""
from __future__ import annotations

import logging
import os

from comfy_api.latest import io

from ..core.errors import GCacheError
from ..core.profile import Profile
from ..core.verdicts import checks_of, failed
from ..search.infra.plots import plot_profile
from . import artifacts
from . import comfy_common as cc
from .modes.base import CACHE_DEVICES
from .modes.profile import profile_config
from .patching import companions, hooks

log = logging.getLogger("gcache")
# what record_forecast adds to a profile for N steps (core/profile.py's optional arrays: E1 N³, the fit statistics
# 2·N³ + 4·N²); tests/comfyui/test_messages.py counts them
FORECAST_NUMBERS = "3·N³"


class GCacheProfile(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="GCacheProfile", display_name="GCache Profile", category=cc.CATEGORY,
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
            description="Records the block-stack residuals of every full sampling run of this model and adds them "
                        "to models/gcache/<name>.profile.safetensors (runs again on every queue).",
            inputs=[
                io.Model.Input("model", tooltip="The model to profile; sampling itself is unchanged."),
                io.String.Input("profile_name", default="my_model",
                                tooltip="File name of the accumulated profile (letters, digits, '.', '_', '-'). Use "
                                        "one name per model, step count and scheduler."),
                io.Combo.Input("history_device", options=list(CACHE_DEVICES), default="model device",
                               tooltip="Where the run's residual history (steps × latent tokens) is kept while "
                                       "sampling: CPU saves GPU memory on long videos.", **cc.ADVANCED),
                io.Boolean.Input("record_forecast", default=False, optional=True,
                                 tooltip="Also record what forecasting the residual needs (E1 and the fit statistics, "
                                         f"about {FORECAST_NUMBERS} numbers for N steps): GCache Policy, and GCache "
                                         "Search given this profile, need it for forecast "
                                         f"{', '.join(cc.FORECASTING[:-1])} or {cc.FORECASTING[-1]}."),
            ],
            outputs=[io.Model.Output(tooltip="Connect to your sampler; every finished run is added to the profile.")],
        )

    @classmethod
    def fingerprint_inputs(cls, **kwargs):
        return float("nan")  # never served from ComfyUI's cache: each queue must sample (and record) again

    @classmethod
    def validate_inputs(cls, history_device):  # named only: **kwargs would turn off ComfyUI's other checks
        try:
            cc.check_choice("history_device", history_device, list(CACHE_DEVICES))
        except GCacheError as e:
            return cc.for_the_browser(str(e))
        return True

    @classmethod
    @cc.shown_to_user
    def execute(cls, model, profile_name, history_device, record_forecast=False) -> io.NodeOutput:
        cc.check_choice("history_device", history_device, list(CACHE_DEVICES))
        path = artifacts.profile_path(cc.folder(), profile_name)
        # a damaged profile file stops the prompt here, before any sampling (not after it, losing the image)
        hidden = getattr(cls, "hidden", None)  # TorchCompileModel / EasyCache after this node: refused here
        config = profile_config(model, path, history_device=CACHE_DEVICES[history_device],
                                forecast=bool(record_forecast), folder=cc.folder(),
                                node_id=getattr(hidden, "unique_id", None))
        companions.check_prompt(getattr(hidden, "prompt", None), getattr(hidden, "unique_id", None), "GCache Profile")
        return io.NodeOutput(hooks.patch_model(model, config, "GCache Profile"))


class GCacheLoadProfile(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="GCacheLoadProfile", display_name="GCache Load Profile", category=cc.CATEGORY,
            description="Loads a saved profile for GCache Search and draws it: the E heatmap and the local "
                        "indicators per step.",
            inputs=[io.Combo.Input("profile", options=cc.profile_choices(),
                                   tooltip="A profile recorded by GCache Profile "
                                           "(models/gcache/*.profile.safetensors).")],
            outputs=[cc.ProfileSocket.Output(tooltip="The profile, for GCache Search."),
                     io.Image.Output(tooltip="E heatmap and local indicators (rel-L1 of δ and h, ‖δ‖) per step.")],
        )

    @classmethod
    def fingerprint_inputs(cls, profile):
        """Changes when the file does, in whichever gcache folder it is (the one it is loaded from)."""
        try:
            return os.path.getmtime(cc.find_file(profile + artifacts.PROFILE_SUFFIX))
        except (OSError, GCacheError):
            return profile

    @classmethod
    @cc.shown_to_user
    def execute(cls, profile) -> io.NodeOutput:
        prof = Profile.load(cc.find_file(profile + artifacts.PROFILE_SUFFIX))
        if prof.defect:  # shown, but GCache Policy and GCache Search refuse it
            log.warning("GCache Load Profile: %s: %s GCache Policy and GCache Search refuse it: profile again.",
                        profile, prof.defect)
        bad = failed(checks_of(prof.meta))
        if bad is not None:  # shown, but no policy made from it skips
            log.warning("GCache Load Profile: %s was recorded where GCache's self-check failed (%s (%s) on ComfyUI "
                        "%s): GCache Policy makes only policies that compute every step from it, and GCache Search "
                        "searches nothing. Profile again where the check passes.", profile, bad["model"],
                        bad["family"], bad["comfyui"])
        return io.NodeOutput(prof, cc.pil_to_image(plot_profile(prof)))
