"""The plan: a pure function of (matrix, recipes, selection, settings) that returns the
ordered steps of each cell. Nothing here touches the machine; ``wheelmill plan`` prints it
and ``wheelmill build`` executes it, step by step.

The steps and their order come from the step registry (``wheelmill.building.steps``); each step's
line is its registry entry describing the spec it will consume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby, takewhile
from pathlib import Path

from wheelmill.building.cache_tiers import Tiers
from wheelmill.building.steps import REGISTRY, CellStep, RecipeStep, StepDefinition
from wheelmill.errors import SelectionError
from wheelmill.inputs import REBUILD_ALL
from wheelmill.inputs.matrix import Matrix
from wheelmill.inputs.recipes import AbiPromise, Recipe, cell_dependencies, closure, resolve_all, select
from wheelmill.inputs.variants import Cell
from wheelmill.inputs.versions import Release
from wheelmill.machine import builder_images as images
from wheelmill.machine.net import split_credentials
from wheelmill.machine.package_sources import torch_index_url
from wheelmill.machine.pins import Pins
from wheelmill.planning import locks
from wheelmill.planning.groups import building_order, built_once, channel_of, group_build
from wheelmill.planning.spec import CellPlan, EnvPlace, RunChoices, Step, StepKind, recipe_spec
from wheelmill.settings import Settings

# The cell's own steps before any recipe's (on this machine: without the container's), and
# each recipe's (without publishing), in the registry's order: for readers and tests.
CELL_STEPS = tuple(
    d.kind
    for d in takewhile(lambda d: isinstance(d, CellStep), REGISTRY)
    if isinstance(d, CellStep) and not d.container
)
RECIPE_STEPS = tuple(d.kind for d in REGISTRY if isinstance(d, RecipeStep) and not d.publishing)


@dataclass(frozen=True, kw_only=True)
class ContainerSetup:
    """How cells get their builder image: the pins, the definitions and the base policy."""

    pins: Pins
    directory: Path
    base_policy: str  # auto | bootstrap | registry


@dataclass(frozen=True, kw_only=True)
class Options:
    """How to run a cell, as the command line and settings say."""

    publish: bool = True
    mirror: bool = True  # with publish: the runtime closure into the channel too
    engine: str = "none"
    containers: ContainerSetup | None = None
    locks_dir: Path = Path("locks")
    release: Release | None = None  # a tag's or a nightly's: versions from git, the track's channels
    rebuild: tuple[str, ...] = ()  # recipes to build although published for their build key; REBUILD_ALL: every one


def plan(  # noqa: PLR0917 - the inputs of the pure function, in their order
    matrix: Matrix,
    recipes: Mapping[str, Recipe],
    cells: Sequence[Cell],
    names: Sequence[str],
    settings: Settings,
    options: Options | None = None,
) -> tuple[CellPlan, ...]:
    """Each cell's plan, in the order the run builds them: as given, but for the cells of a
    ABI group's oldest torch, which go before the group's others (``building_order``)."""
    run = building_order(matrix, cells)
    return tuple(plan_cell(matrix, recipes, cell, names, settings, options or Options(), run=run) for cell in run)


def plan_cell(  # noqa: PLR0917 - the inputs of the pure function, in their order
    matrix: Matrix,
    recipes: Mapping[str, Recipe],
    cell: Cell,
    names: Sequence[str],
    settings: Settings,
    options: Options | None = None,
    *,
    run: Sequence[Cell] = (),
) -> CellPlan:
    """The ordered steps of one cell: its own, then each recipe's, dependencies first.
    With ``options.publish``, each wheel that passes everything goes into the local index.
    ``run``: the cells built with it, in their order (a stable recipe is built by the first of
    its ABI group's oldest torch)."""
    options = options or Options()
    chosen = select(recipes, cell, names)
    resolved = resolve_all(recipes, cell)
    depends = {name: cell_dependencies(recipes[name], chosen) for name in chosen}
    needs = {name: tuple(n for n in chosen if n in closure(depends, depends[name])) for name in chosen}
    stable = {name for name in chosen if resolved[name].abi is AbiPromise.STABLE}
    group = group_build(matrix, cell, run, options.release)
    specs = tuple(
        recipe_spec(
            matrix,
            cell,
            resolved[name],
            depends_on=depends[name],
            needs=needs[name],
            release=options.release,
            group_build=group if built_once(resolved[name], stable, needs[name]) else None,
        )
        for name in chosen
    )
    image = _image(cell, options)
    spec = CellPlan(
        cell=cell,
        root=matrix.path.resolve().parent.parent,
        variant_file=matrix.path,
        engine=options.engine,
        image=image,
        choices=RunChoices(
            env_backend=settings.env_backend,
            env_place=EnvPlace.HOST if image is None else EnvPlace.CONTAINER,
            compiler_cache=settings.compiler_cache,
            install_tests=settings.install_tests,
            served_index=split_credentials(settings.served_index)[0] if settings.served_index else None,
            image_sharing=images.Sharing.of(settings.image_registry, settings.shared_writes) if image else None,
            cache_tiers=(
                Tiers.chosen(settings.cache_tiers, settings.shared_writes, toolkit=cell.variant.base_name).describe()
                if settings.cache_tiers.shared
                else None
            ),
        ),
        torch_index=torch_index_url(cell.variant, settings=settings, template=matrix.torch_index),
        lock=locks.inputs(matrix, resolved, cell),
        locks_dir=options.locks_dir,
        min_free_disk=matrix.min_free_disk.get(cell.variant.family.value, 0),
        channel=channel_of(cell.variant, options.release),
        release=options.release,
        recipes=specs,
        rebuild=_rebuilt(options.rebuild, chosen, cell),
    )
    return replace(spec, steps=tuple(_steps(spec, publish=options.publish, mirror=options.mirror)))


def _rebuilt(names: Sequence[str], chosen: Sequence[str], cell: Cell) -> frozenset[str]:
    """The recipes ``--rebuild`` names (all of them for a bare one), each one this build has."""
    if REBUILD_ALL in names:
        return frozenset(chosen)
    for name in names:
        if name not in chosen:
            raise SelectionError(
                f"--rebuild {name}: not a recipe of this build of {cell.id} (it builds {', '.join(chosen)})",
                fix=f"name one of those, or add --recipe {name}",
            )
    return frozenset(names)


def _fits(definition: StepDefinition, spec: CellPlan, *, mirror: bool) -> bool:
    """A container step needs a container; a mirroring step needs mirroring."""
    if isinstance(definition, CellStep):
        return (spec.image is not None or not definition.container) and (mirror or not definition.mirroring)
    return True


def _image(cell: Cell, options: Options) -> images.BuilderImage | None:
    if options.engine == "none":
        return None
    if options.containers is None:
        raise AssertionError("a container engine needs the container setup")
    setup = options.containers
    return images.choose(setup.pins, cell.variant, cell.python, containers=setup.directory, policy=setup.base_policy)


def _steps(spec: CellPlan, *, publish: bool, mirror: bool) -> list[Step]:
    """The registry in its order: a run of cell steps once, a run of recipe steps for every
    recipe in turn (dependencies first), and then each tested recipe's publishing: a recipe's
    install test runs beside the next recipe's build, which publishing it would wait for."""
    wanted = [d for d in REGISTRY if (publish or not d.publishing) and _fits(d, spec, mirror=mirror)]
    steps: list[Step] = []
    for _scope, run in groupby(wanted, key=type):
        group = list(run)
        if isinstance(group[0], RecipeStep):
            for publishing in (False, True):
                kinds = [d for d in group if isinstance(d, RecipeStep) and d.publishing is publishing]
                steps += [
                    Step(kind=d.kind, recipe=r.name, detail=d.describe(spec, r)) for r in spec.recipes for d in kinds
                ]
        else:
            steps += [Step(kind=d.kind, recipe=None, detail=d.describe(spec)) for d in group if isinstance(d, CellStep)]
    return steps


__all__ = [
    "CELL_STEPS",
    "REBUILD_ALL",
    "RECIPE_STEPS",
    "CellPlan",
    "ContainerSetup",
    "Options",
    "StepKind",
    "plan",
    "plan_cell",
]
