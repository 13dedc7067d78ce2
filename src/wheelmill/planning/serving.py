"""Build once, serve many: a recipe whose libraries keep to PyTorch's stable ABI
(``abi = "stable"``) and whose wheel is tagged ``abi3`` runs on every torch from its minimum
on and every Python from its tag's on. It is built once for its toolkit and arch set (its
*serving group*: a variant, its variants of other torch releases, every Python of them) and
published, the same file, into each channel of the group.

Pure planning: which cells a recipe serves, which of them install-test it (the oldest and
the newest torch, each with the oldest and the newest Python: the range's corners), the
channels it is looked up in, and which cell of a run builds it where no channel has it. The
build-keys step does the looking up (``wheelmill.building.steps.keys``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import Version

from wheelmill.inputs.matrix import Matrix
from wheelmill.inputs.recipes import AbiPromise, ResolvedRecipe
from wheelmill.inputs.variants import Cell, Variant
from wheelmill.inputs.versions import Release


@dataclass(frozen=True, kw_only=True)
class Serving:
    """How one stable recipe of one cell is built once and served."""

    group: str  # the label of its toolkit and arch set: cu130, cu130.sm90, cpu
    cells: tuple[str, ...]  # every cell of the matrix it serves, this one among them
    channels: tuple[str, ...]  # where it is looked up and published: this cell's first, then the group's others
    tested: tuple[str, ...]  # the cells whose install test runs where it is served: the corners of the range
    first: str  # the cell of this run that builds it where no channel has it (this one, where it comes first)

    def tests_in(self, cell: str) -> bool:
        return cell in self.tested

    def describe(self, cell: str) -> str:
        built = "built here" if self.first == cell else f"built by {self.first} earlier in this run"
        return (
            f"built once for {self.group} (torch stable ABI, abi3) and served to {len(self.cells)} cells; "
            f"looked up in channels {', '.join(self.channels)}, {built} where none has it; "
            f"install-tested where served in {', '.join(self.tested)}"
        )


def group_of(variant: Variant) -> tuple[str, str | None, str]:
    """A variant's serving group: the variant it derives from (or itself), its slim arch and
    its platform. Variants of other torch releases share their parent's; a slim variant's arch
    set is its own, and so is each platform's (an aarch64 wheel serves aarch64 cells alone)."""
    return variant.base_name, variant.slim_tag, variant.platform


def serves(recipe: ResolvedRecipe, stable: set[str], needs: Sequence[str]) -> bool:
    """Whether ``recipe`` is built once and served: it promises the stable ABI, and so does
    every recipe it needs (a dependency built per torch pins the torch it was built for)."""
    return recipe.abi is AbiPromise.STABLE and all(name in stable for name in needs)


def serving(matrix: Matrix, cell: Cell, run: Sequence[Cell], release: Release | None) -> Serving:
    """The serving of a stable recipe in ``cell``, a run of ``run``'s cells."""
    group = group_of(cell.variant)
    members = [c for c in matrix.cells if group_of(c.variant) == group]
    in_run = [c for c in run if group_of(c.variant) == group]
    siblings = dict.fromkeys(channel_of(c.variant, release) for c in members)
    own = channel_of(cell.variant, release)
    return Serving(
        group=cell.variant.serving_label,
        cells=tuple(c.id for c in members),
        channels=(own, *(name for name in siblings if name != own)),
        tested=corners(members),
        first=(in_run[0] if in_run else cell).id,
    )


def corners(cells: Sequence[Cell]) -> tuple[str, ...]:
    """The cells of the oldest and the newest torch, each with its oldest and newest Python."""
    torches = sorted({c.variant.torch for c in cells}, key=Version)
    picked: list[str] = []
    for torch in dict.fromkeys((torches[0], torches[-1])):
        pythons = sorted({c.python for c in cells if c.variant.torch == torch}, key=Version)
        for python in dict.fromkeys((pythons[0], pythons[-1])):
            picked += [c.id for c in cells if c.variant.torch == torch and c.python == python]
    return tuple(dict.fromkeys(picked))


def channel_of(variant: Variant, release: Release | None) -> str:
    """The index channel a variant's wheels go to: its own, in the release's track."""
    return release.track.channel(variant.channel) if release else variant.channel
