"""The self-check of the skip path in a mode's run: who is checked (a Subject: the model's weights, its family adapter,
the ComfyUI version and the model's code, GCache's version), what a run's check concluded, the record file
models/gcache/selfcheck.json (core/verdicts.py) and what the user sees. Imports ComfyUI (its version, its server).

A run that computes every step (GCache Profile, Apply (auto)'s first run, GCache Search's reference runs) gets a
RunCheck (../patching/selfcheck.py) from `start_check`; at its close the outcome is recorded for its subject, logged in
one line and shown as the GCache node's text. A first fail computes every step and is checked again by the next run
of a later prompt (`failed_once`; a second sampling in the same prompt counts with the first); a second fail in a row
turns skipping off for that subject in every mode (`recorded_fail`, `refusal`); a subject changes with the model,
ComfyUI, the model's code, GCache or the compute settings (TF32, the cast dtype), and is then checked again.
"""
from __future__ import annotations

import datetime
import hashlib
import inspect
import logging
import os
from dataclasses import dataclass
from typing import Optional

from ...core.errors import GCacheError
from ...core.selfcheck import FAIL, NOT_CHECKED, PASS, Outcome
from ...core.verdicts import DamagedRecord, VerdictBook, checks_of, confirmed, record, same_prompt_again
from ...core.version import VERSION as GCACHE_VERSION
from .. import artifacts
from ..patching.adapters import FALLBACK, Adapter, Route
from ..patching.content_hash import model_key
from ..patching.runtime import RunState
from ..patching.selfcheck import RunCheck
from ..patching.steps import Schedule
from .splits import current_prompt

log = logging.getLogger("gcache")
RECORD_FILE = artifacts.SELFCHECK_FILE
REPORT = "https://github.com/gcache-project/gcache/issues"
FALLBACK_WHY = "the whole-model fallback caches the model's own output, so no block of the model is skipped"
_CODE: dict = {}


def comfyui_version() -> str:
    try:
        import comfyui_version
        return str(comfyui_version.__version__)
    except (ImportError, AttributeError):
        return "unknown"


def model_code(diffusion_model, adapter: Adapter) -> str:
    """A hash of the source files of the model's classes inside ComfyUI and of its blocks' classes: a ComfyUI
    installed from git changes a model's code between version numbers."""
    classes = [c for c in type(diffusion_model).__mro__ if c.__module__.startswith("comfy")]
    for st in adapter.stacks:
        container = getattr(diffusion_model, st.attr, None)
        first = next(iter(container.children()), None) if container is not None else None
        if first is not None:
            classes.append(type(first))
    paths = set()
    for c in classes:
        try:
            paths.add(inspect.getsourcefile(c))
        except TypeError:  # a class without a source file (built in)
            continue
    h = hashlib.sha256()
    for p in sorted(x for x in paths if x):
        try:
            stat = os.stat(p)
            key = (p, stat.st_mtime_ns, stat.st_size)
            if key not in _CODE:
                with open(p, "rb") as f:
                    _CODE[key] = hashlib.sha256(f.read()).hexdigest()
            h.update(_CODE[key].encode())
        except OSError:
            h.update(p.encode())
    return h.hexdigest()[:8]


@dataclass(frozen=True)
class Subject:
    """What a verdict is about, and where it is kept and shown."""
    model: str               # the diffusion model's class
    key: str                 # its weights (patching/content_hash.model_key)
    family: str              # the adapter
    comfyui: str
    code: str                # the model's code (model_code)
    compute: str = ""        # the compute settings it runs under (compute_settings): TF32, the cast dtype
    gcache: str = GCACHE_VERSION
    folder: str = ""         # models/gcache ("": verdicts are neither read nor recorded)
    node_id: str = ""        # the GCache node whose text shows them ("": none)

    def fields(self) -> dict:
        return {"model": self.model, "key": self.key, "family": self.family, "comfyui": self.comfyui,
                "code": self.code, "gcache": self.gcache, "compute": self.compute}

    def where(self) -> str:
        return f"{self.model} ({self.family}) on ComfyUI {self.comfyui}"

    @property
    def path(self) -> str:
        return os.path.join(self.folder, RECORD_FILE)

    def recorded(self) -> Optional[dict]:
        """The verdict recorded for this subject (None: none, or no folder)."""
        if not self.folder:
            return None
        try:
            return _book(self.path).get(self.fields())
        except DamagedRecord as e:
            _set_aside(self.path, str(e))
            return None

    def record(self, outcome: Outcome) -> dict:
        """The verdict of a run's check, kept in the record file (when there is a folder); returns the verdict that
        stands for this subject (a recorded fail stays)."""
        verdict = dict(self.fields(), result=outcome.result, why=outcome.why, error=outcome.error,
                       tolerance=outcome.tolerance, dtype=outcome.dtype, statistic=outcome.statistic,
                       group_error=outcome.group_error, group_tolerance=outcome.group_tolerance,
                       fails=1 if outcome.result == FAIL else None,  # this run's (the record adds the earlier ones)
                       prompt=current_prompt() or "",  # a fail of the prompt of a first fail counts with it
                       date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
        if not self.folder:
            return verdict
        _BOOKS.pop(self.path, None)
        for attempt in (1, 2):
            try:
                return record(self.path, verdict)
            except DamagedRecord as e:  # set aside, then a new file
                if attempt == 2 or not _set_aside(self.path, str(e)):
                    break
            except GCacheError as e:  # its lock: another process held it too long, or a folder without locks
                log.error("GCache self-check: the verdict was not recorded (%s).", e)
                break
            except OSError as e:
                log.error("GCache self-check: could not record the verdict in %s (%s); %s", RECORD_FILE,
                          e.strerror or e, artifacts.FOLDER_FIX)
                break
        return verdict


_BOOKS: dict = {}  # path -> ((inode, mtime, size), VerdictBook): every run of a patched model looks its subject up


def _book(path: str) -> VerdictBook:
    """The record file as it is now (read again only when it changed)."""
    try:
        st = os.stat(path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)  # each write replaces the file (core/files.py)
    except OSError:
        return VerdictBook()
    kept = _BOOKS.get(path)
    if kept is None or kept[0] != stamp:
        kept = _BOOKS[path] = (stamp, VerdictBook.load(path))
    return kept[1]


def compute_settings(base_model, backends=None) -> str:
    """The settings a verdict ran under that change the model's rounding: TF32 allowed in matmuls and in convolutions
    or not, and the dtype ComfyUI casts the weights to (its manual_cast_dtype; "none": the weights' own)."""
    import torch
    b = backends or torch.backends
    cast = getattr(base_model, "manual_cast_dtype", None)
    return (f"tf32 matmul {_tf32(b.cuda.matmul)}, conv {_tf32(b.cudnn)}, "
            f"cast {str(cast).replace('torch.', '') if cast is not None else 'none'}")


def _tf32(backend) -> str:
    """'on' or 'off': torch from 2.9 says fp32_precision ("tf32" | "ieee" | "none"), older ones allow_tf32."""
    try:
        precision = getattr(backend, "fp32_precision", None)
        if isinstance(precision, str) and precision != "none":
            return "on" if precision == "tf32" else "off"
        return "on" if bool(getattr(backend, "allow_tf32", False)) else "off"
    except (AttributeError, RuntimeError):  # a build without the backend
        return "off"


def subject_of(model, adapter: Adapter, folder: str = "", node_id=None) -> Subject:
    dm = model.get_model_object("diffusion_model")
    return Subject(type(dm).__name__, model_key(model), adapter.name, comfyui_version(), model_code(dm, adapter),
                   compute_settings(getattr(model, "model", None)), folder=folder or "",
                   node_id="" if node_id is None else str(node_id))


def _set_aside(path: str, why: str) -> bool:
    try:
        side = artifacts.set_aside(path, "damaged")
    except OSError as e:
        log.error("GCache self-check: %s can't be read (%s) nor moved aside (%s); verdicts are not recorded.",
                  RECORD_FILE, why, e.strerror or e)
        return False
    log.warning("GCache self-check: %s can't be read (%s); it was moved to %s. Models are checked again at their "
                "next run that computes every step.", RECORD_FILE, why, os.path.basename(side))
    return True


# ------------------------------------------------------------------------------ a run's check
def start_check(run: RunState, subject: Subject, adapter: Adapter, sched: Schedule) -> RunCheck:
    """Gives a run that computes every step its self-check (at the run's last step, when it is after the first),
    and, first thing at its close, the verdict (RunCheck.verdict): recorded, logged and shown. The replay's time
    counts as the profile's own work in the step it ran in (the measured io share leaves it out)."""
    if adapter.route == Route.FALLBACK:
        check = RunCheck(adapter, None, FALLBACK_WHY)
    elif sched.end - 1 < 1:
        check = RunCheck(adapter, None, "a one-step run has no step after the first to check")
    else:
        check = RunCheck(adapter, sched.end - 1)
    run.selfcheck = check

    def close(run: RunState, stats, ok: bool):
        if not ok:
            return
        try:  # after sampling: whatever goes wrong here is said, the image is kept
            seconds = check.replay_seconds()
            if seconds and check.step in stats.step_seconds:
                stats.record_seconds[check.step] = stats.record_seconds.get(check.step, 0.0) + seconds
            outcome = check.outcome()
            again = same_prompt_again(subject.recorded(), {"result": outcome.result, "prompt": current_prompt()})
            check.verdict = subject.record(outcome)
            say(check.verdict, subject, outcome, again)
        except Exception as e:  # noqa: BLE001  a fault of the check itself never fails the prompt
            log.error("GCache self-check: could not conclude for %s (%s: %s); nothing was recorded.", subject.where(),
                      type(e).__name__, e)

    run.on_close.insert(0, close)
    return check


_UNVERIFIED: set = set()


def note_unverified(subject: Subject, policy_provenance: dict) -> None:
    """Once per process and subject: a policy applied to a model whose skip path has no verdict on this ComfyUI."""
    if not subject.folder or subject.family == FALLBACK.name or subject.key in _UNVERIFIED:
        return
    _UNVERIFIED.add(subject.key)
    made = [v for v in checks_of(policy_provenance) if v["result"] == PASS]
    where = f" (the policy's profile passed it on ComfyUI {made[-1]['comfyui']})" if made else ""
    log.warning("GCache Apply: the skip path of %s has not been self-checked on this ComfyUI yet%s; its skipped "
                "steps are applied unverified. GCache Apply (auto), GCache Profile and GCache Search's reference "
                "runs check it in a run that computes every step.", subject.where(), where)


# ------------------------------------------------------------------------------ what the user sees
def describe(v: dict) -> str:
    """'element error 3.1e-07 ≤ tolerance 9.5e-07 for float32 (group error ..)' and what went wrong, from a verdict."""
    return Outcome(v["result"], v.get("why", ""), v.get("error"), v.get("tolerance"), v.get("dtype", ""),
                   statistic=v.get("statistic", ""), group_error=v.get("group_error"),
                   group_tolerance=v.get("group_tolerance")).describe()


def say(v: dict, subject: Subject, outcome: Optional[Outcome] = None, again: bool = False) -> None:
    """The one log line (and the node's text) of a run's verdict (`v`: the one that stands for the subject; `outcome`:
    what this run's check found, when it differs: a run not checked leaves an earlier first fail standing; `again`:
    this run failed in the prompt of that first fail, which it counts with)."""
    if again and v["result"] == FAIL and not confirmed(v) and outcome is not None:
        text = (f"GCache self-check failed again in this prompt for {subject.where()} (GCache {subject.gcache}): "
                f"{outcome.describe()}. A second sampling in the prompt of a first fail counts with it: this run "
                f"computed every step; checking again on the next run of a later prompt (a fail there turns skipping "
                f"off for this model until the model, ComfyUI or GCache changes).")
        log.warning(text)
    elif v["result"] == FAIL and not confirmed(v) and outcome is not None and outcome.result == NOT_CHECKED:
        why = (outcome.why or "no reason given").rstrip(".")
        text = (f"GCache self-check: not checked for {subject.where()}: {why}. Its earlier fail ({describe(v)}) "
                "stands: every step is computed until a run checks it again.")
        log.warning(text)
    elif v["result"] == PASS:
        text = (f"GCache self-check passed for {subject.where()}: the skip path reproduced the computed step "
                f"({describe(v)}).")
        log.info(text)
    elif v["result"] == FAIL and not confirmed(v):
        text = (f"GCache self-check failed once for {subject.where()} (GCache {subject.gcache}): {describe(v)}. This "
                f"run computed every step; checking again on the next run (a second fail turns skipping off for this "
                f"model until the model, ComfyUI or GCache changes).")
        log.warning(text)
    elif v["result"] == FAIL:
        text = (f"GCache self-check FAILED for {subject.where()} (GCache {subject.gcache}): {describe(v)}; it failed "
                f"twice in a row. GCache will not skip any step of this model until the model, ComfyUI or GCache "
                f"changes: every step is computed. Please report this line at {REPORT}.")
        log.error(text)
    else:
        text = (f"GCache self-check: not checked for {subject.where()}: "
                f"{(v.get('why') or 'no reason given').rstrip('.')}; its skipped steps are not verified.")
        log.info(text)
    show(subject.node_id, text)


def recorded_fail(subject: Optional[Subject]) -> Optional[dict]:
    """The fail recorded for good for this subject (None: none; a first fail is checked again: `failed_once`)."""
    v = subject.recorded() if subject is not None else None
    return v if v is not None and v["result"] == FAIL and confirmed(v) else None


def failed_once(subject: Optional[Subject]) -> Optional[dict]:
    """The first fail recorded for this subject, which the next run that computes every step checks again."""
    v = subject.recorded() if subject is not None else None
    return v if v is not None and v["result"] == FAIL and not confirmed(v) else None


def refusal(v: dict, subject: Subject) -> str:
    """Why a mode does not skip on a subject with a recorded fail (a sentence for the log and the node's text)."""
    return (f"skipping is off for {subject.where()}: its self-check failed twice, last on "
            f"{v.get('date', 'an earlier run')} ({describe(v)}), so every step is computed. Please report it at "
            f"{REPORT}; GCache checks again when the model, ComfyUI, GCache or the compute settings change (or when "
            f"models/gcache/{RECORD_FILE} is deleted)")


def show(node_id: str, text: str) -> None:
    """`text` under the GCache node in ComfyUI's frontend (nothing outside a server, or without a node id)."""
    if not node_id:
        return
    try:
        from server import PromptServer
        PromptServer.instance.send_progress_text(text, node_id)
    except Exception:  # noqa: BLE001  no server (in-process use), an older frontend: the log line stands
        pass

