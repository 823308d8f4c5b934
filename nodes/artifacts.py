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
from ..core.files import exclusive, safe_name
from ..core.policy import Policy
from ..core.profile import Profile

PROFILE_SUFFIX = ".profile.safetensors"
POLICY_SUFFIX = ".json"
STATE_SUFFIX = ".search.json"


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


def read_policy(path: str) -> Policy:
    try:
        return Policy.load(path)
    except UnicodeDecodeError:  # core reads text; a binary file is not a policy
        raise GCacheError(f"{os.path.basename(path)} is not a GCache policy (not UTF-8 JSON): pick another file "
                          "or run GCache Search again.") from None


def load_profile_opt(path: str) -> Optional[Profile]:
    return Profile.load(path) if os.path.isfile(path) else None


def merge_into_file(path: str, run: Profile, lock_timeout_s: float = 120.0) -> Profile:
    """Add one run's profile to the file at `path` (created if missing); written atomically, under a lock so that
    two processes adding runs at once both land."""
    with exclusive(path, lock_timeout_s):
        old = load_profile_opt(path)
        total = old.merge(run) if old is not None else run
        total.save(path)
    return total


def unique_beside(path: str, tag: str) -> str:
    """A new file name next to `path`: <name>.<tag>-<n><suffix>, for data that must not overwrite `path`."""
    folder, base = os.path.split(path)
    stem, suffix = (base[:-len(PROFILE_SUFFIX)], PROFILE_SUFFIX) if base.endswith(PROFILE_SUFFIX) \
        else os.path.splitext(base)
    n = 1
    while os.path.exists(os.path.join(folder, f"{stem}.{tag}-{n}{suffix}")):
        n += 1
    return os.path.join(folder, f"{stem}.{tag}-{n}{suffix}")
