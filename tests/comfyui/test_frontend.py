"""GCache's panel (web/gcache.js) in ComfyUI's real frontend, in headless Chromium driven over the DevTools protocol
(aiohttp, which ComfyUI requires, is the client). Skipped, with the reason, where no Chromium is installed (Debian:
`apt-get install chromium`)."""
import asyncio
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

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
if BROWSER is None:
    pytest.skip("no Chromium installed (Debian: apt-get install chromium): the frontend panel is not checked",
                allow_module_level=True)

from comfy_server import _get, _post, comfy_server  # noqa: E402
from test_background_search import search, search_prompt, wait_for  # noqa: E402


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
        self.proc.kill()
        self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)


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
        _post(server["url"] + "/prompt", {"prompt": search_prompt("ui_bg", "background", slice_seconds=1),
                                          "client_id": uuid.uuid4().hex})
        wait_for(server, "ui_bg", lambda s: s.get("evaluations", 0) >= 1, "evaluated")
        if tab:  # the sidebar tab (frontends with registerSidebarTab); else the floating panel
            page.eval("document.querySelector('.gcache-searches-tab-button').click(); true")
        else:
            page.eval("window.GCacheSearches.open(); true")
        row = "document.querySelector('[data-gcache-search=\"ui_bg\"]')"
        page.wait(f"{row} && /\\d+\\/30 evaluations/.test({row}.innerText)", "listed the search with its progress")
        page.wait(f"!!document.querySelector('[data-gcache-cancel=\"ui_bg\"]')", "showed a Cancel button")
        page.eval("document.querySelector('[data-gcache-cancel=\"ui_bg\"]').click(); true")
        wait_for(server, "ui_bg", lambda s: s.get("status") == "cancelled", "was cancelled")
        page.wait(f"{row} && {row}.dataset.status === 'cancelled'", "showed the search as cancelled")
        assert (server["base"] / "models" / "gcache" / "ui_bg.search.json").is_file()
        print(f"GCache panel: {'sidebar tab' if tab else 'floating panel'}")
    finally:
        page.close()
