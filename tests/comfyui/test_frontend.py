"""GCache in ComfyUI's real frontend, in headless Chromium driven over the DevTools protocol (aiohttp, which ComfyUI
requires, is the client): the panel of background searches (web/gcache.js) and the bundled workflows as the frontend
draws them. Skipped, with the reason, where no Chromium is installed (Debian: `apt-get install chromium`)."""
import asyncio
import itertools
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

import pytest
from conftest import COMFY, REASON

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKFLOWS = sorted(f for f in os.listdir(os.path.join(REPO, "workflows")) if f.endswith(".json"))

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
if BROWSER is None:
    pytest.skip("no Chromium installed (Debian: apt-get install chromium): the frontend panel is not checked",
                allow_module_level=True)

from comfy_server import _post, comfy_server  # noqa: E402
from test_background_search import search_prompt, wait_for  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Page:
    """One Chromium tab on `url`, with Runtime.evaluate over the DevTools websocket."""

    def __init__(self, url: str):
        self.port, self.profile = _free_port(), tempfile.mkdtemp(prefix="gcache-chromium-")
        # the flags the machines' notes give for a closed network: no background connections, no first-run UI
        self.proc = subprocess.Popen(
            [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={self.profile}", f"--remote-debugging-port={self.port}", "--window-size=1400,900",
             url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.loop = asyncio.new_event_loop()
        self.ws = self.session = None
        self.n = 0
        for _ in range(100):
            try:
                pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2).read())
                target = next(p for p in pages if p.get("type") == "page")
                break
            except (OSError, StopIteration, ValueError):
                time.sleep(0.2)
        else:
            self.close()
            pytest.fail("Chromium did not open its DevTools port")
        self.loop.run_until_complete(self._connect(target["webSocketDebuggerUrl"]))

    async def _connect(self, ws_url):
        import aiohttp
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(ws_url, max_msg_size=0)

    async def _eval(self, expr: str):
        self.n += 1
        await self.ws.send_json({"id": self.n, "method": "Runtime.evaluate",
                                 "params": {"expression": expr, "awaitPromise": True, "returnByValue": True}})
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == self.n:
                res = msg.get("result", {})
                if "exceptionDetails" in res:
                    raise AssertionError(f"{expr[:80]}: {res['exceptionDetails'].get('text')} "
                                         f"{res['exceptionDetails'].get('exception', {}).get('description', '')}")
                return res.get("result", {}).get("value")

    def eval(self, expr: str):
        return self.loop.run_until_complete(self._eval(expr))

    def wait(self, expr: str, what: str, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.eval(expr)
            if value:
                return value
            time.sleep(0.25)
        pytest.fail(f"the page never {what}: {self.eval('document.body.innerText.slice(0, 2000)')}")

    def close(self):
        if self.ws is not None:
            self.loop.run_until_complete(self.ws.close())
            self.loop.run_until_complete(self.session.close())
        self.loop.close()
        self.proc.terminate()  # lets Chromium end its own helper processes, which write into the profile until then
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for _ in range(50):
            shutil.rmtree(self.profile, ignore_errors=True)
            if not os.path.exists(self.profile):
                break
            time.sleep(0.1)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with comfy_server(tmp_path_factory.mktemp("ui_base")) as srv:
        yield srv


def test_the_panel_lists_a_background_search_with_its_progress_and_cancels_it(server):
    page = Page(server["url"])
    try:
        # ComfyUI's frontend loaded GCache's extension (web/gcache.js, served from the pack's WEB_DIRECTORY)
        page.wait("!!window.GCacheSearches", "loaded GCache's extension")
        tab = page.eval("!!document.querySelector('.gcache-searches-tab-button')")
        # queued as the frontend's own client, with the prompt on the canvas: the frontend shows the node's progress
        prompt = search_prompt("ui_bg", "background", slice_seconds=1)
        page.eval(f"(async () => {{ await window.app.loadApiJson({json.dumps(prompt)}, 'ui_bg'); return true; }})()")
        client = page.wait("window.app.api.clientId", "connected its websocket")
        _post(server["url"] + "/prompt", {"prompt": prompt, "client_id": client})
        wait_for(server, "ui_bg", lambda s: s.get("evaluations", 0) >= 1, "evaluated")
        # the reference runs are done: a node progress above 0 % in the page's title ("[total%][node%]") is a slice's
        page.wait("/\\[\\d+%\\]\\[[1-9]\\d*%\\]/.test(document.title)", "showed a slice's progress on the node")
        if tab:  # the sidebar tab (frontends with registerSidebarTab); else the floating panel
            page.eval("document.querySelector('.gcache-searches-tab-button').click(); true")
        else:
            page.eval("window.GCacheSearches.open(); true")
        row = "document.querySelector('[data-gcache-search=\"ui_bg\"]')"
        page.wait(f"{row} && /\\d+\\/30 evaluations/.test({row}.innerText)", "listed the search with its progress")
        page.wait("!!document.querySelector('[data-gcache-cancel=\"ui_bg\"]')", "showed a Cancel button")
        # styled as the frontend styles its own buttons (its comfy-btn class and theme colours), not as a bare button
        look = page.eval("""(() => {
          const cancel = document.querySelector('[data-gcache-cancel="ui_bg"]');
          const bare = document.createElement('button');
          cancel.parentElement.append(bare);
          const props = ['backgroundColor', 'color', 'borderTopColor', 'borderTopLeftRadius'];
          const a = getComputedStyle(cancel), b = getComputedStyle(bare);
          const out = {cancel: props.map((p) => a[p]), bare: props.map((p) => b[p]),
                       theme: getComputedStyle(document.documentElement).getPropertyValue('--comfy-input-bg').trim()};
          bare.remove();
          return out;
        })()""")
        assert look["theme"], "the frontend defines no --comfy-input-bg"
        differ = [p for p, a, b in zip(("background", "color", "border", "radius"), look["cancel"], look["bare"])
                  if a != b]
        assert {"background", "radius"} <= set(differ), look
        assert look["cancel"][3] == "8px", look
        page.eval("document.querySelector('[data-gcache-cancel=\"ui_bg\"]').click(); true")
        wait_for(server, "ui_bg", lambda s: s.get("status") == "cancelled", "was cancelled")
        page.wait(f"{row} && {row}.dataset.status === 'cancelled'", "showed the search as cancelled")
        assert (server["base"] / "models" / "gcache" / "ui_bg.search.json").is_file()
        print(f"GCache panel: {'sidebar tab' if tab else 'floating panel'}")
    finally:
        page.close()


def test_the_tab_lists_a_finished_search_with_its_best_loss_after_a_restart(tmp_path_factory):
    base = tmp_path_factory.mktemp("ui_restart")
    with comfy_server(base) as srv:
        _post(srv["url"] + "/prompt", {"prompt": search_prompt("ui_done", "background", slice_seconds=1),
                                       "client_id": uuid.uuid4().hex})
        before = wait_for(srv, "ui_done", lambda s: s.get("status") == "done", "finished")
    policy = json.loads((base / "models" / "gcache" / "ui_done.json").read_text())
    assert before["best_loss"] == policy["metrics"]["loss"]
    with comfy_server(base, fresh=False) as srv:
        page = Page(srv["url"])
        try:
            page.wait("!!window.GCacheSearches", "loaded GCache's extension")
            if page.eval("!!document.querySelector('.gcache-searches-tab-button')"):
                page.eval("document.querySelector('.gcache-searches-tab-button').click(); true")
            else:
                page.eval("window.GCacheSearches.open(); true")
            row = "document.querySelector('[data-gcache-search=\"ui_done\"]')"
            page.wait(f"{row} && {row}.dataset.status === 'done'", "listed the finished search after the restart")
            shown = page.eval(f"{row}.innerText")
            best = page.eval(f"Number({before['best_loss']!r}).toPrecision(4)")  # as the tab writes numbers
            assert f"done · 30/30 evaluations · best loss {best}" in shown, shown
            assert "done: ui_done.json saved" in shown, shown
            panel = page.eval("(document.getElementById('gcache-searches') || document.body).innerText")
            assert str(base) not in panel and "/models/gcache" not in panel, panel  # file names, never folders
            assert not page.eval("!!document.querySelector('[data-gcache-cancel=\"ui_done\"]')")
        finally:
            page.close()


# The frontend's own view of each node once a workflow is loaded and drawn: its size, the least size it computes for
# the node's widgets and slots, and the rectangle it draws (title bar included).
MEASURE = """(async () => {
  await window.app.loadGraphData(%s);
  for (let i = 0; i < 3; i++) {
    window.app.graph.setDirtyCanvas(true, true);
    await new Promise((r) => requestAnimationFrame(() => r()));
  }
  return window.app.graph._nodes.map((n) => ({
    id: Number(n.id), type: n.type, pos: [...n.pos], size: [...n.size], least: [...n.computeSize()],
    rect: [...(n.boundingRect ?? n.getBounding())], title: window.LiteGraph.NODE_TITLE_HEIGHT,
  }));
})()"""


def _overlap(a, b) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def test_the_bundled_workflows_are_drawn_as_saved_without_overlapping_nodes(server):
    page = Page(server["url"])
    try:
        page.wait("!!window.app?.graph && !!window.GCacheSearches", "loaded the graph and GCache's extension")
        problems = []
        for wf in WORKFLOWS:
            data = json.load(open(os.path.join(REPO, "workflows", wf)))
            saved = {n["id"]: n for n in data["nodes"]}
            drawn = page.eval(MEASURE % json.dumps(data))
            assert sorted(n["id"] for n in drawn) == sorted(saved), wf
            for n in drawn:
                x, y = saved[n["id"]]["pos"]
                w, h = saved[n["id"]]["size"]
                # the rectangle is the node's body and its title bar above it, as big as the frontend draws the node
                assert n["rect"] == [x, y - n["title"], n["size"][0], n["size"][1] + n["title"]], (wf, n)
                if w < n["least"][0] or h < n["least"][1]:
                    problems.append(f"{wf}: {n['type']} #{n['id']} is saved at {w}x{h}; the frontend draws it at "
                                    f"least {n['least'][0]:.0f}x{n['least'][1]:.0f}")
            for a, b in itertools.combinations(drawn, 2):
                if _overlap(a["rect"], b["rect"]):
                    problems.append(f"{wf}: {a['type']} #{a['id']} {a['rect']} and {b['type']} #{b['id']} "
                                    f"{b['rect']} overlap")
        assert not problems, "\n".join(problems)
    finally:
        page.close()
