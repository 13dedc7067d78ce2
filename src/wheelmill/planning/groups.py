"""One build for a group: a recipe whose libraries keep to PyTorch's stable ABI
(``abi = "stable"``) and whose wheel is tagged ``abi3`` runs on every torch from its minimum
on and every Python from its tag's on. It is built once for its toolkit and arch set (its
*ABI group*: a variant, its variants of other torch releases, every Python of them) and
published, the same file, into each channel of the group.

The one build is made against the group's oldest torch (issue 42): the stable shims a
library can call are those of the torch it compiles against, and a shim exists in every
torch from the release that added it on, so a build against the oldest torch runs on every
torch of the group; a build against a newer one may call a shim the older ones lack.

Pure planning: which cells a recipe's one build is for, which of them may build it (the oldest torch's)
and which install-test it (each torch's oldest and newest Python: the range's corners), the
channels it is looked up in, the order a run builds a group's cells in, and which cell of
the run builds it where no channel has it. The build-keys step does the looking up
(``wheelmill.building.steps.keys``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import Version

from wheelmill.inputs.matrix import Matrix
from wheelmill.inputs.recipes import AbiPromise, ResolvedRecipe
from wheelmill.inputs.variants import Cell, Variant
from wheelmill.inputs.versions import Release

Group = tuple[str, str | None, str]


@dataclass(frozen=True, kw_only=True)
class GroupBuild:
    """How one stable recipe of one cell is built once for its group."""

    group: str  # the label of its toolkit and arch set: cu130, cu130.sm90, cpu
    cells: tuple[str, ...]  # every cell of the matrix it is for, this one among them
    channels: tuple[str, ...]  # where it is looked up and published: this cell's first, then the group's others
    tested: tuple[str, ...]  # the cells whose install test runs where it is taken: each torch's corners
    torch: str  # the group's oldest torch, which the one build is made against: its floor is every cell's
    builders: tuple[str, ...]  # the group's cells of that torch: the only ones that build it to publish
    locks: tuple[str, ...]  # the locks of their build envs, by lock id: what the build installs
    first: str | None  # the run's first cell of that torch, which builds it where no channel has it; None: none

    def tests_in(self, cell: str) -> bool:
        return cell in self.tested

    def builds_in(self, cell: str) -> bool:
        """Whether ``cell`` may build the one build: a cell of the group's oldest torch."""
        return cell in self.builders

    def describe(self, cell: str) -> str:
        return (
            f"built once for {self.group} (torch stable ABI, abi3) against torch {self.torch}, the oldest of the "
            f"{len(self.cells)} cells it is for; looked up in channels {', '.join(self.channels)}; "
            f"where none has it, {self._built(cell)}; install-tested where taken in {', '.join(self.tested)}, "
            "and in a cell whose own channel does not list it yet"
        )

    def _built(self, cell: str) -> str:
        if self.first == cell:
            return "built here"
        if self.first is not None:
            return f"built by {self.first} earlier in this run"
        return (
            f"built here only to be checked and tested, and not published "
            f"(no cell of torch {self.torch} in this run, such as {self.builders[0]})"
        )


def group_of(variant: Variant) -> Group:
    """A variant's ABI group: the variant it derives from (or itself), its slim arch and
    its platform. Variants of other torch releases share their parent's; a slim variant's arch
    set is its own, and so is each platform's (an aarch64 wheel is for aarch64 cells alone)."""
    return variant.base_name, variant.slim_tag, variant.platform


def built_once(recipe: ResolvedRecipe, stable: set[str], needs: Sequence[str]) -> bool:
    """Whether ``recipe`` is built once for its group: it promises the stable ABI, and so does
    every recipe it needs (a dependency built per torch pins the torch it was built for)."""
    return recipe.abi is AbiPromise.STABLE and all(name in stable for name in needs)


def group_build(matrix: Matrix, cell: Cell, run: Sequence[Cell], release: Release | None) -> GroupBuild:
    """The group build of a stable recipe in ``cell``, a run of ``run``'s cells (in the order they
    build: ``building_order``; none: ``cell`` alone)."""
    group = group_of(cell.variant)
    members = [c for c in matrix.cells if group_of(c.variant) == group]
    oldest = oldest_torch(members)
    builders = [c for c in members if c.variant.torch == oldest]
    building = tuple(c.id for c in builders)
    siblings = dict.fromkeys(channel_of(c.variant, release) for c in members)
    own = channel_of(cell.variant, release)
    return GroupBuild(
        group=cell.variant.group_label,
        cells=tuple(c.id for c in members),
        channels=(own, *(name for name in siblings if name != own)),
        tested=corners(members),
        torch=oldest,
        builders=building,
        locks=tuple(sorted({c.lock_id for c in builders})),
        first=next((c.id for c in (run or (cell,)) if c.id in building), None),
    )


def oldest_torch(cells: Sequence[Cell]) -> str:
    return min((c.variant.torch for c in cells), key=Version)


def corners(cells: Sequence[Cell]) -> tuple[str, ...]:
    """The cells of each torch with its oldest and its newest Python: every torch of the group has
    its own install tests, whichever of its cells a run builds."""
    picked: list[str] = []
    for torch in sorted({c.variant.torch for c in cells}, key=Version):
        pythons = sorted({c.python for c in cells if c.variant.torch == torch}, key=Version)
        for python in dict.fromkeys((pythons[0], pythons[-1])):
            picked += [c.id for c in cells if c.variant.torch == torch and c.python == python]
    return tuple(dict.fromkeys(picked))


def building_order(matrix: Matrix, cells: Sequence[Cell]) -> tuple[Cell, ...]:
    """``cells`` in the order a run builds them: in the places an ABI group's cells take in
    the run, its cells of the group's oldest torch come first (they build what the others
    take, which then wait for them), the rest in the order given."""
    queues: dict[Group, list[Cell]] = {}
    for cell in cells:
        queues.setdefault(group_of(cell.variant), []).append(cell)
    for group, queue in queues.items():
        floor = oldest_torch([c for c in matrix.cells if group_of(c.variant) == group])
        queue[:] = [c for c in queue if c.variant.torch == floor] + [c for c in queue if c.variant.torch != floor]
    return tuple(queues[group_of(cell.variant)].pop(0) for cell in cells)


def channel_of(variant: Variant, release: Release | None) -> str:
    """The index channel a variant's wheels go to: its own, in the release's track."""
    return release.track.channel(variant.channel) if release else variant.channel
