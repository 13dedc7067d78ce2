"""Headers' times: every header its own, the same for the same tree wherever it lies."""

from __future__ import annotations

import os
from pathlib import Path

from wheelmill.building.headers import EPOCH, pin_header_times

EMPTY_NATIVE = "#pragma once\nnamespace at { namespace native { } }\n"


def tree(root: Path, when: int) -> Path:
    """torch's layout in little: two identical generated headers, a suffixless C++ header
    under include/, a library, a link; all written at the one second ``when``."""
    files = {
        "torch/include/ATen/ops/a_native.h": EMPTY_NATIVE,
        "torch/include/ATen/ops/b_native.h": EMPTY_NATIVE,
        "nvidia/cu13/include/cccl/cuda/std/atomic": "#pragma once\n",
        "torch/lib/libc10.so": "ELF",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
        os.utime(root / name, (when, when))
    (root / "torch/include/ATen/ops/link.h").symlink_to("a_native.h")
    return root


def times(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): int(p.lstat().st_mtime)
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def test_every_header_gets_a_time_of_its_own_and_nothing_else_is_touched(tmp_path: Path) -> None:
    root = tree(tmp_path / "env", when=1_700_000_000)
    link_time = times(root)["torch/include/ATen/ops/link.h"]
    assert pin_header_times(root) == 3
    pinned = times(root)
    headers = [
        pinned[name]
        for name in (
            "nvidia/cu13/include/cccl/cuda/std/atomic",
            "torch/include/ATen/ops/a_native.h",
            "torch/include/ATen/ops/b_native.h",
        )
    ]
    assert headers == [EPOCH, EPOCH + 1, EPOCH + 2]  # identical bytes, never the same time: GCC keeps them apart
    assert pinned["torch/lib/libc10.so"] == 1_700_000_000
    assert pinned["torch/include/ATen/ops/link.h"] == link_time  # a link is left alone, its target is pinned


def test_the_same_tree_gets_the_same_times_whenever_and_wherever_it_was_written(tmp_path: Path) -> None:
    first, second = tree(tmp_path / "one", when=1_700_000_000), tree(tmp_path / "elsewhere" / "two", when=1_800_000_123)
    pin_header_times(first)
    pin_header_times(second)
    unpinned = {"torch/lib/libc10.so": 0, "torch/include/ATen/ops/link.h": 0}
    assert times(first) | unpinned == times(second) | unpinned
