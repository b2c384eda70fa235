"""A headless Chromium driven over the DevTools protocol: enough to use the Airflow and MLflow UIs as a person
does (open a page, wait for text, click a button by its label, type into a field, take a screenshot).

Why not Selenium or Playwright: Debian's `chromium` package speaks CDP itself, so a websocket (the
`websockets` package Airflow already pins) is all a test needs; no driver binary to keep in step with it.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect

from rl_core.runtime.procs import free_port


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, profile: Path, width: int = 1440, height: int = 1000):
        port = free_port()
        self.proc = subprocess.Popen(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            assert time.time() < deadline and self.proc.poll() is None, "chromium did not start"
            time.sleep(0.3)
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.ids = itertools.count(1)
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def send(self, method: str, **params) -> dict:
        """One CDP command; events that arrive before its answer are dropped."""
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=120))
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited; a DOM node comes back as {}, so
        test for one with !!)."""
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:80]}: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait("document.readyState === 'complete'", what=f"load {url}")

    def wait(self, expression: str, timeout: float = 60, what: str = "") -> object:
        deadline = time.time() + timeout
        while True:
            try:
                value = self.js(expression)
            except RuntimeError:
                value = None
            if value:
                return value
            if time.time() > deadline:
                raise AssertionError(f"waited {timeout:.0f}s for {what or expression}; page text:\n{self.text()[:3000]}")
            time.sleep(0.5)

    def text(self) -> str:
        return self.js("document.body ? document.body.innerText : ''") or ""

    def wait_text(self, *needles: str, timeout: float = 60) -> None:
        cond = " && ".join(f"document.body.innerText.includes({json.dumps(n)})" for n in needles)
        self.wait(f"document.body && {cond}", timeout, what=f"text {needles}")

    def click(self, label: str, selector: str = "button, a, [role=button], [role=tab], label, span",
              timeout: float = 30) -> None:
        """Click the last visible element matching selector whose own text is label (the innermost match)."""
        js = f"""(() => {{
            const els = [...document.querySelectorAll({json.dumps(selector)})].filter(
                e => e.innerText && e.innerText.trim() === {json.dumps(label)} && e.offsetParent !== null);
            if (!els.length) return false;
            els[els.length - 1].click();
            return true;
        }})()"""
        self.wait(js, timeout, what=f"a clickable {label!r}")

    def fill(self, selector: str, value: str, index: int = 0) -> None:
        """Type into an input the way React sees it (the native setter, then input and change events)."""
        js = f"""(() => {{
            const el = document.querySelectorAll({json.dumps(selector)})[{index}];
            if (!el) return false;
            const proto = el.tagName === 'TEXTAREA' ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
            Object.getOwnPropertyDescriptor(proto, 'value').set.call(el, {json.dumps(value)});
            el.dispatchEvent(new Event('input', {{bubbles: true}}));
            el.dispatchEvent(new Event('change', {{bubbles: true}}));
            return true;
        }})()"""
        self.wait(js, 30, what=f"an input {selector}[{index}]")

    def scroll_to(self, text: str) -> None:
        """Scroll the innermost element whose own text is `text` to the top of its scrolling container."""
        self.wait(f"""(() => {{
            const el = [...document.querySelectorAll('h1, h2, h3, h4, span, div, button')].filter(
                e => e.innerText && e.innerText.trim() === {json.dumps(text)}).pop();
            if (!el) return false;
            el.scrollIntoView({{block: 'start'}});
            return true;
        }})()""", 30, what=f"a heading {text!r}")

    def buttons(self) -> list[str]:
        """aria-labels and texts of the visible buttons (what a failing click had to choose from)."""
        return self.js("[...document.querySelectorAll('button')].filter(b => b.offsetParent !== null)"
                       ".map(b => b.getAttribute('aria-label') || b.innerText.trim())") or []

    def click_label(self, aria: str, timeout: float = 10) -> bool:
        """Click the first visible button whose aria-label contains `aria` (case-insensitive); False if none."""
        try:
            self.wait(f"""(() => {{
                const b = [...document.querySelectorAll('button')].find(b => b.offsetParent !== null &&
                    (b.getAttribute('aria-label') || '').toLowerCase().includes({json.dumps(aria.lower())}));
                if (!b) return false;
                b.click();
                return true;
            }})()""", timeout, what=f"a button labelled {aria!r}")
            return True
        except AssertionError:
            return False

    def sign_in(self, base: str, password: str) -> None:
        """Sign in to the Airflow UI as admin (simple auth manager), as a person does."""
        self.goto(base)
        self.fill("input[name=username]", "admin")
        self.fill("input[name=password]", password)
        self.click("Sign in", "button")
        self.wait_text("Dags")

    def open_trigger_dialog(self, base: str, password: str, dag_id: str = "realtime_rl") -> None:
        """As a person does on the Airflow UI: sign in as admin, open the DAG, press Trigger; the dialog is open."""
        self.sign_in(base, password)
        self.goto(f"{base}/dags/{dag_id}")
        self.wait_text(dag_id, "Backfills")
        assert self.click_label("Trigger Dag", timeout=30), self.buttons()
        self.wait("!!document.querySelector('input[type=radio][value=backfill]')", what="the trigger dialog")

    def key(self, key: str) -> None:
        """Press and release a named key (Escape, Enter, Tab) in the focused element."""
        codes = {"Escape": 27, "Enter": 13, "Tab": 9}
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=codes[key])

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
