"""The access log of a served index: one JSON object a request, a line each, written by
``wheelmill index serve --access-log`` and by nginx's ``wheelmill_wants`` format
(deploy/nginx-index.conf, deploy/nginx-bucket.conf), read by ``wheelmill wants``:

    {"time": "2026-11-22T13:05:01.123456Z", "method": "GET", "path": "/cu130/simple/torchsort/",
     "status": 200, "ua": "pip/24.2 {...}", "bytes": 1234}

``time`` is RFC 3339 (UTC from ``index serve``; nginx's ``$time_iso8601`` carries its
offset), ``path`` the request's path as sent, without its query, ``ua`` the User-Agent
("" where none was sent), ``bytes`` the body's bytes sent. No client address is kept: what
the log is read for is what was asked, never who asked.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

KEYS = ("time", "method", "path", "status", "ua", "bytes")  # in the order a line has them


@dataclass(frozen=True, kw_only=True)
class Request:
    """One line of the log."""

    time: str
    method: str
    path: str  # as sent (percent-encoded), its query removed
    status: int
    ua: str  # the User-Agent; "" where none was sent
    sent: int | None = None  # the body's bytes sent; None where the line does not say

    def as_line(self) -> str:
        """The request as a line of the log, its newline included."""
        data = {"time": self.time, "method": self.method, "path": self.path, "status": self.status, "ua": self.ua}
        return json.dumps({**data, "bytes": self.sent}, separators=(",", ":")) + "\n"


def path_of(target: str) -> str:
    """The path a request target names, without its query: nginx's ``$request_uri`` keeps
    the query, and a target in absolute form (``http://host/cpu/simple/``) names a path too.

    >>> path_of("/cu130/simple/torch/?format=application/vnd.pypi.simple.v1+json")
    '/cu130/simple/torch/'
    >>> path_of("http://wheels.internal/cpu/simple/?x=1"), path_of("http://h")
    ('/cpu/simple/', '/')
    """
    if target.startswith("/"):
        return target.partition("?")[0]
    try:
        return urllib.parse.urlsplit(target).path or "/"
    except ValueError:  # a malformed port or IPv6 literal: the target as it came
        return target.partition("?")[0]


def parse_request(line: str) -> Request | None:
    """The request a line of the log records; None where it records none (a line of
    another format, a cut line, anything else).

    >>> parse_request('{"time":"t","method":"GET","path":"/cpu/simple/?x=1","status":"404","ua":"pip/24.2"}')
    Request(time='t', method='GET', path='/cpu/simple/', status=404, ua='pip/24.2', sent=None)
    >>> parse_request('127.0.0.1 - - [22/Nov/2026:13:05:01 +0000] "GET / HTTP/1.1" 200 12') is None
    True
    """
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    method, path, status = data.get("method"), data.get("path"), _number(data.get("status"))
    if not isinstance(method, str) or not isinstance(path, str) or status is None:
        return None
    ua = data.get("ua")
    return Request(
        time=str(data.get("time", "")),
        method=method,
        path=path_of(path),
        status=status,
        ua=ua if isinstance(ua, str) else "",
        sent=_number(data.get("bytes")),
    )


def _number(value: Any) -> int | None:
    """A whole number as JSON has it, or as a string of digits (nginx writes what it is given)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
