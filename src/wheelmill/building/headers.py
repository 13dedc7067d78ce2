"""Header files' modification times, fixed so that what a compile preprocesses does not
depend on when the env was installed or the source checked out.

GCC's ``#pragma once`` takes two headers with the same size, the same bytes and the same
modification time (to the second) for one file, and includes the second not at all. torch
ships hundreds of identical generated headers (``ATen/ops/*_native.h`` with an empty
namespace); an installer writes them within a few seconds, so which of them share a second
differs from one install to the next, and with it the preprocessed source: its line
markers, and so the compiler cache's keys, then the bytes built. Here every header under a
root gets a time of its own, in the order of its path: no two are ever taken for one.
"""

from __future__ import annotations

import os
from pathlib import Path

from wheelmill.machine.process import DEFAULT_SOURCE_DATE_EPOCH

SUFFIXES = frozenset({".h", ".hh", ".hpp", ".hxx", ".h++", ".cuh", ".inl", ".inc", ".ipp", ".tcc"})
EPOCH = int(DEFAULT_SOURCE_DATE_EPOCH)


def is_header(relative: str) -> bool:
    """A header by its name, or any file under an ``include`` directory (the C++ library's
    and CCCL's headers have no suffix: ``cuda/std/atomic``).

    >>> [is_header(p) for p in ("torch/include/ATen/ATen.h", "nvidia/cu13/include/cccl/cuda/std/atomic",
    ...                         "torch/lib/libc10.so")]
    [True, True, False]
    """
    directory, _, name = relative.rpartition("/")
    stem, dot, suffix = name.rpartition(".")
    return (bool(stem) and f"{dot}{suffix}" in SUFFIXES) or "include" in directory.split("/")


def pin_header_times(root: Path) -> int:
    """Give each header under ``root`` (links not followed) the time ``EPOCH + n``, ``n`` its
    place in the sorted list of their paths; how many there were."""
    # Sorted by their parts, as pathlib compares paths ("a/b" before "a-c/d").
    headers = sorted(
        (relative for relative in _files(str(root), "") if is_header(relative)),
        key=lambda relative: relative.split("/"),
    )
    for n, relative in enumerate(headers):
        os.utime(root / relative, (EPOCH + n, EPOCH + n), follow_symlinks=False)
    return len(headers)


def _files(directory: str, relative: str) -> list[str]:
    """The regular files under ``directory``, as paths relative to the walk's root (the
    entries' types come with the listing: an env holds 25,000 files, and a stat of each
    was most of the time)."""
    found: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            path = f"{relative}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                found += _files(entry.path, f"{path}/")
            elif entry.is_file(follow_symlinks=False):
                found.append(path)
    return found
