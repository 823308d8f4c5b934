"""Where GCache's artifacts live inside a folder (models/gcache/ in ComfyUI). No ComfyUI import.

    <name>.profile.safetensors   accumulated Profile
    <name>.json                  Policy
    <name>.search.json           search state beside its policy (resume after interrupt/crash)
Names go through core.files.safe_name; nothing here ever unpickles.
"""
from __future__ import annotations

import os
from typing import Optional

from ..core.errors import GCacheError
from ..core.files import safe_name
from ..core.policy import Policy
from ..core.profile import Profile

PROFILE_SUFFIX = ".profile.safetensors"
POLICY_SUFFIX = ".json"
STATE_SUFFIX = ".search.json"
NO_PROFILE = "(none: profile reference runs)"


def profile_path(folder: str, name: str) -> str:
    return os.path.join(folder, safe_name(name, "profile name") + PROFILE_SUFFIX)


def policy_path(folder: str, name: str) -> str:
    return os.path.join(folder, safe_name(name, "policy name") + POLICY_SUFFIX)


def state_path(folder: str, name: str) -> str:
    return os.path.join(folder, safe_name(name, "policy name") + STATE_SUFFIX)


def list_policies(files: list[str]) -> list[str]:
    """Policy files among a folder's file names (search states are not policies)."""
    return sorted(f for f in files if f.endswith(POLICY_SUFFIX) and not f.endswith(STATE_SUFFIX))


def list_profiles(files: list[str]) -> list[str]:
    return sorted(f[:-len(PROFILE_SUFFIX)] for f in files if f.endswith(PROFILE_SUFFIX))


def resolve_in(folder: str, file_name: str) -> str:
    """A file chosen from a list, refused if it names anything outside `folder`."""
    if not file_name or os.path.basename(file_name) != file_name or file_name.startswith("."):
        raise GCacheError(f"{file_name!r} is not a file name inside the gcache folder: pick one from the list.")
    path = os.path.join(folder, file_name)
    if not os.path.isfile(path):
        raise GCacheError(f"No file {file_name!r} in {folder}: refresh the node list (press R) or run GCache "
                          "Search to make a policy.")
    return path


def read_policy(path: str) -> Policy:
    try:
        return Policy.load(path)
    except UnicodeDecodeError:  # core reads text; a binary file is not a policy
        raise GCacheError(f"{os.path.basename(path)} is not a GCache policy (not UTF-8 JSON): pick another file "
                          "or run GCache Search again.") from None


def load_policy_file(folder: str, file_name: str) -> Policy:
    return read_policy(resolve_in(folder, file_name))


def load_profile_opt(path: str) -> Optional[Profile]:
    return Profile.load(path) if os.path.isfile(path) else None


def merge_into_file(path: str, run: Profile) -> Profile:
    """Add one run's profile to the file at `path` (created if missing); written atomically."""
    old = load_profile_opt(path)
    total = old.merge(run) if old is not None else run
    total.save(path)
    return total
