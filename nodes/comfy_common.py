"""What the GCache nodes share inside ComfyUI: the category, custom types, the models/gcache folder, which inputs
are for experts, and what an error shows the browser."""
from __future__ import annotations

import functools
import inspect
import os

import folder_paths
import numpy as np
import torch
from comfy_api.latest import io

from ..core import forecasters
from ..core.errors import GCacheError
from ..core.user_text import quoted, without_server_paths
from . import artifacts

CATEGORY = "GCache"
PolicySocket = io.Custom("GCACHE_POLICY")  # the type of a policy on a link (the node is GCache Policy)
ProfileSocket = io.Custom("GCACHE_PROFILE")
FOLDER = "gcache"
NO_FILE = "(none)"
AUTO = "(auto)"
# combo label → forecaster (core/forecasters: each says its label; the labels of saved workflows stay valid)
FORECAST = {forecasters.get(n).label: n for n in forecasters.names()}
# the forecasters that forecast (all but reuse): what a profile recorded with record_forecast is for
FORECASTING = [label for label, name in FORECAST.items() if forecasters.get(name).forecasts]
# An input for experts: `advanced=True` where this ComfyUI's inputs take it (0.33; its frontend folds such inputs
# under "Show advanced", as it does 4 of EasyCache's 5), nothing where they don't (0.3.64 has no such argument).
ADVANCED = {"advanced": True} if "advanced" in inspect.signature(io.Input.__init__).parameters else {}


def keeps(forecaster: str) -> int:
    """How many computed residuals a forecaster keeps (and forecasts from): tooltips say it from the forecaster."""
    return forecasters.get(forecaster).keeps


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
    except OSError:  # the node that writes there says so, with what to do (artifacts.cant_write), not a raw error
        pass
    return path


def all_folders() -> list[str]:
    register_folder()
    return list(folder_paths.get_folder_paths(FOLDER))


def shown_folders() -> dict[str, str]:
    """Each gcache folder (absolute) → how a message names it: its path under ComfyUI's base directory
    ("models/gcache"), else its last part. Never the absolute path: errors reach the browser."""
    base = os.path.abspath(getattr(folder_paths, "base_path", "") or os.getcwd())
    out = {}
    for f in all_folders():
        path = os.path.abspath(f)
        try:
            inside = os.path.commonpath([path, base]) == base and path != base
        except ValueError:  # another drive (Windows)
            inside = False
        out[path] = os.path.relpath(path, base).replace(os.sep, "/") if inside else os.path.basename(path)
    return out


PACK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # nodes/ -> this pack's folder


def shown_pack() -> str:
    """How a message names this pack's folder: its path under ComfyUI's base directory ("custom_nodes/<pack>"), as
    a user reads it in ComfyUI's folder; "custom_nodes/<pack>" too where the pack lies elsewhere (a link)."""
    base = os.path.abspath(getattr(folder_paths, "base_path", "") or os.getcwd())
    try:
        inside = os.path.commonpath([PACK_DIR, base]) == base and PACK_DIR != base
    except ValueError:  # another drive (Windows)
        inside = False
    shown = os.path.relpath(PACK_DIR, base) if inside else os.path.join("custom_nodes", os.path.basename(PACK_DIR))
    return shown.replace(os.sep, "/")


def for_the_browser(text: str) -> str:
    """A message as a node's error shows it: files by their names in the gcache folder, a file of this pack (its
    requirements.txt) by its path under ComfyUI's folder, no server path."""
    text = text.replace(PACK_DIR + os.sep, shown_pack() + "/")
    return without_server_paths(text, shown_folders())


def shown_to_user(execute):
    """A node's execute whose errors name no server path (core/user_text.py): ComfyUI sends a node's error message to
    the browser. GCacheError and OSError (the two that name files) are rewritten in place; anything else passes."""
    @functools.wraps(execute)
    def run(cls, *args, **kwargs):
        try:
            return execute(cls, *args, **kwargs)
        except GCacheError as e:
            e.problem, e.fix = for_the_browser(e.problem), for_the_browser(e.fix)
            e.args = (for_the_browser(str(e)),)
            raise
        except OSError as e:
            if len(e.args) >= 2:  # str() is "[Errno n] strerror: 'filename'": the file's name only
                if isinstance(e.filename, str):
                    e.filename = for_the_browser(e.filename)
                if isinstance(e.filename2, str):  # (set to None, str() would add " -> None")
                    e.filename2 = for_the_browser(e.filename2)
            else:
                e.args = tuple(for_the_browser(a) if isinstance(a, str) else a for a in e.args)
            raise
    return run


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
        raise GCacheError(f"{quoted(name)} is not in models/gcache: refresh the node list (press R) and pick a file.")
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
        raise GCacheError(f"{what} must be one of {', '.join(map(repr, options))}, got {quoted(value)} (an API client "
                          "or an edited workflow sent it).")
