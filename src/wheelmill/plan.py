"""The plan: a pure function of (matrix, recipes, selection, settings) that returns the
ordered steps of each cell. Nothing here touches the machine; ``wheelmill plan`` prints it
and ``wheelmill build`` executes it, step by step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from wheelmill import locks
from wheelmill.config import format_size
from wheelmill.containers import images
from wheelmill.containers.images import BuilderImage
from wheelmill.containers.pins import Pins
from wheelmill.locks import LockInputs
from wheelmill.matrix import Cell, Family, Matrix
from wheelmill.recipes import GitSource, PathSource, Recipe, ResolvedRecipe, SdistSource, Source, UrlSource, resolve, select
from wheelmill.settings import Settings
from wheelmill.sources import torch_index_url
from wheelmill.versions import Release, VersionRule

DEFAULT_BUILD = ("{python}", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", "{dist}", "{source}")


class StepKind(StrEnum):
    PRE_CHECKS = "pre-checks"
    PREPARE_IMAGE = "prepare-image"
    PREPARE_CONTAINER = "prepare-container"
    TOOLCHAIN_CHECKS = "toolchain-checks"
    PREPARE_ENV = "prepare-env"
    ENV_CHECKS = "env-checks"
    FETCH = "fetch"
    BUILD = "build"
    STAMP = "stamp"
    POST_BUILD_CHECKS = "post-build-checks"
    REPAIR = "repair"
    POST_REPAIR_CHECKS = "post-repair-checks"
    INSTALL_TEST = "install-test"
    PUBLISH = "publish"


# In a container, what needs no container is checked first (fail early: before minutes of
# image building), the toolchain once commands run where the build will. On this machine
# the pre-checks check it all at once.
CONTAINER_CELL_STEPS = (
    StepKind.PRE_CHECKS,
    StepKind.PREPARE_IMAGE,
    StepKind.PREPARE_CONTAINER,
    StepKind.TOOLCHAIN_CHECKS,
    StepKind.PREPARE_ENV,
    StepKind.ENV_CHECKS,
)
CELL_STEPS = (StepKind.PRE_CHECKS, StepKind.PREPARE_ENV, StepKind.ENV_CHECKS)
RECIPE_STEPS = (
    StepKind.FETCH,
    StepKind.BUILD,
    StepKind.STAMP,
    StepKind.POST_BUILD_CHECKS,
    StepKind.REPAIR,
    StepKind.POST_REPAIR_CHECKS,
    StepKind.INSTALL_TEST,
)
# Steps whose work crosses the network: they retry transient failures.
NETWORK_STEPS = frozenset({StepKind.PREPARE_ENV, StepKind.FETCH})


@dataclass(frozen=True, kw_only=True)
class Step:
    kind: StepKind
    recipe: str | None
    detail: str

    @property
    def id(self) -> str:
        return f"{self.recipe}/{self.kind}" if self.recipe else str(self.kind)


@dataclass(frozen=True, kw_only=True)
class ContainerSetup:
    """How cells get their builder image: the pins, the definitions and the base policy."""

    pins: Pins
    directory: Path
    base_policy: str  # auto | bootstrap | registry


@dataclass(frozen=True, kw_only=True)
class CellPlan:
    cell: Cell
    engine: str  # none | podman | docker
    recipes: tuple[ResolvedRecipe, ...]
    steps: tuple[Step, ...]
    torch_index: str | None
    image: BuilderImage | None
    lock: LockInputs
    locks_dir: Path
    release: Release | None = None

    def recipe(self, name: str) -> ResolvedRecipe:
        return next(r for r in self.recipes if r.name == name)

    @property
    def channel(self) -> str:
        """The index channel the wheels go to: the variant's, in the release's track."""
        return channel_of(self.cell, self.release)


@dataclass(frozen=True, kw_only=True)
class Options:
    """How to run a cell, as the command line and settings say."""

    publish: bool = True
    engine: str = "none"
    containers: ContainerSetup | None = None
    locks_dir: Path = Path("locks")
    release: Release | None = None  # a tag's or a nightly's: versions from git, the track's channels


def plan(  # noqa: PLR0917 - the inputs of the pure function, in their order
    matrix: Matrix, recipes: Mapping[str, Recipe], cells: Sequence[Cell], names: Sequence[str], settings: Settings, options: Options | None = None
) -> tuple[CellPlan, ...]:
    return tuple(plan_cell(matrix, recipes, cell, names, settings, options or Options()) for cell in cells)


def plan_cell(  # noqa: PLR0917 - the inputs of the pure function, in their order
    matrix: Matrix, recipes: Mapping[str, Recipe], cell: Cell, names: Sequence[str], settings: Settings, options: Options | None = None
) -> CellPlan:
    """The ordered steps of one cell: its own, then each recipe's, dependencies first.
    With ``options.publish``, each wheel that passes everything goes into the local index."""
    options = options or Options()
    chosen = tuple(resolve(recipes[name], cell) for name in select(recipes, cell, names))
    torch_index = torch_index_url(cell.variant, settings=settings, template=matrix.torch_index)
    image = None
    if options.engine != "none":
        if options.containers is None:
            raise AssertionError("a container engine needs the container setup")
        setup = options.containers
        image = images.choose(setup.pins, cell.variant, cell.python, containers=setup.directory, policy=setup.base_policy)
    partial = CellPlan(
        cell=cell,
        engine=options.engine,
        recipes=chosen,
        steps=(),
        torch_index=torch_index,
        image=image,
        lock=locks.inputs(matrix, recipes, cell),
        locks_dir=options.locks_dir,
        release=options.release,
    )
    cell_steps = CELL_STEPS if image is None else CONTAINER_CELL_STEPS
    steps = [Step(kind=kind, recipe=None, detail=_cell_detail(kind, matrix, partial)) for kind in cell_steps]
    kinds = (*RECIPE_STEPS, StepKind.PUBLISH) if options.publish else RECIPE_STEPS
    for recipe in chosen:
        steps += [Step(kind=kind, recipe=recipe.name, detail=_recipe_detail(kind, matrix, partial, recipe)) for kind in kinds]
    return replace(partial, steps=tuple(steps))


def arch_list(cell: Cell, recipe: ResolvedRecipe) -> str | None:
    return recipe.arch_list or cell.variant.arch_list


def _cell_detail(kind: StepKind, matrix: Matrix, cell_plan: CellPlan) -> str:
    cell = cell_plan.cell
    v = cell.variant
    match kind:
        case StepKind.PREPARE_IMAGE:
            if cell_plan.image is None:
                return "none: no container (engine none)"
            return f"{cell_plan.engine}: builder image from {cell_plan.image.describe()}; tagged by a hash of both, reused while it exists"
        case StepKind.PREPARE_CONTAINER:
            if cell_plan.image is None:
                return "none: commands run on this machine (engine none)"
            return f"{cell_plan.engine}: one container for the cell, the output mounted, package sources read-only; removed at the end"
        case StepKind.PRE_CHECKS:
            where = "the configured package sources" + (f", else {cell_plan.torch_index}" if cell_plan.torch_index else "")
            disk = format_size(matrix.min_free_disk.get(v.family.value, 0))
            lock = f"{cell_plan.locks_dir.name}/{cell.id}.txt, if committed, matches its inputs"
            here = "" if cell_plan.image else _toolchain_detail(cell) + "; "
            return f"{here}free disk >= {disk}; {lock}; {v.torch_requirement} locatable in {where}"
        case StepKind.TOOLCHAIN_CHECKS:
            return "in the container: " + _toolchain_detail(cell)
        case StepKind.PREPARE_ENV:
            requirements = ", ".join(cell_plan.lock.requirements)
            return f"fresh env with Python {cell.python} from the committed lock (else one resolved now), hashes checked: {requirements}"
        case StepKind.ENV_CHECKS:
            runtime = {
                Family.CPU: "a CPU build",
                Family.CUDA: f"built for CUDA {v.toolkit_short} (a CPU torch fails)",
                Family.ROCM: f"built for ROCm {v.toolkit_short} (a CPU torch fails)",
            }[v.family]
            return f"torch is {v.torch}+{v.label}, {runtime}; C++ ABI recorded"
        case _:
            raise AssertionError(f"{kind} is not a cell step")


def _toolchain_detail(cell: Cell) -> str:
    v = cell.variant
    toolkit = {Family.CPU: "no GPU toolkit", Family.CUDA: f"nvcc {v.toolkit_short}", Family.ROCM: f"hipcc {v.toolkit_short}"}[v.family]
    if v.toolkit_wheels:
        toolkit += " (installed, or pip's in the locked env)"
    return f"Python {cell.python}; C++ compiler; {toolkit}"


def channel_of(cell: Cell, release: Release | None) -> str:
    return release.track.channel(cell.variant.channel) if release else cell.variant.channel


def _recipe_detail(kind: StepKind, matrix: Matrix, cell_plan: CellPlan, recipe: ResolvedRecipe) -> str:
    cell = cell_plan.cell
    match kind:
        case StepKind.FETCH:
            return describe_source(recipe.source, matrix.path.resolve().parent.parent) + (f", subdir {recipe.subdir}" if recipe.subdir else "")
        case StepKind.BUILD:
            return _build_detail(matrix, cell, recipe)
        case StepKind.STAMP:
            pins = (["torch==<the env's torch>"] if recipe.torch_pin else []) + [f"{d}==<as built>" for d in recipe.run_requires]
            return f"{_version_detail(cell_plan, recipe)}; Requires-Dist {', '.join(pins) or 'unchanged'}"
        case StepKind.POST_BUILD_CHECKS:
            return _post_build_detail(cell, recipe)
        case StepKind.REPAIR:
            excluded = len(matrix.excludes_for(cell.variant)) + len(recipe.repair_exclude)
            return f"auditwheel repair, {excluded} torch/runtime libraries excluded"
        case StepKind.POST_REPAIR_CHECKS:
            limit = format_size(recipe.max_wheel_size or matrix.max_wheel_size)
            bundled = f"nothing bundled from: {', '.join(matrix.forbid)} or the excludes"
            return f"manylinux tag vs GLIBC/GLIBCXX; baseline {cell.variant.glibc}; {bundled}; size <= {limit}"
        case StepKind.INSTALL_TEST:
            what = [f"import {', '.join(recipe.imports)}"] if recipe.imports else []
            what += [f"torch.ops {', '.join(recipe.torch_ops)}"] if recipe.torch_ops else []
            what += [f"smoke: {' '.join(recipe.smoke)}"] if recipe.smoke else []
            return "clean env with the locked torch; " + "; ".join(what or ["install only"])
        case StepKind.PUBLISH:
            return f"add to channel {cell_plan.channel} of the local index (immutable: the same bytes again are a no-op)"
        case _:
            raise AssertionError(f"{kind} is not a recipe step")


def _version_detail(cell_plan: CellPlan, recipe: ResolvedRecipe) -> str:
    label = f"+{cell_plan.cell.variant.label}" if recipe.local_label else ""
    if cell_plan.release is not None and recipe.version_rule is VersionRule.REPO:
        return f"version {cell_plan.release.version}{label} (the repo's, from git)"
    return f"version {label}" if label else "version as built"


def _build_detail(matrix: Matrix, cell: Cell, recipe: ResolvedRecipe) -> str:
    command = " ".join(recipe.command or DEFAULT_BUILD)
    parts = [command]
    if recipe.depends_on:
        parts.append(f"after installing {', '.join(recipe.depends_on)}")
    archs = arch_list(cell, recipe)
    if cell.variant.family is Family.CUDA:
        parts.append(f"TORCH_CUDA_ARCH_LIST={archs}")
    elif cell.variant.family is Family.ROCM:
        parts.append(f"PYTORCH_ROCM_ARCH={archs}")
    per_job = recipe.memory_per_job or matrix.memory_per_job.get(cell.variant.family.value, 2**31)
    parts.append(f"MAX_JOBS from free memory ({format_size(per_job)} a job) and cores")
    parts += [f"{k}={v}" for k, v in sorted(recipe.env.items())]
    return "; ".join(parts)


def _post_build_detail(cell: Cell, recipe: ResolvedRecipe) -> str:
    parts = ["undefined symbols resolve"]
    presence = "required" if recipe.device_code else "if any"
    match cell.variant.family:
        case Family.CUDA:
            parts.append(f"SASS/PTX == {arch_list(cell, recipe)} ({presence})")
        case Family.ROCM:
            parts.append(f"code objects == {arch_list(cell, recipe)} ({presence})")
        case Family.CPU:
            pass
    if recipe.symbols:
        parts.append(f"exports {', '.join(recipe.symbols)}")
    if recipe.torch_pin:
        parts.append("Requires-Dist torch pinned exactly")
    if recipe.local_label:
        parts.append(f"version label +{cell.variant.label}")
    return "; ".join(parts)


def describe_source(source: Source, root: Path) -> str:
    match source:
        case PathSource(path=path):
            return f"path {path.relative_to(root) if path.is_relative_to(root) else path}"
        case SdistSource(project=project, version=version, sha256=sha256):
            return f"sdist {project}=={version} from the package index, sha256 {sha256[:12]}..."
        case UrlSource(url=url, sha256=sha256):
            return f"url {url}, sha256 {sha256[:12]}..."
        case GitSource(url=url, rev=rev):
            return f"git {url} at {rev[:12]}"
