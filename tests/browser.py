"""Debian's Chromium, headless, driven by selenium: the one browser the tests that open a
page in a real browser share (the coverage page, the docs site)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

WIDTH, HEIGHT = 1280, 900  # a laptop's page, the width the pages are held to


@contextmanager
def headless_chromium(work: Path, *, network_log: bool = False) -> Iterator[Any]:
    """Chromium with a WIDTH x HEIGHT viewport, logging the console (and with
    ``network_log`` every request), its profile under ``work``; quit afterwards. Skips
    where chromium, its driver or selenium is not installed."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("chromium and chromium-driver are not installed (scripts/setup --system installs them)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (scripts/setup)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",  # the tests run as root in CI; Chromium's sandbox refuses root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",  # asks nothing of any server but the test's
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={work / 'chromium-profile'}",
        f"--window-size={WIDTH},{HEIGHT}",
    ):
        options.add_argument(argument)
    logs = {"browser": "ALL", **({"performance": "ALL"} if network_log else {})}
    options.set_capability("goog:loggingPrefs", logs)
    service = webdriver.ChromeService(executable_path=driver, log_output=str(work / "chromedriver.log"))
    chrome = webdriver.Chrome(options=options, service=service)
    try:
        chrome.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
        )
        yield chrome
    finally:
        chrome.quit()
