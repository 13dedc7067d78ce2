"""What every channel shares, on a tree or a bucket: channel names, what a publish says, and
the reading of a wheel for its listing; and the reader of a tree's channel in the layout of
an earlier wheelmill, which ``wheelmill index migrate`` reads once (``wheelmill.index.legacy``):

    <root>/<channel>/simple -> .simple-<n>/                  its pages (a link to a generation)
    <root>/<channel>/files/<wheel>, <wheel>.metadata         its files, and their sidecars
    <root>/<channel>/files/<wheel>.intoto.jsonl              a file's signed provenance

Every channel is written by the one channel code, ``wheelmill.index.objects``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from packaging.utils import canonicalize_name

from wheelmill.errors import ChannelError, CheckError, InvalidWheel
from wheelmill.index import pages
from wheelmill.index.pages import FileEntry, Project
from wheelmill.inputs.archs import ARCH_RECORD, ArchRecord
from wheelmill.inputs.versions import Track

# Reading a wheel (its ELF files, its ABI) loads when a wheel is read, not with the channels'
# words that the command line and the server take from here.
if TYPE_CHECKING:
    from wheelmill.wheel.wheelfile import WheelInfo

# A variant's channel (cu118), or one in a track other than the release track (test/cu118,
# nightly/cu118); the track names, the release records' and the conda channels' directories
# are no channels.
TRACK_DIRS = tuple(t.value for t in Track if t is not Track.RELEASE)
RECORDS_DIR = "releases"
CONDA_DIR = "conda"  # the conda channels beside the wheel channels (wheelmill.index.conda_channels)
BLOBS_DIR = "blobs"  # an object store's content-addressed bytes (wheelmill.index.objects)
UNLISTED_DIR = "unlisted"  # the sweep's marks and trash (wheelmill.index.sweep)
COVERAGE_DIR = "coverage"  # the coverage page (wheelmill.releases.coverage_page)
RESERVED = (*TRACK_DIRS, RECORDS_DIR, CONDA_DIR, BLOBS_DIR, UNLISTED_DIR, COVERAGE_DIR)
# The coverage page's files and their content types: what it writes, and all that is served
# of it (``index serve``, deploy/nginx-*.conf).
COVERAGE_FILES = {
    "index.html": "text/html; charset=utf-8",
    "coverage.json": "application/json",
    "finder.js": "text/javascript; charset=utf-8",
    "coverage.css": "text/css; charset=utf-8",
}
T = TypeVar("T")
_CHANNEL = re.compile(rf"^(?:(?:{'|'.join(TRACK_DIRS)})/)?[a-z0-9][a-z0-9.+_-]*$")


class PublishOutcome(StrEnum):
    ADDED = "added"
    UNCHANGED = "unchanged"
    BUILT_HERE = "built here"  # a mirrored file not added: the channel has the project built


@dataclass(frozen=True, kw_only=True)
class Published:
    channel: str
    project: str
    filename: str
    outcome: PublishOutcome
    replaced: tuple[str, ...] = ()  # mirrored files a built wheel of their project replaced


GENERATION = ".simple-"  # a generation of a channel's pages, named by the ``simple`` link
# What a Requires-Python may hold, in characters, to be listed: a few dozen are usual, and
# megabytes of one would be in every page every client downloads (an arch record is bounded
# where the wheel is read).
PAGE_FIELD_LIMIT = 1024


def channel_names(root: Path) -> list[str]:
    """Every channel under ``root``, those of the test and nightly tracks included."""
    found = [p.parent.parent for p in (*root.glob("*/simple/index.json"), *root.glob("*/*/simple/index.json"))]
    return sorted(str(p.relative_to(root)) for p in found if p.parent == root or p.parent.name in TRACK_DIRS)


def channel_dirs(root: Path) -> list[str]:
    """Every channel under ``root`` that anything was written to, with pages or not yet."""
    found = [
        p.parent
        for p in (*root.glob("*/simple"), *root.glob("*/files"), *root.glob("*/*/simple"), *root.glob("*/*/files"))
    ]
    return sorted({str(p.relative_to(root)) for p in found if p.parent == root or p.parent.name in TRACK_DIRS})


def conda_channel_root(index_root: Path, channel: str) -> Path:
    """A variant's conda channel beside its wheel channel: ``<index>/conda/cu130``, or
    ``<index>/conda/test/cu130`` for a channel of another track."""
    return index_root / CONDA_DIR / channel


def bucket_channel_url(index_bucket: str, channel: str) -> str:
    """A variant's conda channel in an object store's index: ``<index>/conda/<channel>``."""
    return f"{index_bucket.rstrip('/')}/{CONDA_DIR}/{channel}"


def is_channel_name(name: str) -> bool:
    """Whether ``name`` is a name a channel may have (a track's included)."""
    return bool(_CHANNEL.match(name)) and name.rpartition("/")[2] not in RESERVED


def checked_channel(name: str) -> str:
    """``name`` where it names a channel; a ``ChannelError`` saying what one is otherwise."""
    if not is_channel_name(name):
        raise ChannelError(
            f"'{name}' is not a channel name",
            fix="use lower-case letters, digits, '.', '+', '_' and '-', e.g. cu118, "
            "optionally in a track: test/cu118, nightly/cu118",
        )
    return name


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Channel:
    """One channel of a tree in the layout of an earlier wheelmill, read: its pages through
    the ``simple`` link, its files beside them."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = checked_channel(name)
        self.path = root / name

    @property
    def simple(self) -> Path:
        return self.path / "simple"

    @property
    def files(self) -> Path:
        return self.path / "files"

    def exists(self) -> bool:
        return (self.simple / "index.json").is_file()

    def project(self, name: str) -> Project | None:
        page = self.simple / canonicalize_name(name) / "index.json"
        return self._read(page, pages.parse_project_json) if page.is_file() else None

    def projects(self) -> Iterator[Project]:
        """Every project the project list names, from its page."""
        return (p for p in (self.project(n) for n in self.project_names()) if p is not None)

    def project_names(self) -> list[str]:
        page = self.simple / "index.json"
        return self._read(page, pages.parse_root_json) if page.is_file() else []

    def _read(self, page: Path, parse: Callable[[str], T]) -> T:
        """A page of the channel, parsed; a damaged one is an error that says what to do."""
        try:
            return parse(page.read_text(encoding="utf-8"))
        except (ValueError, KeyError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
            raise ChannelError(
                f"{page}: not a valid index page ({type(exc).__name__}: {str(exc)[:120]})",
                fix="restore the page from the index's backup, then migrate again",
            ) from None


def agreeing(wheel: Path) -> WheelInfo:
    """The wheel, read; the index refuses one whose METADATA names another project or version,
    or carries into the pages more than a listing holds (every client downloads the pages)."""
    from wheelmill.wheel.wheelfile import read_wheel  # noqa: PLC0415 - see the imports

    info = read_wheel(wheel)
    if canonicalize_name(info.metadata_name) != info.name or info.metadata_version != str(info.version):
        raise ChannelError(
            f"{wheel}: its METADATA says {info.metadata_name} {info.metadata_version}",
            fix="the file name and the metadata must agree",
        )
    if info.requires_python is not None and len(info.requires_python) > PAGE_FIELD_LIMIT:
        raise InvalidWheel(
            f"{wheel.name}: its Requires-Python is {len(info.requires_python)} characters, more than a page "
            f"lists ({PAGE_FIELD_LIMIT})",
            fix="give Requires-Python as a short specifier (>=3.10) and rebuild it",
        )
    return info


def gpu_archs(info: WheelInfo) -> str | None:
    """What the wheel's arch record says, for its listing (None: it has none); a record
    that is not one makes the wheel invalid."""
    if info.arch_record is None:
        return None
    try:
        return ArchRecord.parse(info.arch_record).describe()
    except ValueError as exc:
        raise InvalidWheel(
            f"{info.path}: {info.dist_info}/{ARCH_RECORD} is not a GPU arch record ({exc})",
            fix="rebuild it with wheelmill, whose stamp step writes that file",
        ) from None


def abi_of_wheel(wheel: Path) -> str | None:
    """The ABI a built wheel's libraries keep to, for its listing (None: it has none, or
    one that cannot be read: judging libraries is the post-repair checks' work, not the
    index's, which lists what it can tell)."""
    try:
        from wheelmill.wheel.abi import read_abi  # noqa: PLC0415 - see the imports

        return read_abi(wheel).listed
    except CheckError:
        return None


class Listing(Protocol):
    """What reading a channel's pages needs, whatever it is written on (or served from)."""

    @property
    def name(self) -> str: ...

    def exists(self) -> bool: ...

    def project(self, name: str) -> Project | None: ...

    def projects(self) -> Iterator[Project]: ...

    def project_names(self) -> list[str]: ...


def built_by_key(channel: Listing) -> dict[str, tuple[str, FileEntry]]:
    """Every build key of the channel's built wheels, with the project and the listing of
    its wheel: a build whose key is here made those bytes already."""
    return by_key(listed_files(channel))


def listed_files(channel: Listing) -> list[tuple[str, FileEntry]]:
    """Every file the channel lists (yanked and mirrored ones too), with its project: one
    read of each page."""
    if not channel.exists():
        return []
    return [(project.name, entry) for project in channel.projects() for entry in project.files]


def by_key(files: Iterable[tuple[str, FileEntry]]) -> dict[str, tuple[str, FileEntry]]:
    """Of listed files, those that answer for their build keys (``answers_for_keys``), by key."""
    found: dict[str, tuple[str, FileEntry]] = {}
    for project, entry in files:
        if answers_for_keys(entry):
            found |= dict.fromkeys(entry.build_keys, (project, entry))
    return found


def keyed_files(project: Project | None) -> Iterator[FileEntry]:
    """The project's files that answer for their build keys."""
    return (f for f in (project.files if project is not None else ()) if answers_for_keys(f))


def answers_for_keys(entry: FileEntry) -> bool:
    """Whether a listed file answers for its build keys: built here, and not yanked (whoever
    yanked one wanted another)."""
    return entry.built and entry.yanked is None
