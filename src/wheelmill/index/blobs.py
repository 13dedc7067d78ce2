"""The index's content-addressed storage: the bytes of every published file once, under
``<root>/.store/sha256/<first two digits>/<sha256>``, and each channel's file another name
(a hard link) of them. A wheel that several channels or tracks hold (the nvidia-* wheels
of every CUDA channel, a release promoted from the test track) takes its disk once.

The store is a dot directory, so no server shows it; a blob is named by its content, so
writers of different channels that store the same bytes at once agree, and a blob is
never changed, only added.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from wheelmill.config import format_size
from wheelmill.files import copy_atomic

STORE_DIR = ".store"
STALE_AFTER = 600.0  # seconds without a write: a download's leftover, not a download


class Blobs:
    def __init__(self, root: Path) -> None:
        self.root = root / STORE_DIR / "sha256"

    @property
    def incoming(self) -> Path:
        """Where downloads land before they are verified and named by their sha256."""
        return self.root.parent / "incoming"

    def path_of(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    def holds(self, sha256: str) -> bool:
        return self.path_of(sha256).is_file()

    def put(self, source: Path, sha256: str, *, tmp_dir: Path) -> Path:
        """``source``'s bytes (whose sha256 the caller computed) stored once: copied, never
        linked, so nothing outside the index can change them."""
        blob = self.path_of(sha256)
        if not blob.is_file():
            blob.parent.mkdir(parents=True, exist_ok=True)
            try:
                copy_atomic(source, blob, tmp_dir=tmp_dir)
            except OSError:  # a full disk: nothing of this put is left, its directory neither
                self.drop(blob)
                raise
        return blob

    def drop(self, blob: Path) -> None:
        """A blob a failed publish stored, and its directory where that is left empty."""
        blob.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: other blobs are in it
            blob.parent.rmdir()

    def stale_downloads(self, *, idle: float = STALE_AFTER) -> list[Path]:
        """What killed mirrors left in ``incoming``: files nothing wrote to for ``idle``
        seconds (a download in progress writes all the time)."""
        if not self.incoming.is_dir():
            return []
        now = time.time()
        return sorted(p for p in self.incoming.rglob("*") if p.is_file() and now - p.stat().st_mtime > idle)

    def orphans(self, *, idle: float = STALE_AFTER) -> list[Path]:
        """Stored files no channel links to any more (a nightly's pruned files, a killed
        publish's blob), untouched for ``idle`` seconds (a publish links its blob at once)."""
        now = time.time()
        return sorted(p for p in self.all() if p.stat().st_nlink == 1 and now - p.stat().st_mtime > idle)

    def all(self) -> Iterator[Path]:
        return (p for p in self.root.glob("??/*") if p.is_file()) if self.root.is_dir() else iter(())


@dataclass(frozen=True, kw_only=True)
class Usage:
    """What the channels list against what the disk holds for them."""

    channels: int
    listed_files: int
    listed_bytes: int  # the sum of the sizes the channels' pages list
    stored_files: int
    stored_bytes: int  # each distinct file (inode) once: the store and the channels' files

    def describe(self) -> str:
        saved = self.listed_bytes - self.stored_bytes
        return (
            f"{self.channels} channel(s) list {self.listed_files} files, {format_size(self.listed_bytes)}; "
            f"stored once: {self.stored_files} files, {format_size(self.stored_bytes)}"
            + (f" ({format_size(saved)} saved by sharing)" if saved > 0 else "")
        )


def stored(paths: Iterable[Path]) -> tuple[int, int]:
    """The number and bytes of the distinct files among ``paths`` (hard links counted once)."""
    inodes: dict[tuple[int, int], int] = {}
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        inodes[st.st_dev, st.st_ino] = st.st_size
    return len(inodes), sum(inodes.values())
