"""``wheelmill index serve``: a read-only HTTP server over the index tree.

PEP 691 content negotiation (the Accept header, ``?format=`` as a fallback, the ``latest``
aliases), the simple API's content types, 404 for anything unknown (decided before any
redirect, so a client never follows one to a 404), single byte ranges (resolvers read wheel
metadata that way), and no path outside the root: every request is mapped onto the kinds of
URL the tree has (pages, a channel's files, the content-addressed blobs a channel written
as objects links to, ``wheelmill.index.objects``, and the coverage page with the logs' ends of
failed builds it links to, ``wheelmill.releases.coverage_page``) and nothing else.

What one client can hold is bounded: an idle connection is closed after a timeout, and a
client with too many connections open gets 503 on the next. A request the server cannot
make sense of gets a status, never a traceback.

The access log is one JSON line a request (``wheelmill.index.access_log``: no client
address), what ``wheelmill wants`` reads; a log that cannot be written is said once on
stderr and never stops the serving.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, ClassVar

from packaging.utils import canonicalize_name

from wheelmill.index.access_log import Request, parse_request, path_of
from wheelmill.index.channels import COVERAGE_DIR, COVERAGE_FILES, RECORDS_DIR, TRACK_DIRS, channel_names, now_rfc3339
from wheelmill.index.limits import IDLE_TIMEOUT, PER_CLIENT
from wheelmill.index.pages import HTML_TYPE, JSON_TYPE
from wheelmill.inputs.versions import Track

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,254}$")  # a file name: 255 bytes at most
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")  # RFC 3986's scheme
_TRACKS = frozenset(t.value for t in Track)
LOG_TYPE = "text/plain; charset=utf-8"  # a failed build's log's end, as the coverage page links it
CHUNK = 1 << 20
# In the server's order of preference when the client accepts several equally.
OFFERED = (JSON_TYPE, HTML_TYPE, "text/html")
# PEP 691: "latest" is whichever version of the API the server serves newest.
_LATEST = {"application/vnd.pypi.simple.latest+json": JSON_TYPE, "application/vnd.pypi.simple.latest+html": HTML_TYPE}


def negotiate(accept: str | None, fmt: str | None) -> str | None:
    """The media type to answer with, or None (406).

    >>> negotiate(None, None), negotiate("application/vnd.pypi.simple.v1+json, text/html;q=0.1", None)
    ('text/html', 'application/vnd.pypi.simple.v1+json')
    >>> negotiate("text/html", "application/vnd.pypi.simple.v1+json"), negotiate("image/png", None)
    ('application/vnd.pypi.simple.v1+json', None)
    """
    if fmt:
        fmt = _LATEST.get(fmt, fmt)
        return fmt if fmt in OFFERED else None
    if not accept:
        return "text/html"
    ranked: list[tuple[float, int, str]] = []
    for position, part in enumerate(accept.split(",")):
        media, *params = [p.strip() for p in part.split(";")]
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if quality > 0:
            ranked.append((-quality, position, _LATEST.get(media.lower(), media.lower())))
    for _quality, _position, media in sorted(ranked):
        for offered in OFFERED:
            if media in (offered, "*/*") or (media.endswith("/*") and offered.startswith(media[:-1])):
                return offered
    return None


def query_format(query: str) -> str | None:
    """The ``format=`` a query asks for, or None.

    >>> query_format("format=application/vnd.pypi.simple.v1+json"), query_format("format=text%2Fhtml&x=1")
    ('application/vnd.pypi.simple.v1+json', 'text/html')
    """
    fmt = urllib.parse.parse_qs(query).get("format", [None])[0]
    # A raw "+" in a query reads as a space; media types have none, so put it back.
    return fmt.replace(" ", "+") if fmt else None


def request_target(target: str) -> tuple[str, str] | HTTPStatus:
    """The path and query a request target names, or the status that refuses it.

    The origin form (``/cpu/simple/``) is the path itself; the absolute form
    (``http://host/cpu/simple/``), which RFC 9112 section 3.2.2 says a server must accept,
    names the same path where its scheme is http or https. Its host is not looked at: the
    server serves one tree by whatever name it is reached, as it ignores the Host header,
    and it never forwards a request (it is no proxy). Another scheme (``file:``) names
    nothing here: 404. Anything else (``*``, an http URI with no host) is 400.

    >>> request_target("/cpu/simple/?format=x"), request_target("HTTP://other.host:8080/cpu/simple/demo/")
    (('/cpu/simple/', 'format=x'), ('/cpu/simple/demo/', ''))
    >>> request_target("//cpu/simple/"), request_target("http://h"), request_target("http://h?x=1")
    (('//cpu/simple/', ''), ('/', ''), ('/', 'x=1'))
    >>> [int(request_target(t)) for t in ("file:///etc/passwd", "ftp://h/cpu/", "*", "http:/cpu/", "cpu")]
    [404, 404, 400, 400, 400]
    """
    if target.startswith("/"):
        path, _, query = target.partition("?")  # not urlsplit: "//x/" would read as a host
        return path, query
    scheme = _SCHEME.match(target)
    if scheme is None:
        return HTTPStatus.BAD_REQUEST
    if scheme.group(1).lower() not in ("http", "https"):
        return HTTPStatus.NOT_FOUND
    try:
        url = urllib.parse.urlsplit(target)
        host = url.hostname
    except ValueError:  # a malformed port or IPv6 literal
        return HTTPStatus.BAD_REQUEST
    if not host or url.fragment:  # RFC 9110 4.2.1: an http URI without a host is invalid
        return HTTPStatus.BAD_REQUEST
    return url.path or "/", url.query


def _is_log_end(top: str, track: str, name: str) -> bool:
    """Whether ``releases/<track>/<version>/failed/<cell>/<name>`` is a failed build's log's
    end (``<stamp>.log``), the one kind of object of the release records that is served."""
    return top == RECORDS_DIR and track in _TRACKS and name.endswith(".log")


@dataclass(frozen=True, kw_only=True)
class Target:
    path: Path
    content_type: str
    vary: bool = False


class IndexHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "wheelmill-index"
    root: ClassVar[Path]
    access_log: ClassVar[IO[str] | None] = None
    log_lock: ClassVar[threading.Lock] = threading.Lock()
    log_failed: ClassVar[bool] = False  # said once on stderr: a full disk would say it each request

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        try:
            self._respond(body=body)
        except OSError as exc:  # the client went away, or a name the file system refuses
            if isinstance(exc, BrokenPipeError | ConnectionResetError | TimeoutError):
                self.close_connection = True
            else:
                self._status(HTTPStatus.NOT_FOUND, "not found", body=body)

    def do_POST(self) -> None:
        self._status(HTTPStatus.METHOD_NOT_ALLOWED, "read-only index", {"Allow": "GET, HEAD"}, body=True)

    do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815 - http.server's method naming

    def _respond(self, *, body: bool) -> None:
        target = request_target(self.path)
        if isinstance(target, HTTPStatus):
            self._status(target, "not found" if target is HTTPStatus.NOT_FOUND else "bad request target", body=body)
            return
        path, raw_query = target
        segments = [urllib.parse.unquote(s) for s in path.split("/")[1:]]
        if segments == [""]:
            self._channels(body=body)
            return
        if any(s in ("", ".", "..") or s.startswith(".") for s in segments[:-1]) or (segments[-1].startswith(".")):
            self._status(HTTPStatus.NOT_FOUND, "not found", body=body)
            return
        if not all(_SEGMENT.match(s) for s in segments if s):
            self._status(HTTPStatus.NOT_FOUND, "not found", body=body)
            return
        self._route(segments, query_format(raw_query), body=body)

    def _route(self, segments: list[str], fmt: str | None, *, body: bool) -> None:
        if segments[0] in (COVERAGE_DIR, RECORDS_DIR):  # no channel is named either (RESERVED)
            self._coverage(segments, body=body)
            return
        if len(segments) > 2 and segments[0] in TRACK_DIRS:  # test/cu118/simple/... is one channel
            segments = [f"{segments[0]}/{segments[1]}", *segments[2:]]
        match segments:
            case [channel, "simple", ""]:
                self._simple(self.root / channel / "simple", fmt, body=body)
            case [channel, "simple", project, ""] if canonicalize_name(project) == project:
                self._simple(self.root / channel / "simple" / project, fmt, body=body)
            case [channel, "simple", project, ""]:
                # PEP 503: a repository MAY redirect another spelling to the normalized name;
                # an unknown project is a 404 first.
                normalized = canonicalize_name(project)
                self._slash(self.root / channel / "simple" / normalized, f"/{channel}/simple/{normalized}/", body=body)
            case [channel, "simple"]:
                self._slash(self.root / channel / "simple", f"/{channel}/simple/", body=body)
            case [channel, "simple", project]:
                normalized = canonicalize_name(project)
                self._slash(self.root / channel / "simple" / normalized, f"/{channel}/simple/{normalized}/", body=body)
            case [channel, "files", filename]:
                self._file(self.root / channel / "files" / filename, body=body)
            case ["blobs", "sha256", digest, filename] if _SHA256.match(digest):  # a channel written as objects
                self._file(self.root / "blobs" / "sha256" / digest / filename, body=body)
            case _:
                self._status(HTTPStatus.NOT_FOUND, "not found", body=body)

    def _coverage(self, segments: list[str], *, body: bool) -> None:
        """The coverage page's files, and of the release records only the logs' ends it links to."""
        page = self.root / COVERAGE_DIR
        match segments:
            case [top, name] if top == COVERAGE_DIR and (name or "index.html") in COVERAGE_FILES:
                name = name or "index.html"
                self._send_file(Target(path=page / name, content_type=COVERAGE_FILES[name]), body=body)
            case [top] if top == COVERAGE_DIR and (page / "index.html").is_file():
                self._status(HTTPStatus.MOVED_PERMANENTLY, "see /coverage/", {"Location": "/coverage/"}, body=body)
            case [top, track, version, "failed", cell, log] if _is_log_end(top, track, log):
                path = self.root / top / track / version / "failed" / cell / log
                self._send_file(Target(path=path, content_type=LOG_TYPE), body=body)
            case _:
                self._status(HTTPStatus.NOT_FOUND, "not found", body=body)

    def _simple(self, directory: Path, fmt: str | None, *, body: bool) -> None:
        chosen = negotiate(self.headers.get("Accept"), fmt)
        if chosen is None:
            self._status(
                HTTPStatus.NOT_ACCEPTABLE, f"this index serves {', '.join(OFFERED)}", {"Vary": "Accept"}, body=body
            )
            return
        page = directory / ("index.json" if chosen == JSON_TYPE else "index.html")
        content_type = chosen if chosen != "text/html" else "text/html; charset=utf-8"
        self._send_file(Target(path=page, content_type=content_type, vary=True), body=body)

    def _file(self, path: Path, *, body: bool) -> None:
        self._send_file(Target(path=path, content_type="application/octet-stream"), body=body)

    def _send_file(self, target: Target, *, body: bool) -> None:
        path = target.path
        if not path.is_file() or not path.resolve().is_relative_to(self.root.resolve()):
            self._status(HTTPStatus.NOT_FOUND, "not found", {"Vary": "Accept"} if target.vary else None, body=body)
            return
        size = path.stat().st_size
        span = self._range(size)
        if span == "invalid":
            self._status(
                HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                "range not satisfiable",
                {"Content-Range": f"bytes */{size}"},
                body=body,
            )
            return
        partial = isinstance(span, tuple)
        start, end = span if isinstance(span, tuple) else (0, size - 1)
        status = HTTPStatus.PARTIAL_CONTENT if partial else HTTPStatus.OK
        self.send_response(status)
        self.send_header("Content-Type", target.content_type)
        self.send_header("Content-Length", str(max(0, end - start + 1)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", self.date_time_string(path.stat().st_mtime))
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        if target.vary:
            self.send_header("Vary", "Accept")
            self.send_header("Cache-Control", "max-age=60")
        self.end_headers()
        sent = self._copy(path, start, end) if body and size else 0
        self._log_access(int(status), sent)

    def _range(self, size: int) -> tuple[int, int] | str | None:
        """The single byte range asked for, None for the whole file, "invalid" for 416."""
        header = self.headers.get("Range")
        match = _RANGE.match(header.strip()) if header else None
        if not header or not match or not (match.group(1) or match.group(2)):
            return None  # absent, multi-range or malformed: send the whole file (RFC 9110)
        first, last = match.groups()
        if not first:  # a suffix: the last N bytes
            length = int(last)
            return (max(0, size - length), size - 1) if length and size else "invalid"
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
        return (start, end) if start < size and start <= end else "invalid"

    def _copy(self, path: Path, start: int, end: int) -> int:
        sent = 0
        with path.open("rb") as f:
            f.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = f.read(min(CHUNK, remaining))
                if not chunk:
                    break
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += len(chunk)
                remaining -= len(chunk)
        return sent

    def _channels(self, *, body: bool) -> None:
        channels = channel_names(self.root) if self.root.is_dir() else []
        links = "".join(f'<a href="{c}/simple/">{c}</a><br>\n' for c in channels)
        page = f"<!DOCTYPE html>\n<html><body><h1>wheelmill index</h1>\n{links}</body></html>\n"
        self._status(HTTPStatus.OK, page, {"Content-Type": "text/html; charset=utf-8"}, body=body)

    def _slash(self, directory: Path, location: str, *, body: bool) -> None:
        """A page asked for by another spelling, or without its trailing slash: where it
        is, if it exists, else 404."""
        if (directory / "index.json").is_file():
            self._status(HTTPStatus.MOVED_PERMANENTLY, f"see {location}", {"Location": location}, body=body)
        else:
            self._status(HTTPStatus.NOT_FOUND, "not found", body=body)

    def _status(self, status: HTTPStatus, text: str, headers: dict[str, str] | None = None, *, body: bool) -> None:
        data = text.encode()
        self.send_response(status)
        extra = dict(headers or {})
        self.send_header("Content-Type", extra.pop("Content-Type", "text/plain; charset=utf-8"))
        self.send_header("Content-Length", str(len(data)))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)
        self._log_access(int(status), len(data) if body else 0)

    def _log_access(self, status: int, sent: int) -> None:
        """The request's line, with the bytes really sent (what the tests measure); its
        writes one at a time, whatever the threads. A write that fails (a full disk, a
        closed file) loses the line, never the answer."""
        if self.access_log is None:
            return
        line = Request(
            time=now_rfc3339(),
            method=self.command,
            path=path_of(self.path),
            status=status,
            ua=self.headers.get("User-Agent", ""),
            sent=sent,
        ).as_line()
        with self.log_lock:
            try:
                self.access_log.write(line)
                self.access_log.flush()
            except (OSError, ValueError) as exc:  # ValueError: the file was closed
                self._log_failing(exc)

    def _log_failing(self, exc: Exception) -> None:
        if type(self).log_failed:
            return
        type(self).log_failed = True
        print(
            f"wheelmill index serve: the access log cannot be written ({exc}); serving on", file=sys.stderr, flush=True
        )

    def log_message(self, format: str, *args: object) -> None:
        """Silence the default stderr log: the access log is written by ``_log_access``."""


class IndexServer(ThreadingHTTPServer):
    """A thread per connection, at most ``per_client`` of them for one client address (the
    next gets 503 at once); a failed request is one line on stderr, never a traceback."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, per_client: int) -> None:
        super().__init__(address, handler)
        self.per_client = per_client
        self._open: Counter[str] = Counter()
        self._counting = threading.Lock()

    def log_to(self, access_log: IO[str]) -> None:
        """Append each request's line to ``access_log`` from now on (opened once it listens:
        an address it cannot take leaves no log file behind)."""
        handler = self.RequestHandlerClass
        assert isinstance(handler, type), "make_server binds a handler class"
        assert issubclass(handler, IndexHandler), "make_server binds an IndexHandler"
        handler.access_log = access_log

    def process_request(self, request: Any, client_address: Any) -> None:
        host = str(client_address[0])
        with self._counting:
            full = self._open[host] >= self.per_client
            self._open[host] += 0 if full else 1
        if full:
            with contextlib.suppress(OSError):
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._counting:
                self._open[str(client_address[0])] -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: ARG002 - socketserver's signature
        error = sys.exc_info()[1]
        print(
            f"wheelmill index serve: {client_address[0]}: {type(error).__name__}: {error}", file=sys.stderr, flush=True
        )


def make_server(
    root: Path,
    host: str,
    port: int,
    access_log: IO[str] | None = None,
    *,
    idle_timeout: float = IDLE_TIMEOUT,
    per_client: int = PER_CLIENT,
) -> IndexServer:
    attributes = {"root": root.resolve(), "access_log": access_log, "timeout": idle_timeout}
    handler = type("BoundIndexHandler", (IndexHandler,), attributes)
    return IndexServer((host, port), handler, per_client=per_client)


def parse_access_log(lines: Sequence[str]) -> list[tuple[str, int, int]]:
    """(path, status, bytes) of every request in an access log."""
    found = (parse_request(line) for line in lines)
    return [(request.path, request.status, request.sent or 0) for request in found if request is not None]
