"""Where GCache's artifacts live inside a folder (models/gcache/ in ComfyUI). No ComfyUI import.

    <name>.profile.safetensors   accumulated Profile
    <name>.json                  Policy
    <name>.search.json           search state beside its policy (resume after interrupt/crash)
    selfcheck.json               the self-check's verdicts (core/verdicts.py; set aside as selfcheck.damaged-<n>.json)
    auto_<model>-<key>_<N>steps_<scheduler>[_<speed-up>x]   GCache Apply (auto)'s own (AutoName)
Names go through core.files.safe_name; nothing here ever unpickles. Whether a folder can take them (cant_write) is
here too: the modes and GCache Search find an unwritable folder before any sampling.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Optional

from ..core import files
from ..core.errors import GCacheError
from ..core.files import exclusive, safe_name
from ..core.policy import Policy
from ..core.profile import Profile

PROFILE_SUFFIX = ".profile.safetensors"
POLICY_SUFFIX = ".json"
STATE_SUFFIX = ".search.json"
SELFCHECK_FILE = "selfcheck.json"  # not a policy: never in GCache Apply's list (nor what is set aside of it)
# what a user can do about a gcache folder GCache can't write in
FOLDER_FIX = ("make it writable for the user ComfyUI runs as, or give a writable folder as `gcache` in "
              "extra_model_paths.yaml (with is_default: true, so that GCache writes there)")


def cant_write(path: str) -> Optional[str]:
    """"the gcache folder <path> can't be written (<reason>)" when no file can be saved in `path`, else None."""
    why = files.unwritable(path)
    return None if why is None else f"the gcache folder {path} can't be written ({why})"


def profile_path(folder: str, name: str) -> str:
    return os.path.join(folder, safe_name(name, "profile name") + PROFILE_SUFFIX)


def policy_path(folder: str, name: str) -> str:
    return os.path.join(folder, safe_name(name, "policy name") + POLICY_SUFFIX)


def state_path(folder: str, name: str) -> str:
    return os.path.join(folder, safe_name(name, "policy name") + STATE_SUFFIX)


def list_policies(files: list[str]) -> list[str]:
    """Policy files among a folder's file names (search states are not policies)."""
    return sorted(f for f in files if f.endswith(POLICY_SUFFIX) and not f.endswith(STATE_SUFFIX)
                  and f != SELFCHECK_FILE and not f.startswith(SELFCHECK_FILE[:-len(POLICY_SUFFIX)] + "."))


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


@dataclass(frozen=True)
class AutoName:
    """GCache Apply (auto)'s files for one model, step count and scheduler:
    auto_<Model>-<weights key>_<N>steps_<scheduler>.profile.safetensors (no speed-up: another speed-up reuses the
    profile) and auto_..._<scheduler>_<speed-up>x.json (the policy)."""
    model: str
    key: str
    n_steps: int
    scheduler: str
    speedup: Optional[float] = None  # the policy's (a searched policy is named by its K instead)

    @property
    def stem(self) -> str:
        return f"auto_{self.model}-{self.key}_{self.n_steps}steps_{self.scheduler}"

    @property
    def policy_name(self) -> str:
        return f"{self.stem}_{self.speedup:g}x"

    def profile_path(self, folder: str) -> str:
        return profile_path(folder, self.stem)

    def policy_path(self, folder: str) -> str:
        return policy_path(folder, self.policy_name)

    def searched_path(self, folder: str, k: int) -> str:
        """A policy GCache Search found for this model, step count and scheduler at K (auto prefers it)."""
        return policy_path(folder, f"{self.stem}_K{k}_searched")

    def with_steps(self, n_steps: int) -> "AutoName":
        return replace(self, n_steps=n_steps)

    def policy_step_counts(self, files: list[str]) -> list[int]:
        """The step counts of this model's auto policies for the same scheduler and speed-up among `files`."""
        head, tail = f"auto_{self.model}-{self.key}_", f"steps_{self.scheduler}_{self.speedup:g}x{POLICY_SUFFIX}"
        return sorted(int(f[len(head):-len(tail)]) for f in files
                      if f.startswith(head) and f.endswith(tail) and f[len(head):-len(tail)].isdigit())


def set_aside(path: str, tag: str = "damaged") -> str:
    """Move a file that can't be read out of the way (beside it, renamed), so that it is made again; returns the
    new path. The user's data is kept, never deleted."""
    side = unique_beside(path, tag)
    os.replace(path, side)
    return side
