"""Where the index's objects are kept: the small protocol that an index is written on, and
its first implementation, a directory tree. The S3 API is the other (``wheelmill.index.s3``).

Writers on many machines share one index only through what its storage itself guarantees,
never through a lock of their own (issue 43). Both implementations give the same five:

    get(key)                  the object's bytes and its version, or None
    create(key, source)       create-once: True where this call made it; False where the key
                              was there (S3: If-None-Match: *); whatever raced, one wins;
                              a source given as ``Linked`` is the index's to keep (the tree
                              makes the key another name of it, no copy)
    swap(key, data, version)  compare-and-swap: replace the object only where its version is
                              still ``version`` (S3: If-Match on the ETag); False otherwise
    copy(source, key)         create-once, from another object (S3: CopyObject, no byte
                              through the caller)
    keys_under(prefix)        every key under a prefix, sorted; delete(key)
    children(prefix)          the names one level below a prefix that hold objects (S3: a
                              listing with a delimiter), sorted
    local(key)                the object as a file of this machine where it is one (the
                              tree's), else None: a reader fetches it instead

A version is opaque: compare it, never read it. Keys are ``/``-separated relative names of
plain segments (``cu130/simple/torch/index.json``): the same key means the same object in
both implementations, and none reaches outside the root.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from wheelmill.errors import ChannelError, IndexWriteError
from wheelmill.files import Content, Linked, file_lock, write_all, write_once

_SEGMENT = re.compile(r"^[A-Za-z0-9_+=@,-][A-Za-z0-9._+=@,-]*$")
# The tree's own directories beside the objects; no key starts with a dot, so none is one.
_WORK = ".storage"


@dataclass(frozen=True, kw_only=True)
class Stored:
    """An object as read: its bytes, and the version a swap of it compares against."""

    data: bytes
    version: str


@dataclass(frozen=True, kw_only=True)
class Headers:
    """What a server in front of the storage sends with an object: a bucket keeps them with
    the object; a tree's server (deploy/nginx-index.conf) sets its own by path."""

    content_type: str | None = None
    cache_control: str | None = None


class Storage(Protocol):
    """What the index is written on; see the module's docstring for the guarantees."""

    @property
    def location(self) -> str:
        """The root, as a person names it: a directory, or ``s3://bucket/prefix``."""
        ...

    def get(self, key: str) -> Stored | None: ...

    def fetch(self, key: str, dest: Path) -> bool:
        """The object's bytes into ``dest`` (replaced whole), streamed; False where it is not."""
        ...

    def create(self, key: str, source: bytes | Path | Linked, *, headers: Headers | None = None) -> bool: ...

    def swap(self, key: str, data: bytes, *, version: str, headers: Headers | None = None) -> bool: ...

    def copy(self, source: str, key: str) -> bool: ...

    def keys_under(self, prefix: str = "") -> list[str]: ...

    def children(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...

    def local(self, key: str) -> Path | None: ...


def checked_key(key: str, *, prefix: bool = False) -> str:
    """``key`` where it is one (``prefix``: an empty one, or one ending in ``/``, too); an
    ``ChannelError`` naming it otherwise: a key never escapes the root, whatever reads it.

    >>> checked_key("cu130/simple/torch/index.json")
    'cu130/simple/torch/index.json'
    >>> checked_key("cu130/", prefix=True), checked_key("", prefix=True)
    ('cu130/', '')
    >>> checked_key("cu130/../x")
    Traceback (most recent call last):
    ...
    wheelmill.errors.ChannelError: 'cu130/../x' is not a storage key
    """
    body = key.removesuffix("/") if prefix else key
    if (prefix and not body) or all(_SEGMENT.match(part) for part in body.split("/")):
        return key
    raise ChannelError(
        f"'{key}' is not a storage key",
        fix="name objects by /-separated plain segments (letters, digits, ._+=@,-; none starting with a dot)",
    )


def version_of(data: bytes) -> str:
    """The tree's version of an object: its sha256, as S3's ETag is the MD5 of a plain PUT."""
    return hashlib.sha256(data).hexdigest()


class TreeStorage:
    """Objects as files under a directory: one machine's index, the embedded default. A
    create is a link of a written, synced file (a link never replaces a name); a swap holds a
    lock per object while it compares and renames; a reader sees a whole old object or a
    whole new one."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def location(self) -> str:
        return str(self.root)

    def path(self, key: str) -> Path:
        return self.root / checked_key(key)

    @property
    def _tmp(self) -> Path:
        return self.root / _WORK / "tmp"

    def get(self, key: str) -> Stored | None:
        try:
            data = self.path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        return Stored(data=data, version=version_of(data))

    def fetch(self, key: str, dest: Path) -> bool:
        path = self.path(key)
        if not path.is_file():
            return False
        write_all({dest: path})
        return True

    # A tree's headers are its server's (deploy/nginx-index.conf): no object carries them.
    def create(self, key: str, source: bytes | Path | Linked, *, headers: Headers | None = None) -> bool:  # noqa: ARG002
        return self._write_once(key, source)

    def swap(self, key: str, data: bytes, *, version: str, headers: Headers | None = None) -> bool:  # noqa: ARG002
        path = self.path(key)
        with _writing(self.location, key), file_lock(self.root / _WORK / "locks" / version_of(key.encode())):
            current = self.get(key)
            if current is None or current.version != version:
                return False
            write_all({path: data}, tmp_dir=self._tmp)
            return True

    def copy(self, source: str, key: str) -> bool:
        origin = self.path(source)
        if not origin.is_file():
            raise ChannelError(f"{self.location}: no object {source} to copy", fix="copy an object that is there")
        return self._write_once(key, Linked(origin))

    def _write_once(self, key: str, content: Content) -> bool:
        path = self.path(key)
        with _writing(self.location, key):
            path.parent.mkdir(parents=True, exist_ok=True)
            return write_once(path, content, tmp_dir=self._tmp)

    def keys_under(self, prefix: str = "") -> list[str]:
        checked_key(prefix, prefix=True)
        top = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        return sorted(key for key in self._walk(top) if key.startswith(prefix))

    def children(self, prefix: str) -> list[str]:
        top = self.root / checked_key(prefix, prefix=True)
        if not top.is_dir():
            return []
        with os.scandir(top) as found:
            return sorted(e.name for e in found if not e.name.startswith(".") and _holds_an_object(Path(e.path)))

    def _walk(self, top: Path) -> Iterator[str]:
        """Every object's key under ``top``, the tree's own dot-named work left out. One
        listing per directory (a channel of 10,000 files is 30,000 objects)."""
        for directory, dirs, files in os.walk(top):
            dirs[:] = [name for name in dirs if not name.startswith(".")]
            base = Path(directory).relative_to(self.root).as_posix()
            yield from (name if base == "." else f"{base}/{name}" for name in files if not name.startswith("."))

    def delete(self, key: str) -> None:
        with _writing(self.location, key):
            self.path(key).unlink(missing_ok=True)

    def local(self, key: str) -> Path | None:
        path = self.path(key)
        return path if path.is_file() else None

    def stale_work(self, *, idle: float) -> list[Path]:
        """The temporary files of writes killed midway (no write takes ``idle`` seconds
        without touching its file): no reader ever sees them, and nothing else removes them."""
        if not self._tmp.is_dir():
            return []
        now = time.time()
        return sorted(p for p in self._tmp.iterdir() if p.is_file() and now - p.stat().st_mtime > idle)


def _holds_an_object(path: Path) -> bool:
    """A file, or a directory with one somewhere below: found at the first, not counted."""
    if path.is_file():
        return True
    for _directory, dirs, files in os.walk(path):
        dirs[:] = [name for name in dirs if not name.startswith(".")]
        if any(not name.startswith(".") for name in files):
            return True
    return False


@contextmanager
def _writing(location: str, key: str) -> Iterator[None]:
    """An OS error while writing an object (a full disk, a read-only tree) as one error that
    names the object; the object is as it was."""
    try:
        yield
    except OSError as exc:
        raise IndexWriteError(
            f"{location}: cannot write {key}: {exc.strerror or exc}",
            fix="free space, or make the index root writable; the object is as it was",
        ) from None
