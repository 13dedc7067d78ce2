"""Where the index is: a directory tree (the embedded default: one machine, nothing to run)
or an object store (``WHEELMILL_INDEX_ROOT=s3://bucket/prefix``: every runner of a fleet
writes it at once). Either is a ``Storage``, and a channel on it is the one channel code's
(``wheelmill.index.objects``): a command asks for the index and its channels here, and
publishes, yanks, removes, checks and reads files through these few functions. A tree's
channel in the layout of an earlier wheelmill is refused here until it is migrated
(``wheelmill.index.legacy``)."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from wheelmill.errors import ChannelError, ConfigError
from wheelmill.index import legacy, objects
from wheelmill.index.channels import CONDA_DIR, TRACK_DIRS, Published, bucket_channel_url, conda_channel_root
from wheelmill.index.downloads import STALE_AFTER, Usage
from wheelmill.index.legacy import Migrated, refuse_legacy
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.pages import FileEntry
from wheelmill.index.storage import Storage, TreeStorage
from wheelmill.index.sweep import channels_of
from wheelmill.provenance.statement import read_beside
from wheelmill.settings import Settings

AnyChannel = ObjectChannel  # the one channel, on either storage


def is_bucket_location(location: str) -> bool:
    """Whether ``location`` (an index root, a conda channel) is in an object store
    (``s3://bucket/prefix``) rather than a directory: the one place that tells them apart."""
    return location.startswith("s3://")


@dataclass(frozen=True)
class Index:
    """A tree (``tree``) or a bucket (``bucket``: ``s3://bucket/prefix``), never both."""

    tree: Path | None = None
    bucket: str | None = None

    @classmethod
    def of(cls, settings: Settings) -> Index:
        """Where ``WHEELMILL_INDEX_ROOT`` says: an ``s3://`` location is an object store's,
        anything else a directory; unset, ``<output>/index``."""
        root = settings.index_root
        if root is not None and is_bucket_location(root):
            return cls(bucket=root)
        return cls(tree=Path(root) if root else settings.output / "index")

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

    def served_tree(self) -> Path:
        """The tree ``index serve`` serves; a bucket is served by nginx in front of it."""
        return self.read_by_path("index serve: it serves an index tree", fix="serve the bucket with nginx")

    def read_by_path(self, what: str, *, fix: str) -> Path:
        """The tree, for what reads the index's files by path (a server of its own, pip and uv
        with a file URL); a bucket is read through nginx in front of it: one line, ``fix``
        and where that nginx's configuration is."""
        if self.tree is None:
            raise ConfigError(
                f"{what}, and WHEELMILL_INDEX_ROOT is an object store ({self.bucket})",
                fix=f"{fix} in front of it: deploy/nginx-bucket.conf (docs/wheel-index.md, 'Serving from a bucket')",
            )
        return self.tree

    def downloads(self, output: Path) -> Path:
        """Where a mirror keeps what it downloads for this index: in a tree itself (what it
        publishes is then one more name of the same bytes), else under the output root."""
        return self.tree if self.tree is not None else output

    def conda_channel(self, name: str) -> str:
        """Where channel ``name``'s conda packages go, as ``wheelmill conda package --channel``
        takes it: a directory beside the tree's channels, or the bucket's ``conda/<name>``."""
        if self.tree is not None:
            return str(conda_channel_root(self.tree, name))
        assert self.bucket is not None
        return bucket_channel_url(self.bucket, name)

    def conda_channel_names(self) -> list[str]:
        """Every conda channel that holds a package or a repodata, tracks' included (``test/cu130``)."""
        top = [name for name in self.storage.children(f"{CONDA_DIR}/") if name not in TRACK_DIRS]
        tracks = [f"{track}/{name}" for track in TRACK_DIRS for name in self.storage.children(f"{CONDA_DIR}/{track}/")]
        return sorted(top + tracks)

    def holds_conda(self, name: str, subdir: str, filename: str) -> bool:
        """Whether channel ``name``'s conda channel holds that package."""
        key = f"{CONDA_DIR}/{name}/{subdir}/{filename}"
        return key in self.storage.keys_under(key)

    def channel(self, name: str) -> AnyChannel:
        if self.tree is not None:
            refuse_legacy(self.tree, name)
        return ObjectChannel(self.storage, name)

    def channel_names(self) -> list[str]:
        """Every channel with pages."""
        return [channel.name for channel in channels_of(self.storage) if channel.exists()]


def publish(
    channel: AnyChannel,
    wheel: Path,
    *,
    provenance: bytes | None = None,
    handed_over: bool = False,
    staging: objects.Staging | None = None,
    **given: str | None,
) -> Published:
    """``objects.publish``. A built wheel's provenance is the one given, else the one beside
    it (``<wheel>.intoto.jsonl``, as a build delivers it into dist/)."""
    if provenance is None and given.get("mirrored_from") is None:
        provenance = read_beside(wheel)
    return objects.publish(channel, wheel, provenance=provenance, handed_over=handed_over, staging=staging, **given)


def provenance_of(channel: AnyChannel, entry: FileEntry) -> bytes | None:
    """The signed provenance a listed file's entry names (its envelopes, one a line); None
    where it names none, or it is gone."""
    return objects.provenance_of(channel, entry)


def set_yanked(channel: AnyChannel, project: str, version: str, reason: str | None) -> list[str]:
    return objects.set_yanked(channel, project, version, reason)


def remove_files(channel: AnyChannel, project: str, filenames: Collection[str]) -> list[str]:
    return objects.remove_files(channel, project, filenames)


def problems(channel: AnyChannel, *, hashes: bool = True) -> list[str]:
    return objects.verify(channel, hashes=hashes)


def copy_file(
    source: AnyChannel,
    target: AnyChannel,
    entry: FileEntry,
    scratch: Path,
    *,
    provenance: bytes | None = None,
    staging: objects.Staging | None = None,
) -> Published:
    """A listed file of ``source`` listed in ``target`` too, the same bytes: on one storage
    its entry copied (on a bucket server-side, no byte through this machine), else
    published from the source's file. Its provenance goes with it: ``provenance`` where
    given (the source's with a promotion's statement after it), else the source's."""
    if source.storage.location == target.storage.location:  # the entry names the source's blob
        project = entry.filename.split("-", 1)[0]
        return objects.promote_file(
            source, target, str(canonicalize_name(project)), entry.filename, provenance=provenance, staging=staging
        )
    provenance = provenance or provenance_of(source, entry)
    with file_of(source, entry, scratch) as wheel:
        if wheel is None:
            raise ChannelError(
                f"{source.name}: {entry.filename} is listed but not stored",
                fix="`wheelmill index verify` says what is missing; publish it again",
            )
        if entry.built:
            return publish(target, wheel, sha256=entry.sha256, provenance=provenance, staging=staging)
        return publish(
            target, wheel, upload_time=entry.upload_time, mirrored_from=entry.mirrored_from, sha256=entry.sha256
        )


def export(
    source: AnyChannel,
    target: AnyChannel,
    *,
    built: Collection[str],
    scratch: Path,
    closure: Collection[str] | None = None,
) -> list[Published]:
    """What a consumer of ``built`` (file names) installs from ``source``, into a tree's
    channel: those built files, and the mirrored ones of ``closure`` (names; None: every
    mirrored one, the channel's whole runtime closure)."""
    wanted = [
        entry
        for project in source.projects()
        for entry in project.files
        if entry.yanked is None
        and (entry.filename in built if entry.built else closure is None or entry.filename in closure)
    ]
    return [copy_file(source, target, entry, scratch) for entry in wanted]


@dataclass(frozen=True, kw_only=True)
class Installable:
    """What a channel's consumer installs: its built files, and the mirrored ones they need."""

    channel: str
    built: tuple[str, ...]
    closure: tuple[str, ...] | None  # None: every mirrored file of the channel


@contextmanager
def tree_to_install_from(index: Index, what: Installable, *, work: Path) -> Iterator[tuple[Path, list[Published]]]:
    """An index tree holding what ``what`` names, for a server on loopback, while the block
    runs: a tree index itself (nothing fetched); a bucket's files fetched into a scratch tree
    under ``work``, removed afterwards. Yields the tree and what was fetched into it."""
    if index.tree is not None:
        yield index.tree, []
        return
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".image-index-", dir=work) as scratch:
        root = Path(scratch) / "index"
        target = Index(tree=root).channel(what.channel)
        fetched = export(
            index.channel(what.channel), target, built=what.built, closure=what.closure, scratch=Path(scratch)
        )
        yield root, fetched


@contextmanager
def file_of(channel: AnyChannel, entry: FileEntry, scratch: Path) -> Iterator[Path | None]:
    """A listed file's bytes as a path while the block runs (a tree's where it lies, a
    bucket's fetched into ``scratch``); None where the file is not there. Read it, never
    write it: a tree's is the index's own file."""
    local = channel.local_file(entry)
    if local is not None:
        yield local
        return
    copy = scratch / entry.filename
    try:
        yield copy if channel.fetch(entry, copy) else None
    finally:
        copy.unlink(missing_ok=True)


def usage(index: Index) -> Usage:
    """What the channels list against the bytes kept for them: each distinct file once,
    however many channels and tracks list it."""
    names = index.channel_names()
    entries = [f for name in names for project in index.channel(name).projects() for f in project.files]
    distinct = {f.sha256: f.size for f in entries}
    return Usage(
        channels=len(names),
        listed_files=len(entries),
        listed_bytes=sum(f.size for f in entries),
        stored_files=len(distinct),
        stored_bytes=sum(distinct.values()),
    )


def migrate(index: Index, *, on_channel: Callable[[Migrated], None]) -> list[Migrated]:
    """A tree's channels of an earlier wheelmill's layout written as objects; a bucket's are
    objects already."""
    return legacy.migrate(index.tree, on_channel=on_channel) if index.tree is not None else []


def tidy(index: Index) -> list[Path]:
    """The temporary files a tree's killed writers left, removed; what was removed (a
    bucket keeps none: a request is whole or not made)."""
    if not isinstance(index.storage, TreeStorage):
        return []
    left = index.storage.stale_work(idle=STALE_AFTER)
    for path in left:
        path.unlink(missing_ok=True)
    return left
