"""A pass-through HTTP proxy in front of the test S3 server that can kill its client.

Every request goes on to the server as it came (method, path and query, headers with the
``Host`` the client signed, the body's bytes, chunked or not), so SigV4 signatures still
verify; the proxy counts the requests. Armed with a request number and a process, it
SIGKILLs that process before it forwards that request and drops the connection instead of
answering: the server saw each of the requests before it, and none from it on. That is a
writer dying between any two of its requests, each in turn. Only on 127.0.0.1, stdlib only.
"""

from __future__ import annotations

import http.client
import http.server
import io
import os
import signal
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from email.message import Message

# Hop-by-hop headers: they describe one connection, not the request, and SigV4 signs none
# of them. Transfer-Encoding stays: a chunked body is forwarded as the raw chunks it came in.
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade", "expect"})
AIM_WAIT = 30.0  # seconds the armed request waits for the test to name the process it kills


@dataclass
class _Arming:
    """What the proxy counts and whom it kills; guarded by ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0
    kill_at: int | None = None
    victim: int | None = None
    aimed: threading.Event = field(default_factory=threading.Event)
    killed: bool = False


class S3Proxy:
    """Forwards to ``upstream`` (``http://127.0.0.1:<port>``); ``url`` is where clients go."""

    def __init__(self, upstream: str) -> None:
        parts = urllib.parse.urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"{upstream}: an http://host:port endpoint")
        self.upstream = (parts.hostname, parts.port)
        self.state = _Arming()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def count(self) -> int:
        """Requests seen since the last ``arm``."""
        with self.state.lock:
            return self.state.count

    @property
    def killed(self) -> bool:
        with self.state.lock:
            return self.state.killed

    def arm(self, kill_at: int | None = None) -> None:
        """Count from zero again; with ``kill_at``, kill the process ``aim`` names at that request."""
        with self.state.lock:
            self.state.count, self.state.kill_at, self.state.victim, self.state.killed = 0, kill_at, None, False
            self.state.aimed.clear()

    def aim(self, pid: int) -> None:
        """The process to kill (known once started, so after ``arm``: the request waits for it)."""
        with self.state.lock:
            self.state.victim = pid
        self.state.aimed.set()

    def admit(self) -> bool:
        """Whether the request just arrived goes on to the server; the armed one kills first,
        and after it nothing goes on (another thread of the dead process may have been
        sending one already)."""
        with self.state.lock:
            self.state.count += 1
            number, kill_at = self.state.count, self.state.kill_at
        if kill_at is None or number < kill_at:
            return True
        if number == kill_at:
            self.state.aimed.wait(AIM_WAIT)
            with self.state.lock:
                victim = self.state.victim
                self.state.killed = victim is not None
            if victim is not None:
                with suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
        return False

    @contextmanager
    def running(self) -> Iterator[S3Proxy]:
        thread = threading.Thread(target=self.server.serve_forever, name="s3proxy", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join(timeout=10)


def _handler(proxy: S3Proxy) -> type[http.server.BaseHTTPRequestHandler]:
    class Forwarding(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the SDK expects, and Expect: 100-continue answered

        def forward(self) -> None:
            body = self._body()
            if not proxy.admit():
                self.close_connection = True  # no answer: the client is dead
                return
            status, reason, headers, answer = _sent_on(proxy.upstream, self.command, self.path, self.headers, body)
            self.send_response_only(status, reason)
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer)

        def _body(self) -> bytes:
            """The body's bytes as sent: ``Content-Length`` of them, or the raw chunked stream."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                return _raw_chunks(self.rfile)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: a test's output is its assertions."""

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward  # noqa: N815 - http.server's names

    return Forwarding


def _raw_chunks(stream: io.BufferedIOBase) -> bytes:
    """A chunked body up to and with its last chunk and trailers, byte for byte."""
    raw = bytearray()
    while True:
        line = stream.readline()
        raw += line
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        raw += stream.read(size + 2)  # the chunk and its CRLF
    while True:  # trailers, then the empty line
        line = stream.readline()
        raw += line
        if line in (b"\r\n", b"\n", b""):
            return bytes(raw)


def _sent_on(
    upstream: tuple[str, int], method: str, path: str, headers: Message, body: bytes
) -> tuple[int, str, list[tuple[str, str]], bytes]:
    """The request to the server on a connection of its own; its answer, read whole."""
    connection = http.client.HTTPConnection(*upstream, timeout=120)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            if name.lower() not in _HOP:
                connection.putheader(name, value)
        connection.putheader("Connection", "close")
        connection.endheaders()
        if body:
            connection.send(body)
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    kept = [(n, v) for n, v in response.getheaders() if n.lower() not in _HOP | {"transfer-encoding"}]
    if method != "HEAD" and response.status not in (204, 304) and response.status >= 200:
        kept = [(n, v) for n, v in kept if n.lower() != "content-length"] + [("Content-Length", str(len(answer)))]
    return response.status, response.reason, kept, answer
