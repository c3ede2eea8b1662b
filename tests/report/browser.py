"""A headless Chromium driven over the DevTools protocol (a tiny websocket client):
load a page, collect JavaScript errors, evaluate an expression, take a screenshot."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-port=0"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Page:
    def __init__(self, binary: str, profile: Path, window: tuple[int, int] = (1280, 2400)) -> None:
        self.proc = subprocess.Popen([binary, *FLAGS, f"--window-size={window[0]},{window[1]}",
                                      f"--user-data-dir={profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = None
        deadline = time.time() + 60
        while time.time() < deadline and port is None:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                port = int(m.group(1))
        if port is None:
            raise RuntimeError("chromium did not open its DevTools port")
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
        page = next(t for t in targets if t.get("type") == "page")
        import websocket

        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []
        for method in ("Page.enable", "Runtime.enable", "Log.enable", "Network.enable"):
            self.call(method)

    def call(self, method: str, **params):
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 60) -> None:
        if any(e["method"] == method for e in self.events):
            return
        deadline = time.time() + timeout
        while time.time() < deadline:
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return
        raise TimeoutError(method)

    def load(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def visible_cells(self) -> list[str]:
        """The text of every table cell a person sees in the window: inside the viewport (its
        box within the window's width and height), not hidden, the topmost element where it
        is drawn (not scrolled away inside its table, not under a panel), not cut short."""
        return self.evaluate("""(() => {
          const W = window.innerWidth, H = window.innerHeight, out = [];
          for (const el of document.querySelectorAll('td, th, [role=cell], [role=gridcell], [role=columnheader], [role=rowheader]')) {
            const r = el.getBoundingClientRect();
            if (r.width < 2 || r.height < 2 || r.left < 0 || r.top < 0 || r.right > W || r.bottom > H) continue;
            if (el.checkVisibility && !el.checkVisibility({opacityProperty: true, visibilityProperty: true})) continue;
            // on top where it is drawn: not scrolled out of its table, not under a panel
            const hit = document.elementFromPoint(Math.min(r.left + 8, r.right - 1), (r.top + r.bottom) / 2);
            if (!hit || !(el === hit || el.contains(hit))) continue;
            // cut short by an ellipsis: the text is wider than its box
            const inner = el.querySelector('a, span') || el;
            if (inner.scrollWidth > inner.clientWidth + 1 && getComputedStyle(inner).textOverflow === 'ellipsis') continue;
            const text = (el.innerText || '').trim();
            if (text) out.push(text);
          }
          return out;
        })()""") or []

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(json.dumps(p.get("exceptionDetails", {}))[:500])
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append(json.dumps(p.get("args", []))[:500])
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", "")[:500] + " " + p["entry"].get("url", ""))
        return out

    def screenshot(self, path: Path, beyond_viewport: bool = True) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=beyond_viewport)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
