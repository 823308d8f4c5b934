"""GCache Search in the background, in a running ComfyUI server (loopback): slices through ComfyUI's own queue, a user
prompt queued meanwhile runs before the search ends, the finished search equals the foreground one, Cancel, and a
server killed mid-search resumes when the node is queued again."""
import json
import math
import os
import signal
import time
import uuid

import pytest

from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

from comfy_server import Listener, _get, _post, comfy_server  # noqa: E402

BUDGET = 30


def search_prompt(name: str, mode: str, slice_seconds: int = 1, seeds: int = 2) -> dict:
    return {
        "1": {"class_type": "GCacheTestTinyFlux", "inputs": {"seed": 0}},
        "2": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 1}},
        "3": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 2}},
        "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {"class_type": "GCacheTestVAE", "inputs": {}},
        "6": {"class_type": "GCacheSearch", "inputs": {
            "model": ["1", 0], "positive": ["2", 0], "negative": ["3", 0], "latent": ["4", 0], "vae": ["5", 0],
            "seed": 7, "seeds": seeds, "steps": 12, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple", "k": 4,
            "budget": BUDGET, "degree": 2, "objective": "ssim", "forecast": "reuse (0)", "policy_name": name,
            "mode": mode, "slice_seconds": slice_seconds}},
    }


def user_prompt(seed: int) -> dict:
    return {
        "1": {"class_type": "GCacheTestTinyFlux", "inputs": {"seed": 0}},
        "2": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 1}},
        "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "6": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "seed": seed, "steps": 6, "cfg": 1.0,
                                                   "sampler_name": "euler", "scheduler": "simple", "positive": ["2", 0],
                                                   "negative": ["2", 0], "latent_image": ["4", 0], "denoise": 1.0}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": f"user_{seed}"}},
    }


def queue(srv, prompt) -> str:
    return _post(srv["url"] + "/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})["prompt_id"]


def finished(srv, pid, timeout=300) -> dict:
    for _ in range(int(timeout / 0.2)):
        h = _get(f"{srv['url']}/history/{pid}").get(pid)
        if h and h.get("status", {}).get("completed") is not None:
            return h
        time.sleep(0.2)
    pytest.fail(f"prompt {pid} did not finish: " + srv["log"].read_text()[-3000:])


def search(srv, name) -> dict:
    rows = {s["id"]: s for s in _get(srv["url"] + "/gcache/searches")["searches"]}
    return rows.get(name, {})


def wait_for(srv, name, pred, what, timeout=600) -> dict:
    for _ in range(int(timeout / 0.25)):
        s = search(srv, name)
        if pred(s):
            return s
        time.sleep(0.25)
    pytest.fail(f"search {name} never {what}: {search(srv, name)}\n" + srv["log"].read_text()[-3000:])


def policy_file(srv, name) -> dict:
    return json.loads((srv["base"] / "models" / "gcache" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with comfy_server(tmp_path_factory.mktemp("bg_base")) as srv:
        yield srv


def test_background_search_yields_to_user_prompts_and_equals_the_foreground_one(server):
    t0 = time.monotonic()
    pid = queue(server, search_prompt("bg", "background"))
    h = finished(server, pid)
    assert h["status"]["status_str"] == "success"  # returned after the references, not after the search
    s = wait_for(server, "bg", lambda s: s.get("evaluations", 0) >= 1, "evaluated")
    assert s["status"] in ("queued", "running") and s["budget"] == BUDGET
    # a prompt queued now runs before the search is done: it waits at most one slice
    user = queue(server, user_prompt(11))
    done_user = finished(server, user)
    assert done_user["status"]["status_str"] == "success"
    at_user = search(server, "bg")
    assert at_user["status"] != "done" and at_user["evaluations"] < BUDGET, at_user
    final = wait_for(server, "bg", lambda s: s.get("status") == "done", "finished")
    assert final["evaluations"] == BUDGET and time.monotonic() - t0 < 600
    slices = [h for h in _get(server["url"] + "/history?max_items=1000").values()
              if "gcache_slice" in json.dumps(h.get("prompt", [None, None, {}])[2])]
    assert len(slices) >= 2  # the search ran as prompts of ComfyUI's own queue
    # the same search in the foreground, under another name: the same policy
    with Listener(server["url"]) as ws:
        fg = _post(server["url"] + "/prompt", {"prompt": search_prompt("fg", "foreground"),
                                               "client_id": ws.client_id})["prompt_id"]
        assert finished(server, fg)["status"]["status_str"] == "success"
    # its progress bar: the 2 reference runs, then evaluations of the budget
    bars = [(d["max"], d["value"]) for d in ws.of("progress") if d["prompt_id"] == fg and d["node"] == "6"]
    assert bars[0] == (2, 0) and (2, 2) in bars and bars[-1] == (BUDGET, BUDGET), bars
    assert {m for m, _ in bars} == {2, BUDGET} and [v for m, v in bars if m == BUDGET] == \
        sorted(v for m, v in bars if m == BUDGET)
    bg_pol, fg_pol = policy_file(server, "bg"), policy_file(server, "fg")
    assert bg_pol["mask"] == fg_pol["mask"] and bg_pol["metrics"]["loss"] == fg_pol["metrics"]["loss"]
    # GCache Apply (auto) on the same model, steps and scheduler, at a speed-up that asks for the search's K: the
    # searched policy, not an instant one
    searched = [f for f in os.listdir(server["base"] / "models" / "gcache") if f.endswith("_K4_searched.json")]
    assert len(searched) == 1 and searched[0].startswith("auto_Flux-"), searched
    io_share = json.loads((server["base"] / "models" / "gcache" / searched[0]).read_text())["metrics"]["io_share"]
    speedup = math.ceil(100 * 12 / (4 + 8 * io_share)) / 100  # just above the K = 4 speed-up (K = 3 gives more)
    apply = search_prompt("unused", "foreground")
    apply["6"] = {"class_type": "GCacheApply", "inputs": {"model": ["1", 0], "policy_file": "(auto)",
                                                          "cache_device": "model device", "step_mismatch": "remap",
                                                          "auto_speedup": speedup}}
    apply["7"] = {"class_type": "KSampler", "inputs": {"model": ["6", 0], "seed": 5, "steps": 12, "cfg": 2.0,
                                                       "sampler_name": "euler", "scheduler": "simple",
                                                       "positive": ["2", 0], "negative": ["3", 0],
                                                       "latent_image": ["4", 0], "denoise": 1.0}}
    apply["8"] = {"class_type": "SaveLatent", "inputs": {"samples": ["7", 0], "filename_prefix": "auto_after"}}
    assert finished(server, queue(server, apply))["status"]["status_str"] == "success"
    log = server["log"].read_text()
    assert "applying the policy GCache Search found" in log and "GCache: computed 4/12 steps" in log
    bg_state = json.loads((server["base"] / "models" / "gcache" / "bg.search.json").read_text())
    fg_state = json.loads((server["base"] / "models" / "gcache" / "fg.search.json").read_text())
    strip = ("seconds", "gp_seconds")
    assert [{k: v for k, v in e.items() if k not in strip} for e in bg_state["history"]] == \
        [{k: v for k, v in e.items() if k not in strip} for e in fg_state["history"]]


def test_the_client_that_queued_the_search_sees_its_progress_on_the_node_in_every_slice(server):
    """ComfyUI's progress bar on GCache Search's node (its "progress" events, sent to the client that queued the
    prompt): reference runs done of the seeds in the user's prompt, then evaluations done of the budget in every
    slice, the slices a slice queued included."""
    seeds = 3
    with Listener(server["url"]) as ws:
        pid = _post(server["url"] + "/prompt", {"prompt": search_prompt("progress", "background", seeds=seeds),
                                                "client_id": ws.client_id})["prompt_id"]
        wait_for(server, "progress", lambda s: s.get("status") == "done", "finished")
        time.sleep(1)  # the last slice's events reach the websocket
    events = [(e["type"], e["data"]) for e in ws.events if e.get("type") in ("progress", "gcache.search")]
    refs = [d for t, d in events if t == "progress" and d["prompt_id"] == pid]
    assert refs and all(d["node"] == "6" and d["max"] == seeds for d in refs), refs
    assert refs[-1]["value"] == seeds and [d["value"] for d in refs] == sorted(d["value"] for d in refs)
    slices = {h["prompt"][1] for h in _get(server["url"] + "/history?max_items=1000").values()
              if json.dumps(h["prompt"][2]).count('"gcache_slice": "progress"')}
    evaluations, seen, last = None, set(), 0
    for kind, d in events:
        if kind == "gcache.search" and d["id"] == "progress":
            evaluations = d["evaluations"]  # what the GCache tab shows
        elif kind == "progress" and d["prompt_id"] != pid:
            assert d["prompt_id"] in slices and d["node"] == "6" and d["max"] == BUDGET, d
            assert d["value"] == evaluations and d["value"] >= last, (d, evaluations, last)
            seen.add(d["prompt_id"])
            last = d["value"]
    state = json.loads((server["base"] / "models" / "gcache" / "progress.search.json").read_text())
    assert last == BUDGET == len(state["history"])
    assert len(seen) >= 2, seen  # the first slice and ones queued by a slice, all for this client


def test_cancel_ends_the_search_and_keeps_its_state_file(server):
    pid = queue(server, search_prompt("cancel_me", "background", slice_seconds=1))
    finished(server, pid)
    wait_for(server, "cancel_me", lambda s: s.get("evaluations", 0) >= 1, "evaluated")
    r = _post(server["url"] + "/gcache/searches/cancel_me/cancel", {})
    assert r["status"] == "cancelled"
    time.sleep(3)  # a slice that was queued runs and does nothing
    n = search(server, "cancel_me")["evaluations"]
    time.sleep(2)
    s = search(server, "cancel_me")
    assert s["status"] == "cancelled" and s["evaluations"] == n < BUDGET
    state = server["base"] / "models" / "gcache" / "cancel_me.search.json"
    assert state.is_file() and not json.loads(state.read_text())["done"]


def test_a_foreground_search_is_listed_as_running_and_its_cancel_lets_the_prompt_finish(server):
    """The tab once listed a running foreground search as "not running in this ComfyUI: queue … again"."""
    pid = queue(server, search_prompt("fg_cancel", "foreground", seeds=4))
    s = wait_for(server, "fg_cancel", lambda s: s.get("status") == "running" and s.get("evaluations", 0) >= 2,
                 "ran two evaluations in the foreground")
    assert s["mode"] == "foreground" and s["message"] == "running in the foreground (this prompt): evaluating", s
    assert _post(server["url"] + "/gcache/searches/fg_cancel/cancel", {})["status"] == "cancelled"
    assert finished(server, pid)["status"]["status_str"] == "success"  # the prompt went on with the best so far
    s = search(server, "fg_cancel")
    state = json.loads((server["base"] / "models" / "gcache" / "fg_cancel.search.json").read_text())
    assert s["status"] == "cancelled" and s["evaluations"] == len(state["history"]) < BUDGET and not state["done"]
    assert s["message"].startswith(f"cancelled after {len(state['history'])} of {BUDGET} evaluations"), s
    assert "cancelled after" in server["log"].read_text()


def test_a_killed_server_lists_the_search_as_paused_and_resumes_it_when_queued_again(tmp_path_factory):
    base = tmp_path_factory.mktemp("bg_kill")
    with comfy_server(base) as srv:
        finished(srv, queue(srv, search_prompt("killed", "background", slice_seconds=1)))
        wait_for(srv, "killed", lambda s: s.get("evaluations", 0) >= 6, "evaluated 6")
        os.kill(srv["proc"].pid, signal.SIGKILL)
        srv["proc"].wait(30)
    state = json.loads((base / "models" / "gcache" / "killed.search.json").read_text())
    done_before = len(state["history"])
    assert not state["done"] and done_before >= 6
    with comfy_server(base, fresh=False) as srv:
        s = search(srv, "killed")
        assert s["status"] == "paused" and s["evaluations"] == done_before and "queue GCache Search again" in s["message"]
        finished(srv, queue(srv, search_prompt("killed", "background", slice_seconds=1)))
        wait_for(srv, "killed", lambda s: s.get("status") == "done", "finished")
        fg = queue(srv, search_prompt("killed_fg", "foreground"))
        assert finished(srv, fg)["status"]["status_str"] == "success"
        assert policy_file(srv, "killed")["mask"] == policy_file(srv, "killed_fg")["mask"]
        resumed = json.loads((base / "models" / "gcache" / "killed.search.json").read_text())
        assert resumed["history"][:done_before] == state["history"][:done_before]
        assert "resumed at evaluation" in srv["log"].read_text()


def test_interrupt_pauses_the_search_and_queueing_it_again_resumes(server):
    finished(server, queue(server, search_prompt("interrupt_me", "background", slice_seconds=120, seeds=4)))
    wait_for(server, "interrupt_me", lambda s: s.get("status") == "running" and s.get("evaluations", 0) >= 2,
             "ran two evaluations")
    _post(server["url"] + "/interrupt", {})  # ComfyUI's own Interrupt, mid-slice (often mid-evaluation)
    s = wait_for(server, "interrupt_me", lambda s: s.get("status") not in ("queued", "running"), "stopped")
    assert s["status"] == "paused" and "queue GCache Search again" in s["message"], s
    assert s["evaluations"] < BUDGET
    state = json.loads((server["base"] / "models" / "gcache" / "interrupt_me.search.json").read_text())
    assert not state["done"] and len(state["history"]) >= 2
    time.sleep(2)
    assert search(server, "interrupt_me")["status"] == "paused"  # no slice was queued after the Interrupt
    finished(server, queue(server, search_prompt("interrupt_me", "background", slice_seconds=120, seeds=4)))
    final = wait_for(server, "interrupt_me", lambda s: s.get("status") == "done", "finished")
    assert final["evaluations"] == BUDGET
    resumed = json.loads((server["base"] / "models" / "gcache" / "interrupt_me.search.json").read_text())
    assert resumed["history"][:len(state["history"])] == state["history"]
