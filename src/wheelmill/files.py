"""Writing files so that no reader, crash or kill ever sees half of one, and one writer at a
time: the one atomic write and the one file lock of wheelmill.

A new file is written under a temporary name in the same directory (or a given one on the
same file system), flushed to disk, and renamed over its final name: a rename is atomic,
so the name points at the old bytes or the new ones, never at a mix. Temporary names start
with ``TMP_PREFIX`` and end in ``.part``, so leftovers of a killed writer are recognizable.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

TMP_PREFIX = ".wm-tmp-"
TMP_SUFFIX = ".part"


@contextmanager
def atomic_path(path: Path, *, tmp_dir: Path | None = None) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to; renamed onto ``path`` when the
    block ends normally (after an fsync), removed when it raises."""
    tmp = _temporary(path, tmp_dir)
    try:
        yield tmp
        _sync(tmp)
        _rename(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Linked:
    """A file's content given as another name of it: hard-linked, not copied, so however
    many names a file has its bytes are stored once (copied where no link can be made)."""

    source: Path


def write_atomic(path: Path, data: bytes, *, tmp_dir: Path | None = None) -> None:
    write_all({path: data}, tmp_dir=tmp_dir)


def copy_atomic(source: Path, path: Path, *, tmp_dir: Path | None = None) -> None:
    write_all({path: source}, tmp_dir=tmp_dir)


Content = bytes | Path | Linked


def write_all(contents: Mapping[Path, Content], *, tmp_dir: Path | None = None) -> None:
    """Files, each atomically, renamed in the given order, from bytes, from a file to copy or
    from a file to link; every new content is written out and synced before the first
    rename, so a full disk changes none of them."""
    temps: list[Path] = []
    try:
        for path, data in contents.items():
            tmp = _temporary(path, tmp_dir)
            temps.append(tmp)
            if isinstance(data, Linked) and _linked(data.source, tmp):
                continue  # the bytes are the source's, already on disk
            _copy(data.source if isinstance(data, Linked) else data, tmp)
            _sync(tmp)
        for tmp, path in zip(temps, contents, strict=True):
            _rename(tmp, path)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)


def write_once(path: Path, data: Content, *, tmp_dir: Path | None = None) -> bool:
    """``path`` created with ``data``, whole, unless it exists: True where this call made it.
    The bytes are written and synced under a temporary name, which is then linked to
    ``path``: a link never replaces a name, so of writers racing for one path one wins and
    the others leave it as the winner wrote it."""
    tmp = _temporary(path, tmp_dir)
    try:
        if not (isinstance(data, Linked) and _linked(data.source, tmp)):
            _copy(data.source if isinstance(data, Linked) else data, tmp)
            _sync(tmp)
        tmp.chmod(tmp.stat().st_mode | 0o444)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _copy(data: bytes | Path, tmp: Path) -> None:
    if isinstance(data, Path):
        with data.open("rb") as src, tmp.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    else:
        tmp.write_bytes(data)


def _linked(source: Path, tmp: Path) -> bool:
    """Make ``tmp`` another name of ``source``; False where this file system cannot."""
    tmp.unlink()
    try:
        os.link(source, tmp)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        return False
    return True


def _temporary(path: Path, tmp_dir: Path | None) -> Path:
    directory = tmp_dir or path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=TMP_SUFFIX, dir=directory)
    os.close(fd)
    return Path(name)


def _sync(tmp: Path) -> None:
    with tmp.open("rb+") as written:
        os.fsync(written.fileno())  # the bytes are on disk before a name points at them


def sync_directory(directory: Path) -> None:
    """A rename in ``directory`` on disk (its entry, not only the file's bytes)."""
    handle = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _rename(tmp: Path, path: Path) -> None:
    mode = tmp.stat().st_mode & 0o7777
    if mode & 0o444 != 0o444:  # readable by a web server's user; a linked file's mode is its source's too
        tmp.chmod(mode | 0o444)
    tmp.replace(path)


def target_of(leftover: Path) -> str:
    """The file a leftover temporary was meant to become.

    >>> target_of(Path(".wm-tmp-lib-1.0-py3-none-any.whl.k2j3h4.part"))
    'lib-1.0-py3-none-any.whl'
    """
    return leftover.name.removeprefix(TMP_PREFIX).removesuffix(TMP_SUFFIX).rsplit(".", 1)[0]


@contextmanager
def file_lock(path: Path, *, busy: Callable[[str], Exception] | None = None) -> Iterator[IO[str]]:
    """An exclusive lock on ``path`` (created if missing) for the block; a dead holder's
    lock dies with it. Waits for the holder, or with ``busy`` raises ``busy(holder)`` at
    once (the file names the holder's pid)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if busy is None else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            assert busy is not None, "only a lock taken without waiting is refused"
            handle.seek(0)
            raise busy(handle.read().strip() or "another process") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
