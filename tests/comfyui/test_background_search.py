"""GCache Search in the background, in a running ComfyUI server (loopback): slices through ComfyUI's own queue, a user
prompt queued meanwhile runs before the search ends, the finished search equals the foreground one, Cancel, and a
server killed mid-search resumes when the node is queued again.

No test depends on the machine's speed: where one needs the search at a known point (running, not finished), it
holds the search's decodes with a gate file (gcache_test_pack.Gate) and waits until the search waits there; what
happened in which order is read from ComfyUI's own history, and "nothing more happens" is ComfyUI's queue found
empty, from which nothing can queue again."""
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
from gcache_test_pack import Gate  # noqa: E402

BUDGET = 30


def search_prompt(name: str, mode: str, slice_seconds: int = 1, seeds: int = 2, gate: str = "",
                  forecast: str = "reuse (0)", budget: int = BUDGET) -> dict:
    return {
        "1": {"class_type": "GCacheTestTinyFlux", "inputs": {"seed": 0}},
        "2": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 1}},
        "3": {"class_type": "GCacheTestCond", "inputs": {"tokens": 6, "dim": 32, "pooled": 24, "seed": 2}},
        "4": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {"class_type": "GCacheTestVAE", "inputs": {"gate": gate} if gate else {}},
        "6": {"class_type": "GCacheSearch", "inputs": {
            "model": ["1", 0], "positive": ["2", 0], "negative": ["3", 0], "latent": ["4", 0], "vae": ["5", 0],
            "seed": 7, "seeds": seeds, "steps": 12, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple", "k": 4,
            "budget": budget, "degree": 2, "objective": "ssim", "forecast": forecast, "policy_name": name,
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


def state_file(srv, name) -> dict:
    return json.loads((srv["base"] / "models" / "gcache" / f"{name}.search.json").read_text())


def gate(srv, name: str, decodes: int) -> Gate:
    """A gate that lets `decodes` decodes run, then holds the search (the reference runs decode once per seed, then
    every evaluation once per seed)."""
    g = Gate(str(srv["base"] / f"gate_{name}"))
    g.allow(decodes)
    return g


def held(srv, g: Gate, n: int, what: str, timeout=600) -> None:
    """Waits until the search waits at the gate after exactly n decodes."""
    for _ in range(int(timeout / 0.05)):
        if g.held(n):
            return
        time.sleep(0.05)
    pytest.fail(f"the search never waited at its gate {what}: " + srv["log"].read_text()[-3000:])


def idle(srv, timeout=600) -> None:
    """Waits until ComfyUI runs nothing and has nothing queued: from there nothing can queue a slice again (only a
    running slice queues the next)."""
    for _ in range(int(timeout / 0.2)):
        q = _get(srv["url"] + "/queue")
        if not q.get("queue_running") and not q.get("queue_pending"):
            return
        time.sleep(0.2)
    pytest.fail("ComfyUI's queue never emptied: " + json.dumps(_get(srv["url"] + "/queue"))[:2000])


def ran(srv, pid) -> tuple[int, int]:
    """When ComfyUI started and ended a prompt (its own timestamps, ms)."""
    msgs = dict((m[0], m[1]) for m in _get(f"{srv['url']}/history/{pid}")[pid]["status"]["messages"])
    return msgs["execution_start"]["timestamp"], msgs["execution_success"]["timestamp"]


def slices_of(srv, name) -> list[str]:
    """The prompt ids of the search's slices in ComfyUI's history."""
    return [pid for pid, h in _get(srv["url"] + "/history?max_items=1000").items()
            if json.dumps(h.get("prompt", [None, None, {}])[2]).count(f'"gcache_slice": "{name}/')]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with comfy_server(tmp_path_factory.mktemp("bg_base")) as srv:
        yield srv


def test_background_search_yields_to_user_prompts_and_equals_the_foreground_one(server):
    g = gate(server, "bg", 2 + 2 * 3)  # the 2 reference runs and 3 sampled evaluations, then the search waits
    pid = queue(server, search_prompt("bg", "background", gate=g.path))
    h = finished(server, pid)
    assert h["status"]["status_str"] == "success"  # returned after the references, not after the search
    # their self-check knows the prompt it ran in (a second fail in one prompt counts with its first: verdicts.py)
    checked = json.loads((server["base"] / "models" / "gcache" / "selfcheck.json").read_text())["verdicts"]
    assert [(v["result"], v["prompt"]) for v in checked] == [("pass", pid)], checked
    held(server, g, 8, "in its 4th sampled evaluation")  # (start masks that coincide are not sampled twice)
    s = search(server, "bg")
    assert s["status"] == "running" and 3 <= s["evaluations"] < BUDGET == s["budget"], s
    time.sleep(1)  # the held slice has run its slice_seconds: it ends with the evaluation it waits in
    queued_at = time.time() * 1000
    user = queue(server, user_prompt(11))  # queued while the search is held: it can't have ended
    g.allow(10 ** 6)
    done_user = finished(server, user)
    assert done_user["status"]["status_str"] == "success"
    final = wait_for(server, "bg", lambda s: s.get("status") == "done", "finished")
    assert final["evaluations"] == BUDGET
    # ComfyUI's own order: the user prompt waited for the one slice that was running, and the search went on after it
    start, end = ran(server, user)
    times = sorted(ran(server, p) for p in slices_of(server, "bg"))
    assert not [t for t in times if queued_at <= t[0] < start], (times, queued_at, start)  # only the held one ran on
    assert any(t[0] >= end for t in times), (times, end)
    assert len(times) >= 2  # the search ran as prompts of ComfyUI's own queue
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
        idle(server)  # the last slice has ended: every slice is in ComfyUI's history
        slices = set(slices_of(server, "progress"))
        for _ in range(3000):  # and every slice's events have reached this client: its end is the last of them
            if slices <= {d.get("prompt_id") for d in ws.of("execution_success")}:
                break
            time.sleep(0.01)
        else:
            pytest.fail(f"the websocket never got the end of every slice: {slices}")
    events = [(e["type"], e["data"]) for e in ws.events if e.get("type") in ("progress", "gcache.search")]
    refs = [d for t, d in events if t == "progress" and d["prompt_id"] == pid]
    assert refs and all(d["node"] == "6" and d["max"] == seeds for d in refs), refs
    assert refs[-1]["value"] == seeds and [d["value"] for d in refs] == sorted(d["value"] for d in refs)
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
    g = gate(server, "cancel_me", 2 + 2)  # the reference runs and one sampled evaluation
    finished(server, queue(server, search_prompt("cancel_me", "background", slice_seconds=1, gate=g.path)))
    held(server, g, 4, "in its 2nd sampled evaluation")
    r = _post(server["url"] + "/gcache/searches/cancel_me/cancel", {})
    assert r["status"] == "cancelled"
    g.allow(10 ** 6)  # the evaluation in progress ends; the slice stops there and queues no next one
    idle(server)
    s, state = search(server, "cancel_me"), state_file(server, "cancel_me")
    assert s["status"] == "cancelled" and s["evaluations"] == len(state["history"]) < BUDGET, s
    assert not state["done"] and not (server["base"] / "models" / "gcache" / "cancel_me.json").exists()


def test_a_foreground_search_is_listed_as_running_and_its_cancel_lets_the_prompt_finish(server):
    """The tab once listed a running foreground search as "not running in this ComfyUI: queue … again"."""
    g = gate(server, "fg_cancel", 4 + 4 * 2)  # 4 reference runs and 2 evaluations of 4 seeds each
    pid = queue(server, search_prompt("fg_cancel", "foreground", seeds=4, gate=g.path))
    held(server, g, 12, "in its 3rd sampled evaluation")
    s = search(server, "fg_cancel")
    assert s["status"] == "running" and 2 <= s["evaluations"] < BUDGET and s["mode"] == "foreground", s
    assert s["message"] == "running in the foreground (this prompt): evaluating", s
    assert _post(server["url"] + "/gcache/searches/fg_cancel/cancel", {})["status"] == "cancelled"
    g.allow(10 ** 6)
    assert finished(server, pid)["status"]["status_str"] == "success"  # the prompt went on with the best so far
    s = search(server, "fg_cancel")
    state = state_file(server, "fg_cancel")
    n = len(state["history"])
    assert s["status"] == "cancelled" and s["evaluations"] == n < BUDGET and not state["done"]
    assert s["message"].startswith(f"cancelled after {n} of {BUDGET} evaluations"), s
    assert "cancelled after" in server["log"].read_text()


def test_a_killed_server_lists_the_search_as_paused_and_resumes_it_when_queued_again(tmp_path_factory):
    base = tmp_path_factory.mktemp("bg_kill")
    with comfy_server(base) as srv:
        g = gate(srv, "killed", 2 + 2 * 6)  # the reference runs and 6 sampled evaluations, then it waits
        finished(srv, queue(srv, search_prompt("killed", "background", slice_seconds=1, gate=g.path)))
        held(srv, g, 14, "in its 7th sampled evaluation")
        os.kill(srv["proc"].pid, signal.SIGKILL)
        srv["proc"].wait(30)
    state = json.loads((base / "models" / "gcache" / "killed.search.json").read_text())
    done_before = len(state["history"])
    assert not state["done"] and 6 <= done_before < BUDGET
    g.allow(10 ** 6)
    with comfy_server(base, fresh=False) as srv:
        s = search(srv, "killed")
        assert s["status"] == "paused" and s["evaluations"] == done_before
        assert "queue GCache Search again" in s["message"]
        finished(srv, queue(srv, search_prompt("killed", "background", slice_seconds=1, gate=g.path)))
        wait_for(srv, "killed", lambda s: s.get("status") == "done", "finished")
        fg = queue(srv, search_prompt("killed_fg", "foreground"))
        assert finished(srv, fg)["status"]["status_str"] == "success"
        assert policy_file(srv, "killed")["mask"] == policy_file(srv, "killed_fg")["mask"]
        resumed = json.loads((base / "models" / "gcache" / "killed.search.json").read_text())
        assert resumed["history"][:done_before] == state["history"][:done_before]
        assert "resumed at evaluation" in srv["log"].read_text()


def test_interrupt_pauses_the_search_and_queueing_it_again_resumes(server):
    g = gate(server, "interrupt_me", 4 + 4 * 2)  # 4 reference runs and 2 evaluations, then it waits in the 3rd
    finished(server, queue(server, search_prompt("interrupt_me", "background", slice_seconds=120, seeds=4,
                                                 gate=g.path)))
    held(server, g, 12, "in its 3rd sampled evaluation")
    _post(server["url"] + "/interrupt", {})  # ComfyUI's own Interrupt, mid-slice and mid-evaluation
    g.allow(10 ** 6)
    s = wait_for(server, "interrupt_me", lambda s: s.get("status") not in ("queued", "running"), "stopped")
    assert s["status"] == "paused" and "queue GCache Search again" in s["message"], s
    idle(server)  # nothing runs, nothing is queued: no slice was queued after the Interrupt
    state = state_file(server, "interrupt_me")
    assert search(server, "interrupt_me")["status"] == "paused"
    assert not state["done"] and 2 <= len(state["history"]) < BUDGET
    finished(server, queue(server, search_prompt("interrupt_me", "background", slice_seconds=120, seeds=4,
                                                 gate=g.path)))
    final = wait_for(server, "interrupt_me", lambda s: s.get("status") == "done", "finished")
    assert final["evaluations"] == BUDGET
    resumed = state_file(server, "interrupt_me")
    assert resumed["history"][:len(state["history"])] == state["history"]


def test_a_finished_search_queued_again_and_grown_leaves_no_row_running(server):
    """A finished fitted search queued again unchanged was refused (its start masks), and saving it again failed on
    its fresh seeds, leaving its row "running" with ComfyUI's queue empty; a larger budget was refused too. Here: the
    search, queued again in the background and in the foreground, then with a larger budget, through ComfyUI's own
    queue; after each, with nothing running or queued, no row of the GCache tab says running or queued."""
    name, fitted = "requeued", "fitted (profile)"

    def settled(what):
        idle(server)
        rows = _get(server["url"] + "/gcache/searches")["searches"]
        assert not [r for r in rows if r["status"] in ("queued", "running")], (what, rows)
        return search(server, name)

    assert finished(server, queue(server, search_prompt(name, "background", forecast=fitted)))["status"][
        "status_str"] == "success"
    wait_for(server, name, lambda s: s.get("status") == "done", "finished")
    first = settled("the search")
    saved = policy_file(server, name)
    for mode in ("background", "foreground"):
        h = finished(server, queue(server, search_prompt(name, mode, forecast=fitted)))
        assert h["status"]["status_str"] == "success", (mode, server["log"].read_text()[-3000:])
        row = settled(f"queued again ({mode})")
        assert row["status"] == "done" and row["evaluations"] == first["evaluations"] == BUDGET, row
        assert policy_file(server, name) == saved
    grown = BUDGET + 4
    h = finished(server, queue(server, search_prompt(name, "background", forecast=fitted, budget=grown)))
    assert h["status"]["status_str"] == "success", server["log"].read_text()[-3000:]
    wait_for(server, name, lambda s: s.get("status") == "done", "finished with the larger budget")
    row = settled("grown")
    assert row["evaluations"] == grown == len(state_file(server, name)["history"]) and row["budget"] == grown
    assert policy_file(server, name)["provenance"]["iterations"] == grown
