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
from ..search.end_game import fresh_seeds

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


def search_profile_path(folder: str, name: str) -> str:
    """The profile GCache Search `name` records from its reference runs when none is connected."""
    return os.path.join(folder, name + ".search" + PROFILE_SUFFIX)


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
        raise GCacheError(f"{os.path.basename(path)} is not a GCache policy (not UTF-8 JSON).",
                          "Pick another file or run GCache Search again.") from None


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


# What a searched policy's loss was measured on (GCache Search's provenance, nodes/search_jobs/job.py): two searched
# policies whose provenance agrees on these and whose objective is the same were compared with the same reference
# images on the same seeds, so the lower loss is the better policy. What a message calls each when they differ.
SAME_REFERENCES = {"model": "model", "seeds": "seeds", "inputs": "conditioning, latent or LoRAs", "steps": "steps",
                   "cfg": "cfg", "sampler": "sampler", "scheduler": "scheduler", "latent_shape": "latent size"}


def differs(a: Policy, b: Policy) -> list[str]:
    """What differs between the measurements of two searched policies (empty: their losses compare)."""
    out = [word for key, word in SAME_REFERENCES.items()
           if key not in a.provenance or a.provenance.get(key) != b.provenance.get(key)]
    if a.metrics.get("objective") != b.metrics.get("objective"):
        out.append("objective")
    if not all(isinstance(p.metrics.get("loss"), (int, float)) for p in (a, b)):
        out.append("loss (one has none)")
    return out


def fresh_evidence(p: Policy):
    """(the fresh seeds, the loss on them) of a searched policy whose final choice sampled fresh seeds, else None.
    The policy records how many fresh seeds (search/end_game.py FreshOutcome.provenance: a count, or None) and its
    search seeds (GCache Search's provenance); which fresh seeds follows from those (end_game.fresh_seeds)."""
    record, loss = p.provenance.get("fresh_seeds"), p.metrics.get("fresh_loss")
    seeds = p.provenance.get("seeds")
    if not (isinstance(record, dict) and record.get("losses") and isinstance(loss, (int, float))
            and isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
        return None
    fresh = fresh_seeds(seeds)
    count = record.get("seeds")
    if count is not None and count != len(fresh):  # not what a search on these seeds samples: no evidence
        return None
    return fresh, float(loss)


def ranking_losses(new: Policy, old: Policy) -> tuple[float, float, str]:
    """(new's loss, old's loss, the evidence they are) for two searched policies measured on the same references.
    The search ranks its own finalists by their loss on fresh seeds (search/end_game.py: the loss on the seeds it
    searched on flatters the mask it chose most), so two policies are ranked the same way where both have a loss on
    the same fresh seeds; otherwise by the search-seed loss, and the log says so."""
    a, b = fresh_evidence(new), fresh_evidence(old)
    if a and b and a[0] == b[0]:
        return a[1], b[1], f"ranked on the {len(a[0])} fresh seeds its final choice sampled"
    why = "neither has a loss on fresh seeds" if not (a or b) else "only one has a loss on fresh seeds" \
        if not (a and b) else "they have different fresh seeds"
    return new.metrics["loss"], old.metrics["loss"], f"ranked on the search seeds ({why} to rank them by)"


@dataclass(frozen=True)
class Kept:
    """What save_searched did: the policy now in the file (auto applies it) and what the log says about it."""
    policy: Policy
    ours: bool  # the file holds the new policy
    note: str   # "" or what happened to what was there before


def save_searched(path: str, policy: Policy) -> Kept:
    """Saves a searched policy where GCache Apply (auto) looks for it (AutoName.searched_path: one file per model,
    step count, scheduler and K), unless the file holds a better one: a search never silently replaces a better
    searched policy. The file's policy is kept when it was measured on the same seeds and reference images with the
    same objective (differs) and its loss is not higher (a search resumed with a larger budget too); replaced when
    this one's is lower; moved aside (renamed ….replaced-<n>.json beside it, still in Apply's list) when the two
    were measured on other references, whose losses don't compare: the latest search is then the one auto applies.
    Under the file's lock, so that two searches finishing at once both compare with what the other saved."""
    name = os.path.basename(path)
    with exclusive(path):
        old, note = None, ""
        if os.path.isfile(path):
            try:
                old = read_policy(path)
            except GCacheError as e:
                note = f"the policy there can't be read ({e.problem.rstrip('.')}): it was moved to " \
                       f"{os.path.basename(set_aside(path))}"
        if old is not None:
            other = differs(old, policy)
            if not other:
                new_loss, old_loss, evidence = ranking_losses(policy, old)
                if old_loss <= new_loss:
                    return Kept(old, False, f"kept the policy an earlier search saved as {name}: on the same "
                                            f"seeds and reference images, {evidence}, its loss {old_loss:.6g} is not "
                                            f"higher than this search's {new_loss:.6g}")
                note = f"it replaces the policy an earlier search saved there: on the same seeds and reference " \
                       f"images, {evidence}, its loss {new_loss:.6g} is lower than that one's {old_loss:.6g}"
            else:
                aside = os.path.basename(set_aside(path, "replaced"))
                note = f"the policy an earlier search saved there was measured on another {', '.join(other)}, so " \
                       f"the two losses don't compare: it was moved to {aside} (pick it in policy_file to apply it)"
        policy.save(path)
    return Kept(policy, True, note)


def set_aside(path: str, tag: str = "damaged") -> str:
    """Move a file that can't be read out of the way (beside it, renamed), so that it is made again; returns the
    new path. The user's data is kept, never deleted."""
    side = unique_beside(path, tag)
    os.replace(path, side)
    return side
