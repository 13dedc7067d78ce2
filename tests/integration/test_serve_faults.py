"""``wheelmill index serve`` against odd and hostile clients, over real sockets: unknown
projects are 404 before any redirect (only a project that exists is redirected to its
normalized page), odd request targets get a status (never a traceback), idle connections are closed and
one client's connections are bounded, and PEP 691's ``latest`` types are served."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.channels import tree_channel
from tests.ports import free_port
from tests.wheels import make_wheel
from wheelmill.index.pages import JSON_TYPE
from wheelmill.index.roots import publish

pytestmark = pytest.mark.integration


class Server:
    def __init__(self, root: Path, *args: str) -> None:
        self.port = free_port()
        env = {**os.environ, "WHEELMILL_INDEX_ROOT": str(root)}
        command = [sys.executable, "-m", "wheelmill", "index", "serve", "--port", str(self.port), *args]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("the server did not start")

    def get(self, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        response.read()
        connection.close()
        return response

    def raw(self, request: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(request)
            return sock.recv(4096)

    def stop(self) -> str:
        self.process.terminate()
        _out, err = self.process.communicate(timeout=30)
        return err


@pytest.fixture
def index(tmp_path: Path) -> Path:
    root = tmp_path / "index"
    publish(tree_channel(root, "cpu"), make_wheel(tmp_path, "wm-lib", "1.0", tag="py3-none-any"))
    return root


@pytest.fixture
def server(index: Path) -> Iterator[Server]:
    served = Server(index)
    yield served
    assert "Traceback" not in served.stop()


@pytest.mark.parametrize(
    "path",
    ["/cpu/simple/no-such/", "/cpu/simple/No_Such/", "/cpu/simple/no_such", "/nochannel/simple", "/cpu/simple/no-such"],
)
def test_an_unknown_project_or_channel_is_404_without_a_redirect(server: Server, path: str) -> None:
    response = server.get(path)
    assert response.status == 404 and response.getheader("Location") is None


@pytest.mark.parametrize("path", ["/cpu/simple/WM_Lib/", "/cpu/simple/WM_Lib", "/cpu/simple/wm-lib"])
def test_a_project_that_exists_is_redirected_to_its_normalized_page(server: Server, path: str) -> None:
    response = server.get(path)
    assert response.status == 301 and response.getheader("Location") == "/cpu/simple/wm-lib/"
    assert server.get("/cpu/simple/wm-lib/").status == 200


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"GET * HTTP/1.1", b"400"),
        (b"GET /cpu/simple/" + b"a" * 300 + b"/ HTTP/1.1", b"404"),
        (b"GET /cpu/files/" + b"b" * 5000 + b" HTTP/1.1", b"404"),
        (b"GET /blobs/sha256/" + b"0" * 64 + b"/" + b"b" * 5000 + b" HTTP/1.1", b"404"),
    ],
)
def test_odd_request_targets_get_a_status(server: Server, request_line: bytes, status: bytes) -> None:
    answer = server.raw(request_line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.split(b" ")[1] == status, answer[:200]
    assert server.get("/cpu/simple/wm-lib/").status == 200, "the server goes on serving"


def test_pep691_latest_is_the_newest_version(server: Server) -> None:
    response = server.get("/cpu/simple/wm-lib/", {"Accept": "application/vnd.pypi.simple.latest+json"})
    assert response.status == 200 and response.getheader("Content-Type") == JSON_TYPE


def test_idle_connections_are_closed_and_one_client_cannot_hold_them_all(index: Path) -> None:
    served = Server(index, "--idle-timeout", "1", "--per-client", "4")
    try:
        idle = [socket.create_connection(("127.0.0.1", served.port), timeout=10) for _ in range(4)]
        time.sleep(0.3)
        refused = served.raw(b"GET /cpu/simple/ HTTP/1.1\r\nHost: x\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 503"), refused
        for sock in idle:  # the server closes each once it has been idle for a second
            assert sock.recv(1) == b""
            sock.close()
        time.sleep(0.2)
        assert served.get("/cpu/simple/").status == 200, "their places are free again"
    finally:
        assert "Traceback" not in served.stop()
