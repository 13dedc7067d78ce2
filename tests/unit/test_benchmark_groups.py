"""The groups benchmark's cells: a variant's ABI group on the variant's own platform,
the oldest torch's cells first (they build the one build; the others take it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import groups
import runs

from wheelmill.inputs.matrix import Matrix, load_matrix


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return load_matrix(runs.ROOT / "recipes" / "matrix.toml")


def test_the_group_is_the_variant_and_its_other_torches_on_its_own_platform(matrix: Matrix) -> None:
    """cuda130's variant of torch 2.12 has an aarch64 twin: another machine's group, whose
    cells an x86_64 run cannot build (their pre-checks refuse engine none)."""
    assert groups.group_cells(matrix, "cuda130", ["310", "313"]) == [
        "cuda130-torch2.12-py310",
        "cuda130-torch2.12-py313",
        "cuda130-py310",
        "cuda130-py313",
    ]
    assert groups.group_cells(matrix, "cuda130-sm90", ["310"]) == [
        "cuda130-sm90-torch2.12-py310",
        "cuda130-sm90-py310",
    ]


def test_an_aarch64_variant_takes_its_own_platforms_group(matrix: Matrix) -> None:
    assert groups.group_cells(matrix, "cuda130-aarch64", ["311"]) == [
        "cuda130-torch2.12-aarch64-py311",
        "cuda130-aarch64-py311",
    ]
    assert groups.group_cells(matrix, "cpu", ["311"]) == ["cpu-py311"], "cpu-aarch64 is its twin, no other torch"
