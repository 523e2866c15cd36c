"""What the browser tests share: a real headless Chromium (selenium + chromedriver) and the real
`syncviz dash` server on a free port. The `browser` fixture (tests/conftest.py) is built here.
Screenshots go to $SYNCVIZ_SHOTS (default /tmp/syncviz-dashboard-shots)."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from test_dashboard import free_port

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                # WebGL (the many-rank lanes, long step series) in software: recent Chromium wants it asked for
                "--enable-unsafe-swiftshader"]
SHOTS = Path(os.environ.get("SYNCVIZ_SHOTS", "/tmp/syncviz-dashboard-shots"))
WAIT_S = 60   # generous: the CI machine may be busy


def start_chromium(width: int = 1400, height: int = 1000):
    """A headless Chromium driven by selenium (the test is skipped where none is installed)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.skip("chromium and chromedriver must be on PATH (.ci/browsers.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    for f in CHROME_FLAGS + [f"--window-size={width},{height}"]:
        opts.add_argument(f)
    opts.binary_location = chromium
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    SHOTS.mkdir(parents=True, exist_ok=True)
    return webdriver.Chrome(service=Service(driver_path), options=opts)


@contextlib.contextmanager
def dash_server(root: Path, *args: str):
    """The real `syncviz dash ROOT [ARGS]` on a free port; yields its base URL once it answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "syncviz", "dash", str(root), "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + WAIT_S
    try:
        while True:
            try:
                urllib.request.urlopen(base + "/_dash-layout", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    proc.kill()
                    pytest.fail(f"server did not start: {proc.stdout.read()}")
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def wait_for(fn, what, timeout=WAIT_S, state=None):
    """Poll ``fn`` until it returns something truthy; on timeout say what was awaited (and
    ``state()``, what the page showed, when given)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f"; {state()}" if state else ""))


def text(driver, css):
    from selenium.webdriver.common.by import By
    return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, css))


def js_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
