"""A search worker that drives a ComfyUI server (on its own GPU) through ComfyUI's HTTP API. No ComfyUI import.

The user's workflow in API format ("Save (API)") with a GCache Apply node between the model and the sampler
and an image output (SaveImage / PreviewImage). For each evaluation the worker sets the sampler's seed and GCache
Apply's `policy_json` (the mask as a policy), queues the prompt, waits for it, fetches the images over /view and
scores them against the same seeds sampled with every step computed (fetched once, at the first evaluation).
Loopback or cluster-internal addresses only: the worker talks to the server it was given.

As a Ray actor (ray_executor.RayExecutor, one actor per server address), or `ComfyUIWorker.pool(urls, ...)`, a
thread-per-server executor without Ray.
"""
from __future__ import annotations

import copy
import hashlib
import io
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Optional, Sequence

import numpy as np
import torch

from ...core import forecasters
from ...core.errors import GCacheError
from ...core.policy import Policy

SAMPLERS = ("KSampler", "KSamplerAdvanced", "SamplerCustom", "RandomNoise")
IMAGE_OUTPUTS = ("SaveImage", "PreviewImage", "SaveAnimatedWEBP", "SaveAnimatedPNG")


def _node_of(workflow: dict, classes: Sequence[str], what: str) -> str:
    found = [nid for nid, n in workflow.items() if n.get("class_type") in classes]
    if len(found) != 1:
        raise GCacheError(f"The workflow needs exactly one {what} ({' / '.join(classes)}), found {len(found)}.")
    return found[0]


class ComfyUIWorker:
    """One ComfyUI server's evaluations. It applies the search's forecaster only (a policy's profile-fitted parameters
    need the profile, which a server's worker doesn't hold), so the forecaster check is skipped."""

    can_apply_forecaster = False

    def __init__(self, url: str, workflow: dict, seeds: Sequence[int], objective: str = "ssim",
                 forecast="reuse", timeout_s: float = 1800.0):
        from .objectives import make_objective
        self.url, self.workflow = url.rstrip("/"), copy.deepcopy(workflow)
        self.seeds, self.forecast, self.timeout_s = [int(s) for s in seeds], forecasters.canonical(forecast), timeout_s
        # a profile-fitted forecaster's parameters come from the profile, which workers don't hold
        if forecasters.get(self.forecast).needs_profile:
            raise GCacheError(f"A ComfyUI worker applies the forecasters without profile-fitted parameters "
                              f"({', '.join(forecasters.profile_free())}), not {self.forecast!r}.")
        self.apply, self.sampler, self.output = self.nodes_of(self.workflow)
        self.seed_key = "noise_seed" if "noise_seed" in self.workflow[self.sampler]["inputs"] else "seed"
        self.objective = make_objective(objective)
        self.client = uuid.uuid4().hex
        self._refs: Optional[list] = None

    @staticmethod
    def nodes_of(workflow) -> tuple[str, str, str]:
        """(GCache Apply, sampler, image output) node ids of an API-format workflow; a GCacheError says what is
        missing. Cheap and offline, so the coordinator checks a workflow before it starts any worker."""
        if not isinstance(workflow, dict) or not workflow or not all(
                isinstance(n, dict) and isinstance(n.get("class_type"), str) and isinstance(n.get("inputs", {}), dict)
                for n in workflow.values()):
            raise GCacheError("The workflow is not in ComfyUI's API format (node id → class_type, inputs): in ComfyUI "
                              "export it with Workflow → Export (API) / 'Save (API)'.")
        return (_node_of(workflow, ("GCacheApply",), "GCache Apply node"),
                _node_of(workflow, SAMPLERS, "sampler with a seed"),
                _node_of(workflow, IMAGE_OUTPUTS, "image output"))

    @classmethod
    def workflow_identity(cls, workflow: dict) -> str:
        """A hash of what decides the losses: the workflow without what each evaluation sets (the sampler's seed,
        GCache Apply's policy) and without the output's file name."""
        apply, sampler, output = cls.nodes_of(workflow)
        wf = copy.deepcopy(workflow)
        for nid, keys in ((apply, ("policy_json",)), (sampler, ("seed", "noise_seed")), (output, ("filename_prefix",))):
            for k in keys:
                wf[nid].get("inputs", {}).pop(k, None)
        return hashlib.sha256(json.dumps(wf, sort_keys=True).encode()).hexdigest()[:16]

    # ---------------------------------------------------------------- HTTP
    def _request(self, path: str, data: Optional[dict] = None) -> bytes:
        req = urllib.request.Request(self.url + path, json.dumps(data).encode() if data is not None else None,
                                     {"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.read()
        except urllib.error.HTTPError as e:  # ComfyUI says what it refused (e.g. validation errors per node)
            raise GCacheError(f"ComfyUI at {self.url} refused {path.split('?')[0]}: HTTP {e.code} "
                              f"{e.read().decode(errors='replace')[:1500]}") from None
        except OSError as e:
            raise GCacheError(f"ComfyUI at {self.url} is unreachable ({e}). The search state keeps every finished "
                              "evaluation: start the server again and rerun the same command to resume.") from None

    def _images(self, mask: list, seed: int) -> torch.Tensor:
        prompt = copy.deepcopy(self.workflow)
        pol = Policy(list(mask), forecast=self.forecast, method="search-candidate")
        prompt[self.apply]["inputs"]["policy_json"] = pol.to_json()
        prompt[self.sampler]["inputs"][self.seed_key] = int(seed)
        pid = json.loads(self._request("/prompt", {"prompt": prompt, "client_id": self.client}))["prompt_id"]
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            hist = json.loads(self._request(f"/history/{pid}"))
            status = hist.get(pid, {}).get("status", {})
            if status.get("completed") is not None:
                if status.get("status_str") != "success":
                    raise GCacheError(f"ComfyUI at {self.url} failed the evaluation prompt: "
                                      f"{json.dumps(status.get('messages', []))[-800:]}")
                return self._fetch(hist[pid]["outputs"][self.output]["images"])
            time.sleep(0.2)
        raise GCacheError(f"ComfyUI at {self.url} did not finish an evaluation within {self.timeout_s:.0f} s.")

    def _fetch(self, images: list) -> torch.Tensor:
        from PIL import Image
        out = []
        for im in images:
            q = urllib.parse.urlencode({"filename": im["filename"], "subfolder": im.get("subfolder", ""),
                                        "type": im.get("type", "output")})
            arr = np.asarray(Image.open(io.BytesIO(self._request(f"/view?{q}"))).convert("RGB"), dtype=np.float32)
            out.append(torch.from_numpy(arr / 255.0).permute(2, 0, 1))
        return torch.stack(out)

    # ---------------------------------------------------------------- the worker's job
    def run(self, mask: list) -> list[float]:
        """Per-seed losses of `mask` against every step computed (the references are sampled once)."""
        if self._refs is None:
            self._refs = [self._images([1] * len(mask), s) for s in self.seeds]
        return [float(self.objective(self._images(list(mask), s), ref)) for s, ref in zip(self.seeds, self._refs)]

    def pid(self) -> str:
        return self.url

    @staticmethod
    def pool(urls: Sequence[str], workflow: dict, seeds: Sequence[int], objective: str = "ssim", forecast="reuse"):
        """An executor without Ray (parallel.ThreadExecutor): one thread per server, each evaluation on a free
        server. It declares what the workers can evaluate (the search's forecaster only)."""
        import queue

        from .parallel import ThreadExecutor
        free: queue.Queue = queue.Queue()
        for u in urls:
            free.put(ComfyUIWorker(u, workflow, seeds, objective, forecast))

        def run(mask):  # a plain function: it declares no other forecaster (executor.py)
            w = free.get()
            try:
                return w.run(mask)
            finally:
                free.put(w)
        return ThreadExecutor(run, len(urls))
