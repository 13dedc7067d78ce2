"""Publishing to an external index: a real pypiserver with --disable-fallback and htpasswd
authentication, reached directly or through a proxy that fails uploads first."""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.wheels import make_wheel

pytestmark = pytest.mark.integration
ANY = "py3-none-any"
USER, PASSWORD = "ci", "s3cret-for-tests"


@pytest.fixture
def pypiserver(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    packages = tmp_path / "packages"
    packages.mkdir()
    # htpasswd's {SHA} form, which pypiserver checks through passlib.
    digest = base64.b64encode(hashlib.sha1(PASSWORD.encode()).digest()).decode()  # noqa: S324 - the file format's hash
    (tmp_path / "htpasswd").write_text(f"{USER}:{{SHA}}{digest}\n")
    port = free_port()
    log = (tmp_path / "pypiserver.log").open("w")
    argv = [
        sys.executable,
        "-m",
        "pypiserver",
        "run",
        "-i",
        "127.0.0.1",
        "-p",
        str(port),
        "-P",
        str(tmp_path / "htpasswd"),
        "-a",
        "update",
        "--disable-fallback",
        str(packages),
    ]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "simple/", timeout=2):
                break
        except OSError:
            time.sleep(0.2)
    yield url, packages
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def publish(
    url: str, *wheels: Path, password: str = PASSWORD, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "WHEELMILL_PUBLISH_USERNAME": USER,
        "WHEELMILL_PUBLISH_PASSWORD": password,
        "WHEELMILL_RETRY_DELAY": "0.05",
        **(extra or {}),
    }
    argv = [
        sys.executable,
        "-m",
        "wheelmill",
        "--output",
        str(wheels[0].parent / "out"),
        "publish",
        "--to",
        url,
        *map(str, wheels),
    ]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=300)


def test_upload_is_idempotent(pypiserver: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = pypiserver
    wheel = make_wheel(
        tmp_path / "dist", "wm-remote", "1.0+cu118", tag=ANY, files={"wm_remote/__init__.py": b"X = 1\n"}
    )
    first = publish(url, wheel)
    assert first.returncode == 0, first.stderr
    assert "uploaded: " + wheel.name in first.stdout
    assert (packages / wheel.name).read_bytes() == wheel.read_bytes()
    second = publish(url, wheel)
    assert second.returncode == 0, second.stderr
    assert "skipped: " + wheel.name in second.stdout
    log = (tmp_path / "dist" / "out" / "logs" / "publish.log").read_text()
    assert PASSWORD not in log and "UV_PUBLISH_PASSWORD=***" in log


def test_other_bytes_under_a_published_name_are_refused(pypiserver: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = pypiserver
    first = make_wheel(tmp_path / "a", "wm-remote", "1.0", tag=ANY, files={"wm_remote/__init__.py": b"X = 1\n"})
    other = make_wheel(tmp_path / "b", "wm-remote", "1.0", tag=ANY, files={"wm_remote/__init__.py": b"X = 2\n"})
    assert publish(url, first).returncode == 0
    refused = publish(url, other)
    assert refused.returncode == 14
    (line,) = refused.stderr.strip().splitlines()
    assert "already there with other bytes" in line and "fix:" in line
    assert (packages / first.name).read_bytes() == first.read_bytes()


def test_bad_credentials_fail_at_once(pypiserver: tuple[str, Path], tmp_path: Path) -> None:
    url, _packages = pypiserver
    wheel = make_wheel(tmp_path / "dist", "wm-remote", "2.0", tag=ANY)
    result = publish(url, wheel, password="wrong")  # noqa: S106 - a deliberately bad password
    assert result.returncode == 16, result.stderr
    (line,) = result.stderr.strip().splitlines()
    retries = [note for note in result.stdout.splitlines() if "retrying in" in note]
    # A refusal is never retried. The server may answer before it has read the upload, so
    # uv can see a broken pipe, not the 403: wheelmill then asks the index without the file.
    assert retries == []
    assert "the index refused the upload of wm_remote-2.0-py3-none-any.whl" in line
    assert "status code 403 Forbidden" in line and "<html>" not in line
    assert "fix: set WHEELMILL_PUBLISH_USERNAME and WHEELMILL_PUBLISH_PASSWORD" in line


class FlakyProxy:
    """Forwards to pypiserver, but answers the first ``failures`` uploads with ``status``
    (503), and with ``echo`` a page that repeats the request's headers, credentials too."""

    def __init__(self, upstream: str, failures: int, *, status: int = 503, echo: bool = False) -> None:
        self.failures = failures
        self.uploads = 0
        host, port = upstream.removeprefix("http://").rstrip("/").split(":")
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _forward(self, body: bytes | None) -> None:
                connection = http.client.HTTPConnection(host, int(port), timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                connection.close()

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                proxy.uploads += 1
                if proxy.uploads <= proxy.failures:
                    page = f"<html><body>we got: {dict(self.headers)!r}</body></html>".encode() if echo else b""
                    self.send_response(status)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                self._forward(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_transient_upload_failures_are_retried(pypiserver: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = pypiserver
    proxy = FlakyProxy(url, failures=2)
    try:
        wheel = make_wheel(tmp_path / "dist", "wm-remote", "3.0", tag=ANY)
        result = publish(proxy.url, wheel)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("failed") == 2 and "retrying in" in result.stdout
        assert "(3 attempts)" in result.stdout
        assert proxy.uploads == 3
        assert (packages / wheel.name).read_bytes() == wheel.read_bytes()
    finally:
        proxy.close()


def test_persistent_upload_failure_is_a_clear_error(pypiserver: tuple[str, Path], tmp_path: Path) -> None:
    url, _packages = pypiserver
    proxy = FlakyProxy(url, failures=100)
    try:
        wheel = make_wheel(tmp_path / "dist", "wm-remote", "4.0", tag=ANY)
        result = publish(proxy.url, wheel, extra={"WHEELMILL_RETRIES": "3"})
        assert result.returncode == 16
        (line,) = result.stderr.strip().splitlines()
        assert "gave up on wm_remote-4.0-py3-none-any.whl after 3 attempts" in line and "WHEELMILL_RETRIES" in line
        assert proxy.uploads == 3
    finally:
        proxy.close()


def _shown(result: subprocess.CompletedProcess[str], wheel: Path) -> str:
    """Everything a publish showed anyone: its output and its log."""
    return result.stdout + result.stderr + (wheel.parent / "out" / "logs" / "publish.log").read_text()


def test_credentials_in_the_url_are_taken_out_and_used(pypiserver: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = pypiserver
    wheel = make_wheel(tmp_path / "dist", "wm-remote", "5.0", tag=ANY)
    with_credentials = url.replace("http://", f"http://{USER}:{PASSWORD}@")
    result = publish(
        with_credentials, wheel, extra={"WHEELMILL_PUBLISH_USERNAME": "", "WHEELMILL_PUBLISH_PASSWORD": ""}
    )
    assert result.returncode == 0, result.stderr
    assert f"uploaded: {wheel.name} -> {url}" in result.stdout
    assert (packages / wheel.name).read_bytes() == wheel.read_bytes()
    assert PASSWORD not in _shown(result, wheel)


@pytest.mark.parametrize(("status", "failures", "code"), [(503, 2, 0), (403, 100, 16)])
def test_a_server_that_echoes_the_credentials_shows_them_to_no_one(
    pypiserver: tuple[str, Path], tmp_path: Path, status: int, failures: int, code: int
) -> None:
    url, _packages = pypiserver
    proxy = FlakyProxy(url, failures=failures, status=status, echo=True)
    try:
        wheel = make_wheel(tmp_path / "dist", "wm-remote", "6.0", tag=ANY)
        result = publish(proxy.url, wheel, extra={"WHEELMILL_RETRIES": "3"})
        assert result.returncode == code, result.stdout + result.stderr
        shown = _shown(result, wheel)
        assert "we got" in shown, "the server's page was seen (and masked), not dropped"
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        assert PASSWORD not in shown and token not in shown, shown[-2000:]
        if code:
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith("wheelmill: error: ")
    finally:
        proxy.close()
