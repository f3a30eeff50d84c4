"""A headless Chromium driven over the DevTools protocol, for the checks that need a real browser.

Chromium's ``--screenshot`` flag renders a page but cannot measure it or set a cookie first; the DevTools protocol
(a websocket, here through aiohttp, which ``ray[default]`` already installs) can: open a page at a given viewport,
evaluate a script in it, set a cookie, capture a PNG. :class:`Browser` wraps the few commands the checks use.

    async with Browser(width=1400, height=1000) as browser:
        await browser.open("file:///…/report.html")
        width = await browser.evaluate("document.documentElement.scrollWidth")
        await browser.screenshot(Path("report.png"))
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

START_TIMEOUT_S = 30.0


class Checks:
    """The checks' verdict lines: ``check(passed, what)`` prints one ``ok``/``FAIL`` line and counts the failures."""

    def __init__(self) -> None:
        self.failed = 0

    def __call__(self, passed: bool, what: str) -> bool:
        print(f"{'ok  ' if passed else 'FAIL'} {what}", flush=True)
        self.failed += not passed
        return passed


def chromium_path() -> str | None:
    """The Chromium (or Chrome) executable on PATH, None when there is none."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    return None


class BrowserError(RuntimeError):
    """Chromium did not start, or a DevTools command failed."""


class Browser:
    """One headless Chromium with one page, at a fixed viewport, for an ``async with`` block."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self.width, self.height = width, height
        self._profile: tempfile.TemporaryDirectory | None = None
        self._process: subprocess.Popen | None = None
        self._session: Any = None
        self._socket: Any = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Browser:
        import aiohttp

        executable = chromium_path()
        if executable is None:
            raise BrowserError("no chromium on PATH (apt-get install chromium)")
        # Chromium's helper processes may still write into the profile as it exits: a leftover file is no failure
        self._profile = tempfile.TemporaryDirectory(prefix="check-browser-", ignore_cleanup_errors=True)
        profile = Path(self._profile.name)
        # port 0: Chromium picks a free port and writes it into DevToolsActivePort of the profile
        self._process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             # nothing but the pages checked: no updates, sync or other traffic of its own
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = await self._wait_for_port(profile / "DevToolsActivePort")
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json(content_type=None)
        page = next((t for t in targets if t.get("type") == "page"), None)
        if page is None:
            raise BrowserError("Chromium opened no page")
        self._socket = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send("Page.enable")
        await self.send("Network.enable")
        # the viewport itself, so that innerWidth is exactly the width asked for
        await self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                        deviceScaleFactor=1, mobile=False)
        return self

    async def _wait_for_port(self, port_file: Path) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise BrowserError(f"Chromium exited with code {self._process.returncode} at start")
            if port_file.is_file() and (text := port_file.read_text().split()):
                return int(text[0])
            await asyncio.sleep(0.2)
        raise BrowserError(f"Chromium opened no DevTools port within {START_TIMEOUT_S:g} s")

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self._socket is not None:
            await self._socket.close()
        if self._session is not None:
            await self._session.close()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._profile is not None:
            self._profile.cleanup()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command and its result; the events that arrive meanwhile are not needed and dropped."""
        command_id = next(self._ids)
        await self._socket.send_str(json.dumps({"id": command_id, "method": method, "params": params}))
        while True:
            message = json.loads((await self._socket.receive()).data)
            if message.get("id") == command_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})

    async def open(self, url: str, settle_s: float = 0.0, timeout_s: float = 60.0) -> None:
        """Navigate to ``url``, wait until the document has loaded, then ``settle_s`` more for scripts to render."""
        await self.send("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while await self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise BrowserError(f"{url} did not finish loading within {timeout_s:g} s")
            await asyncio.sleep(0.2)
        await asyncio.sleep(settle_s)

    async def wait_for(self, expression: str, timeout_s: float = 30.0) -> bool:
        """Poll a script until it is truthy; False when ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await self.evaluate(expression):
                return True
            await asyncio.sleep(0.5)
        return False

    async def evaluate(self, expression: str) -> Any:
        """The value of a script in the page (JSON-able values only)."""
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"script failed: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    async def set_cookie(self, name: str, value: str, url: str) -> None:
        """A cookie for ``url``'s host, as a server's Set-Cookie would leave it."""
        result = await self.send("Network.setCookie", name=name, value=value, url=url, path="/")
        if not result.get("success", True):
            raise BrowserError(f"Chromium refused the cookie {name} for {url}")

    async def screenshot(self, path: Path, full_page: bool = False) -> Path:
        """A PNG of the viewport, or of the whole page (as wide as the viewport) with ``full_page``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = await self.evaluate("document.documentElement.scrollHeight")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1})
        data = (await self.send("Page.captureScreenshot", **params))["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
