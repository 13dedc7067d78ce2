"""The GPU stage of a cell, as pure planning: which wheels of the channel it tests and with
which checks.

Builds run on machines without a GPU; the GPU stage runs on one, from the channel alone.
Each recipe of the cell that has a wheel in the channel is tested: the newest wheel of its
project (the project is the recipe's name, as every recipe's wheel is called) that the
cell's Python installs, or the one a release's record names for the cell. How each wheel's
result is judged against what ``wheelmill doctor`` said is a check: ``wheelmill.checks.gpu``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from wheelmill.inputs.recipes import PathSource, ResolvedRecipe
from wheelmill.inputs.variants import X86_64, Cell
from wheelmill.machine.net import IndexFile


@dataclass(frozen=True, kw_only=True)
class WheelUnderTest:
    """A recipe's wheel in the channel, and what the stage runs for it."""

    recipe: str
    filename: str
    url: str  # where the file is: a path under the index root, or a URL
    sha256: str | None
    imports: tuple[str, ...]
    torch_ops: tuple[str, ...]
    gpu_smoke: tuple[str, ...] | None  # templates; {python} is filled in where it runs

    def command(self, python: str, recipes: str, source: str | None, values: Mapping[str, str]) -> list[str] | None:
        if self.gpu_smoke is None:
            return None
        filled = {"python": python, "recipes": recipes, **values, **({"source": source} if source else {})}
        return [part.format_map(filled) for part in self.gpu_smoke]


@dataclass(frozen=True, kw_only=True)
class GpuStagePlan:
    cell: Cell
    channel: str
    wheels: tuple[WheelUnderTest, ...]
    missing: tuple[str, ...]  # recipes of the cell without a wheel in the channel

    def template_values(self) -> dict[str, str]:
        variant = self.cell.variant
        return {"cell": self.cell.id, "label": variant.wheel_label, "arch_list": variant.arch_list or ""}


def cell_tags(python: str, machine: str = X86_64) -> list[Tag]:
    """The tags CPython ``python`` on Linux on ``machine`` installs, best first (as pip ranks them).

    >>> tags = cell_tags("3.11")
    >>> str(tags[0]).startswith("cp311-cp311-manylinux"), Tag("cp39", "abi3", "linux_x86_64") in tags
    (True, True)
    >>> Tag("cp311", "cp311", "manylinux_2_28_aarch64") in cell_tags("3.11", "aarch64") and not Tag(
    ...     "cp311", "cp311", "manylinux_2_28_x86_64") in cell_tags("3.11", "aarch64")
    True
    """
    version = tuple(int(part) for part in python.split("."))
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in range(40, 4, -1)]
    legacy = ["manylinux2014"] + (["manylinux2010", "manylinux1"] if machine == X86_64 else [])
    platforms += [f"{name}_{machine}" for name in legacy] + [f"linux_{machine}"]
    return [*cpython_tags(version, platforms=platforms), *compatible_tags(version, platforms=platforms)]


def file_for_cell(
    files: Iterable[IndexFile], python: str, *, labels: Collection[str], machine: str = X86_64
) -> IndexFile | None:
    """The file of a project the cell installs: built by wheelmill (not a mirrored copy of an
    upstream file, such as torch's), not yanked, its local label one of the variant's
    (``cu130.torch2.12``, or ``cu130`` for a wheel built once for every torch), the newest
    version, the best tag."""
    ranks = {tag: rank for rank, tag in enumerate(cell_tags(python, machine))}
    best: tuple[Version, int, IndexFile] | None = None
    for entry in files:
        try:
            _name, version, _build, tags = parse_wheel_filename(entry.filename)
        except InvalidWheelFilename:
            continue  # an sdist or another file: not an installable wheel
        fitting = [ranks[tag] for tag in tags if tag in ranks]
        if entry.yanked or entry.mirrored or not fitting or (version.local or "") not in {*labels, ""}:
            continue
        candidate = (version, -min(fitting), entry)
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    return best[2] if best else None


def plan_stage(
    cell: Cell,
    channel: str,
    recipes: Mapping[str, ResolvedRecipe],
    listed: Mapping[str, Sequence[IndexFile]],
    *,
    named: Mapping[str, str] | None = None,
) -> GpuStagePlan:
    """The stage for ``cell``: ``listed`` is each recipe project's files in the channel;
    ``named``, where a release's record says, the file of each recipe to test."""
    wheels, missing = [], []
    for name in sorted(recipes):
        recipe = recipes[name]
        files = listed.get(canonicalize_name(name), ())
        if named is not None:
            wanted = named.get(name)
            found = next((f for f in files if f.filename == wanted), None) if wanted else None
        else:
            labels = {cell.variant.wheel_label, cell.variant.group_label}
            found = file_for_cell(files, cell.python, labels=labels, machine=cell.variant.platform)
        if found is None:
            missing.append(name)
            continue
        wheels.append(
            WheelUnderTest(
                recipe=name,
                filename=found.filename,
                url=found.url,
                sha256=found.sha256,
                imports=recipe.imports,
                torch_ops=recipe.torch_ops,
                gpu_smoke=recipe.gpu_smoke,
            )
        )
    return GpuStagePlan(cell=cell, channel=channel, wheels=tuple(wheels), missing=tuple(missing))


def source_of(recipe: ResolvedRecipe) -> str | None:
    """A path source is part of the repository, so the GPU machine has it; a downloaded one
    it has not (its checks live beside the recipes)."""
    return str(recipe.source.path) if isinstance(recipe.source, PathSource) else None
