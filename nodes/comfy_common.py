"""What the GCache nodes share inside ComfyUI: the category, custom types, the models/gcache folder."""
from __future__ import annotations

import os

import numpy as np
import torch

import folder_paths
from comfy_api.latest import io

from ..core import forecasters
from ..core.errors import GCacheError
from . import artifacts

CATEGORY = "GCache"
PolicySocket = io.Custom("GCACHE_POLICY")  # the type of a policy on a link (the node is GCache Policy)
ProfileSocket = io.Custom("GCACHE_PROFILE")
FOLDER = "gcache"
NO_FILE = "(none)"
AUTO = "(auto)"
# combo label → forecaster (core/forecasters: each says its label; the labels of saved workflows stay valid)
FORECAST = {forecasters.get(n).label: n for n in forecasters.names()}


def register_folder() -> None:
    """models/gcache/ (more folders via extra_model_paths.yaml, key `gcache`)."""
    if FOLDER not in folder_paths.folder_names_and_paths:
        folder_paths.folder_names_and_paths[FOLDER] = ([os.path.join(folder_paths.models_dir, FOLDER)],
                                                       {".json", ".safetensors"})


def folder() -> str:
    """Where GCache writes: the first models/gcache folder (created on demand)."""
    register_folder()
    path = folder_paths.get_folder_paths(FOLDER)[0]
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:  # the node that writes there says so, with what to do (artifacts.cant_write), not a raw PermissionError
        pass
    return path


def all_folders() -> list[str]:
    register_folder()
    return list(folder_paths.get_folder_paths(FOLDER))


def all_files() -> list[str]:
    register_folder()
    try:
        return list(folder_paths.get_filename_list(FOLDER))
    except FileNotFoundError:  # a listed folder was deleted while ComfyUI runs: its cached listing is stale
        folder_paths.filename_list_cache.pop(FOLDER, None)
        return list(folder_paths.get_filename_list(FOLDER))


def find_file(name: str) -> str:
    """A file from the gcache folders' list; refused if it is not one of them."""
    register_folder()
    if name not in all_files():
        raise GCacheError(f"{name!r} is not in models/gcache: refresh the node list (press R) and pick a file.")
    return folder_paths.get_full_path_or_raise(FOLDER, name)


def policy_choices() -> list[str]:
    """GCache Apply's list: "(auto)" first (no file needed), then the saved policies."""
    return [AUTO] + artifacts.list_policies(all_files())


def profile_choices() -> list[str]:
    return artifacts.list_profiles(all_files()) or [NO_FILE]


def pil_to_image(img) -> torch.Tensor:
    """PIL image → ComfyUI IMAGE [1, H, W, 3] float in [0, 1]."""
    arr = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(arr)[None]


def check_choice(what: str, value, options) -> None:
    """Combo values arrive unchecked through the HTTP API: an unknown one must not act as a default."""
    if value not in options:
        raise GCacheError(f"{what} must be one of {', '.join(map(repr, options))}, got {value!r} (an API client or an "
                          "edited workflow sent it).")
