"""GCache Search in the background: a search runs in slices queued through ComfyUI's own prompt queue. Imports
ComfyUI.

Queuing GCache Search (mode "background") samples the reference runs, returns the best policy known so far and queues
a *slice prompt*: the part of the user's prompt that GCache Search needs (its node and everything upstream of it,
which ComfyUI serves from its cache or loads again: it keeps managing the models), with a marker in the node's inputs
that only GCache Search reads (SLICE_KEY; ComfyUI passes a node only the inputs it declares). A slice runs
evaluations until its time budget is spent (at least one), saves the state file and queues the next slice at the end
of the queue, behind whatever the user queued meanwhile: ComfyUI runs one prompt at a time, so a user prompt waits at
most one slice and the search never samples beside it. Slices are queued over ComfyUI's HTTP API (the public way to
queue, the same in every ComfyUI version), on loopback, under the client id of the prompt that started the search:
ComfyUI sends a prompt's events (progress on the node included) to the client that queued it.

Jobs is the one owner of the searches this ComfyUI process runs: status for the frontend panel (web/gcache.js) over
GET /gcache/searches and the "gcache.search" event, Cancel (POST /gcache/searches/{id}/cancel: the search ends before
its next image, its state file is kept), and the reference images kept between slices. A job's status is a state
machine (MOVES). A foreground search (mode "foreground": one prompt searches until done) is listed too, as running in
the foreground; Cancel stops it before its next image.
A server that was killed lists its unfinished state files as paused; queueing GCache Search again resumes them.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from ...core.errors import GCacheError
from ...core.user_text import without_server_paths
from ..artifacts import POLICY_SUFFIX, PROFILE_SUFFIX, STATE_SUFFIX, search_profile_path

log = logging.getLogger("gcache")
SLICE_KEY = "gcache_slice"  # in a slice prompt's GCache Search inputs: the job it continues ("<id>/<token>")
EVENT = "gcache.search"


# A job's status is a state machine: queued → running → queued (next slice) | paused | done | failed | cancelled.
# Cancelled, done (finished) and failed are terminal; paused can only be cancelled. Queueing GCache Search again
# resumes a paused, cancelled or failed search as a new Job (its state file is kept), never by moving the old one.
# "queued → queued": the start's first slice queued (the job is put as queued, then says so).
MOVES = {
    "queued": {"queued", "running", "paused", "failed", "cancelled"},
    "running": {"queued", "paused", "done", "failed", "cancelled"},
    "paused": {"cancelled"},
    "cancelled": set(), "done": set(), "failed": set(),
}
ACTIVE = ("queued", "running")


@dataclass
class Job:
    """One background search, as this process knows it. Its status changes only through Jobs (under its lock)."""
    id: str                          # the policy name (one search per name and folder)
    state_path: str
    budget: int
    node_id: str
    prompt: dict                     # the slice prompt queued for each slice
    status: str = "queued"           # see MOVES
    evaluations: int = 0             # history entries so far (instant masks and start grid included)
    best_loss: Optional[float] = None
    message: str = ""
    refs: Any = None                 # the reference images, kept between slices (dropped when the search ends)
    refs_key: str = ""               # what the references were sampled from (a changed prompt samples them again)
    queued_prompt: Optional[str] = None
    client_id: Optional[str] = None  # who queued the search: each slice's progress goes to that client
    mode: str = "background"         # "foreground": one prompt searches until done (no slices; see search_node.py)
    identity: str = ""               # what the search is (model, references, config: SearchJob.identity)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)  # this job, not another of its name: its slices
    updated: float = field(default_factory=time.time)

    def public(self) -> dict:
        return {"id": self.id, "status": self.status, "evaluations": self.evaluations, "budget": self.budget,
                "best_loss": self.best_loss, "message": file_names(self.message),
                "state_file": os.path.basename(self.state_path), "mode": self.mode,
                "updated": round(self.updated, 3)}

    @property
    def cancelled(self) -> bool:
        return self.status == "cancelled"

    @property
    def marker(self) -> str:
        """What its slice prompts carry (SLICE_KEY): its id and token ("/" is in no policy name)."""
        return f"{self.id}/{self.token}"


class Jobs:
    """The searches of this process. Every change of a job (its status above all) happens under one lock, so that a
    Cancel from the server's thread is never overwritten by the prompt thread's slice: a move MOVES does not allow
    is refused (update returns False) and the caller stops."""

    def __init__(self):
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str) -> Optional[Job]:
        with self._lock:
            return self._jobs.get(job_id)

    def of_marker(self, marker: Optional[str]) -> Optional[Job]:
        """The job a slice prompt's marker names: None when that job is no longer this id's (a newer search of the
        name replaced it), or the marker names none."""
        job_id, _, token = str(marker or "").rpartition("/")
        job = self.get(job_id)
        return job if job is not None and token and job.token == token else None

    def of_search(self, job_id: str, identity: str) -> Optional[Job]:
        """The job of this id when it is this search (the same identity), else None."""
        job = self.get(job_id)
        return job if job is not None and job.identity == identity else None

    def put(self, job: Job) -> Job:
        """Lists `job` under its id. A live (queued or running) job of the id that is another search is never
        replaced: GCacheError, nothing changed (search_node.py refuses such a start before any sampling)."""
        if job.status not in MOVES:
            raise ValueError(f"GCache internal error: a job can't start as {job.status!r}")
        with self._lock:
            live = self._jobs.get(job.id)
            if live is not None and live is not job and live.status in ACTIVE and live.identity != job.identity:
                raise GCacheError(another_search(live))
            self._jobs[job.id] = job
            job.updated = time.time()
            row = job.public()
        _send(row)
        return job

    def update(self, job: Job, status: Optional[str] = None, **changes) -> bool:
        """Applies `changes` (and the move to `status`) at once; False, with nothing changed, when the job's status
        may not move to `status` (it was cancelled or has ended meanwhile)."""
        with self._lock:
            if status is not None:
                if status not in MOVES:
                    raise ValueError(f"GCache internal error: no job status {status!r}")
                if status not in MOVES[job.status]:
                    log.debug("GCache Search %s: %s → %s refused.", job.id, job.status, status)
                    return False
                job.status = status
            for k, v in changes.items():
                setattr(job, k, v)
            job.updated = time.time()
            row = job.public()
        _send(row)  # outside the lock: ComfyUI's send_sync only queues the event
        return True

    def keep_refs(self, job: Job, refs, key: str) -> None:
        """The reference images a slice sampled, kept for the next slices while the search goes on (a Cancel or
        the end drops them, and a job that has stopped keeps none)."""
        with self._lock:
            if job.status in ACTIVE:
                job.refs, job.refs_key = refs, key

    def cancel(self, job_id: str) -> Optional[Job]:
        """Cancel a search: a background one ends (no more slices, nothing more sampled); a foreground one stops
        before its next image and its prompt goes on with the best policy so far. Its state file is kept either
        way. A search that has ended is left as it is."""
        job = self.get(job_id)
        if job is not None:
            then = " (the prompt goes on with the best policy so far)" if job.mode == "foreground" else ""
            self.update(job, status="cancelled", refs=None,
                        message=f"cancelled{then}; its state file is kept: queue GCache Search again to resume")
        return job

    def listing(self, folders: list[str]) -> list[dict]:
        """The searches of this process, then the other state files in the gcache folders: finished ones (done, as
        their policy file says) and unfinished ones (paused: a server that was killed or restarted, or an end game that
        was stopped)."""
        with self._lock:  # one consistent picture of the jobs; the folders are read after
            out = [j.public() for j in sorted(self._jobs.values(), key=lambda j: -j.updated)]
            known = {j.state_path for j in self._jobs.values()}
        profiles = _Profiles(folders)
        for folder in folders:
            if not os.path.isdir(folder):
                continue
            for f in sorted(os.listdir(folder)):
                path = os.path.join(folder, f)
                if f.endswith(STATE_SUFFIX) and path not in known:
                    row = _state_row(folder, f, profiles)
                    if row is not None:
                        out.append(row)
        return out


def another_search(live: Job) -> str:
    """Why a search can't start while `live`, another search of its policy name, is queued or running."""
    return (f"GCache Search {live.id} is {live.status} in this ComfyUI for another model, other inputs or settings, "
            f"and {os.path.basename(live.state_path)} and its profile are that search's. Nothing was sampled: give "
            "this search another policy_name, or cancel the other one in the GCache tab first.")


def _state_row(folder: str, f: str, profiles: "_Profiles") -> Optional[dict]:
    """The tab's row of a state file no search of this process owns (None: not a readable state)."""
    from ...search.state import SearchState
    path, name = os.path.join(folder, f), f[:-len(STATE_SUFFIX)]
    state = SearchState.peek(path)  # read and checked as a search would read it (None: none, or unreadable)
    if state is None:
        return None
    hist, budget = state.history, int(state.config["budget"])
    losses = [h["loss"] for h in hist]
    row = {"id": name, "status": "paused", "evaluations": len(hist), "budget": budget,
           "best_loss": min(losses) if losses else None,
           "message": "not running in this ComfyUI: queue GCache Search again to resume", "state_file": f,
           "updated": round(os.path.getmtime(path), 3)}
    if state.done and _end_game_unfinished(state, profiles.of(state, search_profile_path(folder, name))):
        # paused: the next queue samples what its end game owes
        row["message"] = ("end game unfinished (its forecaster check or its final choice on fresh seeds was stopped): "
                          "queue GCache Search again to finish it")
        return row
    if state.done:
        loss = _policy_loss(os.path.join(folder, name + POLICY_SUFFIX), state.search_id)
        row.update(status="done", message=f"done: {name}{POLICY_SUFFIX} saved" if loss is not None else
                   f"done, but {name}{POLICY_SUFFIX} is missing or from another search: queue GCache Search again "
                   "to save it")
        if loss is not None:
            row["best_loss"] = loss  # the loss of the policy it chose, as the tab showed when it finished
    return row


def _end_game_unfinished(state, profile) -> bool:
    """Whether a done search's end game still has evaluations to make (end_game.complete: a Cancel, an Interrupt or a
    crash stopped it in its forecaster check or on its fresh seeds; the next queue samples them, and they may change
    the policy). The state alone can't tell: which forecasters the end game measures depends on what its profile can
    fit (l2p needs the Gram statistics), so this asks, with that profile, the question the next queue asks
    (search_node.py _is_finished). Without the profile (None: not in the gcache folders) the policy file judges."""
    from ...search import end_game
    if profile is None:
        return False
    try:
        return not end_game.complete(state, profile, state.config["forecast"])
    except (GCacheError, KeyError):  # a forecaster this GCache lacks: the search itself says why when queued
        return False


class _Profiles:
    """The profile a done search was made from, found for the listing: its own (<name>.search.profile.safetensors,
    where its reference runs record it), else the one of the same identity (state_file.profile_identity) in the gcache
    folders (a connected profile). Profiles are some 0.2 MB; they are read for done rows only, each file once."""

    def __init__(self, folders: list[str]):
        self.folders, self.loaded = folders, {}

    def load(self, path: str):
        from ...core.profile import Profile
        from ...search.state_file import profile_identity
        if path not in self.loaded:
            try:
                profile = Profile.load(path)
                self.loaded[path] = None if profile.defect else (profile_identity(profile), profile)
            except (GCacheError, OSError):  # a damaged profile is no search's: the search says why when queued
                self.loaded[path] = None
        return self.loaded[path]

    def of(self, state, own: str):
        want = dict(state.profile_id or {})
        paths = [own] + [os.path.join(d, f) for d in self.folders if os.path.isdir(d)
                         for f in sorted(os.listdir(d)) if f.endswith(PROFILE_SUFFIX)]
        for path in dict.fromkeys(paths):
            found = self.load(path) if os.path.isfile(path) else None
            if found is not None and found[0] == want:
                return found[1]
        return None


def _policy_loss(path: str, search: Optional[str]) -> Optional[float]:
    """The loss of the policy file a finished search saved (None: none there, or another search's)."""
    try:
        with open(path, encoding="utf-8") as fh:
            policy = json.load(fh)
        loss = policy["metrics"]["loss"]
        same = search is not None and policy["provenance"]["state"] == search
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(loss) if same and isinstance(loss, (int, float)) else None


def file_names(text: str) -> str:
    """`text` as the tab shows it: files by their names in the gcache folder, never server paths
    (core/user_text.py; the folders' names come from register_routes)."""
    return without_server_paths(text, _SHOWN_FOLDERS[0]())


_SHOWN_FOLDERS = [lambda: {}]  # the gcache folders → how a message names them (set by register_routes)


JOBS = Jobs()


def _send(data: dict) -> None:
    try:
        from server import PromptServer
        PromptServer.instance.send_sync(EVENT, data)
    except Exception:  # noqa: BLE001  no server (in-process use): nobody to tell
        pass


# ------------------------------------------------------------------------------------------- slice prompts
def slice_prompt(prompt: dict, node_id: str, marker: str) -> dict:
    """GCache Search's node and everything upstream of it in `prompt` (API format), with the slice marker (the job's
    Job.marker)."""
    keep, todo = set(), [str(node_id)]
    while todo:
        nid = todo.pop()
        if nid in keep or nid not in prompt:
            continue
        keep.add(nid)
        for v in (prompt[nid].get("inputs") or {}).values():
            if isinstance(v, list) and len(v) == 2 and isinstance(v[0], (str, int)):
                todo.append(str(v[0]))
    # only what a client sends: ComfyUI writes its own keys into the prompt it runs ("is_changed": a fingerprint of
    # NaN sent back as JSON would be one shared NaN object, equal to itself, and GCache Search would come from cache)
    out = {nid: json.loads(json.dumps({k: prompt[nid][k] for k in ("class_type", "inputs", "_meta")
                                       if k in prompt[nid]})) for nid in keep}
    out[str(node_id)]["inputs"][SLICE_KEY] = marker
    return out


def marker(prompt: Optional[dict], node_id: Optional[str]) -> Optional[str]:
    """The job marker of a slice prompt (Job.marker; None when the user queued the node)."""
    try:
        return prompt[str(node_id)]["inputs"].get(SLICE_KEY)
    except (TypeError, KeyError, AttributeError):
        return None


def current_client() -> Optional[str]:
    """The client id of the prompt ComfyUI is running now (None: queued without one, or no server)."""
    try:
        from server import PromptServer
        return getattr(PromptServer.instance, "client_id", None)
    except Exception:  # noqa: BLE001  no server (in-process use)
        return None


def queue_prompt(prompt: dict, client_id: Optional[str] = None) -> str:
    """Queue `prompt` at the end of ComfyUI's queue, over its HTTP API on loopback, for `client_id` (ComfyUI sends
    that client the prompt's events; without one, as a prompt queued without one); returns its prompt id."""
    from comfy.cli_args import args
    from server import PromptServer
    srv = PromptServer.instance
    host = getattr(srv, "address", None) or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    scheme = "https" if getattr(args, "tls_keyfile", None) else "http"
    url = f"{scheme}://{host}:{srv.port}/prompt"
    data = json.dumps({"prompt": prompt, **({"client_id": client_id} if client_id else {})}).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    ctx = None
    if scheme == "https":  # our own server's certificate
        import ssl
        ctx = ssl._create_unverified_context()
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            return json.loads(r.read())["prompt_id"]
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"ComfyUI refused the next slice: HTTP {e.code} {e.read().decode(errors='replace')[:500]}")


# ------------------------------------------------------------------------------------------- routes
def register_routes(folders, shown_folders=lambda: {}) -> None:
    """GET /gcache/searches, POST /gcache/searches/{id}/cancel (added once, when the extension loads); `folders()`:
    the gcache folders, `shown_folders()`: how a message names each (file_names)."""
    _SHOWN_FOLDERS[0] = shown_folders
    try:
        from aiohttp import web
        from server import PromptServer
    except ImportError:
        return
    routes = PromptServer.instance.routes

    @routes.get("/gcache/searches")
    async def list_searches(request):
        return web.json_response({"searches": JOBS.listing(folders())})

    @routes.post("/gcache/searches/{job_id}/cancel")
    async def cancel_search(request):
        job = JOBS.cancel(request.match_info["job_id"])
        if job is None:
            return web.json_response({"error": "no such search running in this ComfyUI"}, status=404)
        return web.json_response(job.public())
