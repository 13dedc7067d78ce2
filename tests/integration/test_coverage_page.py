"""The coverage page in a real browser: Debian's Chromium, headless, driven by its
chromedriver through selenium, at 1280x900, over the page `wheelmill coverage --page` writes
into a tree index and `wheelmill index serve` serves on loopback.

The release is tests/unit/test_coverage.py's (cells built, served, failed and planned), with
what installers asked for and the torch releases upstream the matrix lacks. The finder
answers three picks given in the URL's query (a file: the exact pip and uv lines, which then
install it; a failed build: its step and error; a spot not in the matrix: how often it was
asked for), the page without JavaScript shows its tables, nothing is wider than the window,
no request fails, and a screenshot of the whole page is saved (its path printed). nginx
with deploy/nginx-index.conf serves the same files as `index serve`, with the same types."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.browser import WIDTH, headless_chromium
from tests.integration.test_bucket_serving import bucket_of_its_own, public_read, running_nginx
from tests.integration.test_index import isolated_env, pip, serving_nginx, venv
from tests.objectstore import ObjectStore
from tests.ports import free_port
from tests.unit import test_coverage
from tests.unit.test_coverage_page import UPSTREAM, WANTS, covered
from wheelmill.index.channels import COVERAGE_FILES
from wheelmill.index.roots import Index
from wheelmill.index.s3 import S3Storage
from wheelmill.index.serve import parse_access_log
from wheelmill.machine.tools import uv_bin
from wheelmill.releases.coverage_page import render_page, write_page

pytestmark = pytest.mark.integration
released = test_coverage.released  # the fixture: an rc with cells built, served, failed and planned
CPU = "2.13.0"  # the cpu variant's torch
CUDA = "2.14.1"  # cuda130's
BUILT = {"recipe": "example-cpp-ops", "torch": CPU, "accelerator": "cpu", "python": "3.11", "platform": "x86_64"}
FAILED = {"recipe": "torchsort", "torch": CUDA, "accelerator": "cuda 13.0", "python": "3.12", "platform": "x86_64"}
ABSENT = {"recipe": "example-cuda-ops", "torch": CPU, "accelerator": "cpu", "python": "3.12", "platform": "x86_64"}


@dataclass(frozen=True)
class Site:
    index: Path
    url: str  # the served index's root
    access_log: Path


@pytest.fixture
def site(released: Index, tmp_path: Path) -> Iterator[Site]:
    """The page of the release, written by `wheelmill coverage --page` and then written over
    with what was asked for and what upstream has (what the command takes as parameters
    only, for now); served by `wheelmill index serve` on a free loopback port."""
    assert released.tree is not None
    env = {**os.environ, "WHEELMILL_INDEX_ROOT": str(released.tree), "WHEELMILL_OUTPUT": str(tmp_path / "wheels")}
    env.pop("WHEELMILL_SERVED_INDEX", None)  # the page finds the index's URL from its own
    wrote = subprocess.run(
        [sys.executable, "-m", "wheelmill", "coverage", "--page"], env=env, capture_output=True, text=True, check=False
    )
    assert wrote.returncode == 0 and wrote.stdout.strip().endswith(f"{released.tree}/coverage/"), wrote
    write_page(released.storage, render_page(covered(released).as_dict(), wants=WANTS, upstream=UPSTREAM))
    with index_serve(released.tree, tmp_path / "access.log", env) as url:
        yield Site(index=released.tree, url=url, access_log=tmp_path / "access.log")


@contextmanager
def index_serve(root: Path, access_log: Path, env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "wheelmill", "index", "serve", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(
        [*argv, "--access-log", str(access_log)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while get(f"{url}/coverage/")[0] != 200:
            assert server.poll() is None and time.monotonic() < deadline, "index serve did not answer"
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        assert server.stderr is not None
        server.stderr.close()


def get(url: str) -> tuple[int, str, bytes]:
    """The status, content type and body of a GET; 0 where nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"] or "", b""
    except OSError:
        return 0, "", b""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium at WIDTH x HEIGHT (tests/browser.py)."""
    with headless_chromium(tmp_path) as chrome:
        yield chrome


def finder_answer(chrome: Any, site: Site, picks: dict[str, str]) -> Any:
    """The finder's answer once it has read the data, for ``picks`` given in the URL's query."""
    query = urllib.parse.urlencode(picks)
    chrome.get(f"{site.url}/coverage/?{query}")
    deadline = time.monotonic() + 20
    while not chrome.execute_script("return document.getElementById('answer').dataset.ready === '1'"):
        assert time.monotonic() < deadline, "the finder gave no answer"
        time.sleep(0.05)
    answer = chrome.find_element("id", "answer")
    assert chrome.find_element("id", "finder").is_displayed()
    picked = {name: chrome.execute_script(f"return document.forms.picks.elements.{name}.value") for name in picks}
    assert picked == picks, "each pick of the query is the select's"
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(chrome.current_url).query) == {k: [v] for k, v in picks.items()}
    fits(chrome)
    print(f"\nfinder answer for ?{query}:\n{answer.text}\n")
    return answer


def fits(chrome: Any) -> None:
    """No horizontal overflow at 1280 px, no image that did not load."""
    assert chrome.execute_script("return window.innerWidth") == WIDTH
    width = chrome.execute_script("return document.documentElement.scrollWidth")
    assert width <= WIDTH, f"the page is {width} px wide"
    broken = chrome.execute_script(
        "return Array.from(document.images).filter(i => !i.complete || !i.naturalWidth).length"
    )
    assert broken == 0


def lines_of(answer: Any, css: str) -> list[str]:
    return [e.text for e in answer.find_elements("css selector", css)]


def test_the_finder_answers_from_the_query_and_the_page_reads_without_javascript(
    site: Site, browser: Any, tmp_path: Path
) -> None:
    simple = f"{site.url}/test/cpu/simple/"
    built = finder_answer(browser, site, BUILT)
    requirement = "example-cpp-ops==2.4.0rc1+cpu"
    assert lines_of(built, "pre.pip") == [f"pip install --index-url {simple} {requirement}"]
    assert lines_of(built, "pre.uv") == [f"uv venv --python 3.11\nuv pip install --index-url {simple} {requirement}"]
    installs_as_the_page_says(built, tmp_path)
    screenshot = tmp_path / "coverage-page.png"
    save_full_page(browser, screenshot)

    failed = finder_answer(browser, site, FAILED)
    answers = failed.find_elements("css selector", "article")
    assert [a.get_attribute("class") for a in answers] == ["answer failed", "answer planned"], "cuda130, its slim twin"
    cuda130 = answers[0]
    assert "cuda130: channel test/cu130" in cuda130.text
    verdict = "not built: failed at build (torchsort), exit 10: nvcc fatal: unsupported gpu"
    assert verdict in lines_of(cuda130, ".verdict")
    log = cuda130.find_element("css selector", "a.log").get_attribute("href")
    assert get(log) == (200, "text/plain; charset=utf-8", b"...\nnvcc fatal: unsupported gpu\n")

    absent = finder_answer(browser, site, ABSENT)
    assert lines_of(absent, ".verdict") == [
        "not built: not in the matrix (example-cuda-ops is not built for cpu-py312)"
    ]
    assert lines_of(absent, ".asked") == ["asked for 7 times: 7 in test/cpu (no such project)"]

    tables_without_javascript(browser, site)
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    requests = parse_access_log(site.access_log.read_text().splitlines())
    assert requests and not [(path, status) for path, status, _sent in requests if status >= 400]
    print(f"the coverage page, whole: {screenshot}")


def installs_as_the_page_says(answer: Any, tmp_path: Path) -> None:
    """The answer's pip line and uv lines, run as they are (pip on a venv of its own, uv in a
    folder of its own), install the file."""
    (pip_line,) = lines_of(answer, "pre.pip")
    command, install, *rest = pip_line.split()
    assert (command, install) == ("pip", "install")
    done = pip(venv(tmp_path / "pip-env"), "install", *rest)
    assert done.returncode == 0, done.stdout + done.stderr
    (uv_lines,) = lines_of(answer, "pre.uv")
    folder = tmp_path / "uv-project"
    folder.mkdir()
    for line in uv_lines.splitlines():
        program, *args = line.split()
        assert program == "uv"
        done = subprocess.run(
            [uv_bin(), *args], cwd=folder, env=isolated_env(), capture_output=True, text=True, check=False, timeout=600
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert list(folder.glob(".venv/lib/python3.11/site-packages/example_cpp_ops-2.4.0rc1+cpu.dist-info"))


def save_full_page(chrome: Any, path: Path) -> None:
    """The whole page, not just the window, as one PNG (DevTools' screenshot beyond the viewport)."""
    import base64  # noqa: PLC0415 - only here

    size = chrome.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": WIDTH, "height": int(size["height"]), "scale": 1}
    shot = chrome.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def tables_without_javascript(chrome: Any, site: Site) -> None:
    """With scripts off, the finder stays hidden and the tables say what exists: the built
    spot's mark is there to see, and still nothing is wider than the window."""
    chrome.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        chrome.get(f"{site.url}/coverage/?{urllib.parse.urlencode(BUILT)}")
        assert not chrome.find_element("id", "finder").is_displayed()
        table = chrome.find_element("css selector", "#recipe-example-cpp-ops table")
        row = table.find_element("xpath", ".//tr[th='cpu']")
        built = row.find_element("css selector", "td.spot.built")
        assert built.is_displayed() and built.text == "built"
        assert "example_cpp_ops-2.4.0rc1+cpu" in (built.get_attribute("title") or "")
        assert chrome.find_element("id", "answer").text == ""
        fits(chrome)
    finally:
        chrome.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})


def test_nginx_serves_the_page_and_the_logs_ends_as_index_serve_does(site: Site, tmp_path: Path) -> None:
    """deploy/nginx-index.conf over the same tree: each of the page's files and a log's end,
    with the type `index serve` gives it, and nothing else of the records."""
    (log,) = [p.relative_to(site.index).as_posix() for p in (site.index / "releases").rglob("*.log")]
    served = {f"/coverage/{name}": (kind, f"coverage/{name}") for name, kind in COVERAGE_FILES.items()}
    served["/coverage/"] = served["/coverage"] = (COVERAGE_FILES["index.html"], "coverage/index.html")  # one redirect
    served[f"/{log}"] = ("text/plain; charset=utf-8", log)
    hidden = ("/releases/test/2.4.0rc1/release.json", f"/{log.removesuffix('.log')}.json", "/coverage/x.html")
    with serving_nginx(site.index, tmp_path / "nginx") as nginx:
        for base in (site.url, nginx):
            for path, (kind, key) in served.items():
                assert get(base + path) == (200, kind, (site.index / key).read_bytes()), (base, path)
            assert [get(base + path)[0] for path in hidden] == [404] * len(hidden), base


def test_nginx_serves_the_page_from_a_bucket_as_written_there(
    site: Site, object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """deploy/nginx-bucket.conf in front of a bucket the page was written into (through the
    index's storage, as `wheelmill coverage --page` writes it there) with a log's end: the
    same files and types, and nothing else of the records, even where the bucket lets anyone
    read every key under the prefix."""
    for name, value in object_store.environ().items():
        monkeypatch.setenv(name, value)
    prefix = f"index-{uuid.uuid4().hex[:8]}"
    (log,) = [p.relative_to(site.index).as_posix() for p in (site.index / "releases").rglob("*.log")]
    record = f"{log.removesuffix('.log')}.json"
    with bucket_of_its_own(object_store, public_read("@BUCKET@", [f"{prefix}/*"])) as bucket:
        storage = S3Storage.of(f"s3://{bucket}/{prefix}/")
        page = {name: (site.index / "coverage" / name).read_bytes() for name in COVERAGE_FILES}
        assert write_page(storage, page) == f"s3://{bucket}/{prefix}/coverage/"
        for key in (log, record):
            storage.create(key, (site.index / key).read_bytes())
        served = {f"/coverage/{name}": (kind, page[name]) for name, kind in COVERAGE_FILES.items()}
        served["/coverage/"] = served["/coverage"] = (COVERAGE_FILES["index.html"], page["index.html"])
        served[f"/{log}"] = ("text/plain; charset=utf-8", (site.index / log).read_bytes())
        with running_nginx(f"{object_store.endpoint}/{bucket}/{prefix}", tmp_path / "nginx") as base:
            for path, (kind, body) in served.items():
                assert get(base + path) == (200, kind, body), path
            assert [get(f"{base}/{key}")[0] for key in (record, "coverage/x.html")] == [404, 404]
