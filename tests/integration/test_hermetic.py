"""Hermetic builds, for real: an sdist whose setup.py downloads a "prebuilt binary" from a
loopback server instead of compiling (as several CUDA extensions do unless told not to).
Its fetch reaches the server; its build, on this machine (a network namespace) and in a
container (one with no network), does not: no request arrives, and the failure says the
build reached for the network."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from wheelmill.errors import BuildError, PrecheckError
from wheelmill.machine.engine import detect

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent

SETUP = """import urllib.request
from setuptools import setup

try:  # a prebuilt binary instead of a compile, the way some setup.py files do it
    urllib.request.urlopen("{url}", timeout=10).read()
except OSError as exc:
    raise SystemExit(f"downloader: could not download the prebuilt binary: {{exc}}")
setup(name="downloader", version="1.0", py_modules=["downloader"])
"""


def sdist(url: str) -> bytes:
    files = {
        "setup.py": SETUP.format(url=url),
        "downloader.py": "X = 1\n",
        "PKG-INFO": "Metadata-Version: 2.1\nName: downloader\nVersion: 1.0\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"downloader-1.0/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Loopback:
    """Serves the sdist, and counts every request by path."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.payload = b""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append(self.path)
                body = server.payload if self.path.endswith(".tar.gz") else b"a prebuilt binary"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        # On every address of this machine: a container with the host's network could reach it too.
        self.httpd = ThreadingHTTPServer(("0.0.0.0", 0), Handler)  # noqa: S104 - a test server, gone with the test
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def loopback() -> Iterator[Loopback]:
    server = Loopback()
    yield server
    server.close()


def repo(tmp_path: Path, server: Loopback) -> Path:
    """The project's recipes (whose build requirements the committed locks cover), matrix,
    containers and locks, and one more recipe: the sdist, the one the test builds."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "recipes", root / "recipes")
    shutil.copytree(ROOT / "extensions", root / "extensions")
    shutil.copytree(ROOT / "containers", root / "containers")
    shutil.copytree(ROOT / "locks", root / "locks")
    server.payload = sdist(f"http://127.0.0.1:{server.port}/prebuilt.whl")
    digest = hashlib.sha256(server.payload).hexdigest()
    (root / "recipes" / "downloader.toml").write_text(
        'name = "downloader"\ncells = ["cpu-*"]\n\n[source]\n'
        f'url = "http://127.0.0.1:{server.port}/files/downloader-1.0.tar.gz"\nsha256 = "{digest}"\n'
    )
    return root


ENGINES = ["none", *(pytest.param(name, marks=pytest.mark.engine) for name in ("podman", "docker"))]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_build_that_reaches_for_the_network_gets_none_and_says_so(
    tmp_path: Path, loopback: Loopback, engine: str
) -> None:
    if engine != "none":
        try:
            detect(engine)
        except PrecheckError as exc:
            pytest.skip(exc.one_line())
    root = repo(tmp_path, loopback)
    env = {**os.environ, "WHEELMILL_OUTPUT": str(tmp_path / "out")}
    command = [
        sys.executable,
        "-m",
        "wheelmill",
        "build",
        "--cell",
        "cpu-py311",
        "--recipe",
        "downloader",
        "--engine",
        engine,
        "--no-publish",
    ]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False, timeout=1800)
    assert result.returncode == BuildError.exit_code, (result.stdout + result.stderr)[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert (
        "downloader/build: downloader: the build tried to reach the network, which a build step does not have" in line
    ), line
    assert "could not download the prebuilt binary" in line and "fix: " in line
    assert loopback.requests == ["/files/downloader-1.0.tar.gz"], "the fetch reached the server, the build did not"
