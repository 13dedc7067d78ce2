"""Recipes: what to build for one package, loaded from ``recipes/<name>.toml``.

Per-cell overrides (``[[override]]`` tables selected by glob on the cell id) are resolved
in exactly one place, :func:`resolve`, which returns the frozen ``ResolvedRecipe`` a plan
and its steps work from.

Globs match a slim cell (``cuda130-sm90-py311``) by its parent's id (``cuda130-py311``): a
slim cell builds what its parent builds, the same way, and shares its parent's build env;
only its arch list differs (``wheelmill.planning.spec`` decides that).
"""

from __future__ import annotations

import fnmatch
import graphlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from wheelmill.config import load_toml, parse_size, validate
from wheelmill.errors import ConfigError, SelectionError, did_you_mean
from wheelmill.inputs import SCHEMAS
from wheelmill.inputs.archs import CudaArchs, RocmArchs
from wheelmill.inputs.variants import PLATFORMS, Cell, Family
from wheelmill.inputs.versions import VersionRule

SCHEMA = "recipe.schema.json"
TORCH = "torch"  # the recipe that builds torch itself
MATRIX_FILE = "matrix.toml"


@dataclass(frozen=True, kw_only=True)
class PathSource:
    path: Path


@dataclass(frozen=True, kw_only=True)
class SdistSource:
    """An sdist named ``project==version``, found through the configured package index."""

    project: str
    version: str
    sha256: str


@dataclass(frozen=True, kw_only=True)
class UrlSource:
    url: str
    sha256: str


@dataclass(frozen=True, kw_only=True)
class GitSource:
    """A commit of a git repository; ``url`` as upstream names it (a site's mirror setting
    redirects it, submodules included, the way git's ``insteadOf`` does)."""

    url: str
    rev: str
    submodules: bool = False


Source = PathSource | SdistSource | UrlSource | GitSource


class AbiPromise(StrEnum):
    """What a recipe's libraries promise of their ABI, checked after repair."""

    STABLE = "stable"  # PyTorch's stable ABI alone: no libtorch C++ symbol


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """A recipe as written: its own keys, plus the raw tables overrides merge into."""

    name: str
    file: Path
    description: str
    cells: tuple[str, ...]
    opt_in: bool  # built only when named, or needed by a recipe that is
    platforms: tuple[str, ...] = PLATFORMS  # the machines it builds for (of those its cells' variants list)
    abi: AbiPromise | None = None  # what its libraries promise of their ABI; None: nothing
    depends_on: tuple[str, ...]
    after: tuple[str, ...]  # built after (and against) these when the cell builds them too
    source: Source
    subdir: str | None
    patches: tuple[Path, ...]
    tables: Mapping[str, Any]
    overrides: tuple[Mapping[str, Any], ...]

    def applies_to(self, cell: Cell) -> bool:
        return cell.variant.platform in self.platforms and matches(cell, self.cells)


def matches(cell: Cell, globs: Sequence[str]) -> bool:
    """Whether a recipe's (or an override's) cell globs select ``cell``, by its recipe ids."""
    return any(fnmatch.fnmatchcase(each, glob) for each in cell.recipe_ids for glob in globs)


@dataclass(frozen=True, kw_only=True)
class ResolvedRecipe:
    """A recipe for one cell, with every override applied and every default filled in."""

    name: str
    file: Path
    depends_on: tuple[str, ...]
    source: Source
    subdir: str | None
    patches: tuple[Path, ...]
    command: tuple[str, ...] | None
    env: Mapping[str, str]
    arch_list: str | None
    memory_per_job: int | None
    build_requires: tuple[str, ...]
    local_label: bool
    version_rule: VersionRule
    torch_pin: bool
    run_requires: tuple[str, ...]
    test_requires: tuple[str, ...]
    imports: tuple[str, ...]
    torch_ops: tuple[str, ...]
    symbols: tuple[str, ...]
    smoke: tuple[str, ...] | None
    gpu_smoke: tuple[str, ...] | None  # the GPU stage's check, on a GPU machine (``wheelmill test-gpu``)
    max_wheel_size: int | None
    device_code: bool | None
    abi: AbiPromise | None = None
    repair_exclude: tuple[str, ...] = field(default=())
    provides: tuple[str, ...] = field(default=())  # libraries the wheel itself ships (torch's own)


def load_recipes(directory: Path) -> dict[str, Recipe]:
    """Every ``*.toml`` in ``directory`` but the matrix, validated, with a valid DAG."""
    files = sorted(p for p in directory.glob("*.toml") if p.name != MATRIX_FILE)
    recipes = {}
    for file in files:
        recipe = load_recipe(file)
        recipes[recipe.name] = recipe
    _check_graph(recipes)
    return recipes


def load_recipe(file: Path) -> Recipe:
    data = load_toml(file)
    validate(data, schema_path=SCHEMAS / SCHEMA, file=file)
    if data["name"] != file.stem:
        raise ConfigError(
            f"{file}: name: '{data['name']}' differs from the file name",
            fix=f'rename the file to {data["name"]}.toml or set name = "{file.stem}"',
        )
    for index, override in enumerate(data.get("override", ())):
        _check_tables(override, file=file, where=f"override[{index}].")
        if "source" in override:
            where = f"override[{index}].source"
            _source(override["source"], file=file, where=where)
            _patches(override["source"], file=file, where=where)
    _check_tables(data, file=file, where="")
    return Recipe(
        name=data["name"],
        file=file,
        description=data.get("description", ""),
        cells=tuple(data.get("cells", ["*"])),
        opt_in=data.get("opt-in", False),
        platforms=tuple(data.get("platforms", PLATFORMS)),
        abi=AbiPromise(data["abi"]) if "abi" in data else None,
        depends_on=tuple(data.get("depends-on", ())),
        after=tuple(data.get("after", ())),
        source=_source(data["source"], file=file),
        subdir=data["source"].get("subdir"),
        patches=_patches(data["source"], file=file, where="source"),
        tables={k: data[k] for k in ("version", "build", "requirements", "checks", "repair") if k in data},
        overrides=tuple(data.get("override", ())),
    )


def _source(raw: Mapping[str, Any], *, file: Path, where: str = "source") -> Source:
    kinds = [k for k in ("path", "sdist", "url", "git") if k in raw]
    if len(kinds) != 1:
        found = ", ".join(kinds) or "none"
        raise ConfigError(
            f"{file}: {where}: give exactly one of path, sdist, url, git (found: {found})", fix="keep one source kind"
        )
    kind = kinds[0]
    if kind in ("sdist", "url") and "sha256" not in raw:
        raise ConfigError(
            f"{file}: {where}.sha256: a {kind} source needs its sha256",
            fix='add sha256 = "<64 hex digits>" (`pip hash FILE`)',
        )
    if kind == "git" and "rev" not in raw:
        raise ConfigError(
            f"{file}: {where}.rev: a git source needs a pinned commit", fix='add rev = "<40-hex commit id>"'
        )
    for key in ("rev", "submodules"):
        if kind != "git" and key in raw:
            raise ConfigError(f"{file}: {where}.{key}: only a git source takes {key}", fix=f"remove {key}")
    if kind in ("path", "git") and "sha256" in raw:
        raise ConfigError(f"{file}: {where}.sha256: a {kind} source takes no sha256", fix="remove sha256")
    match kind:
        case "path":
            path = (file.parent / raw["path"]).resolve()
            if not path.is_dir():
                raise ConfigError(
                    f"{file}: {where}.path: {path} is not a directory",
                    fix="point it at the package's source directory, relative to the recipe",
                )
            return PathSource(path=path)
        case "sdist":
            project, version = raw["sdist"].split("==", 1)
            return SdistSource(project=project, version=version, sha256=raw["sha256"])
        case "url":
            return UrlSource(url=raw["url"], sha256=raw["sha256"])
        case _:
            return GitSource(url=raw["git"], rev=raw["rev"], submodules=raw.get("submodules", False))


def _patches(raw: Mapping[str, Any], *, file: Path, where: str) -> tuple[Path, ...]:
    """The source's patch files, which must exist: a patch that is not there is a recipe
    that cannot build, found now rather than after the download."""
    patches = tuple((file.parent / name).resolve() for name in raw.get("patches", ()))
    for patch in patches:
        if not patch.is_file():
            raise ConfigError(
                f"{file}: {where}.patches: {patch} is not a file", fix="give patch files relative to the recipe file"
            )
    return patches


def _check_tables(tables: Mapping[str, Any], *, file: Path, where: str) -> None:
    """Checks the schema cannot express: arch-list syntax and sizes."""
    arch = tables.get("build", {}).get("arch-list")
    if arch is not None:
        try:
            RocmArchs.parse(arch) if arch.lstrip().startswith("gfx") else CudaArchs.parse(arch)
        except ValueError as exc:
            raise ConfigError(f"{file}: {where}build.arch-list: {exc}", fix="list archs separated by ';'") from None


def _check_graph(recipes: Mapping[str, Recipe]) -> None:
    for recipe in recipes.values():
        for key, names in (("depends-on", recipe.depends_on), ("after", recipe.after)):
            for dep in names:
                if dep not in recipes:
                    raise ConfigError(
                        f"{recipe.file}: {key}: unknown recipe '{dep}'{did_you_mean(dep, recipes)}",
                        fix=f"use one of: {', '.join(sorted(recipes))}",
                    )
                if dep == recipe.name:
                    word = "depend on" if key == "depends-on" else "come after"
                    raise ConfigError(f"{recipe.file}: {key}: a recipe cannot {word} itself", fix=f"remove '{dep}'")
    try:
        tuple(graphlib.TopologicalSorter({r.name: (*r.depends_on, *r.after) for r in recipes.values()}).static_order())
    except graphlib.CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        first = recipes[exc.args[1][0]].file
        raise ConfigError(f"{first}: depends-on: cycle {cycle}", fix="break the cycle: recipes form a DAG") from None


def closure(depends_on: Mapping[str, Sequence[str]], roots: Iterable[str]) -> set[str]:
    """``roots`` and everything they depend on, transitively.

    >>> sorted(closure({"a": ["b"], "b": ["c"], "c": []}, ["a"]))
    ['a', 'b', 'c']
    """
    found: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name not in found:
            found.add(name)
            stack.extend(depends_on[name])
    return found


def order(recipes: Mapping[str, Recipe], names: Sequence[str]) -> tuple[str, ...]:
    """``names`` and everything they depend on, dependencies first, ties by name; a recipe
    comes after those of its ``after`` that are built too."""
    wanted = closure({name: recipe.depends_on for name, recipe in recipes.items()}, names)
    sorter = graphlib.TopologicalSorter({n: cell_dependencies(recipes[n], wanted) for n in sorted(wanted)})
    sorter.prepare()
    result: list[str] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        result.extend(ready)
        sorter.done(*ready)
    return tuple(result)


def cell_dependencies(recipe: Recipe, built: Iterable[str]) -> tuple[str, ...]:
    """What ``recipe`` is built against in a cell that builds ``built``: what it depends on,
    and what it comes after where that is built too. Every recipe comes after torch: a cell
    that builds torch builds the rest against it (else against the variant's torch)."""
    chosen = set(built)
    after = (*recipe.after, TORCH) if recipe.name != TORCH else recipe.after
    return (
        *recipe.depends_on,
        *dict.fromkeys(name for name in after if name in chosen and name not in recipe.depends_on),
    )


def select(recipes: Mapping[str, Recipe], cell: Cell, names: Sequence[str]) -> tuple[str, ...]:
    """The recipes to build in ``cell``: the named ones (or all that apply) and their deps."""
    for name in names:
        if name not in recipes:
            raise SelectionError(
                f"unknown recipe '{name}'{did_you_mean(name, recipes)}", fix=f"use one of: {', '.join(sorted(recipes))}"
            )
        if not recipes[name].applies_to(cell):
            raise SelectionError(
                f"recipe '{name}' is not built for cell {cell.id} ({_reach(recipes[name])})",
                fix="pick a cell it applies to, or widen its cells in " + str(recipes[name].file),
            )
    chosen = list(names) or [n for n, r in sorted(recipes.items()) if r.applies_to(cell) and not r.opt_in]
    result = order(recipes, chosen)
    for name in result:
        if not recipes[name].applies_to(cell):
            needer = next(n for n in result if name in recipes[n].depends_on)
            raise SelectionError(
                f"recipe '{needer}' depends on '{name}', which is not built for cell {cell.id}",
                fix=f"add the cell to the cells of {recipes[name].file}",
            )
    return result


def _reach(recipe: Recipe) -> str:
    """``its cells: cpu*; its platforms: x86_64``: what a recipe is built for."""
    platforms = f"; its platforms: {', '.join(recipe.platforms)}" if recipe.platforms != PLATFORMS else ""
    return f"its cells: {', '.join(recipe.cells)}{platforms}"


def check_cells(recipes: Mapping[str, Recipe], cells: Sequence[Cell]) -> None:
    """Every recipe, and every override in it, is for some cell of the matrix: a glob that
    matches nothing is a typo that would silently build nothing. Globs match cells by their
    ``base_id``, so one on a slim cell's own id matches nothing and is refused here."""
    ids = list(dict.fromkeys(each for c in cells for each in c.recipe_ids))
    for recipe in recipes.values():
        tables = [("cells", recipe.cells)] + [
            (f"override[{i}].cells", tuple(o["cells"])) for i, o in enumerate(recipe.overrides)
        ]
        for key, globs in tables:
            if not any(fnmatch.fnmatchcase(cell, glob) for cell in ids for glob in globs):
                raise ConfigError(
                    f"{recipe.file}: {key}: {', '.join(globs)} match no cell of the matrix"
                    f"{did_you_mean(globs[0], ids)}",
                    fix="write globs on cell ids such as cuda*-py311 "
                    "(`wheelmill matrix` lists the cells; a slim cell takes its parent's recipes)",
                )


def _version_rule(source: Source, named: str | None) -> VersionRule:
    """In-house code (a path in this repository) carries the repo's version; a third-party
    sdist, URL or git tag keeps its project's own, unless the recipe says otherwise."""
    if named is not None:
        return VersionRule(named)
    return VersionRule.REPO if isinstance(source, PathSource) else VersionRule.SOURCE


def resolve_all(recipes: Mapping[str, Recipe], cell: Cell) -> dict[str, ResolvedRecipe]:
    """Every recipe that applies to ``cell``, resolved for it: once a cell, for its plan and
    its lock's inputs alike."""
    return {name: resolve(recipe, cell) for name, recipe in recipes.items() if recipe.applies_to(cell)}


def resolve(recipe: Recipe, cell: Cell) -> ResolvedRecipe:
    """The recipe for ``cell``: overrides whose globs match, merged in file order."""
    tables: dict[str, Any] = _merge({}, dict(recipe.tables))
    source, subdir, patches = recipe.source, recipe.subdir, recipe.patches
    for index, override in enumerate(recipe.overrides):
        if matches(cell, override["cells"]):
            tables = _merge(tables, {k: v for k, v in override.items() if k not in ("cells", "source")})
            # a source is replaced whole: a commit of one tag with the URL of another is no source
            if "source" in override:
                raw, where = override["source"], f"override[{index}].source"
                source, subdir = _source(raw, file=recipe.file, where=where), raw.get("subdir")
                patches = _patches(raw, file=recipe.file, where=where)
    build, checks = tables.get("build", {}), tables.get("checks", {})
    requirements, repair = tables.get("requirements", {}), tables.get("repair", {})
    return ResolvedRecipe(
        name=recipe.name,
        file=recipe.file,
        depends_on=recipe.depends_on,
        source=source,
        subdir=subdir,
        patches=patches,
        command=tuple(build["command"]) if "command" in build else None,
        env=dict(build.get("env", {})),
        arch_list=build.get("arch-list") if cell.variant.family is not Family.CPU else None,
        memory_per_job=parse_size(build["memory-per-job"]) if "memory-per-job" in build else None,
        build_requires=tuple(build.get("requires", ())),
        local_label=tables.get("version", {}).get("local-label", True),
        version_rule=_version_rule(source, tables.get("version", {}).get("from")),
        torch_pin=requirements.get("torch", "exact") == "exact",
        run_requires=tuple(requirements.get("run", ())),
        test_requires=tuple(requirements.get("test", ())),
        imports=tuple(checks.get("imports", ())),
        torch_ops=tuple(checks.get("torch-ops", ())),
        symbols=tuple(checks.get("symbols", ())),
        smoke=tuple(checks["smoke"]) if "smoke" in checks else None,
        gpu_smoke=tuple(checks["gpu-smoke"]) if "gpu-smoke" in checks else None,
        max_wheel_size=parse_size(checks["max-wheel-size"]) if "max-wheel-size" in checks else None,
        device_code=checks.get("device-code"),
        abi=recipe.abi,
        repair_exclude=tuple(repair.get("exclude", ())),
        provides=tuple(repair.get("provides", ())),
    )


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: tables merge key by key, anything else (lists too) replaces."""
    result = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = _merge(dict(result[key]), value)
        else:
            result[key] = dict(value) if isinstance(value, Mapping) else value
    return result
