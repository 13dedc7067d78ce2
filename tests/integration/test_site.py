"""The docs site in a real browser: mkdocs.yml built with ``mkdocs build --strict``, served
over HTTP on loopback, and every page of it opened in Debian's Chromium, headless, at a
window 1280 px wide, as a newcomer's laptop shows it.

A page fails where it is wider than the window (the document scrolls sideways, or an element
ends past the window's right edge outside a box that scrolls or clips it: a code block or a
wide table scrolls in its own box, which is fine), where an image did not load (an SVG in
``<img>`` too), where a request failed, went anywhere but the test's server (a CDN, a web
font) or the browser logged an error, or where a code block scrolls sideways though no line
of it is wider than the 80 columns tests/unit/test_docs.py holds the docs' code to
(docs/stylesheets/site.css makes 80 fit, in a list item too). It takes about half a minute,
most of it the screenshots. Each page is kept as a screenshot of the whole page,
``<page>.png`` (``index.png``, ``design-abi.png``, ...), in the folder the test prints: the
environment variable ``WHEELMILL_SITE_SHOTS`` where it is set, else under the test's tmp_path,
which pytest removes once the test passes (``tmp_path_retention_policy = "failed"``), so set
the variable to look at the pages of a passing run."""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.browser import WIDTH, headless_chromium

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CODE_WIDTH = 80  # tests/unit/test_docs.py's

# Every element that ends past the window's right edge, but for those inside a box that
# scrolls or clips its overflow (a code block, a table's wrapper, the header's title) and
# those not shown; each as "tag#id.class ... right edge".
PAST_THE_EDGE = """
const edge = window.innerWidth;
const contained = (e) => {
  for (let box = e.parentElement; box && box !== document.body; box = box.parentElement) {
    if (/auto|scroll|hidden|clip/.test(getComputedStyle(box).overflowX)) return true;
  }
  return false;
};
const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
  Array.from(e.classList).map((c) => '.' + c).join('');
return Array.from(document.body.querySelectorAll('*')).filter((e) => {
  const box = e.getBoundingClientRect();
  const style = getComputedStyle(e);
  return box.width > 0 && box.height > 0 && box.right > edge + 0.5 &&
    style.visibility !== 'hidden' && style.display !== 'none' && !contained(e);
}).slice(0, 10).map((e) => name(e) + ' ends at ' + Math.round(e.getBoundingClientRect().right) + ' px: ' +
  (e.textContent || '').trim().slice(0, 60));
"""
BROKEN_IMAGES = """
return Array.from(document.images).filter((i) => i.complete && i.naturalWidth === 0)
  .map((i) => i.currentSrc || i.src);
"""
IMAGES_LOADED = "return Array.from(document.images).every((i) => i.complete)"
# Each code block that scrolls sideways though no line of it is wider than CODE_WIDTH (a
# program's output, shown as printed, may be wider, and scroll).
CODE_THAT_SCROLLS = f"""
return Array.from(document.querySelectorAll('pre > code'))
  .filter((e) => e.scrollWidth > e.clientWidth && e.textContent.split('\\n').every((l) => l.length <= {CODE_WIDTH}))
  .map((e) => e.clientWidth + ' px for ' + e.scrollWidth + ': ' + e.textContent.trim().slice(0, 60));
"""


@dataclass(frozen=True)
class Served:
    url: str
    failed: list[str]  # what the server answered with an error, as it answers


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Path, Served]]:
    """The site, built strictly into tmp_path and served on a free loopback port."""
    built = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(built)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    failed: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            if int(code) >= 400:
                failed.append(f"{self.path}: {code}")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: failures are kept above

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(built)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield built, Served(url=f"http://127.0.0.1:{server.server_address[1]}", failed=failed)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium at WIDTH x HEIGHT, logging the network too (tests/browser.py)."""
    with headless_chromium(tmp_path, network_log=True) as chrome:
        yield chrome


def pages_of(built: Path) -> list[str]:
    """Each page's path under the site's root (``""``, ``"design/abi/"``, ...): one a Markdown
    file of docs/, as the built site has them."""
    pages = sorted(str(p.parent.relative_to(built)) + "/" for p in built.rglob("index.html"))
    pages = ["" if page == "./" else page for page in pages]
    assert pages == sorted(url_of(md) for md in DOCS.rglob("*.md")), "one built page a Markdown file of docs/"
    return pages


def url_of(md: Path) -> str:
    """Where mkdocs puts the page of ``md`` under the site's root (its directory URLs)."""
    page = md.relative_to(DOCS).with_suffix("")
    folder = page.parent if page.name == "index" else page
    return "" if folder == Path() else f"{folder}/"


def shots_folder(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("WHEELMILL_SITE_SHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_full_page(chrome: Any, path: Path) -> None:
    """The whole page, not just the window, as one PNG (DevTools' screenshot beyond the viewport)."""
    size = chrome.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": WIDTH, "height": int(size["height"]), "scale": 1}
    shot = chrome.execute_cdp_cmd(
        "Page.captureScreenshot",
        {"format": "png", "captureBeyondViewport": True, "clip": clip, "optimizeForSpeed": True},
    )
    path.write_bytes(base64.b64decode(shot["data"]))


def network_faults(chrome: Any, served: str) -> list[str]:
    """The requests since the last call that failed, answered with an error, or went to any
    server but ``served``; and what the console said was an error."""
    faults: list[str] = []
    urls: dict[str, str] = {}
    for entry in chrome.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        method, params = message["method"], message.get("params", {})
        if method == "Network.requestWillBeSent":
            url = urls[params["requestId"]] = params["request"]["url"]
            if not url.startswith((f"{served}/", "data:", "blob:")):
                faults.append(f"a request off the test's server: {url}")
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            faults.append(f"{params['response']['url']}: {params['response']['status']}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            faults.append(f"{urls.get(params['requestId'], params['requestId'])}: {params['errorText']}")
    faults += [f"console: {e['message']}" for e in chrome.get_log("browser") if e["level"] == "SEVERE"]
    return faults


def faults_of_page(chrome: Any, url: str, served: str) -> list[str]:
    """What is wrong with the page at ``url``, opened in ``chrome``: nothing, or a line a fault."""
    chrome.get(url)
    deadline = time.monotonic() + 10
    while not chrome.execute_script(IMAGES_LOADED):
        assert time.monotonic() < deadline, f"{url}: its images never finished loading"
        time.sleep(0.05)
    faults = []
    assert chrome.execute_script("return window.innerWidth") == WIDTH
    width = chrome.execute_script("return document.documentElement.scrollWidth")
    if width > WIDTH:
        faults.append(f"the page is {width} px wide")
    faults += [f"past the right edge: {e}" for e in chrome.execute_script(PAST_THE_EDGE)]
    faults += [f"a broken image: {src}" for src in chrome.execute_script(BROKEN_IMAGES)]
    faults += [f"code of {CODE_WIDTH} columns that scrolls: {e}" for e in chrome.execute_script(CODE_THAT_SCROLLS)]
    return faults + network_faults(chrome, served)


def test_every_page_of_the_site_fits_the_window_and_loads_whole(
    site: tuple[Path, Served], browser: Any, tmp_path: Path
) -> None:
    built, served = site
    remote = [
        f"{page.relative_to(built)}: {ref}"
        for page in built.rglob("*.html")
        for ref in re.findall(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"((?:https?:)?//[^\"]+)\"", page.read_text())
    ]
    assert remote == [], "the site loads nothing from elsewhere (a CDN, web fonts)"
    shots = shots_folder(tmp_path)
    faults: dict[str, list[str]] = {}
    started = time.monotonic()
    pages = pages_of(built)
    browser.get("about:blank")
    for log in ("performance", "browser"):
        browser.get_log(log)  # what the new tab asked for, before any page of the site
    for page in pages:
        found = faults_of_page(browser, f"{served.url}/{page}", served.url)
        save_full_page(browser, shots / f"{page.strip('/').replace('/', '-') or 'index'}.png")
        if found:
            faults[page or "/"] = found
    print(f"\n{len(pages)} pages opened in {time.monotonic() - started:.1f} s; screenshots in {shots}")
    assert faults == {}, "\n".join(f"{page}: {fault}" for page, found in faults.items() for fault in found)
    assert served.failed == [], "the server answered these with an error"
