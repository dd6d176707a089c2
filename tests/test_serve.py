"""`mha-tui serve`: the app in a real browser (headless Chromium over the DevTools protocol)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, run_cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync",
                  "--disable-extensions", "--mute-audio", "--window-size=1280,800"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.25) -> Any:
    """check() until it returns something true; fail naming what after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group this test started (the server and its app processes),
    then SIGKILL to what is left; bounded."""
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            if sig == signal.SIGTERM:  # the leader left; its app processes may linger
                os.killpg(process.pid, signal.SIGKILL)
            return
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue


class DevTools:
    """The few DevTools protocol calls the test needs, over aiohttp's websocket client."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.next_id = ws, 0
        self.events: list[str] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), timeout=30)
            if "method" in message:
                self.events.append(message["method"])
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def event(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while name not in self.events:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"gave up after {timeout:.0f} s waiting for {name}")
            message = await asyncio.wait_for(self.ws.receive_json(), timeout=left)
            if "method" in message:
                self.events.append(message["method"])

    async def screenshot(self) -> bytes:
        return base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"])

    async def press(self, key: str, code: str, key_code: int) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=key, code=code, text=key,
                            unmodifiedText=key, windowsVirtualKeyCode=key_code,
                            nativeVirtualKeyCode=key_code)


def colour_cells(png: bytes) -> dict[str, int]:
    """Pixels of the value ramps the app colours cells with (render/values.py: from the dark neutral
    towards blue for negative values, red for positive, green for probabilities)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    counts = {"green": 0, "blue": 0, "red": 0}
    for r, g, b in getattr(image, "get_flattened_data", image.getdata)():
        if g > r + 40 and g > b + 25 and r < 70:
            counts["green"] += 1
        elif b > r + 60 and b > g + 30 and g > r + 20:
            counts["blue"] += 1
        elif r > g + 60 and r > b + 60 and g < 110:
            counts["red"] += 1
    return counts


@pytest.fixture
def server(tmp_path: Path):
    """`mha-tui serve` on a free loopback port; yields its URL; stopped at the end."""
    pytest.importorskip("textual_serve", reason="the [serve] extra (textual-serve) is not installed")
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "mha_tui", "serve", "I love AI !", "--host", "127.0.0.1",
         "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for("the server's URL line", lambda: f"serving the app on {url}".encode()
                 in (tmp_path / "serve.log").read_bytes() or process.poll() is not None, 120)
        assert process.poll() is None, (tmp_path / "serve.log").read_text()
        yield url
    finally:
        stop(process)
        log.close()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: apt-get install -y chromium "
                                               "chromium-driver (.ci/run does as root)")
def test_the_app_runs_in_a_browser_and_keys_change_the_stage(server: str, tmp_path: Path) -> None:
    """Headless Chromium opens the served page; the app draws the embed stage (blue and red
    cells); pressing 8 jumps to softmax, whose probabilities are drawn green (and no value
    is red any more: the blue left is the rail's highlight). Screenshots of
    both are kept in the test's folder. The page loads nothing but from this server."""
    import aiohttp

    profile = tmp_path / "chromium-profile"
    browser = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                                "about:blank"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        active = profile / "DevToolsActivePort"
        wait_for("Chromium's DevTools port", lambda: active.exists() and active.read_text().strip(), 60)
        devtools_port = int(active.read_text().split()[0])

        async def drive() -> tuple[bytes, bytes, list[str]]:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as response:
                    targets = json.loads(await response.text())
                page = next(t for t in targets if t["type"] == "page")
                async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    tools = DevTools(ws)
                    await tools.call("Page.enable")
                    await tools.call("Page.navigate", url=server)
                    await tools.event("Page.loadEventFired", 60)

                    async def until(what: str, check: Callable[[dict[str, int]], bool],
                                    timeout: float) -> bytes:
                        deadline = time.monotonic() + timeout
                        while True:
                            shot = await tools.screenshot()
                            if check(colour_cells(shot)):
                                return shot
                            if time.monotonic() > deadline:
                                (tmp_path / "gave-up.png").write_bytes(shot)
                                pytest.fail(f"gave up after {timeout:.0f} s waiting for {what}")
                            await asyncio.sleep(0.5)

                    embed = await until("the embed stage's values", lambda c: c["blue"] > 500
                                        and c["red"] > 500, 120)
                    resources = await tools.call(
                        "Runtime.evaluate", returnByValue=True,
                        expression="JSON.stringify(performance.getEntriesByType('resource')"
                                   ".map(e => e.name).concat([location.href]))")
                    requested = json.loads(resources["result"]["value"])
                    await tools.call("Runtime.evaluate", expression=(
                        "document.querySelector('.xterm-helper-textarea').focus()"))
                    await tools.press("8", "Digit8", 56)
                    softmax = await until("the softmax stage's weights", lambda c: c["green"] > 500, 30)
                    return embed, softmax, requested

        embed, softmax, requested = asyncio.run(drive())
        (tmp_path / "1-embed.png").write_bytes(embed)
        (tmp_path / "2-softmax.png").write_bytes(softmax)
        before, after = colour_cells(embed), colour_cells(softmax)
        assert before["green"] < after["green"] // 10, (before, after)
        assert after["red"] < before["red"] // 10, (before, after)
        assert requested and all(url.startswith(server) or url.startswith("ws://127.0.0.1")
                                 for url in requested), requested
    finally:
        stop(browser)


def test_serve_refusals_are_one_line() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = str(taken.getsockname()[1])
    for argv, message in ((["I love AI !", "--port", busy], "Address already in use"),
                          (["I love AI !", "--dump", "x.txt"], "--dump is for transcripts"),
                          (["I love AI !", "--heads", "3"], "--heads 3 does not divide"),
                          (["I love AI !", "--port", "0"], "--port must be between 1 and 65535"),
                          ([], "serve needs the sentence")):
        result = run_cli("serve", *argv)
        assert result.returncode == 2, (argv, result.stderr)
        lines = result.stderr.decode().splitlines()
        assert len(lines) == 1 and message in lines[0], (argv, lines)
    taken.close()


def test_the_page_loads_nothing_from_the_internet() -> None:
    """Our copy of textual-serve's page names no host: fonts, script and styles are served
    from textual-serve's own static folder."""
    page = (Path(ROOT) / "mha_tui" / "web" / "app_index.html").read_text("utf-8")
    body = page.split("-#}", 1)[1]
    assert "googleapis" not in body and "https://" not in body
    assert "{{ config.static.url }}js/textual.js" in body
    assert "{{ config.static.url }}fonts/RobotoMono-VariableFont_wght.ttf" in body
    textual_serve = pytest.importorskip("textual_serve", reason="the [serve] extra is not installed")
    static = Path(textual_serve.__file__).parent / "static"
    for name in ("js/textual.js", "css/xterm.css", "fonts/RobotoMono-VariableFont_wght.ttf",
                 "images/background.png"):
        assert (static / name).is_file(), name
