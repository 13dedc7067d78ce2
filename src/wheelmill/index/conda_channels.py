"""A conda channel: ``<root>/<subdir>/<package>.conda`` and each subdir's ``repodata.json``,
written by py-rattler's indexer, in a directory (``CondaChannel``) or an object store
(``BucketCondaChannel``), beside the wheel channels of either index. Immutable like the wheel
index: the same bytes under a published name are a no-op, other bytes are refused. In a
directory, one writer at a time; a package is renamed into place whole, and the index is
rewritten after it, so a killed writer leaves a package the next write (or ``wheelmill conda
index``) lists.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import os
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from wheelmill.errors import PACKAGE_TAKEN_FIX, ChannelError, IndexConflict, IndexWriteError, UsageError
from wheelmill.files import Linked, file_lock, write_all
from wheelmill.index.channels import CONDA_DIR
from wheelmill.index.roots import is_bucket_location
from wheelmill.machine.net import sha256_of

if TYPE_CHECKING:
    from rattler.index import S3Credentials

    from wheelmill.index.roots import Index
    from wheelmill.index.s3 import S3Storage

# a channel indexes noarch even where it has none: solvers read it beside their machine's
SUBDIRS = ("linux-64", "linux-aarch64", "noarch")
INDEX_TRIES = 5  # runs of the S3 indexer, where another job's indexer wrote first
REPODATA = "noarch/repodata.json"  # written by every index of a channel: solvers can read it


class AddOutcome(StrEnum):
    ADDED = "added"
    UNCHANGED = "unchanged"  # the same bytes were there


@dataclass(frozen=True, kw_only=True)
class Added:
    path: Path
    outcome: AddOutcome


def configured_channels(given: Sequence[str], index: Index) -> list[str]:
    """The channels solves read, as URLs: those given (URLs or directories), else the
    indexed ones beside ``index``'s wheel channels, so a CPU and a CUDA build are both offered."""
    if given:
        return [c if "://" in c else Path(c).resolve().as_uri() for c in given]
    local = [channel for channel in index_channels(index) if channel.indexed()]
    if not local:
        raise UsageError(
            f"conda: no conda channel under {index.location.rstrip('/')}/{CONDA_DIR}",
            fix="seed one (wheelmill conda seed --cell ...) or give --channel URL",
        )
    return [channel.url for channel in local]


def index_channels(index: Index) -> list[AnyCondaChannel]:
    """Every conda channel beside ``index``'s wheel channels that a write started, tracks' included."""
    return [channel_at(index.conda_channel(name)) for name in index.conda_channel_names()]


def channel_at(location: str) -> AnyCondaChannel:
    """The conda channel at ``location``, as ``--channel`` and the index give it: an object
    store's (``s3://bucket/prefix/conda/cu130``), else a directory."""
    return BucketCondaChannel(location) if is_bucket_location(location) else CondaChannel(Path(location))


class CondaChannel:
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def url(self) -> str:
        return self.root.resolve().as_uri()

    @property
    def location(self) -> str:
        return str(self.root)

    def package_names(self) -> set[str]:
        return {p.name for p in self.packages()}

    def indexed(self) -> bool:
        return (self.root / REPODATA).is_file()

    def add(self, packages: list[Path]) -> list[Added]:
        """Each package into its subdir (the directory it was written to names it), then the
        channel indexed once."""
        with self._locked():
            added = [self._add_one(package) for package in packages]
            self._index()
        return added

    def reindex(self) -> None:
        with self._locked():
            self._index()

    def _add_one(self, package: Path) -> Added:
        subdir = package.parent.name
        if subdir not in SUBDIRS:
            raise IndexWriteError(
                f"{package}: not in a subdir of {', '.join(SUBDIRS)}",
                fix="write packages into <dir>/linux-64, <dir>/linux-aarch64 or <dir>/noarch",
            )
        target = self.root / subdir / package.name
        if target.exists():
            if sha256_of(target) == sha256_of(package):
                return Added(path=target, outcome=AddOutcome.UNCHANGED)
            raise IndexConflict(
                f"{target}: already published with other bytes",
                fix=PACKAGE_TAKEN_FIX,
            )
        write_all({target: Linked(package)})  # the temporary's name ends in .part: no indexer lists it
        return Added(path=target, outcome=AddOutcome.ADDED)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            for subdir in SUBDIRS:
                (self.root / subdir).mkdir(parents=True, exist_ok=True)
            with file_lock(self.root / ".lock"):
                yield
        except OSError as exc:
            raise IndexWriteError(
                f"{self.root}: cannot write the conda channel: {exc.strerror or exc} ({exc.filename or self.root})",
                fix="free space, or make the index root writable (WHEELMILL_INDEX_ROOT)",
            ) from None

    def _index(self) -> None:
        from rattler.exceptions import CacheDirError, IoError  # noqa: PLC0415 - a native module: loaded when used
        from rattler.index import index_fs  # noqa: PLC0415

        # Checked before: rattler's indexer panics on an archive that is no zip, blames a
        # damaged one on the disk ("No index.json found"), or lists it with its new sha256.
        _refuse_damaged(self.root, self.packages())
        try:
            asyncio.run(index_fs(self.root, write_zst=False, write_shards=False, force=True))
        except (CacheDirError, IoError) as exc:
            fix = "free space or make the channel writable; then run wheelmill conda index"
            raise IndexWriteError(f"{self.root}: cannot index the conda channel: {exc}", fix=fix) from None

    def packages(self) -> list[Path]:
        return sorted(p for subdir in SUBDIRS for p in (self.root / subdir).glob("*.conda"))


def archive_damage(path: Path) -> str | None:
    """Why ``path`` is no whole .conda archive, or None where it is one. A .conda is a zip of
    ``metadata.json`` and two zstd tarballs, ``info-*.tar.zst`` and ``pkg-*.tar.zst``; each
    member's CRC is checked, since bytes overwritten in place keep the file's size and the
    zip's directory at its end, which is all ``zipfile.is_zipfile`` reads.

    >>> scratch = __import__("tempfile").TemporaryDirectory()
    >>> p = Path(scratch.name) / "x-1-0.conda"
    >>> _ = p.write_bytes(b"not a zip")
    >>> archive_damage(p)
    'not a zip archive'
    >>> with zipfile.ZipFile(p, "w") as z:
    ...     z.writestr("metadata.json", "{}"); z.writestr("pkg-x-1-0.tar.zst", b"p" * 64)
    ...     z.writestr("info-x-1-0.tar.zst", b"i")
    >>> archive_damage(p) is None
    True
    >>> data = bytearray(p.read_bytes()); data[120:124] = b"XXXX"; _ = p.write_bytes(bytes(data))
    >>> archive_damage(p)
    'its member pkg-x-1-0.tar.zst is damaged (its CRC or header is wrong)'
    >>> scratch.cleanup()
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            bad = archive.testzip()  # the name of the first member that fails its CRC or header check
    except zipfile.BadZipFile:
        return "not a zip archive"
    except (zlib.error, EOFError, NotImplementedError) as exc:  # a member that is not stored: its stream is damaged
        return f"a member cannot be read: {exc}"
    if bad is not None:
        return f"its member {bad} is damaged (its CRC or header is wrong)"
    missing = [m for m in ("metadata.json", "info-*.tar.zst", "pkg-*.tar.zst") if not fnmatch.filter(names, m)]
    return f"it has no {' and no '.join(missing)}" if missing else None


def _refuse_damaged(root: Path, packages: list[Path]) -> None:
    """Stop before the indexer writes anything where a package is damaged: its repodata
    stays as it was, and the line names the package, not the disk."""
    damaged = [(p, why) for p in packages if (why := archive_damage(p)) is not None]
    if damaged:
        first, why = damaged[0]
        raise ChannelError(
            f"{root}: {first.relative_to(root)} is not a .conda archive: {why}"
            + (f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""),
            fix=f"remove {first.name}, publish its wheel again (wheelmill conda package), "
            "then run wheelmill conda index",
        )


class BucketCondaChannel:
    """A conda channel in an object store, beside its wheel channels
    (``s3://bucket/prefix/conda/cu130``): each package made once (``If-None-Match``: the
    same bytes again are a no-op, other bytes are refused), then py-rattler's S3 indexer
    writes each subdir's repodata with conditional writes, so jobs adding packages at once
    lose none; an indexer that lost a race runs again."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    @property
    def location(self) -> str:
        return self.url

    def add(self, packages: list[Path]) -> list[Added]:
        added = [self._add_one(package) for package in packages]
        self._index()
        return added

    def package_names(self) -> set[str]:
        keys = (key for subdir in SUBDIRS for key in self._storage.keys_under(f"{subdir}/"))
        return {key.rsplit("/", 1)[1] for key in keys if key.endswith(".conda")}

    def indexed(self) -> bool:
        return REPODATA in self._storage.keys_under(REPODATA)

    @functools.cached_property
    def _storage(self) -> S3Storage:
        """One S3 client for all of the channel's calls, not one a call."""
        from wheelmill.index.s3 import S3Storage  # noqa: PLC0415 - the SDK loads only for a bucket

        return S3Storage.of(self.url)

    def reindex(self) -> None:
        self._index()

    def _add_one(self, package: Path) -> Added:
        from wheelmill.index.storage import Headers  # noqa: PLC0415

        subdir = package.parent.name
        if subdir not in SUBDIRS or not zipfile.is_zipfile(package):
            raise IndexWriteError(
                f"{package}: not a .conda archive in a subdir of {', '.join(SUBDIRS)}",
                fix="write packages with wheelmill conda package",
            )
        storage = self._storage
        key = f"{subdir}/{package.name}"
        if storage.create(key, package, headers=Headers(content_type="application/octet-stream")):
            return Added(path=package, outcome=AddOutcome.ADDED)
        with tempfile.TemporaryDirectory(prefix="wheelmill-conda-") as scratch:
            there = Path(scratch) / package.name
            if storage.fetch(key, there) and sha256_of(there) == sha256_of(package):
                return Added(path=package, outcome=AddOutcome.UNCHANGED)
        raise IndexConflict(
            f"{self.url}/{key}: already published with other bytes",
            fix=PACKAGE_TAKEN_FIX,
        )

    def _index(self) -> None:
        from rattler.index import index_s3  # noqa: PLC0415 - a native module: loaded when used

        for tries in range(1, INDEX_TRIES + 1):
            try:
                asyncio.run(index_s3(self.url, credentials=_credentials(), write_zst=False, write_shards=False))
            except Exception as exc:  # noqa: BLE001 - a native indexer's failures carry no common type
                if tries == INDEX_TRIES:
                    said = str(exc).splitlines()[0] if str(exc) else repr(exc)
                    raise IndexWriteError(
                        f"{self.url}: cannot index the conda channel: {said}",
                        fix="check the object store's endpoint and credentials; then run wheelmill conda index",
                    ) from None
                time.sleep(0.5 * 2**tries)  # another job's indexer wrote first: read its repodata again
            else:
                return


AnyCondaChannel = CondaChannel | BucketCondaChannel


def _credentials() -> S3Credentials | None:
    """What rattler's S3 client needs to reach a server other than AWS's (the same variables
    the AWS SDK reads); None: the SDK's default chain, for AWS itself."""
    from rattler.index import S3Credentials  # noqa: PLC0415

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return None
    return S3Credentials(
        endpoint_url=endpoint,
        region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        session_token=os.environ.get("AWS_SESSION_TOKEN"),
        addressing_style="path",
    )
