"""The index on disk: one static tree per channel, written only by wheelmill.

    <root>/<channel>/simple/index.html, index.json            the project list
    <root>/<channel>/simple/<project>/index.html, index.json  a project's files
    <root>/<channel>/files/<wheel>, <wheel>.metadata          immutable files
    <root>/<channel>/files/<wheel>.intoto.jsonl               its signed provenance, where it has one

Published files are immutable: the same bytes again is a no-op, other bytes under a
published name are refused. A file's bytes are kept once, in the content-addressed store
(``wheelmill.index.blobs``), and a channel's file is a hard link to them. A file is built
(wheelmill made it) or mirrored (a dependency fetched from upstream); a project built in
a channel is never also mirrored there: its built wheel replaces the mirrored ones. Every
file is written to a temporary name and renamed into place, files before the pages that
list them, under an exclusive lock per channel; so a reader, a concurrent publisher or a
publisher killed at any instant finds a valid index (at worst an unlisted file, which the
next publish of it lists). A publish touches its own project's pages, and the project list
only when the project is new. A built wheel's listing carries the GPU archs its
``gpu-archs.json`` records (``wheelmill.inputs.archs.ArchRecord``), and the build keys it
was built for (``wheelmill.planning.buildkey``): the same bytes published again for
another key add the key to the listing, and the file stays as it is. Its signed provenance
(``wheelmill.provenance``) is written with it and listed as ``_provenance``; a file listed
without one learns it from the next publish of the same bytes that has one.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Protocol, TypeVar

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from wheelmill.errors import CheckError, IndexConflict, IndexStoreError, IndexWriteError, InvalidWheel
from wheelmill.files import Content, Linked, file_lock, sync_directory, write_all, write_atomic
from wheelmill.index import pages
from wheelmill.index.blobs import Blobs, Usage, stored
from wheelmill.index.pages import FileEntry, Project
from wheelmill.inputs.archs import ARCH_RECORD, ArchRecord
from wheelmill.inputs.versions import Track
from wheelmill.machine.net import sha256_of
from wheelmill.provenance.statement import SUFFIX as PROVENANCE
from wheelmill.wheel.abi import read_abi
from wheelmill.wheel.wheelfile import WheelInfo, read_wheel

# A variant's channel (cu118), or one in a track other than the release track (test/cu118,
# nightly/cu118); the track names, the release records' and the conda channels' directories
# are no channels.
TRACK_DIRS = tuple(t.value for t in Track if t is not Track.RELEASE)
RECORDS_DIR = "releases"
CONDA_DIR = "conda"  # the conda channels beside the wheel channels (wheelmill.conda.channel)
BLOBS_DIR = "blobs"  # an object store's content-addressed bytes (wheelmill.index.objects)
UNLISTED_DIR = "unlisted"  # the sweep's marks and trash (wheelmill.index.sweep)
RESERVED = (*TRACK_DIRS, RECORDS_DIR, CONDA_DIR, BLOBS_DIR, UNLISTED_DIR)
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


def usage(root: Path) -> Usage:
    """The bytes the channels under ``root`` list, and the bytes the disk holds for them."""
    names = channel_names(root)
    entries = [f for name in names for project in Channel(root, name).projects() for f in project.files]
    files = [p for name in names for p in (root / name / "files").glob("*.whl")]
    count, size = stored([*files, *Blobs(root).all()])
    return Usage(
        channels=len(names),
        listed_files=len(entries),
        listed_bytes=sum(f.size for f in entries),
        stored_files=count,
        stored_bytes=size,
    )


def checked_channel(name: str) -> str:
    """``name`` where it names a channel; an ``IndexStoreError`` saying what one is otherwise."""
    if not _CHANNEL.match(name) or name.rpartition("/")[2] in RESERVED:
        raise IndexStoreError(
            f"'{name}' is not a channel name",
            fix="use lower-case letters, digits, '.', '+', '_' and '-', e.g. cu118, "
            "optionally in a track: test/cu118, nightly/cu118",
        )
    return name


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Channel:
    """One channel of the index (``cu118``, ``cpu``, ``rocm6.2``) under a storage root.

    A project's state is its JSON page; its HTML page and the project list follow from the
    JSON pages. The pages change as one step: ``simple`` is a link to a generation of them
    (``.simple-<n>``), and a writer makes the next generation beside it (the current pages
    hard-linked, the changed ones written), then switches the link with one rename. A reader
    sees the old pages or the new ones, every pair of them agreeing, whatever instant a
    writer dies at; the next writer removes what a dead one left.
    """

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

    @property
    def tmp(self) -> Path:
        """Where writes start; a dot directory, so no server ever shows it."""
        return self.path / ".tmp"

    @property
    def pending(self) -> Path:
        """An update an older wheelmill left half-done (it wrote the pages one by one)."""
        return self.path / ".pending"

    def exists(self) -> bool:
        return (self.simple / "index.json").is_file()

    @contextmanager
    def lock(self) -> Iterator[None]:
        """The one writer of this channel at a time (a dead writer's lock dies with it),
        after what a killed writer left is removed or finished. An OS error while writing
        (a full disk, a read-only or unwritable tree) is one error: every page of the next
        generation is on disk before the switch, and the wheel's files before it too, so
        the channel is as it was before."""
        try:
            for directory in (self.files, self.tmp):
                directory.mkdir(parents=True, exist_ok=True)
            with file_lock(self.path / ".lock"):
                for leftover in self.tmp.iterdir():  # what a killed writer was writing
                    leftover.unlink(missing_ok=True)
                self._settle()
                self.mend()
                yield
        except OSError as exc:
            raise IndexWriteError(
                f"{self.path}: cannot write the index: {exc.strerror or exc} ({exc.filename or self.path})",
                fix="free space, or make the index root writable (WHEELMILL_INDEX_ROOT); the channel is as it was",
            ) from None

    def _settle(self) -> None:
        """Under the lock: the pages as one generation behind the link (a channel an older
        wheelmill wrote has them in ``simple`` itself: moved once), and no other generation
        (a killed writer's next one, or the one before the last switch)."""
        if not self.simple.is_symlink():
            first = self._generation_dir()
            if self.simple.is_dir():
                self.simple.rename(first)  # once: the tree of an older wheelmill
            else:
                first.mkdir()
            self._switch(first)
        self._drop_generations(keep=self.simple.readlink().name)

    def _generation_dir(self) -> Path:
        return self.path / f"{GENERATION}{time.time_ns()}-{os.getpid()}"

    def _next_generation(self) -> Path:
        """The current pages in a new generation, as hard links (no page copied)."""
        new = self._generation_dir()
        new.mkdir()
        current = self.simple.resolve()
        for page in current.rglob("*"):
            target = new / page.relative_to(current)
            if page.is_dir():
                target.mkdir()
            else:
                os.link(page, target)
        return new

    def _switch(self, generation: Path) -> None:
        """``simple`` names ``generation`` from now on: the one step readers see."""
        link = self.tmp / "simple-link"
        self.tmp.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(generation.name)  # relative to where it goes: the channel's directory
        link.replace(self.simple)
        sync_directory(self.path)

    def stale_generations(self) -> list[Path]:
        """Generations ``simple`` does not name: a killed writer's next one, or the one before
        its switch. No reader sees them; the next writer removes them."""
        current = self.simple.readlink().name if self.simple.is_symlink() else None
        return sorted(old for old in self.path.glob(f"{GENERATION}*") if old.name != current)

    def _drop_generations(self, keep: str) -> None:
        """Every generation but ``keep`` (by name: the channel's path may be relative, or
        reached through a link, where the link's target resolves to another spelling)."""
        for old in self.path.glob(f"{GENERATION}*"):
            if old.name != keep:
                shutil.rmtree(old, ignore_errors=True)

    def _change(self, contents: Mapping[Path, Content], files: Mapping[Path, Content] | None = None) -> None:
        """Pages (paths under ``simple``) changed as one step, after ``files`` (a wheel and its
        sidecar): the next generation staged whole, the files written, then the switch."""
        new = self._next_generation()
        try:
            staged = {new / path.relative_to(self.simple): content for path, content in contents.items()}
            for path in staged:
                path.parent.mkdir(parents=True, exist_ok=True)
            write_all(staged, tmp_dir=self.tmp)
            if files:
                write_all(files, tmp_dir=self.tmp)
            old = self.simple.resolve()
            self._switch(new)
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
        shutil.rmtree(old, ignore_errors=True)

    def mend(self) -> str | None:
        """Finish the page update an older wheelmill's killed writer left (under the lock):
        the project's HTML page from its JSON page, the project list from the project pages.
        Its name."""
        if not self.pending.is_file():
            return None
        name = self.pending.read_text(encoding="utf-8").strip()
        project = self.project(name) if name else None
        self._change(self._pages(project, self._names_on_disk()))
        self.pending.unlink()
        return name

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
        """A page of the channel, parsed; a damaged one is an error that says how to mend it."""
        try:
            return parse(page.read_text(encoding="utf-8"))
        except (ValueError, KeyError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
            raise IndexStoreError(
                f"{page}: not a valid index page ({type(exc).__name__}: {str(exc)[:120]})",
                fix=f"run `wheelmill index repair --channel {self.name}`: it rebuilds the pages from what is left",
            ) from None

    def update(self, project: Project, files: Mapping[Path, Content] | None = None) -> None:
        """Replace a project's pages (under the lock), and the project list where it lacks
        the project, after ``files`` (a wheel and its sidecar), as one step."""
        names = self.project_names()
        listed = project.name in names and (self.simple / "index.html").is_file()
        self._change(self._pages(project, None if listed else sorted({*names, project.name})), files)

    def rewrite(self, projects: Sequence[Project]) -> None:
        """Projects' pages written again, and the project list made again from the pages
        there will be (under the lock), as one step."""
        contents: dict[Path, Content] = {}
        for project in projects:
            contents |= self._pages(project, None)
        names = sorted({*self._names_on_disk(), *(p.name for p in projects)})
        self._change(contents | self._pages(None, names))

    def _pages(self, project: Project | None, names: list[str] | None) -> dict[Path, Content]:
        """The project's pages, and the project list's (when ``names`` are given)."""
        contents: dict[Path, Content] = {}
        if project is not None:
            directory = self.simple / project.name
            contents[directory / "index.json"] = pages.project_json(project).encode()
            contents[directory / "index.html"] = pages.project_html(project).encode()
        if names is not None:
            contents[self.simple / "index.json"] = pages.root_json(names).encode()
            contents[self.simple / "index.html"] = pages.root_html(names).encode()
        return contents

    def _names_on_disk(self) -> list[str]:
        return sorted(p.name for p in self.simple.iterdir() if (p / "index.json").is_file())


def agreeing(wheel: Path) -> WheelInfo:
    """The wheel, read; the index refuses one whose METADATA names another project or version,
    or carries into the pages more than a listing holds (every client downloads the pages)."""
    info = read_wheel(wheel)
    if canonicalize_name(info.metadata_name) != info.name or info.metadata_version != str(info.version):
        raise IndexStoreError(
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
        return read_abi(wheel).listed
    except CheckError:
        return None


def publish(
    channel: Channel,
    wheel: Path,
    *,
    upload_time: str | None = None,
    mirrored_from: str | None = None,
    sha256: str | None = None,
    build_key: str | None = None,
    provenance: bytes | None = None,
) -> Published:
    """Add ``wheel`` to ``channel``, built here (for ``build_key``) or (``mirrored_from`` an
    upstream URL) mirrored; identical bytes again are a no-op, but for a build key the
    listing lacks, which it learns (and the provenance, where it has none). A built wheel
    replaces the mirrored files of its
    project; a mirrored one is not added where the project is built. The arch record is
    wheelmill's own: only a built wheel's is read (and must be valid)."""
    info = agreeing(wheel)
    archs = gpu_archs(info) if mirrored_from is None else None
    sha256 = sha256 or sha256_of(wheel)
    with channel.lock():
        target = channel.files / wheel.name
        if target.exists() and sha256_of(target) != sha256:
            raise IndexConflict(
                f"{channel.name}: {wheel.name} is already published with other bytes "
                f"(sha256 {sha256_of(target)[:16]}..., this one {sha256[:16]}...)",
                fix="published files are immutable: bump the version (or the build tag) instead",
            )
        project = channel.project(info.name) or Project(name=info.name, files=())
        if mirrored_from is not None and any(f.built for f in project.files):
            return Published(
                channel=channel.name, project=info.name, filename=wheel.name, outcome=PublishOutcome.BUILT_HERE
            )
        listed = next((f for f in project.files if f.filename == wheel.name), None)
        if target.exists() and listed is not None and listed.built == (mirrored_from is None):
            if build_key is not None and build_key not in listed.build_keys:
                listed = _add_key(channel, project, listed, build_key)
            if provenance is not None and listed.provenance is None:
                _add_provenance(channel, channel.project(info.name) or project, listed, provenance)
            return Published(
                channel=channel.name, project=info.name, filename=wheel.name, outcome=PublishOutcome.UNCHANGED
            )
        replaced = [f for f in project.files if not f.built] if mirrored_from is None else []
        blobs = Blobs(channel.root)
        stored = blobs.holds(sha256)
        blob = blobs.put(wheel, sha256, tmp_dir=channel.tmp)
        files: dict[Path, Content] = {channel.files / f"{wheel.name}.metadata": info.metadata}
        files |= {} if target.exists() else {target: Linked(blob)}
        if provenance is not None:
            files[channel.files / f"{wheel.name}{PROVENANCE}"] = provenance
        entry = FileEntry(
            filename=wheel.name,
            version=str(info.version),
            sha256=sha256,
            size=wheel.stat().st_size,
            upload_time=upload_time or now_rfc3339(),
            requires_python=info.requires_python,
            metadata_sha256=hashlib.sha256(info.metadata).hexdigest(),
            mirrored_from=mirrored_from,
            gpu_archs=archs,
            # read here, for an entry written: a no-op publish of the same bytes reads nothing
            abi=abi_of_wheel(wheel) if mirrored_from is None else None,
            build_keys=(build_key,) if build_key else (),
            provenance=FileEntry.files_url(f"{wheel.name}{PROVENANCE}") if provenance is not None else None,
        )
        kept = tuple(f for f in project.files if f not in replaced and f.filename != wheel.name)
        try:
            channel.update(replace(project, files=(*kept, entry)), files)
        except OSError:
            if not stored:  # what this publish stored goes with it: the index is as it was
                blobs.drop(blob)
            raise
        for gone in (f for f in replaced if f.filename != wheel.name):  # the page first: no page lists a missing file
            _unlink(channel, gone.filename)
    return Published(
        channel=channel.name,
        project=info.name,
        filename=wheel.name,
        outcome=PublishOutcome.ADDED,
        replaced=tuple(f.filename for f in replaced),
    )


def _add_key(channel: Channel, project: Project, listed: FileEntry, key: str) -> FileEntry:
    """Other inputs gave the same bytes (a reproducible build of an edited comment, say):
    the listing learns the key (under the lock), so the next build with it need not run."""
    learnt = replace(listed, build_keys=(*listed.build_keys, key))
    channel.update(replace(project, files=tuple(learnt if f == listed else f for f in project.files)))
    return learnt


def _add_provenance(channel: Channel, project: Project, listed: FileEntry, provenance: bytes) -> None:
    """A file published before it had a provenance gets the one this publish brings: the
    file first, then the page that names it."""
    name = f"{listed.filename}{PROVENANCE}"
    learnt = replace(listed, provenance=FileEntry.files_url(name))
    files = tuple(learnt if f.filename == listed.filename else f for f in project.files)
    channel.update(replace(project, files=files), {channel.files / name: provenance})


def _unlink(channel: Channel, filename: str) -> None:
    """A file no page lists any more, with its sidecars: its metadata, then its provenance."""
    (channel.files / f"{filename}.metadata").unlink(missing_ok=True)
    (channel.files / f"{filename}{PROVENANCE}").unlink(missing_ok=True)
    (channel.files / filename).unlink(missing_ok=True)


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
    its wheel: a build whose key is here made those bytes already. A yanked wheel answers
    for no key: whoever yanked it wanted another."""
    if not channel.exists():
        return {}
    found: dict[str, tuple[str, FileEntry]] = {}
    for project in channel.projects():
        for entry in (f for f in project.files if f.built and f.yanked is None):
            found |= dict.fromkeys(entry.build_keys, (project.name, entry))
    return found


def set_yanked(channel: Channel, project_name: str, version: str, reason: str | None) -> list[str]:
    """Yank (``reason`` a string, maybe empty) or unyank (None) every file of a version."""
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise IndexStoreError(
            f"'{version}' is not a version", fix="give the version as the index lists it (`wheelmill index list`)"
        ) from None
    with channel.lock():
        project = channel.project(project_name)
        if project is None:
            raise IndexStoreError(
                f"{channel.name}: no project '{project_name}'",
                fix=f"`wheelmill index list --channel {channel.name}` shows what is there",
            )
        hits = [f for f in project.files if Version(f.version) == wanted]
        if not hits:
            raise IndexStoreError(
                f"{channel.name}: {project.name} has no version {version}",
                fix=f"published versions: {', '.join(project.versions)}",
            )
        files = tuple(replace(f, yanked=reason) if Version(f.version) == wanted else f for f in project.files)
        channel.update(replace(project, files=files))
    return [f.filename for f in hits]


def remove_files(channel: Channel, project_name: str, filenames: Collection[str]) -> list[str]:
    """Drop these files of a project (a nightly track's retention; a release's files are
    never removed, only yanked): the page first, so no page ever lists a missing file."""
    with channel.lock():
        project = channel.project(project_name)
        if project is None:
            return []
        gone = [f for f in project.files if f.filename in filenames]
        channel.update(replace(project, files=tuple(f for f in project.files if f.filename not in filenames)))
        # and what a removal killed between its page and its unlinks left: no page lists it
        # now, so only a removal that names it again can find it
        listed = {f.filename for f in project.files}
        left = sorted(name for name in filenames if name not in listed and (channel.files / name).exists())
        for filename in [*(f.filename for f in gone), *left]:
            _unlink(channel, filename)
    return [f.filename for f in gone] + left


def repair(channel: Channel) -> list[str]:
    """Make ``channel`` a valid index again from what is left, and say what was done: the
    update a killed writer left is finished, leftovers go, every project's pages are
    rewritten from its JSON page (or, where that is damaged, its HTML page, or its files),
    missing sidecars are made again from their wheels, and only entries whose file is gone
    are dropped. A file whose bytes differ from its listing is reported, never relisted."""
    pending = channel.pending.read_text(encoding="utf-8").strip() if channel.pending.is_file() else None
    said = [f"finished the interrupted update of {pending or 'the project list'}"] if pending is not None else []
    said += [f"removed {p.name}" for p in channel.tmp.iterdir()] if channel.tmp.is_dir() else []
    said += [f"removed {p.name}, a generation of pages no reader saw" for p in channel.stale_generations()]
    with channel.lock():
        mended = []
        for directory in sorted(p for p in channel.simple.iterdir() if p.is_dir()):
            project, how = _recovered(channel, directory.name)
            project, notes = _complete(channel, project)
            mended.append(project)
            said += [f"{project.name}: {note}" for note in [*how, *notes]]
        channel.rewrite(mended)
    listed = {
        f.filename
        for name in channel.project_names()
        for f in (channel.project(name) or Project(name=name, files=())).files
    }
    unlisted = sorted(p.name for p in channel.files.glob("*.whl") if p.name not in listed)
    said += [f"{name} is not listed (an interrupted publish): publish it again to list it" for name in unlisted]
    return said


def _recovered(channel: Channel, name: str) -> tuple[Project, list[str]]:
    """A project's entries: its JSON page, else what its HTML page says, else its files."""
    try:
        project = channel.project(name)
    except IndexStoreError as exc:
        project, damaged = None, exc.message
    else:
        damaged = "no index.json"
    if project is not None:
        return project, []
    try:
        anchors, source = (
            pages.links((channel.simple / name / "index.html").read_text(encoding="utf-8")),
            "its index.html",
        )
    except (OSError, ValueError):
        wheels = [p for p in sorted(channel.files.glob("*.whl")) if canonicalize_name(p.name.split("-", 1)[0]) == name]
        anchors, source = [{"href": p.name} for p in wheels], "its files"
    entries = [entry for entry in (_entry(channel, anchor) for anchor in anchors) if entry is not None]
    return Project(name=name, files=tuple(entries)), [f"rebuilt from {source} ({damaged})"]


def _entry(channel: Channel, anchor: Mapping[str, str | None]) -> FileEntry | None:
    """The listing of the file a link names, from the link and the file; None when the
    file is gone (or is no wheel)."""
    url, _, digest = (anchor.get("href") or "").partition("#sha256=")
    filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
    path = channel.files / filename
    try:
        version = str(parse_wheel_filename(filename)[1])
    except InvalidWheelFilename:
        return None
    if not path.is_file():
        return None
    return FileEntry(
        filename=filename,
        version=version,
        sha256=digest or sha256_of(path),
        size=path.stat().st_size,
        upload_time=datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        requires_python=anchor.get("data-requires-python"),
        metadata_sha256=(anchor.get("data-core-metadata") or "").removeprefix("sha256="),
        yanked=anchor.get("data-yanked"),
        mirrored_from=anchor.get("data-mirrored-from"),
        gpu_archs=anchor.get("data-gpu-archs"),
        abi=anchor.get("data-abi"),
        build_keys=pages.build_keys_of(anchor.get("data-build-keys")),
        provenance=anchor.get("data-provenance") if (channel.files / f"{filename}{PROVENANCE}").is_file() else None,
    )


def _complete(channel: Channel, project: Project) -> tuple[Project, list[str]]:
    """The project with entries whose file is gone dropped, every sidecar made again from
    its wheel where it is missing or differs, and a built wheel's GPU archs read from it
    where the listing lacks them; what was done, and what cannot be."""
    entries, notes = [], []
    for entry in project.files:
        path, sidecar = channel.files / entry.filename, channel.files / f"{entry.filename}.metadata"
        if not path.is_file():
            notes.append(f"dropped {entry.filename}: its file is gone")
            continue
        if sha256_of(path) != entry.sha256:
            notes.append(f"{entry.filename}: its bytes differ from its listing: restore it from the index's storage")
        info = read_wheel(path)
        if not sidecar.is_file() or sidecar.read_bytes() != info.metadata:
            write_atomic(sidecar, info.metadata, tmp_dir=channel.tmp)
            notes.append(f"made the .metadata of {entry.filename} again")
        metadata_sha256, requires_python = (
            hashlib.sha256(info.metadata).hexdigest(),
            entry.requires_python or info.requires_python,
        )
        # a listing rebuilt from its file
        archs = gpu_archs(info) if entry.built and entry.gpu_archs is None else entry.gpu_archs
        abi = abi_of_wheel(path) if entry.built and entry.abi is None else entry.abi
        entries.append(
            replace(
                entry,
                metadata_sha256=metadata_sha256,
                requires_python=requires_python,
                size=path.stat().st_size,
                gpu_archs=archs,
                abi=abi,
            )
        )
    return replace(project, files=tuple(entries)), notes
