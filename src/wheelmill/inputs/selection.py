"""Which cells a change affects. A pull request builds those cells, and never none.

    recipes/matrix.toml                      every cell
    recipes/<recipe>.toml                    the cells the recipe is built for
    a file of a recipe's path source         the cells that recipe is built for
    locks/<cell>.txt                         that cell
    containers/pins.toml, containers/builder every cell
    containers/manylinux/, containers/rocm/  the cells of the families built on them
    anything else (the pipeline's code, docs) the matrix's canary cells

A recipe's dependents need not be added: a recipe is only built for cells that also
build what it depends on.

Slim cells (``cuda130-sm90-py311``) are left out unless named (among the canary cells):
each is its parent cell's build for one arch of the parent's list, so the parent's cell
tests everything a slim one would. Releases and nightlies build them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from wheelmill.inputs.matrix import Matrix
from wheelmill.inputs.recipes import PathSource, Recipe
from wheelmill.inputs.variants import Cell, Family

# Builder image definitions and the families whose images build from them.
_DEFINITIONS = {"builder": tuple(Family), "manylinux": (Family.CPU, Family.CUDA), "rocm": (Family.ROCM,)}


def affected_cells(
    matrix: Matrix, recipes: Mapping[str, Recipe], changed: Sequence[str], *, root: Path
) -> tuple[Cell, ...]:
    """The cells, in matrix order, that the ``changed`` paths (relative to ``root``) affect;
    the canary cells when none is."""
    wanted = {cell.id for path in changed for cell in _affected_by(PurePosixPath(path.strip()), matrix, recipes, root)}
    chosen = tuple(c for c in matrix.cells if c.id in wanted)
    return chosen or tuple(matrix.cell(c) for c in matrix.canary) or _full(matrix)[:1]


def _full(matrix: Matrix) -> tuple[Cell, ...]:
    """The cells a pull request may pick by anything but their name: no slim ones."""
    return tuple(c for c in matrix.cells if not c.variant.slim_of)


def _affected_by(path: PurePosixPath, matrix: Matrix, recipes: Mapping[str, Recipe], root: Path) -> tuple[Cell, ...]:
    parts = path.parts
    match parts:
        case ("recipes", "matrix.toml") | ("containers", "pins.toml"):
            return _full(matrix)
        case ("recipes", name) if name.endswith(".toml"):
            return _cells_of([r for r in recipes.values() if r.file.name == name], matrix)
        case ("locks", name) if name.endswith(".txt"):
            return tuple(c for c in matrix.cells if c.id == name.removesuffix(".txt"))
        case ("containers", definition, *_) if definition in _DEFINITIONS:
            return tuple(c for c in _full(matrix) if c.variant.family in _DEFINITIONS[definition])
    absolute = root.resolve() / path
    return _cells_of(
        [r for r in recipes.values() if isinstance(r.source, PathSource) and absolute.is_relative_to(r.source.path)],
        matrix,
    )


def _cells_of(chosen: Sequence[Recipe], matrix: Matrix) -> tuple[Cell, ...]:
    return tuple(c for c in _full(matrix) if any(r.applies_to(c) for r in chosen))
