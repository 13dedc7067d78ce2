"""The index on disk: one static tree per channel, written only by wheelmill.

    <root>/<channel>/simple/index.html, index.json            the project list
    <root>/<channel>/simple/<project>/index.html, index.json  a project's files
    <root>/<channel>/files/<wheel>, <wheel>.metadata          immutable files

Published files are immutable: the same bytes again is a no-op, other bytes under a
published name are refused. Every file is written to a temporary name and renamed into
place, files before the pages that list them, under an exclusive lock per channel; so a
reader, a concurrent publisher or a publisher killed at any instant finds a valid index
(at worst an unlisted file, which the next publish of it lists). A publish touches its own
project's pages, and the project list only when the project is new.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from wheelmill.errors import IndexConflict, IndexStoreError
from wheelmill.files import copy_atomic, file_lock, write_atomic
from wheelmill.index import pages
from wheelmill.index.pages import FileEntry, Project
from wheelmill.net import sha256_of
from wheelmill.versions import Track
from wheelmill.wheelfile import WheelInfo, read_wheel

# A variant's channel (cu118), or one in a track other than the release track (test/cu118,
# nightly/cu118); the track names and the release records' directory are no channels.
TRACK_DIRS = tuple(t.value for t in Track if t is not Track.RELEASE)
RECORDS_DIR = "releases"
RESERVED = (*TRACK_DIRS, RECORDS_DIR)
_CHANNEL = re.compile(rf"^(?:(?:{'|'.join(TRACK_DIRS)})/)?[a-z0-9][a-z0-9.+_-]*$")


class Outcome(StrEnum):
    ADDED = "added"
    UNCHANGED = "unchanged"


@dataclass(frozen=True, kw_only=True)
class Published:
    channel: str
    project: str
    filename: str
    outcome: Outcome


def channel_names(root: Path) -> list[str]:
    """Every channel under ``root``, those of the test and nightly tracks included."""
    found = [p.parent.parent for p in (*root.glob("*/simple/index.json"), *root.glob("*/*/simple/index.json"))]
    return sorted(str(p.relative_to(root)) for p in found if p.parent == root or p.parent.name in TRACK_DIRS)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Channel:
    """One channel of the index (``cu118``, ``cpu``, ``rocm6.2``) under a storage root."""

    def __init__(self, root: Path, name: str) -> None:
        if not _CHANNEL.match(name) or name.rpartition("/")[2] in RESERVED:
            raise IndexStoreError(
                f"'{name}' is not a channel name",
                fix="use lower-case letters, digits, '.', '+', '_' and '-', e.g. cu118, optionally in a track: test/cu118, nightly/cu118",
            )
        self.root = root
        self.name = name
        self.path = root / name

    @property
    def simple(self) -> Path:
        return self.path / "simple"

    @property
    def files(self) -> Path:
        return self.path / "files"

    @property
    def tmp(self) -> Path:
        """Where writes start; a dot directory, so no server ever shows it."""
        return self.path / ".tmp"

    def exists(self) -> bool:
        return (self.simple / "index.json").is_file()

    @contextmanager
    def lock(self) -> Iterator[None]:
        """The one writer of this channel at a time; a dead writer's lock dies with it."""
        for directory in (self.files, self.simple, self.tmp):
            directory.mkdir(parents=True, exist_ok=True)
        with file_lock(self.path / ".lock"):
            # Whatever is in .tmp now was left by a writer that was killed.
            for leftover in self.tmp.iterdir():
                leftover.unlink(missing_ok=True)
            yield

    def project(self, name: str) -> Project | None:
        page = self.simple / canonicalize_name(name) / "index.json"
        return pages.parse_project_json(page.read_text(encoding="utf-8")) if page.is_file() else None

    def project_names(self) -> list[str]:
        page = self.simple / "index.json"
        return pages.parse_root_json(page.read_text(encoding="utf-8")) if page.is_file() else []

    def write_project(self, project: Project) -> None:
        directory = self.simple / project.name
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / "index.json", pages.project_json(project).encode(), tmp_dir=self.tmp)
        write_atomic(directory / "index.html", pages.project_html(project).encode(), tmp_dir=self.tmp)

    def write_root(self, names: list[str]) -> None:
        write_atomic(self.simple / "index.json", pages.root_json(names).encode(), tmp_dir=self.tmp)
        write_atomic(self.simple / "index.html", pages.root_html(names).encode(), tmp_dir=self.tmp)


def _agreeing(wheel: Path) -> WheelInfo:
    """The wheel, read; the index refuses one whose METADATA names another project or version."""
    info = read_wheel(wheel)
    if canonicalize_name(info.metadata_name) != info.name or info.metadata_version != str(info.version):
        raise IndexStoreError(f"{wheel}: its METADATA says {info.metadata_name} {info.metadata_version}", fix="the file name and the metadata must agree")
    return info


def publish(channel: Channel, wheel: Path, *, upload_time: str | None = None) -> Published:
    """Add ``wheel`` to ``channel``; identical bytes again are a no-op."""
    info = _agreeing(wheel)
    sha256 = sha256_of(wheel)
    with channel.lock():
        target = channel.files / wheel.name
        if target.exists() and sha256_of(target) != sha256:
            raise IndexConflict(
                f"{channel.name}: {wheel.name} is already published with other bytes (sha256 {sha256_of(target)[:16]}..., this one {sha256[:16]}...)",
                fix="published files are immutable: bump the version (or the build tag) instead",
            )
        project = channel.project(info.name) or Project(name=info.name, files=())
        if target.exists() and any(f.filename == wheel.name for f in project.files):
            return Published(channel=channel.name, project=info.name, filename=wheel.name, outcome=Outcome.UNCHANGED)
        metadata_sha256 = hashlib.sha256(info.metadata).hexdigest()
        write_atomic(channel.files / f"{wheel.name}.metadata", info.metadata, tmp_dir=channel.tmp)
        if not target.exists():
            copy_atomic(wheel, target, tmp_dir=channel.tmp)
        entry = FileEntry(
            filename=wheel.name,
            version=str(info.version),
            sha256=sha256,
            size=target.stat().st_size,
            upload_time=upload_time or now_rfc3339(),
            requires_python=info.requires_python,
            metadata_sha256=metadata_sha256,
        )
        channel.write_project(replace(project, files=(*project.files, entry)))
        names = channel.project_names()
        if info.name not in names:
            channel.write_root([*names, info.name])
    return Published(channel=channel.name, project=info.name, filename=wheel.name, outcome=Outcome.ADDED)


def set_yanked(channel: Channel, project_name: str, version: str, reason: str | None) -> list[str]:
    """Yank (``reason`` a string, maybe empty) or unyank (None) every file of a version."""
    with channel.lock():
        project = channel.project(project_name)
        if project is None:
            raise IndexStoreError(f"{channel.name}: no project '{project_name}'", fix=f"`wheelmill index list --channel {channel.name}` shows what is there")
        wanted = Version(version)
        hits = [f for f in project.files if Version(f.version) == wanted]
        if not hits:
            raise IndexStoreError(f"{channel.name}: {project.name} has no version {version}", fix=f"published versions: {', '.join(project.versions)}")
        files = tuple(replace(f, yanked=reason) if Version(f.version) == wanted else f for f in project.files)
        channel.write_project(replace(project, files=files))
    return [f.filename for f in hits]


def remove_files(channel: Channel, project_name: str, filenames: Collection[str]) -> list[str]:
    """Drop these files of a project (a nightly track's retention; a release's files are
    never removed, only yanked): the page first, so no page ever lists a missing file."""
    with channel.lock():
        project = channel.project(project_name)
        if project is None:
            return []
        gone = [f for f in project.files if f.filename in filenames]
        channel.write_project(replace(project, files=tuple(f for f in project.files if f.filename not in filenames)))
        for entry in gone:
            (channel.files / f"{entry.filename}.metadata").unlink(missing_ok=True)
            (channel.files / entry.filename).unlink(missing_ok=True)
    return [f.filename for f in gone]
