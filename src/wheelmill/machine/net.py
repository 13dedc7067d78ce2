"""HTTP downloads and package-index queries, with failures sorted into transient or not.

Connection errors, timeouts, 5xx, 408 and 429 are transient (``TransientError``: the
caller's retry policy decides); 404 and other 4xx are final (``FetchError``); a sha256
mismatch is an ``IntegrityError`` and the bad bytes are deleted, never kept. Asked for a
project's page, an index that answers 404 or 410 does not have it; one that answers 401 or
403 refused to say, which is an error, never "not there".
"""

from __future__ import annotations

import base64
import hashlib
import html.parser
import io
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPMessage
from pathlib import Path
from typing import IO, Any, BinaryIO

from packaging.utils import canonicalize_name

from wheelmill.errors import FetchError, IntegrityError
from wheelmill.files import atomic_path
from wheelmill.retry import TransientError

TIMEOUT = 60.0
CHUNK = 1 << 20
# A project's page: PyPI's torch page, the largest an index here reads, is a few MB of JSON.
PAGE_LIMIT = 64 << 20
# A small file read whole into memory (a provenance: a few envelopes of some KB each).
SMALL_FILE_LIMIT = 16 << 20
_ABSENT_STATUS = {404, 410}
PEP691_JSON = "application/vnd.pypi.simple.v1+json"
_TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}
# Output of a failed command (uv, git) that means "try again later", not "this cannot work".
_TRANSIENT = (
    "error sending request",
    "connection reset",
    "connection refused",
    "timed out",
    "operation timed out",
    "dns error",
    "temporary failure in name resolution",
    "server error (50",
    "status: 50",
    "status code: 50",
    "status code 50",
    "status code 429",
    "status code 408",
    "too many requests",
    "broken pipe",
)


def is_transient(output: str) -> bool:
    """Does a failed command's output say "try again later" rather than "this cannot work"?"""
    text = output.lower()
    return any(marker in text for marker in _TRANSIENT)


@dataclass(frozen=True, kw_only=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    yanked: bool = False  # PEP 592: an installer skips it unless pinned to it
    mirrored: bool = False  # a wheelmill channel's copy of an upstream file, not one it built


class _CredentialsStayHome(urllib.request.HTTPRedirectHandler):
    """urllib gives a redirect every header of the request, Authorization too, whatever host
    the redirect names: an index's credential would reach any host its answer points at. It
    is kept only for a redirect to the same scheme, host and port."""

    def redirect_request(  # noqa: PLR0917 - urllib calls it so
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and origin(newurl) != origin(req.full_url):
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_CredentialsStayHome)


def origin(url: str) -> tuple[str, str, int | None]:
    """A URL's scheme, host and port (the scheme's own where none is given).

    >>> origin("https://Wheels.example/simple/") == origin("https://wheels.example:443/x")
    True
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


def open_url(request: urllib.request.Request | str, *, timeout: float = TIMEOUT) -> urllib.response.addinfourl:
    """The one way wheelmill opens a URL: a credential it sends goes to the URL's own host alone."""
    response: urllib.response.addinfourl = _OPENER.open(request, timeout=timeout)
    return response


def _open(
    url: str, *, accept: str | None = None, auth: tuple[str, str] | None = None, timeout: float = TIMEOUT
) -> urllib.response.addinfourl:
    headers = {"User-Agent": "wheelmill"}
    if accept:
        headers["Accept"] = accept
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - http(s) and file URLs by design
    try:
        response = open_url(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise _http_error(url, exc.code, str(exc.reason)) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TransientError(f"{url}: {reason}") from None
    return response


class _Absent(FetchError):
    """A page the index says it does not have (404, 410): a project not on it. Caught where
    that is an answer (``project_files``); anywhere else, the ``FetchError`` it is."""


def _http_error(url: str, code: int, reason: str) -> Exception:
    if code in _TRANSIENT_STATUS:
        return TransientError(f"{url}: HTTP {code} {reason}")
    if code in _ABSENT_STATUS:
        return _Absent(f"{url}: HTTP {code} {reason}", fix="check the URL, or the project and version")
    if code in (401, 403):
        return FetchError(
            f"{url}: HTTP {code} {reason}: the index refused access",
            fix="give credentials the index accepts (user:token in the index URL), or check their rights",
        )
    return FetchError(f"{url}: HTTP {code} {reason}", fix="check the URL, or the project and version")


def upload_refusal(url: str, auth: tuple[str, str] | None, *, timeout: float = TIMEOUT) -> str | None:
    """How an upload endpoint refuses these credentials (``status code 403 Forbidden``), or
    None when it does not: a legacy-API upload without a file, which an index answers 401 or
    403 before it reads anything, and 400 (no file) once the credentials pass."""
    headers = {"User-Agent": "wheelmill", "Content-Type": "application/x-www-form-urlencoded"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    body = urllib.parse.urlencode({":action": "file_upload", "protocol_version": "1"}).encode()
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310 - the index's own URL
    try:
        open_url(request, timeout=timeout).close()
    except urllib.error.HTTPError as exc:
        exc.close()
        return f"status code {exc.code} {exc.reason}" if exc.code in (401, 403) else None
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return None
    return None


def download(
    url: str,
    dest: Path,
    *,
    sha256: str,
    on_progress: Callable[[int, int | None], None] | None = None,
    auth: tuple[str, str] | None = None,
    tmp_dir: Path | None = None,
) -> Path:
    """Fetch ``url`` to ``dest`` atomically and verify its sha256.

    The bytes go to a temporary file beside ``dest`` and are renamed only once verified, so
    an interrupted or corrupt download never leaves a file under the final name.
    """
    digest = hashlib.sha256()
    with atomic_path(dest, tmp_dir=tmp_dir) as tmp:
        with tmp.open("wb") as out:
            _copy_response(url, out, digest, on_progress, auth)
        actual = digest.hexdigest()
        if actual != sha256:
            raise IntegrityError(
                f"{url}: sha256 mismatch: expected {sha256}, got {actual}",
                fix="the file changed or was tampered with; check the source and update sha256 only if you trust it",
            )
    return dest


def fetch_unchecked(url: str, dest: Path) -> str:
    """Fetch ``url`` (credentials in it are sent as Basic auth, never in the request line) to
    ``dest`` and return its sha256, whatever it is: for a verifier, which says itself what a
    mismatch means."""
    bare, username, password = split_credentials(url)
    auth = (username or "", password or "") if username or password else None
    digest = hashlib.sha256()
    with atomic_path(dest) as tmp, tmp.open("wb") as out:
        _copy_response(bare, out, digest, None, auth)
    return digest.hexdigest()


def linked(page: str, href: str, *, what: str) -> str:
    """Where a page's link points, on the page's own host alone: a served page that points a
    file or its provenance at another host, or at ``file://`` (this machine's own files), is
    refused, so what the page's writer controls is what it serves.

    >>> linked("https://w.example/cu130/simple/torch/", "../../../blobs/x.whl", what="x.whl")
    'https://w.example/blobs/x.whl'
    """
    target = urllib.parse.urljoin(page, href)
    if origin(target) != origin(page):
        elsewhere = split_credentials(target)[0][:200]
        raise FetchError(
            f"{split_credentials(page)[0]}: links {what} at {elsewhere}, not on the index's own host; refused",
            fix="serve the index's files and provenance from the index's own host and port",
        )
    return target


def fetch_bytes(url: str, *, limit: int = SMALL_FILE_LIMIT) -> bytes:
    """The bytes at ``url``, held in memory (a small file: a provenance, a page), credentials
    in it sent as Basic auth; unchecked, like ``fetch_unchecked``."""
    bare, username, password = split_credentials(url)
    auth = (username or "", password or "") if username or password else None
    out = io.BytesIO()

    def bounded(done: int, _size: int | None) -> None:
        if done > limit:
            raise FetchError(f"{bare}: more than {limit >> 20} MiB; not read further", fix="check what serves it")

    _copy_response(bare, out, hashlib.sha256(), bounded, auth)
    return out.getvalue()


def _copy_response(
    url: str,
    out: BinaryIO,
    digest: hashlib._Hash,
    on_progress: Callable[[int, int | None], None] | None,
    auth: tuple[str, str] | None,
) -> None:
    with _open(url, auth=auth) as response:
        total = response.headers.get("Content-Length")
        size = int(total) if total and total.isdigit() else None
        done = 0
        try:
            while chunk := response.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                done += len(chunk)
                if on_progress:
                    on_progress(done, size)
        except (TimeoutError, ConnectionError, urllib.error.URLError) as exc:
            raise TransientError(f"{url}: connection lost after {done} bytes: {exc}") from None
        if size is not None and done != size:
            raise TransientError(f"{url}: connection closed after {done} of {size} bytes")


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``https://user:pass@host/x`` -> (``https://host/x``, user, pass), percent-decoded.

    >>> split_credentials("https://ci%40team:p%2Fss@wheels.example:8443/api/")
    ('https://wheels.example:8443/api/', 'ci@team', 'p/ss')
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    host = parts.netloc.rpartition("@")[2]
    bare = urllib.parse.urlunsplit(parts._replace(netloc=host))
    return bare, urllib.parse.unquote(parts.username or "") or None, urllib.parse.unquote(parts.password or "") or None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def project_files(
    location: str, project: str, *, flat: bool = False, auth: tuple[str, str] | None = None
) -> list[IndexFile]:
    """Files of ``project`` at an index (PEP 691 JSON or PEP 503 HTML) or, with ``flat``, a
    find-links location (a directory, or one page of links)."""
    name = canonicalize_name(project)
    if "://" not in location or location.startswith("file://"):
        path = Path(urllib.parse.urlparse(location).path if location.startswith("file://") else location)
        if (path / name / "index.html").is_file():  # a PEP 503 tree on disk
            page = (path / name / "index.html").as_uri()
            return _parse_html((path / name / "index.html").read_text(encoding="utf-8", errors="replace"), page)
        if path.is_dir():  # find-links directory
            return [
                IndexFile(filename=p.name, url=p.as_uri(), sha256=None) for p in sorted(path.iterdir()) if p.is_file()
            ]
        return []
    page = location if flat else location.rstrip("/") + f"/{name}/"
    try:
        with _open(page, accept=f"{PEP691_JSON}, text/html;q=0.1", auth=auth) as response:
            raw = _read_page(response, page)
            content_type = response.headers.get("Content-Type", "")
    except _Absent:
        return []  # the project is not on this index
    body = raw.decode("utf-8", errors="replace")
    if content_type.startswith(PEP691_JSON):
        return _parse_json(body, page)
    return _parse_html(body, page)


def read_json_page(url: str, *, auth: tuple[str, str] | None = None) -> dict[str, Any] | None:
    """A PEP 691 JSON page (a project list, a project's files), or None where the index says
    it has no such page (404, 410). One that answers another type is not a JSON page."""
    try:
        with _open(url, accept=PEP691_JSON, auth=auth) as response:
            raw = _read_page(response, url)
            content_type = response.headers.get("Content-Type", "")
    except _Absent:
        return None
    if not content_type.startswith(PEP691_JSON):
        raise FetchError(
            f"{url}: answered {content_type or 'no content type'}, not a PEP 691 JSON page",
            fix="point it at an index that serves PEP 691 JSON (wheelmill's index server, nginx with deploy/*.conf)",
        )
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # nested some thousand deep is no page either
        raise FetchError(f"{url}: not JSON", fix="check that the URL is the index's simple API") from None
    if not isinstance(data, dict):
        raise FetchError(f"{url}: not a PEP 691 page", fix="check that the URL is the index's simple API")
    return data


def _read_page(response: urllib.response.addinfourl, page: str) -> bytes:
    """A page's bytes, at most ``PAGE_LIMIT`` of them: an index that sends more is not serving
    a project's page, and is not read to the end."""
    try:
        raw: bytes = response.read(PAGE_LIMIT + 1)
    except (TimeoutError, ConnectionError, urllib.error.URLError) as exc:
        raise TransientError(f"{page}: connection lost while reading the page: {exc}") from None
    if len(raw) > PAGE_LIMIT:
        raise FetchError(
            f"{page}: the page is larger than {PAGE_LIMIT >> 20} MiB; not read further",
            fix="check that the URL is a package index's project page",
        )
    return raw


def _parse_json(body: str, page: str) -> list[IndexFile]:
    try:
        return [
            IndexFile(
                filename=file_name(f["filename"], page),
                url=urllib.parse.urljoin(page, f["url"]),
                sha256=f.get("hashes", {}).get("sha256"),
                yanked=f.get("yanked", False) not in (False, None),
                mirrored="_mirrored-from" in f,
            )
            for f in json.loads(body).get("files", [])
        ]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise FetchError(f"{page}: not a PEP 691 project page", fix="check that the URL is a package index") from None


def file_name(name: object, page: str) -> str:
    """A file name an index lists, as a name alone: it becomes a path here, so a name that
    holds a directory (``../x.whl``; packaging takes ``/../`` inside a build tag) is refused.

    >>> file_name("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "p")
    'torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl'
    """
    text = str(name)
    if not text or text in (".", "..") or any(c in text for c in "/\\\0") or text != text.strip():
        raise FetchError(
            f"{page}: lists a file named {text[:120]!r}, which is no file name", fix="check what serves that index"
        )
    return text


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[tuple[str, dict[str, str | None]]] = []  # each link, and its attributes

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            named = dict(attrs)
            if named.get("href"):
                self.hrefs.append((str(named["href"]), named))


def _parse_html(body: str, page: str) -> list[IndexFile]:
    parser = _Links()
    parser.feed(body)
    files = []
    for href, attributes in parser.hrefs:
        url, _, fragment = urllib.parse.urljoin(page, href).partition("#")
        sha = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
        last = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        if not last:
            continue  # a folder's link, as a find-links page of a directory listing has
        filename = file_name(last, page)
        yanked, mirrored = "data-yanked" in attributes, "data-mirrored-from" in attributes
        files.append(IndexFile(filename=filename, url=url, sha256=sha, yanked=yanked, mirrored=mirrored))
    return files
