"""Committed locks: ``locks/<cell>.txt``, the hashed pins of a cell's build env.

A lock records a hash of its inputs (the Python, the platform and every build requirement
of every recipe of the cell) in its first line. A lock made for other inputs is an error in
the pre-checks, before anything builds; ``wheelmill lock --cell <cell>`` remakes it. A cell
without a committed lock is resolved at build time, and its report says so.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from wheelmill.envs import Target
from wheelmill.matrix import Cell, Matrix
from wheelmill.recipes import Recipe, resolve

_HEADER = re.compile(r"^# wheelmill lock of (\S+); inputs sha256:([0-9a-f]{64})$")


@dataclass(frozen=True, kw_only=True)
class LockInputs:
    cell: str
    target: Target
    requirements: tuple[str, ...]

    @property
    def digest(self) -> str:
        data = {"python": self.target.python, "platform": self.target.platform, "requirements": sorted(self.requirements)}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def header(self) -> str:
        return f"# wheelmill lock of {self.cell}; inputs sha256:{self.digest}\n# made by `wheelmill lock --cell {self.cell}`; do not edit\n"


def target(cell: Cell) -> Target:
    return Target(python=cell.python, platform=f"x86_64-{cell.variant.glibc}")


def inputs(matrix: Matrix, recipes: Mapping[str, Recipe], cell: Cell) -> LockInputs:
    """Everything the build env of ``cell`` installs, whichever of its recipes a run builds."""
    variant = cell.variant
    extra = [req for r in recipes.values() if r.applies_to(cell) for req in resolve(r, cell).build_requires]
    requirements = [variant.torch_requirement, *matrix.build_requires, *variant.toolkit_wheels, *extra]
    return LockInputs(cell=cell.id, target=target(cell), requirements=tuple(dict.fromkeys(requirements)))


def path_of(locks: Path, cell: str) -> Path:
    return locks / f"{cell}.txt"


def recorded_digest(lock: Path) -> str | None:
    first = lock.read_text(encoding="utf-8").splitlines()[:1]
    match = _HEADER.match(first[0]) if first else None
    return match.group(2) if match else None


def requirements_text(requirements: Sequence[str]) -> str:
    return "\n".join(requirements) + "\n"
