"""Start a real ComfyUI server for the suite (test helper; loopback only)."""
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
from conftest import COMFY

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _post(url, data):
    req = urllib.request.Request(url, json.dumps(data).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
            return json.loads(body) if body else {}  # /interrupt answers 200 with no body
    except urllib.error.HTTPError as e:  # ComfyUI says what it refused (validation errors per node)
        pytest.fail(f"POST {url}: {e.code} {e.read().decode(errors='replace')[:3000]}")


@contextlib.contextmanager
def comfy_server(base, fresh: bool = True):
    """A ComfyUI server on a free loopback port, with this repository and the test pack as custom nodes (fresh=False:
    a server started again on a base directory an earlier one used)."""
    if fresh:
        (base / "custom_nodes").mkdir()
        os.symlink(REPO, base / "custom_nodes" / "ComfyUI-GCache")
        os.symlink(os.path.join(HERE, "gcache_test_pack"), base / "custom_nodes" / "gcache_test_pack")
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    log = open(base / "server.log", "a")
    # on a GPU (bench/gpu_check.sh) the server runs with ComfyUI's defaults there: since 0.33, Dynamic VRAM
    device = [] if os.environ.get("GCACHE_TEST_SERVER_GPU") else ["--cpu"]
    proc = subprocess.Popen([sys.executable, "main.py", *device, "--listen", "127.0.0.1", "--port", str(port),
                             "--base-directory", str(base), "--disable-auto-launch"],
                            cwd=COMFY, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                break
            try:
                info = _get(url + "/object_info")
                break
            except OSError:
                time.sleep(0.5)
        else:
            info = None
        if proc.poll() is not None or info is None:
            pytest.fail("ComfyUI did not start: " + (base / "server.log").read_text()[-3000:])
        yield {"url": url, "info": info, "base": base, "log": base / "server.log", "proc": proc}
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()




class Listener:
    """A websocket client of the server under its own client id (aiohttp, which ComfyUI requires, in a thread): the
    JSON events ComfyUI sends it, in the order they came."""

    def __init__(self, url: str):
        self.url, self.client_id, self.events = url, uuid.uuid4().hex, []
        self._stop, self._connected = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._listen()), daemon=True)

    async def _listen(self):
        import aiohttp
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(self.url.replace("http", "ws", 1) + f"/ws?clientId={self.client_id}",
                                          max_msg_size=0) as ws:
                while not self._stop.is_set():
                    try:
                        msg = await ws.receive(timeout=0.2)
                    except asyncio.TimeoutError:
                        continue
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        self.events.append(json.loads(msg.data))
                        self._connected.set()  # the server's first "status": it knows this client id now
                    elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        return

    def __enter__(self):
        self._thread.start()
        if not self._connected.wait(30):
            pytest.fail(f"no websocket connection to {self.url}")
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def of(self, kind: str) -> list:
        return [e["data"] for e in list(self.events) if e.get("type") == kind]
