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

from wheelmill.process import DEFAULT_SOURCE_DATE_EPOCH

SUFFIXES = frozenset({".h", ".hh", ".hpp", ".hxx", ".h++", ".cuh", ".inl", ".inc", ".ipp", ".tcc"})
EPOCH = int(DEFAULT_SOURCE_DATE_EPOCH)


def is_header(relative: Path) -> bool:
    """A header by its name, or any file under an ``include`` directory (the C++ library's
    and CCCL's headers have no suffix: ``cuda/std/atomic``).

    >>> [is_header(Path(p)) for p in ("torch/include/ATen/ATen.h", "nvidia/cu13/include/cccl/cuda/std/atomic", "torch/lib/libc10.so")]
    [True, True, False]
    """
    return relative.suffix in SUFFIXES or "include" in relative.parts[:-1]


def pin_header_times(root: Path) -> int:
    """Give each header under ``root`` (links not followed) the time ``EPOCH + n``, ``n`` its
    place in the sorted list of their paths; how many there were."""
    headers = sorted(path.relative_to(root) for path in _files(root) if is_header(path.relative_to(root)))
    for n, relative in enumerate(headers):
        os.utime(root / relative, (EPOCH + n, EPOCH + n), follow_symlinks=False)
    return len(headers)


def _files(root: Path) -> list[Path]:
    found = []
    for directory, _dirs, names in os.walk(root):
        found += [Path(directory, name) for name in names if not Path(directory, name).is_symlink()]
    return found
