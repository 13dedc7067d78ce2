"""Writing files so that no reader, crash or kill ever sees half of one, and one writer at a
time: the one atomic write and the one file lock of wheelmill.

A new file is written under a temporary name in the same directory (or a given one on the
same file system), flushed to disk, and renamed over its final name: a rename is atomic,
so the name points at the old bytes or the new ones, never at a mix. Temporary names start
with ``TMP_PREFIX`` and end in ``.part``, so leftovers of a killed writer are recognizable.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

TMP_PREFIX = ".wm-tmp-"
TMP_SUFFIX = ".part"


@contextmanager
def atomic_path(path: Path, *, tmp_dir: Path | None = None) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to; renamed onto ``path`` when the
    block ends normally (after an fsync), removed when it raises."""
    directory = tmp_dir or path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=TMP_SUFFIX, dir=directory)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with tmp.open("rb+") as written:
            os.fsync(written.fileno())  # the bytes are on disk before the name points at them
        tmp.chmod(0o644)  # readable by a web server's user
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes, *, tmp_dir: Path | None = None) -> None:
    with atomic_path(path, tmp_dir=tmp_dir) as tmp:
        tmp.write_bytes(data)


def copy_atomic(source: Path, path: Path, *, tmp_dir: Path | None = None) -> None:
    with atomic_path(path, tmp_dir=tmp_dir) as tmp, source.open("rb") as src, tmp.open("wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)


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
