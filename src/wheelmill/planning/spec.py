"""What the plan resolves, once, for one cell and for each recipe in it: frozen values that
the steps consume and the printed plan describes, the way cibuildwheel resolves its build
options per identifier. Nothing downstream reads the matrix or the recipe files again: what
a step does is what its spec says, and the golden plans pin it.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from wheelmill.errors import ConfigError
from wheelmill.inputs.archs import CudaArchs, GpuArchs, RocmArchs, parse_archs
from wheelmill.inputs.matrix import Matrix
from wheelmill.inputs.recipes import AbiPromise, GitSource, PathSource, ResolvedRecipe, SdistSource, Source, UrlSource
from wheelmill.inputs.variants import Cell, Family
from wheelmill.inputs.versions import Release, VersionRule, stamp_version
from wheelmill.machine.builder_images import BuilderImage, Sharing
from wheelmill.planning.groups import GroupBuild
from wheelmill.planning.locks import LockInputs
from wheelmill.settings import CompilerCacheMode, EnvBackendName, InstallTests

# PEP 517's build_wheel alone, through pypa/build: pip wheel asks the backend for the
# wheel's metadata first, in a process of its own, and a setup.py that imports torch runs
# twice (example-cpp-ops here: 19.6 s with pip wheel, 14.7 s with build).
DEFAULT_BUILD = (
    "{python}",
    "-m",
    "build",
    "--wheel",
    "--no-isolation",
    "--skip-dependency-check",
    "--outdir",
    "{dist}",
    "{source}",
)
DEFAULT_MEMORY_PER_JOB = 2 * 2**30
# What a build's templates (its command and variables) and a smoke command may use.
BUILD_FIELDS = frozenset({"python", "source", "dist", "cell", "label", "arch_list", "arch_numbers"})
SMOKE_FIELDS = BUILD_FIELDS - {"dist"}
# What a GPU check may use: it runs on a GPU machine with the recipes but no downloaded source
# (a path source is part of the repository, so it is there too).
GPU_FIELDS = frozenset({"python", "recipes", "source", "cell", "label", "arch_list"})
_ARCH_VARIABLE = {Family.CUDA: "TORCH_CUDA_ARCH_LIST", Family.ROCM: "PYTORCH_ROCM_ARCH"}


class StepKind(StrEnum):
    PRE_CHECKS = "pre-checks"
    BUILD_KEYS = "build-keys"
    PREPARE_IMAGE = "prepare-image"
    PREPARE_CONTAINER = "prepare-container"
    TOOLCHAIN_CHECKS = "toolchain-checks"
    PREPARE_ENV = "prepare-env"
    ENV_CHECKS = "env-checks"
    COMPILER_CACHE = "compiler-cache"
    FETCH = "fetch"
    BUILD = "build"
    STAMP = "stamp"
    POST_BUILD_CHECKS = "post-build-checks"
    REPAIR = "repair"
    POST_REPAIR_CHECKS = "post-repair-checks"
    INSTALL_TEST = "install-test"
    PUBLISH = "publish"
    CLOSURE = "closure"
    MIRROR = "mirror"
    CHANNEL_CHECKS = "channel-checks"


@dataclass(frozen=True, kw_only=True)
class Step:
    kind: StepKind
    recipe: str | None
    detail: str

    @property
    def id(self) -> str:
        return f"{self.recipe}/{self.kind}" if self.recipe else str(self.kind)


@dataclass(frozen=True, kw_only=True)
class VersionSpec:
    """Whose version a wheel carries and which label: decided before anything is built."""

    rule: VersionRule
    release: Release | None
    label: str | None  # the variant's wheel label (cu130, a slim cu130.sm90), where the recipe wants one

    def stamp(self, built: str) -> str | None:
        """The version to stamp over ``built``, or None to keep it."""
        return stamp_version(self.rule, built, release=self.release, label=self.label)

    def describe(self) -> str:
        label = f"+{self.label}" if self.label else ""
        if self.release is not None and self.rule is VersionRule.REPO:
            return f"version {self.release.version}{label} (the repo's, from git)"
        return f"version {label}" if label else "version as built"

    def expected(self, source: Source) -> str:
        """The version the wheel will carry, as far as it is known before building."""
        label = f"+{self.label}" if self.label else ""
        if self.rule is VersionRule.REPO and self.release is not None:
            return f"{self.release.version}{label}"
        if isinstance(source, SdistSource):
            return f"{source.version}{label}"
        return f"<as built>{label}"


@dataclass(frozen=True, kw_only=True)
class RecipeSpec:
    """One recipe in one cell, with every override, matrix default and variant value applied."""

    name: str
    file: Path
    cell: str
    family: Family
    label: str  # the local version label the wheels carry (cu130, a slim cu130.sm90), for {label}
    source: Source
    subdir: str | None
    depends_on: tuple[str, ...]  # built before it in this cell and installed for its build
    needs: tuple[str, ...]  # depends_on and what they depend on, in build order
    patches: tuple[Path, ...]
    command: tuple[str, ...]
    env: Mapping[str, str]  # the recipe's own build variables (templates)
    archs: GpuArchs | None  # what device code the build must carry; None for the CPU
    memory_per_job: int
    version: VersionSpec
    torch_pin: bool
    run_requires: tuple[str, ...]
    repair_excludes: tuple[str, ...]
    forbid: tuple[str, ...]  # never inside a wheel, besides the excludes
    provides: tuple[str, ...]  # libraries the wheel ships itself: excluded for others, not for it
    max_wheel_size: int
    test_requires: tuple[str, ...]
    imports: tuple[str, ...]
    torch_ops: tuple[str, ...]
    symbols: tuple[str, ...]
    smoke: tuple[str, ...] | None
    device_code: bool | None
    abi: AbiPromise | None = None
    group_build: GroupBuild | None = None  # built once for its toolkit and arch set, for every torch and Python

    @property
    def arch_list(self) -> str | None:
        """The arch list as the family's build tooling reads it (``8.0;9.0+PTX``)."""
        return None if self.archs is None else self.archs.text

    @property
    def arch_variable(self) -> str | None:
        """The variable the family's build tooling reads the arch list from."""
        return _ARCH_VARIABLE.get(self.family)

    def build_variables(self) -> dict[str, str]:
        """What the spec puts into the build's environment (the rest comes from the run)."""
        variables = {self.arch_variable: self.arch_list or ""} if self.arch_variable else {}
        # FORCE_CUDA: torch's extension builder compiles device code without a visible GPU.
        variables["FORCE_CUDA"] = "0" if self.family is Family.CPU else "1"
        variables["WHEELMILL_CELL"] = self.cell
        return variables

    @property
    def forbidden(self) -> tuple[str, ...]:
        return (*self.forbid, *(glob for glob in self.repair_excludes if glob not in self.provides))

    def template_values(self) -> dict[str, str]:
        """What a build's templates may say besides paths: the cell and its arch list, as
        written (``8.0;9.0+PTX``) and as the numbers some packages read (``80;90``)."""
        arch_list = self.arch_list or ""
        numbers = [item.removesuffix("+PTX").replace(".", "") for item in arch_list.split(";") if item]
        return {"cell": self.cell, "label": self.label, "arch_list": arch_list, "arch_numbers": ";".join(numbers)}

    @property
    def sibling_pins(self) -> tuple[str, ...]:
        """Run requirements on recipes built before it: pinned to exactly what was built."""
        return tuple(r for r in self.run_requires if r in self.depends_on)


class EnvPlace(StrEnum):
    """Where a cell's env backend makes and runs its envs."""

    CONTAINER = "in the cell's container"
    HOST = "on this machine"


@dataclass(frozen=True, kw_only=True)
class RunChoices:
    """What the settings decide of how a cell runs, resolved once into its plan: the steps
    read them here, and the printed plan says them."""

    env_backend: EnvBackendName
    env_place: EnvPlace
    compiler_cache: CompilerCacheMode
    install_tests: InstallTests
    served_index: str | None = None  # where build keys are looked up besides the local index (no credentials)
    image_sharing: Sharing | None = None  # the registry builder images are pulled from and pushed to
    cache_tiers: str | None = None  # the compiler cache's tiers where shared ones are set: "disk, redis (read-only)"

    def describe(self) -> str:
        tests = {
            InstallTests.BESIDE: "beside the next recipe's steps",
            InstallTests.AFTER: "each after the one before",
            InstallTests.NONE: "none (wheels untested, not published)",
        }[self.install_tests]
        cache = f"{self.compiler_cache}" + (
            f" (tiers {self.cache_tiers})" if self.cache_tiers and self.compiler_cache is CompilerCacheMode.ON else ""
        )
        return f"envs by {self.env_backend} {self.env_place}; compiler cache {cache}; install tests {tests}"


@dataclass(frozen=True, kw_only=True)
class CellPlan:
    """A cell's plan: its spec, its recipes' specs, and the ordered steps."""

    cell: Cell
    root: Path  # the repository: paths in the printed plan are relative to it
    variant_file: Path  # where the cell's variant is defined, for messages
    engine: str  # none | podman | docker
    image: BuilderImage | None
    choices: RunChoices
    torch_index: str | None
    lock: LockInputs
    locks_dir: Path
    min_free_disk: int
    channel: str  # the index channel the wheels go to: the variant's, in the release's track
    release: Release | None
    recipes: tuple[RecipeSpec, ...]
    steps: tuple[Step, ...] = ()
    rebuild: frozenset[str] = frozenset()  # recipes built whatever their channel has for their build key

    def recipe(self, name: str) -> RecipeSpec:
        return next(r for r in self.recipes if r.name == name)

    @property
    def rebuilds_all(self) -> bool:
        """A bare ``--rebuild``: every recipe built, the channel asked nothing."""
        return bool(self.rebuild) and self.rebuild == {r.name for r in self.recipes}


def recipe_spec(
    matrix: Matrix,
    cell: Cell,
    recipe: ResolvedRecipe,
    *,
    depends_on: tuple[str, ...],
    needs: tuple[str, ...],
    release: Release | None,
    group_build: GroupBuild | None = None,
) -> RecipeSpec:
    """The spec of ``recipe`` (already resolved for ``cell``): the matrix's defaults filled in,
    and what only a cell can tell checked now, not when a step gets to it. A recipe built
    once for every torch (``group_build``) carries the label of its toolkit and arch set alone."""
    _check_templates(recipe)
    _check_archs(recipe, cell)
    _check_switches(recipe)
    variant = cell.variant
    family = variant.family.value
    label = variant.group_label if group_build else variant.wheel_label
    return RecipeSpec(
        name=recipe.name,
        file=recipe.file,
        cell=cell.id,
        family=variant.family,
        label=label,
        source=recipe.source,
        subdir=recipe.subdir,
        depends_on=depends_on,
        needs=needs,
        patches=recipe.patches,
        command=recipe.command or DEFAULT_BUILD,
        env=recipe.env,
        archs=parse_archs(variant.family, archs_for(recipe, cell)),
        memory_per_job=recipe.memory_per_job or matrix.memory_per_job.get(family, DEFAULT_MEMORY_PER_JOB),
        version=VersionSpec(rule=recipe.version_rule, release=release, label=label if recipe.local_label else None),
        torch_pin=recipe.torch_pin,
        run_requires=recipe.run_requires,
        repair_excludes=(*matrix.excludes_for(variant), *recipe.repair_exclude),
        forbid=matrix.forbid,
        provides=recipe.provides,
        max_wheel_size=recipe.max_wheel_size or matrix.max_wheel_size,
        test_requires=(*matrix.test_requires, *recipe.test_requires),
        imports=recipe.imports,
        torch_ops=recipe.torch_ops,
        symbols=recipe.symbols,
        smoke=recipe.smoke,
        device_code=recipe.device_code,
        abi=recipe.abi,
        group_build=group_build,
    )


def archs_for(recipe: ResolvedRecipe, cell: Cell) -> str | None:
    """The one rule for the archs a recipe builds: a slim cell's one arch, whatever the
    recipe says (its channel and label promise that arch, and a recipe's own list, such as
    torchsort's cheap "8.0;9.0", must neither widen it nor leave it out); elsewhere the
    recipe's own list, else the variant's full one."""
    if cell.variant.slim_of is not None:
        return cell.variant.arch_list
    return recipe.arch_list or cell.variant.arch_list


def _check_templates(recipe: ResolvedRecipe) -> None:
    command = recipe.command or DEFAULT_BUILD
    templates = [("build.command", part, BUILD_FIELDS) for part in command]
    templates += [(f"build.env.{key}", value, BUILD_FIELDS) for key, value in recipe.env.items()]
    templates += [("checks.smoke", part, SMOKE_FIELDS) for part in recipe.smoke or ()]
    gpu_fields = GPU_FIELDS if isinstance(recipe.source, PathSource) else GPU_FIELDS - {"source"}
    templates += [("checks.gpu-smoke", part, gpu_fields) for part in recipe.gpu_smoke or ()]
    for key, template, allowed in templates:
        try:
            fields = [
                name for _text, name, _spec, _conversion in string.Formatter().parse(template) if name is not None
            ]
        except ValueError as exc:
            raise ConfigError(
                f"{recipe.file}: {key}: {template!r} is not a template ({exc})", fix="write a literal brace as {{ or }}"
            ) from None
        unknown = [name for name in fields if name not in allowed]
        if unknown:
            raise ConfigError(
                f"{recipe.file}: {key}: unknown placeholder {{{unknown[0]}}} in {template!r}",
                fix=f"use only {{{'}, {'.join(sorted(allowed))}}}",
            )


def _check_archs(recipe: ResolvedRecipe, cell: Cell) -> None:
    """A recipe's own arch list must be one the cell's toolkit reads (CUDA archs are no
    ROCm targets, and the other way round)."""
    family = cell.variant.family
    if recipe.arch_list is None or family is Family.CPU:
        return
    kind = "CUDA" if family is Family.CUDA else "ROCm"
    try:
        CudaArchs.parse(recipe.arch_list) if family is Family.CUDA else RocmArchs.parse(recipe.arch_list)
    except ValueError as exc:
        raise ConfigError(
            f"{recipe.file}: build.arch-list: '{recipe.arch_list}' is no {kind} arch list, "
            f"and cell {cell.id} builds for {kind} ({exc})",
            fix=f'give the {kind} cells their own arch-list in an [[override]] with cells = ["{family.value}*"]',
        ) from None


# Build switches that are silently ignored without another one: knowledge a recipe author
# should not have to rediscover from a wheel that lacks a backend.
_SWITCH_NEEDS = {
    "USE_SYSTEM_UCC": "USE_UCC",  # torch: builds no UCC backend unless USE_UCC=1 too
    "USE_SYSTEM_NCCL": "USE_NCCL",  # torch: no NCCL at all unless USE_NCCL=1
}
_ON = frozenset({"1", "ON", "TRUE", "YES"})


def _check_switches(recipe: ResolvedRecipe) -> None:
    env = {key: value.upper() for key, value in recipe.env.items()}
    for switch, needed in _SWITCH_NEEDS.items():
        if env.get(switch) in _ON and env.get(needed) not in _ON:
            raise ConfigError(
                f"{recipe.file}: build.env.{switch}: {switch}=1 does nothing without {needed}=1 "
                "(the build silently leaves the backend out)",
                fix=f'set {needed} = "1" in the same build.env',
            )


def describe_source(source: Source, root: Path) -> str:
    match source:
        case PathSource(path=path):
            return f"path {path.relative_to(root) if path.is_relative_to(root) else path}"
        case SdistSource(project=project, version=version, sha256=sha256):
            return f"sdist {project}=={version} from the package index, sha256 {sha256[:12]}..."
        case UrlSource(url=url, sha256=sha256):
            return f"url {url}, sha256 {sha256[:12]}..."
        case GitSource(url=url, rev=rev, submodules=submodules):
            return f"git {url} at {rev[:12]}" + (" with submodules" if submodules else "")
