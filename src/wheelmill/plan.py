"""The plan: a pure function of (matrix, recipes, selection, settings) that returns the
ordered steps of each cell. Nothing here touches the machine; ``wheelmill plan`` prints it
and ``wheelmill build`` executes it, step by step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from wheelmill.config import format_size
from wheelmill.matrix import Cell, Family, Matrix
from wheelmill.recipes import GitSource, PathSource, Recipe, ResolvedRecipe, SdistSource, Source, UrlSource, resolve, select
from wheelmill.settings import Settings
from wheelmill.sources import torch_index_url

DEFAULT_BUILD = ("{python}", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", "{dist}", "{source}")


class StepKind(StrEnum):
    PREPARE_CONTAINER = "prepare-container"
    PRE_CHECKS = "pre-checks"
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


CELL_STEPS = (StepKind.PREPARE_CONTAINER, StepKind.PRE_CHECKS, StepKind.PREPARE_ENV, StepKind.ENV_CHECKS)
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
class CellPlan:
    cell: Cell
    engine: str
    recipes: tuple[ResolvedRecipe, ...]
    steps: tuple[Step, ...]
    torch_index: str | None

    def recipe(self, name: str) -> ResolvedRecipe:
        return next(r for r in self.recipes if r.name == name)


def plan(
    matrix: Matrix, recipes: Mapping[str, Recipe], cells: Sequence[Cell], names: Sequence[str], settings: Settings, *, publish: bool = True
) -> tuple[CellPlan, ...]:
    return tuple(plan_cell(matrix, recipes, cell, names, settings, publish=publish) for cell in cells)


def plan_cell(matrix: Matrix, recipes: Mapping[str, Recipe], cell: Cell, names: Sequence[str], settings: Settings, *, publish: bool = True) -> CellPlan:
    """The ordered steps of one cell: its own, then each recipe's, dependencies first.
    With ``publish``, each wheel that passes everything goes into the local index."""
    chosen = tuple(resolve(recipes[name], cell) for name in select(recipes, cell, names))
    torch_index = torch_index_url(cell.variant, settings=settings, template=matrix.torch_index)
    steps = [Step(kind=kind, recipe=None, detail=_cell_detail(kind, matrix, cell, chosen, torch_index)) for kind in CELL_STEPS]
    kinds = (*RECIPE_STEPS, StepKind.PUBLISH) if publish else RECIPE_STEPS
    for recipe in chosen:
        steps += [Step(kind=kind, recipe=recipe.name, detail=_recipe_detail(kind, matrix, cell, recipe)) for kind in kinds]
    return CellPlan(cell=cell, engine="none", recipes=chosen, steps=tuple(steps), torch_index=torch_index)


def arch_list(cell: Cell, recipe: ResolvedRecipe) -> str | None:
    return recipe.arch_list or cell.variant.arch_list


def build_requires(matrix: Matrix, recipes: Sequence[ResolvedRecipe]) -> tuple[str, ...]:
    extra = [req for r in recipes for req in r.build_requires]
    return tuple(dict.fromkeys([*matrix.build_requires, *extra]))


def _cell_detail(kind: StepKind, matrix: Matrix, cell: Cell, recipes: Sequence[ResolvedRecipe], torch_index: str | None) -> str:
    v = cell.variant
    match kind:
        case StepKind.PREPARE_CONTAINER:
            return "none: commands run on this machine (engine none)"
        case StepKind.PRE_CHECKS:
            toolkit = {Family.CPU: "no GPU toolkit", Family.CUDA: f"nvcc {v.toolkit_short}", Family.ROCM: f"hipcc {v.toolkit_short}"}[v.family]
            where = "the configured package sources" + (f", else {torch_index}" if torch_index else "")
            disk = format_size(matrix.min_free_disk.get(v.family.value, 0))
            return f"Python {cell.python}; C++ compiler; {toolkit}; free disk >= {disk}; {v.torch_requirement} locatable in {where}"
        case StepKind.PREPARE_ENV:
            return f"fresh env with Python {cell.python} from a hashed lock of: {v.torch_requirement}, {', '.join(build_requires(matrix, recipes))}"
        case StepKind.ENV_CHECKS:
            runtime = {
                Family.CPU: "a CPU build",
                Family.CUDA: f"built for CUDA {v.toolkit_short} (a CPU torch fails)",
                Family.ROCM: f"built for ROCm {v.toolkit_short} (a CPU torch fails)",
            }[v.family]
            return f"torch is {v.torch}+{v.label}, {runtime}; C++ ABI recorded"
        case _:
            raise AssertionError(f"{kind} is not a cell step")


def _recipe_detail(kind: StepKind, matrix: Matrix, cell: Cell, recipe: ResolvedRecipe) -> str:
    match kind:
        case StepKind.FETCH:
            return describe_source(recipe.source, matrix.path.resolve().parent.parent) + (f", subdir {recipe.subdir}" if recipe.subdir else "")
        case StepKind.BUILD:
            return _build_detail(matrix, cell, recipe)
        case StepKind.STAMP:
            pins = (["torch==<the env's torch>"] if recipe.torch_pin else []) + [f"{d}==<as built>" for d in recipe.run_requires]
            label = f"version +{cell.variant.label}" if recipe.local_label else "version as built"
            return f"{label}; Requires-Dist {', '.join(pins) or 'unchanged'}"
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
            return f"add to channel {cell.variant.channel} of the local index (immutable: the same bytes again are a no-op)"
        case _:
            raise AssertionError(f"{kind} is not a recipe step")


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
