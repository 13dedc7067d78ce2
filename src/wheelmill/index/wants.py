"""What installers asked a channel for that it could not serve: ``wheelmill wants``.

A served index's access log (``wheelmill.index.access_log``) says what was asked and by
what. pip and uv say who asks in their User-Agent, ``<installer>/<version> <JSON>`` (the
"linehaul" data PyPI reads): the Python, its implementation, the system, the cpu and the
libc. Each request of a project page by an installer is held to what the channel holds
now: a file the asking interpreter would take (a wheel whose tags it supports, by
``packaging.tags``, and whose Requires-Python it meets; an sdist), none (``no compatible
file``), or no such project at all. The requests that found nothing are the wants, one per
channel, project, Python, implementation, platform and reason, the most asked first.

Requests by anything else (a browser, curl, a crawler: no JSON in its User-Agent) are no
wants, and a line that is no request (another format, a cut line) is counted and skipped.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import urllib.parse
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags, generic_tags, mac_platforms
from packaging.utils import InvalidName, InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from wheelmill.index.access_log import parse_request
from wheelmill.index.channels import TRACK_DIRS, is_channel_name
from wheelmill.index.pages import FileEntry, Project
from wheelmill.index.roots import Index, is_bucket_location

Reason = Literal["no compatible file", "no such project"]
# The answers that say what a channel has: a page (200, or 304 from a cache that holds it)
# or none (404). A redirect is followed by the request that counts; a 406 or a 5xx says
# nothing of the project.
ANSWERS = frozenset({200, 304, 404})
SDISTS = (".tar.gz", ".zip")
# What a log that breaks off (a .gz cut while it was rotated) leaves: one line skipped.
DAMAGED = "<the rest of this log could not be read>"
WINDOWS = {"amd64": "win_amd64", "arm64": "win_arm64", "x86": "win32"}  # platform.machine() to its tag


@dataclass(frozen=True, kw_only=True)
class Interpreter:
    """What an installer's User-Agent says of the Python it installs for."""

    python: str  # its full version: 3.12.7
    implementation: str  # CPython, PyPy
    implementation_version: str = ""
    system: str = ""  # Linux, Darwin, Windows
    cpu: str = ""  # x86_64, aarch64, arm64, AMD64
    libc: str = ""  # glibc or musl (Linux); "" where unsaid
    libc_version: str = ""
    os_version: str = ""  # macOS's, for its platform tags

    @property
    def python_minor(self) -> str:
        """3.12: what decides the tags."""
        return ".".join(self.python.split(".")[:2])

    @property
    def platform(self) -> str:
        """The newest platform tag it takes, as a label: manylinux_2_36_x86_64."""
        platforms = _platforms(self)
        return platforms[0] if platforms else f"{self.system} {self.cpu}".strip().lower() or "unknown"


@dataclass(frozen=True, kw_only=True)
class Asker:
    """An installer (pip, uv) and the interpreter it asked for."""

    installer: str
    version: str
    interpreter: Interpreter


@dataclass(frozen=True, kw_only=True)
class Want:
    """Requests of one project of one channel that it could not serve, by one kind of interpreter."""

    channel: str
    project: str
    python: str  # 3.12
    implementation: str
    platform: str
    reason: Reason
    count: int
    installers: tuple[tuple[str, int], ...]  # ("pip", 3), ("uv", 1): the most asking first

    def as_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "project": self.project,
            "python": self.python,
            "implementation": self.implementation,
            "platform": self.platform,
            "reason": self.reason,
            "count": self.count,
            "installers": dict(self.installers),
        }


@dataclass(frozen=True, kw_only=True)
class WantsReport:
    """The wants of a set of logs, and what was read to find them."""

    wants: tuple[Want, ...]  # the most asked first
    lines: int  # lines read
    skipped: int  # lines that are no request
    requests: int  # installers' requests of project pages, answered
    served: int  # of them, those the channel holds a file for

    def top(self, count: int) -> WantsReport:
        """The report with its ``count`` most asked wants alone."""
        return replace(self, wants=self.wants[:count])

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "skipped": self.skipped,
            "requests": self.requests,
            "served": self.served,
            "wants": [want.as_dict() for want in self.wants],
        }


def parse_user_agent(ua: str) -> Asker | None:
    """The installer and interpreter pip's or uv's User-Agent names; None for any other.

    >>> asker = parse_user_agent('uv/0.13.9 {"installer":{"name":"uv","version":"0.13.9"},"python":"3.12.1",'
    ...     '"implementation":{"name":"CPython","version":"3.12.1"},"distro":{"libc":{"lib":"glibc","version":"2.36"}},'
    ...     '"system":{"name":"Linux","release":"6.1.0"},"cpu":"x86_64"}')
    >>> asker.installer, asker.interpreter.python_minor, asker.interpreter.platform
    ('uv', '3.12', 'manylinux_2_36_x86_64')
    >>> parse_user_agent("Mozilla/5.0 (X11; Linux x86_64)"), parse_user_agent("curl/8.5.0")
    (None, None)
    """
    head, _, rest = ua.partition(" ")
    name, slash, version = head.partition("/")
    if not slash or not rest.startswith("{"):
        return None
    try:
        data = json.loads(rest)
    except ValueError:
        return None
    interpreter = _interpreter(data) if isinstance(data, dict) else None
    if interpreter is None:
        return None
    installer = _text(data, "installer", "name") or name
    return Asker(installer=installer, version=_text(data, "installer", "version") or version, interpreter=interpreter)


def _interpreter(data: dict[str, Any]) -> Interpreter | None:
    python = _text(data, "python")
    if len(_release(python)) < 2:  # no Python to hold the files to: no installer's request
        return None
    return Interpreter(
        python=python,
        implementation=_text(data, "implementation", "name") or "unknown",
        implementation_version=_text(data, "implementation", "version"),
        system=_text(data, "system", "name"),
        cpu=_text(data, "cpu"),
        libc=_text(data, "distro", "libc", "lib"),
        libc_version=_text(data, "distro", "libc", "version"),
        os_version=_text(data, "distro", "version"),
    )


def _text(data: Any, *keys: str) -> str:
    """The string at ``keys`` in nested objects; "" where there is none."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, str) else ""


def _release(version: str) -> tuple[int, ...]:
    """A version's numbers, (2, 36) for "2.36"; () where it is none."""
    try:
        return Version(version).release
    except InvalidVersion:
        return ()


@functools.cache
def _platforms(interpreter: Interpreter) -> tuple[str, ...]:
    """The platform tags it takes, the newest first; () where its system is not said."""
    cpu, libc = interpreter.cpu, _release(interpreter.libc_version)
    match interpreter.system:
        case "Linux" if interpreter.libc == "glibc" and len(libc) >= 2:
            return (*_manylinux(libc[1], cpu), f"linux_{cpu}")
        case "Linux" if interpreter.libc == "musl" and len(libc) >= 2:
            return (*(f"musllinux_{libc[0]}_{minor}_{cpu}" for minor in range(libc[1], -1, -1)), f"linux_{cpu}")
        case "Linux":  # pip says no libc on musl, nor where it cannot tell: its own builds alone
            return (f"linux_{cpu}",)
        case "Darwin" if len(_release(interpreter.os_version)) >= 2:
            major, minor = _release(interpreter.os_version)[:2]
            return tuple(mac_platforms((major, minor), cpu))
        case "Windows":
            return (WINDOWS.get(cpu.lower(), f"win_{cpu.lower()}"),)
        case _:
            return ()


def _manylinux(glibc_minor: int, cpu: str) -> Iterator[str]:
    """PEP 600's tags up to glibc 2.<minor>, and the names PEP 513/571/599 gave three of them."""
    for minor in range(glibc_minor, -1, -1):
        yield f"manylinux_2_{minor}_{cpu}"
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(minor)
        if legacy and (minor == 17 or cpu in ("x86_64", "i686")):
            yield f"{legacy}_{cpu}"


@functools.cache
def supported_tags(interpreter: Interpreter) -> frozenset[Tag]:
    """Every wheel tag the interpreter takes, as its installer would compute it there."""
    major, minor = _release(interpreter.python)[:2]
    version, platforms = (major, minor), _platforms(interpreter)
    match interpreter.implementation:
        case "CPython":
            tags = [*cpython_tags(version, [f"cp{major}{minor}"], platforms)]
            return frozenset([*tags, *compatible_tags(version, f"cp{major}{minor}", platforms)])
        case "PyPy":
            pypy = _release(interpreter.implementation_version)[:2]
            abis = [f"pypy{major}{minor}_pp{pypy[0]}{pypy[1]}"] if len(pypy) == 2 else []
            tags = [*generic_tags(f"pp{major}{minor}", abis, platforms)]
            return frozenset([*tags, *compatible_tags(version, f"pp{major}{minor}", platforms)])
        case _:
            return frozenset(compatible_tags(version, None, platforms))


def serves(entry: FileEntry, interpreter: Interpreter) -> bool:
    """Whether an installer on ``interpreter`` would take the file: not yanked (installers
    pass a yanked file by unless it is pinned), its Requires-Python met, and a wheel with a
    tag the interpreter supports or an sdist (which it may build)."""
    if entry.yanked is not None or not _meets(entry.requires_python, interpreter.python):
        return False
    if entry.filename.endswith(SDISTS):
        return True
    try:
        tags = parse_wheel_filename(entry.filename)[3]
    except InvalidWheelFilename:
        return False
    return not tags.isdisjoint(supported_tags(interpreter))


def _meets(requires_python: str | None, python: str) -> bool:
    if not requires_python:
        return True
    try:
        return SpecifierSet(requires_python).contains(python, prereleases=True)
    except InvalidSpecifier:  # installers pass a specifier they cannot read by too
        return True


def project_page(path: str) -> tuple[str, str] | None:
    """The channel and (normalized) project whose page ``path`` is; None for any other path.

    >>> project_page("/cu130/simple/Torch_Sort/"), project_page("/test/cu130/simple/torchsort")
    (('cu130', 'torch-sort'), ('test/cu130', 'torchsort'))
    >>> project_page("/cu130/simple/"), project_page("/blobs/sha256/ab/x.whl"), project_page("/x/simple/a b/")
    (None, None, None)
    """
    parts = [urllib.parse.unquote(part) for part in path.strip("/").split("/")]
    if len(parts) == 4 and parts[0] in TRACK_DIRS:
        parts = [f"{parts[0]}/{parts[1]}", *parts[2:]]
    if len(parts) != 3 or parts[1] != "simple" or not is_channel_name(parts[0]):
        return None
    try:
        return parts[0], canonicalize_name(parts[2], validate=True)
    except InvalidName:
        return None


@dataclass(frozen=True)
class _Key:
    """What one want is of."""

    channel: str
    project: str
    python: str
    implementation: str
    platform: str
    reason: Reason


def wants(lines: Iterable[str], index: Index, *, channel: str | None = None) -> WantsReport:
    """The wants of the requests ``lines`` log, against what ``index`` holds now; those of
    ``channel`` alone where it is given."""
    tally = _Tally(index=index, channel=channel)
    for line in lines:
        tally.add(line)
    return tally.report()


class _Tally:
    """The lines read so far, and what they asked for; each project page read once."""

    def __init__(self, *, index: Index, channel: str | None) -> None:
        self.index, self.channel = index, channel
        self.lines = self.skipped = self.requests = 0
        self.counts: dict[_Key, Counter[str]] = {}
        self.projects: dict[tuple[str, str], Project | None] = {}

    def add(self, line: str) -> None:
        self.lines += 1
        request = parse_request(line)
        if request is None:
            self.skipped += 1
            return
        page = project_page(request.path) if request.status in ANSWERS and request.method in ("GET", "HEAD") else None
        asker = parse_user_agent(request.ua) if page else None
        if page is None or asker is None or self.channel not in (None, page[0]):
            return
        self.requests += 1
        key = _want_key(page, asker.interpreter, self._project(page))
        if key is not None:
            self.counts.setdefault(key, Counter())[asker.installer] += 1

    def _project(self, page: tuple[str, str]) -> Project | None:
        if page not in self.projects:
            self.projects[page] = self.index.channel(page[0]).project(page[1])
        return self.projects[page]

    def report(self) -> WantsReport:
        found = tuple(sorted((_want(key, by) for key, by in self.counts.items()), key=_rank))
        served = self.requests - sum(want.count for want in found)
        return WantsReport(wants=found, lines=self.lines, skipped=self.skipped, requests=self.requests, served=served)


def _want_key(page: tuple[str, str], interpreter: Interpreter, project: Project | None) -> _Key | None:
    """What the request wants, or None where the channel serves it."""
    if project is None:
        reason: Reason = "no such project"
    elif any(serves(entry, interpreter) for entry in project.files):
        return None
    else:
        reason = "no compatible file"
    return _Key(
        channel=page[0],
        project=page[1],
        python=interpreter.python_minor,
        implementation=interpreter.implementation,
        platform=interpreter.platform,
        reason=reason,
    )


def _want(key: _Key, by: Counter[str]) -> Want:
    installers = tuple(sorted(by.items(), key=lambda item: (-item[1], item[0])))
    return Want(
        channel=key.channel,
        project=key.project,
        python=key.python,
        implementation=key.implementation,
        platform=key.platform,
        reason=key.reason,
        count=sum(by.values()),
        installers=installers,
    )


def _rank(want: Want) -> tuple[Any, ...]:
    """The most asked first; then by channel, project, Python, ...: the same order each run."""
    python = _release(want.python)
    return (-want.count, want.channel, want.project, python, want.implementation, want.platform, want.reason)


def log_lines(location: str) -> Iterator[str]:
    """Every line of the access logs at ``location``: a file; a directory of them (every
    file below it, by name); or a bucket's prefix (``s3://bucket/prefix/``: every object
    under it, read through the index's own storage). A ``.gz`` one (a rotated log) is
    read decompressed."""
    if is_bucket_location(location):
        storage = Index(bucket=location).storage
        for key in storage.keys_under():
            found = storage.get(key)
            if found is not None:
                yield from _lines(key, io.BytesIO(found.data))
        return
    path = Path(location)
    for file in _files(path) if path.is_dir() else [path]:
        with file.open("rb") as raw:
            yield from _lines(file.name, raw)


def _files(directory: Path) -> list[Path]:
    """Every file below ``directory`` by name, none hidden or in a hidden directory."""
    found = (p for p in directory.rglob("*") if p.is_file())
    return sorted(p for p in found if not any(part.startswith(".") for part in p.relative_to(directory).parts))


def _lines(name: str, raw: IO[bytes]) -> Iterator[str]:
    if not name.endswith(".gz"):
        yield from _decoded(raw)
        return
    with gzip.GzipFile(fileobj=raw) as unpacked:
        yield from _decoded(unpacked)


def _decoded(stream: Iterable[bytes]) -> Iterator[str]:
    try:
        for line in stream:
            # nginx escapes what it logs, but not bytes above 0x7f: a request may carry any
            yield line.decode("utf-8", errors="replace").rstrip("\r\n")
    except (OSError, EOFError, zlib.error):  # a .gz cut short, or no gzip at all
        yield DAMAGED
