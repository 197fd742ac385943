"""Headless Chromium over the DevTools protocol, for the page tests (test_viz, test_serve_page).

Debian's `chromium` package and `websocket-client` are all it needs; the `chromium` fixture
(tests/conftest.py) skips a test where either is missing.
"""

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path


class Chromium:
    """Headless Chromium driven over the DevTools protocol (a websocket)."""

    FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-port=0", "--window-size=1400,1000")  # fmt: skip

    def __init__(self, binary: str):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="aiayn-chromium-")
        self.proc = subprocess.Popen(
            [binary, *self.FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        port_file = Path(self.profile, "DevToolsActivePort")  # Chromium writes its port here
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("Chromium did not start")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True
        )
        self.next_id, self.events = 0, []

    def send(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30):
        self.wait_for_n(method, 1, timeout)

    def wait_for_n(self, method: str, n: int, timeout: float = 30):
        """Until `method` has been seen n times since the browser started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(e.get("method") == method for e in self.events) >= n:
                return
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def js(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def errors(self) -> list:
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown" or (m == "Log.entryAdded" and p["entry"]["level"]
                                                  == "error"):  # fmt: skip
                out.append(p)
            if m == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                out.append(p)
        return out

    def close(self):
        with contextlib.suppress(Exception):
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
