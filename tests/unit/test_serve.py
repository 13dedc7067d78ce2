"""``wheelmill index serve`` and the absolute form of a request target (RFC 9112 section
3.2.2: ``GET http://host/cpu/simple/demo/ HTTP/1.1``, which a server must accept): an http or
https target is served as the path it names, whatever its host; another scheme is 404; no
spelling of a path reaches outside the root. A real server on 127.0.0.1 (the one the command
starts, in a thread), spoken to over a raw socket."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.channels import stored_file, tree_channel
from tests.wheels import make_wheel
from wheelmill.index.roots import publish
from wheelmill.index.serve import IndexServer, make_server

SECRET = b"outside the index root"
WHEEL = "demo-1.0-py3-none-any.whl"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An index tree with demo 1.0 in its cpu channel, and a secret beside the tree."""
    tmp_path = tmp_path_factory.mktemp("served")
    root = tmp_path / "index"
    publish(tree_channel(root, "cpu"), make_wheel(tmp_path / "wheels", "demo", "1.0", tag="py3-none-any"))
    (tmp_path / "secret.txt").write_bytes(SECRET)
    yield root
    shutil.rmtree(tmp_path)


@pytest.fixture(scope="module")
def blob(tree: Path) -> str:
    """The path the pages link demo's wheel by: its blob, ``/blobs/sha256/<hex>/<name>``."""
    return "/" + stored_file(tree_channel(tree, "cpu"), WHEEL).relative_to(tree).as_posix()


@pytest.fixture(scope="module")
def server(tree: Path) -> Iterator[IndexServer]:
    served = make_server(tree, "127.0.0.1", 0)
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    yield served
    served.shutdown()
    served.server_close()
    thread.join(timeout=10)


def ask(server: IndexServer, target: str, host: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of one GET of ``target``, sent as it is."""
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    answer = b""
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10) as sock:
        sock.sendall(request)
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split(" ")[1]), headers, body


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1/cpu/simple/demo/",
        "HTTP://127.0.0.1/cpu/simple/demo/",  # schemes are case-insensitive (RFC 3986 3.1)
        "https://127.0.0.1:443/cpu/simple/demo/",
        "http://index.internal/cpu/simple/demo/",  # the host is not looked at: one tree
        "http://user@127.0.0.1/cpu/simple/demo/",
    ],
)
def test_an_absolute_http_target_is_the_path_it_names(server: IndexServer, target: str) -> None:
    expected = ask(server, "/cpu/simple/demo/")
    assert expected[0] == 200 and b"demo-1.0-py3-none-any.whl" in expected[2]
    status, headers, body = ask(server, target)
    assert (status, body) == (200, expected[2])
    assert headers["content-type"] == expected[1]["content-type"]


def test_an_absolute_target_keeps_its_query_files_and_redirects(server: IndexServer, blob: str) -> None:
    json_type = "application/vnd.pypi.simple.v1+json"
    status, headers, page = ask(server, f"http://127.0.0.1/cpu/simple/demo/?format={json_type}")
    assert (status, headers["content-type"]) == (200, json_type)
    assert f'"../../..{blob}"'.encode() in page, "the page links the file by its blob, relative to the page"
    status, _, body = ask(server, f"http://127.0.0.1{blob}")
    assert status == 200 and body.startswith(b"PK")
    status, headers, _ = ask(server, "http://127.0.0.1/cpu/simple/Demo")
    assert (status, headers["location"]) == (301, "/cpu/simple/demo/")
    assert ask(server, "http://127.0.0.1")[0] == 200  # the root: the list of channels


@pytest.mark.parametrize(
    "target",
    [
        "file:///etc/passwd",
        "file://127.0.0.1/cpu/simple/demo/",
        "ftp://127.0.0.1/cpu/simple/demo/",
        "gopher://127.0.0.1/cpu/simple/demo/",
    ],
)
def test_another_scheme_names_nothing_here(server: IndexServer, target: str) -> None:
    status, _, body = ask(server, target)
    assert (status, body) == (404, b"not found")


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1/../../etc/passwd",
        "http://127.0.0.1/../secret.txt",
        "http://127.0.0.1/cpu/../../secret.txt",
        "http://127.0.0.1/%2e%2e/%2e%2e/etc/passwd",
        "http://127.0.0.1/%2E%2E/secret.txt",
        "http://127.0.0.1/cpu/files/..%2f..%2fsecret.txt",
        "http://127.0.0.1/cpu/files/%2e%2e%2f%2e%2e%2fsecret.txt",
        "http://127.0.0.1/cpu/files/%2fetc%2fpasswd",
        "http://127.0.0.1/blobs/sha256/..%2f..%2f..%2fsecret.txt",
        f"http://127.0.0.1/blobs/sha256/{'0' * 64}/..%2f..%2f..%2f..%2fsecret.txt",
        f"http://127.0.0.1/blobs/sha256/{'0' * 64}/%2e%2e",
        "http://127.0.0.1/blobs/sha256/../../../secret.txt",
        "http://127.0.0.1//etc/passwd",
        "http://127.0.0.1/cpu/simple/..%5c..%5csecret.txt/",
        "/../secret.txt",
        "/cpu/files/..%2f..%2fsecret.txt",
        "/blobs/sha256/%2e%2e/%2e%2e/%2e%2e/secret.txt",
    ],
)
def test_no_spelling_of_a_path_reaches_outside_the_root(server: IndexServer, target: str) -> None:
    status, _, body = ask(server, target)
    assert status == 404, (target, status)
    assert SECRET not in body and b"root:" not in body


@pytest.mark.parametrize("target", ["*", "http:/cpu/simple/demo/", "http:///cpu/simple/demo/", "http://[::1/cpu/"])
def test_a_target_that_names_no_resource_is_a_bad_request(server: IndexServer, target: str) -> None:
    assert ask(server, target)[0] == 400
    assert ask(server, "http://127.0.0.1/cpu/simple/demo/")[0] == 200, "the server goes on serving"
