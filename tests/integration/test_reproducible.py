"""Same inputs, same bytes: a recipe built from two copies of the project at different paths,
into different output roots, gives byte-identical wheels. Paths compiled into a library
(debug info, __FILE__) are mapped to fixed names by the build's prefix maps."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_cells import ROOT

pytestmark = pytest.mark.integration


def _copy_of_the_project(where: Path) -> Path:
    for part in ("recipes", "extensions", "locks", "containers"):
        shutil.copytree(ROOT / part, where / part)
    return where


def _build(project: Path, output: Path, cell: str, recipe: str) -> Path:
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "none"}
    command = [sys.executable, "-m", "wheelmill", "build", "--cell", cell, "--recipe", recipe, "--no-publish"]
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (wheel,) = (output / cell / "dist").glob(f"{recipe.replace('-', '_')}-*.whl")
    return wheel


def _assert_same_bytes_from_two_places(tmp_path: Path, cell: str, recipe: str) -> None:
    first = _build(_copy_of_the_project(tmp_path / "a"), tmp_path / "out-a", cell, recipe)
    second = _build(_copy_of_the_project(tmp_path / "elsewhere" / "deeper" / "b"), tmp_path / "other-root", cell, recipe)
    assert first.name == second.name
    assert first.read_bytes() == second.read_bytes(), f"{first} and {second} differ"


def test_example_cpp_ops_is_byte_identical_from_two_clones_and_output_roots(tmp_path: Path) -> None:
    _assert_same_bytes_from_two_places(tmp_path, "cpu-py311", "example-cpp-ops")
