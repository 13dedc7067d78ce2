"""Where a mirror keeps what it downloads: each file's bytes once, under
``<root>/.store/sha256/<first two digits>/<sha256>`` (``<root>``: a tree index's own root,
or the output root for a bucket), verified before they are named by their sha256. A tree
index's blob of the same bytes is another name (a hard link) of the download, so a closure's
gigabytes take their disk once; the next cell that needs the same torch finds it here.

The download area is a dot directory, so no server shows it; a file is named by its
content, so mirrors of different channels that keep the same bytes at once agree.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from wheelmill.config import format_size

# Named ".store" on disk: the indexes and output roots that earlier versions wrote hold it
# under that name, so the directory keeps it.
DOWNLOADS_DIR = ".store"
STALE_AFTER = 600.0  # seconds without a write: a download's leftover, not a download


class Downloads:
    """A mirror's download area under ``root`` (``wheelmill.index.roots.Index.downloads``)."""

    def __init__(self, root: Path) -> None:
        self.root = root / DOWNLOADS_DIR / "sha256"

    @property
    def incoming(self) -> Path:
        """Where downloads land before they are verified and named by their sha256."""
        return self.root.parent / "incoming"

    def path_of(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    def holds(self, sha256: str) -> bool:
        return self.path_of(sha256).is_file()

    def stale_downloads(self, *, idle: float = STALE_AFTER) -> list[Path]:
        """What killed mirrors left in ``incoming``: files nothing wrote to for ``idle``
        seconds (a download in progress writes all the time)."""
        if not self.incoming.is_dir():
            return []
        now = time.time()
        return sorted(p for p in self.incoming.rglob("*") if p.is_file() and now - p.stat().st_mtime > idle)

    def orphans(self, *, idle: float = STALE_AFTER) -> list[Path]:
        """Downloads no index file is another name of any more (the sweep deleted the blob, or
        the index is a bucket, which was sent a copy), untouched for ``idle`` seconds (a
        mirror publishes what it downloaded at once)."""
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
    stored_bytes: int  # each distinct file (inode) once: the downloads and the channels' files

    def describe(self) -> str:
        saved = self.listed_bytes - self.stored_bytes
        return (
            f"{self.channels} channel(s) list {self.listed_files} files, {format_size(self.listed_bytes)}; "
            f"stored once: {self.stored_files} files, {format_size(self.stored_bytes)}"
            + (f" ({format_size(saved)} saved by sharing)" if saved > 0 else "")
        )
