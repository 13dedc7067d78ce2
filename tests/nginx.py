"""What the tests need to run nginx with the configs in deploy/ and ask it: the njs module
that negotiates the simple API's format, the one table of Accept headers every server of
the index is held to (tests/data/accept.toml), and a GET that returns any status."""

from __future__ import annotations

import tomllib
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
NJS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")  # Debian's libnginx-mod-http-js


def main_context() -> str:
    """The lines a test's own nginx.conf starts with to load the njs module; skips where it
    is not installed."""
    if not NJS_MODULE.is_file():
        pytest.skip("nginx's njs module is not installed (scripts/setup --system installs it)")
    return f"load_module {NJS_MODULE};\n"


@dataclass(frozen=True)
class AcceptCase:
    accept: str | None  # the Accept header, or none sent
    format: str | None  # the ?format= query as sent, or none
    chosen: str | None  # the media type answered, or None for 406

    @property
    def query(self) -> str:
        return "" if self.format is None else f"?format={self.format}"

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.accept is None else {"Accept": self.accept}


def accept_cases() -> list[AcceptCase]:
    table = tomllib.loads((ROOT / "tests" / "data" / "accept.toml").read_text())
    return [
        AcceptCase(
            accept=case.get("accept"),
            format=case.get("format"),
            chosen=None if case["chosen"] == "406" else case["chosen"],
        )
        for case in table["case"]
    ]


# The Content-Type each chosen format is answered with.
CONTENT_TYPES = {
    "application/vnd.pypi.simple.v1+json": "application/vnd.pypi.simple.v1+json",
    "application/vnd.pypi.simple.v1+html": "application/vnd.pypi.simple.v1+html",
    "text/html": "text/html; charset=utf-8",
}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Message  # names in any case; get_all() for a header sent more than once
    body: bytes


def get(url: str, headers: Mapping[str, str] | None = None, method: str = "GET") -> Answer:
    request = urllib.request.Request(url, headers=dict(headers or {}), method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, response.headers, response.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.headers, exc.read())
