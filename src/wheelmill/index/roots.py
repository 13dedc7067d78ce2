"""Where the index is: a directory tree (the embedded default: one machine, nothing to run)
or an object store (``WHEELMILL_INDEX_ROOT=s3://bucket/prefix``: every runner of a fleet
writes it at once). A command asks for the index and its channels here, and publishes,
yanks, removes and checks through these few functions, whichever it is."""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from wheelmill.errors import IndexStoreError
from wheelmill.index import objects, store
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.pages import FileEntry
from wheelmill.index.storage import Storage, TreeStorage
from wheelmill.index.store import Channel, Published
from wheelmill.index.sweep import stored_names
from wheelmill.index.verify import verify
from wheelmill.provenance.statement import read_beside
from wheelmill.settings import Settings

AnyChannel = Channel | ObjectChannel


@dataclass(frozen=True)
class Index:
    """A tree (``tree``) or a bucket (``bucket``: ``s3://bucket/prefix``), never both."""

    tree: Path | None = None
    bucket: str | None = None

    @classmethod
    def of(cls, settings: Settings) -> Index:
        return cls(bucket=settings.index_bucket) if settings.index_bucket else cls(tree=settings.index)

    @property
    def location(self) -> str:
        return self.bucket or str(self.tree)

    @functools.cached_property
    def storage(self) -> Storage:
        if self.bucket is not None:
            from wheelmill.index.s3 import S3Storage  # noqa: PLC0415 - the SDK loads only for a bucket

            return S3Storage.of(self.bucket)
        assert self.tree is not None
        return TreeStorage(self.tree)

    def channel(self, name: str) -> AnyChannel:
        return ObjectChannel(self.storage, name) if self.bucket else Channel(self.storage_root, name)

    @property
    def storage_root(self) -> Path:
        assert self.tree is not None
        return self.tree

    def channel_names(self) -> list[str]:
        """Every channel with pages."""
        if self.bucket is None:
            return store.channel_names(self.storage_root)
        return [n for n in stored_names(self.storage) if self.channel(n).exists()]


def publish(channel: AnyChannel, wheel: Path, *, provenance: bytes | None = None, **given: str | None) -> Published:
    """``store.publish`` or ``objects.publish``: the same rules, on a tree or as objects. A
    built wheel's provenance is the one given, else the one beside it (``<wheel>.intoto.jsonl``,
    as a build delivers it into dist/)."""
    if provenance is None and given.get("mirrored_from") is None:
        provenance = read_beside(wheel)
    if isinstance(channel, ObjectChannel):
        return objects.publish(channel, wheel, provenance=provenance, **given)
    return store.publish(channel, wheel, provenance=provenance, **given)


def provenance_of(channel: AnyChannel, entry: FileEntry) -> bytes | None:
    """The signed provenance a listed file's entry names (its envelopes, one a line); None
    where it names none, or it is gone."""
    if isinstance(channel, ObjectChannel):
        return objects.provenance_of(channel, entry)
    return read_beside(channel.files / entry.filename) if entry.provenance is not None else None


def set_yanked(channel: AnyChannel, project: str, version: str, reason: str | None) -> list[str]:
    if isinstance(channel, ObjectChannel):
        return objects.set_yanked(channel, project, version, reason)
    return store.set_yanked(channel, project, version, reason)


def remove_files(channel: AnyChannel, project: str, filenames: Collection[str]) -> list[str]:
    if isinstance(channel, ObjectChannel):
        return objects.remove_files(channel, project, filenames)
    return store.remove_files(channel, project, filenames)


def problems(channel: AnyChannel, *, hashes: bool = True) -> list[str]:
    if isinstance(channel, ObjectChannel):
        return objects.verify(channel, hashes=hashes)
    return verify(channel, hashes=hashes)


def copy_file(
    source: AnyChannel, target: AnyChannel, entry: FileEntry, scratch: Path, *, provenance: bytes | None = None
) -> Published:
    """A listed file of ``source`` listed in ``target`` too, the same bytes: between two
    object channels its entry copied server-side (no byte through this machine), else
    published from the source's file. Its provenance goes with it: ``provenance`` where
    given (the source's with a promotion's statement after it), else the source's."""
    if isinstance(source, ObjectChannel) and isinstance(target, ObjectChannel):  # the entry names the source's
        project = entry.filename.split("-", 1)[0]
        return objects.promote_file(
            source, target, str(canonicalize_name(project)), entry.filename, provenance=provenance
        )
    provenance = provenance or provenance_of(source, entry)
    with file_of(source, entry, scratch) as wheel:
        if wheel is None:
            raise IndexStoreError(
                f"{source.name}: {entry.filename} is listed but not stored",
                fix="`wheelmill index verify` says what is missing; publish it again",
            )
        if entry.built:
            return publish(target, wheel, sha256=entry.sha256, provenance=provenance)
        return publish(
            target, wheel, upload_time=entry.upload_time, mirrored_from=entry.mirrored_from, sha256=entry.sha256
        )


def export(source: AnyChannel, target: Channel, *, built: Collection[str], scratch: Path) -> list[Published]:
    """What a consumer of ``built`` (file names) installs from ``source``, into a tree's
    channel: those built files, and every mirrored one (the runtime closure): what a cell's
    images install from an object store, served on loopback as a tree."""
    wanted = [
        entry
        for project in source.projects()
        for entry in project.files
        if entry.yanked is None and (not entry.built or entry.filename in built)
    ]
    return [copy_file(source, target, entry, scratch) for entry in wanted]


@contextmanager
def file_of(channel: AnyChannel, entry: FileEntry, scratch: Path) -> Iterator[Path | None]:
    """A listed file's bytes as a path while the block runs (a bucket's, fetched into
    ``scratch``); None where the file is not there."""
    if isinstance(channel, Channel):
        path = channel.files / entry.filename
        yield path if path.is_file() else None
        return
    copy = scratch / entry.filename
    try:
        yield copy if channel.fetch(entry, copy) else None
    finally:
        copy.unlink(missing_ok=True)
