"""Why headers' times are fixed, shown with the real GCC: two identical ``#pragma once``
headers written in the same second are one file to it, in different seconds two, so the
preprocessed source (the compiler cache's key) depended on when the env was installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from wheelmill.building.headers import pin_header_times

pytestmark = pytest.mark.integration
EMPTY_NATIVE = "#pragma once\nnamespace at { namespace native { } }\n"


def preprocessed(root: Path) -> str:
    done = subprocess.run(
        ["g++", "-E", "-I", str(root / "include"), str(root / "main.cpp")], capture_output=True, text=True, check=True
    )
    return "\n".join(line.replace(str(root), "ROOT") for line in done.stdout.splitlines())


def installed(root: Path, seconds: tuple[int, int]) -> Path:
    (root / "include").mkdir(parents=True)
    (root / "main.cpp").write_text('#include "a_native.h"\n#include "b_native.h"\nint main() { return 0; }\n')
    for name, when in zip(("a_native.h", "b_native.h"), seconds, strict=True):
        (root / "include" / name).write_text(EMPTY_NATIVE)
        os.utime(root / "include" / name, (when, when))
    return root


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_install_times_change_what_gcc_preprocesses_unless_they_are_pinned(tmp_path: Path) -> None:
    same_second = installed(tmp_path / "fast", (1_700_000_000, 1_700_000_000))
    two_seconds = installed(tmp_path / "slow", (1_700_000_000, 1_700_000_001))
    assert "b_native.h" not in preprocessed(same_second)  # taken for a_native.h, skipped
    assert "b_native.h" in preprocessed(two_seconds)
    pin_header_times(same_second)
    pin_header_times(two_seconds)
    assert preprocessed(same_second) == preprocessed(two_seconds)
    assert "b_native.h" in preprocessed(same_second)
