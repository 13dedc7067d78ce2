"""A recipe's build key: one hash of every input of its build in a cell. The channel lists
each built wheel's keys (``wheelmill.index.channels``), so a build whose key is listed there
made those bytes already and need not run again.

The inputs, each a part of the key:

- ``source``: what fetch will produce: a path source's tree (names, modes and bytes of the
  files fetch copies), an sdist's or URL's pinned sha256 (fetch checks the bytes), a git
  source's pinned commit (fetch checks out exactly that), and the bytes of every patch;
- ``recipe``: the recipe's spec as the plan resolved it for the cell: the build command
  and variables, arch list, version rule, pins, checks, repair policy;
- ``lock``: the cell's lock inputs and the committed lock's bytes;
- ``builder``: the builder image's definition (its directory, base and CPython pins, what
  its tag hashes but for the base's image id, which only the engine knows), or on this
  machine the toolchain a build here uses;
- ``variant``: the matrix's variant of the cell;
- ``wheelmill``: its version and the tree of its own code: a change to what wheelmill does
  to a build (its flags, its environment) changes every key, whether released or not;
- ``dependencies``: the keys of the recipes it depends on, so a changed dependency changes
  the keys of what depends on it, and of nothing else.

A recipe built once for every torch and Python (``wheelmill.planning.groups``) has a key
that says neither the cell's torch nor its Python, but the torch it is built against: its
``lock`` part is the cell's requirements but torch (on the platform), the building torch
(the group's oldest) and the committed locks of the cells that may build it (that torch's,
every Python: re-locking one builds again); its ``builder`` leaves out the Python, its
``variant`` part is its ABI group (family, label, toolkit, arch list, glibc) and its
``recipe`` part leaves out the cell. Every cell of the group computes the same key, so each
finds the one build in any of the group's channels, and only a cell of that torch builds
what is published under it: one key, one file.

A key costs reading files and, on this machine, asking the compiler its version: nothing is
built, cloned or downloaded to know it.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import platform
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from wheelmill import __version__
from wheelmill.errors import FetchError
from wheelmill.inputs.recipes import GitSource, PathSource, SdistSource, Source, UrlSource
from wheelmill.inputs.variants import Variant
from wheelmill.machine.builder_images import BuilderImage
from wheelmill.machine.net import sha256_of
from wheelmill.planning.groups import GroupBuild
from wheelmill.planning.locks import path_of
from wheelmill.planning.spec import CellPlan, RecipeSpec

# What fetch never copies from a path source (build outputs, VCS and tool state): no part
# of the source, so no part of its key either. These, at any depth:
NOT_SOURCE = ("*.egg-info", "__pycache__", ".git", ".nox", ".pytest_cache", "*.so")
# These at the source's root only, where setuptools writes its outputs: a package or folder of
# that name deeper down is source (issue 42: an unanchored "build" dropped any build/ package).
NOT_SOURCE_AT_ROOT = ("build", "dist")
# Where the source, its patches and the recipe file are: parts of the key by content instead.
_LOCATIONS = frozenset({"file", "source", "patches"})


@dataclass(frozen=True, kw_only=True)
class BuildKey:
    recipe: str
    inputs: Mapping[str, Any]  # JSON data: every input, by part

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @property
    def short(self) -> str:
        return self.digest[:12]


def build_keys(plan: CellPlan, builder: Mapping[str, Any]) -> dict[str, BuildKey]:
    """Every recipe's key in the plan's build order, so a dependency's comes before its
    dependents' and goes into theirs."""
    shared = {
        "lock": lock_identity(plan),
        "builder": dict(builder),
        "variant": plain(plan.cell.variant),
        "wheelmill": wheelmill_identity(),
    }
    found: dict[str, BuildKey] = {}
    for spec in plan.recipes:
        dependencies = {name: found[name].digest for name in spec.depends_on}
        recipe = recipe_identity(spec)
        inputs = {
            **(group_parts(plan, spec.group_build, builder) if spec.group_build else shared),
            "source": source_identity(spec),
            "recipe": {k: v for k, v in recipe.items() if k not in _CELL_FIELDS} if spec.group_build else recipe,
            "dependencies": dependencies,
        }
        found[spec.name] = BuildKey(recipe=spec.name, inputs=inputs)
    return found


def group_parts(plan: CellPlan, group: GroupBuild, builder: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a group build's key besides its source, recipe and dependencies: the
    same in every cell of its ABI group."""
    return {
        "lock": group_lock_identity(plan, group),
        "builder": without_python(builder),
        "variant": group_identity(plan.cell.variant),
        "wheelmill": wheelmill_identity(),
    }


# What a group build's spec says of the cell it was planned in, not of its build.
_CELL_FIELDS = frozenset({"cell", "group_build"})
# What of a variant a build once for every torch and Python does not depend on.
_NOT_SERVING = frozenset(
    {
        "name",
        "torch",
        "torch_on_pypi",
        "torch_index",
        "pythons",
        "other_torch",
        "torch_of",
        "torch_tag",
        "slim",
        "slim_of",
    }
)


def group_identity(variant: Variant) -> dict[str, Any]:
    """The variant of a recipe built once: its toolkit and arch set, not its torch or Pythons."""
    return {key: value for key, value in plain(variant).items() if key not in _NOT_SERVING}


def group_lock_identity(plan: CellPlan, group: GroupBuild) -> dict[str, Any]:
    """What the build env of the one build installs, the same in every cell of the group: the
    requirements but torch, on its platform; the torch it is built against; and the committed
    lock of each cell that may build it (a slim cell's is its parent's)."""
    requirements = [r for r in plan.lock.requirements if canonicalize_name(Requirement(r).name) != "torch"]
    return {
        "requirements": sorted(requirements),
        "platform": plan.lock.target.platform,
        "torch": group.torch,
        "committed": {lock: committed_identity(plan.locks_dir, lock) for lock in group.locks},
    }


def without_python(builder: Mapping[str, Any]) -> dict[str, Any]:
    """The builder but for its Python: an image's CPython pin, this machine's interpreter."""
    return {kind: {key: value for key, value in part.items() if key != "python"} for kind, part in builder.items()}


def source_identity(spec: RecipeSpec) -> dict[str, Any]:
    return {**_source(spec.source), "patches": [sha256_of(patch) for patch in spec.patches]}


def _source(source: Source) -> dict[str, Any]:
    match source:
        case PathSource(path=path):
            return {"tree": tree_hash(path)}
        case SdistSource(sha256=sha256) | UrlSource(sha256=sha256):
            return {"sha256": sha256}
        case GitSource(rev=rev, submodules=submodules):
            return {"commit": rev, "submodules": submodules}


@functools.cache
def wheelmill_identity() -> dict[str, str]:
    """wheelmill itself: its version, and its package's files, every layer (once per process)."""
    package = Path(__file__).parents[1]
    return {"version": __version__, "code": tree_hash(package, ignore=left_out(package, anywhere=("__pycache__",)))}


def recipe_identity(spec: RecipeSpec) -> dict[str, Any]:
    """The spec but for where its files are: the same recipe in another clone, same key. The
    arch list as the build reads it, its text."""
    identity = {f.name: plain(getattr(spec, f.name)) for f in fields(spec) if f.name not in _LOCATIONS | {"archs"}}
    return {**identity, "arch_list": spec.arch_list}


def lock_identity(plan: CellPlan) -> dict[str, Any]:
    return {"inputs": plan.lock.digest, "committed": committed_identity(plan.locks_dir, plan.lock.cell)}


def committed_identity(locks: Path, cell: str) -> str | None:
    """The bytes of the lock committed for ``cell`` (a lock id), by sha256; None: none is."""
    committed = path_of(locks, cell)
    return sha256_of(committed) if committed.is_file() else None


def image_identity(image: BuilderImage) -> dict[str, Any]:
    """The builder image by its definition: the directory of its Containerfile, its base
    and its CPython (by sha256: a mirror moves the tarball, not its bytes)."""
    python = {"version": image.python.version, "sha256": image.python.sha256}
    return {"definition": tree_hash(image.containerfile.parent), "base": plain(image.base), "python": python}


def host_identity(
    *, compiler: tuple[str, str] | None, python: tuple[str, str] | None, toolkit: tuple[str, str] | None
) -> dict[str, Any]:
    """This machine's toolchain, as (path, version) pairs, with its architecture and C
    library (whose version sets the wheel's platform tag)."""
    return {
        "machine": platform.machine(),
        "libc": " ".join(platform.libc_ver()),
        "compiler": compiler,
        "python": python,
        "toolkit": toolkit,
    }


def plain(value: object) -> Any:
    """A value as JSON data: dataclasses by field, enums by value, mappings sorted. A path
    is refused: where a file is says nothing of what it holds, and differs by machine."""
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in sorted(value.items())}
    if isinstance(value, tuple | list):
        return [plain(item) for item in value]
    if isinstance(value, Path):
        raise TypeError(f"{value}: a path is no part of a build key; key the content")
    return value


Ignore = Callable[[str, list[str]], set[str]]


def left_out(
    root: Path, *, anywhere: tuple[str, ...] = NOT_SOURCE, at_root: tuple[str, ...] = NOT_SOURCE_AT_ROOT
) -> Ignore:
    """What is no part of the tree at ``root``, in the form of ``shutil.copytree``'s ``ignore``:
    of a directory's names, those matching ``anywhere``, and in ``root`` itself ``at_root`` too.

    >>> ignore = left_out(Path("/src"))
    >>> sorted(ignore("/src", ["build", "setup.py", "x.so"])), sorted(ignore("/src/pkg/build", ["build", "x.py"]))
    (['build', 'x.so'], [])
    """
    top = os.path.normpath(root)

    def ignore(directory: str, names: list[str]) -> set[str]:
        patterns = anywhere + at_root if os.path.normpath(directory) == top else anywhere
        return {name for name in names if any(fnmatch.fnmatch(name, pattern) for pattern in patterns)}

    return ignore


def tree_hash(root: Path, *, ignore: Ignore | None = None) -> str:
    """The files fetch copies from ``root`` (all but what ``left_out(root)`` names, unless told
    otherwise): relative name, kind, executable bit and bytes (a link's target), in name order;
    the same tree anywhere gives the same hash."""
    digest = hashlib.sha256()
    for relative, identity in sorted(_tree(root, ignore or left_out(root))):
        digest.update(f"{relative}\0{identity}\0".encode())
    return digest.hexdigest()


def _tree(root: Path, ignore: Ignore) -> Iterator[tuple[str, str]]:
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(set(dirs) - ignore(top, dirs))
        here = Path(top)
        linked = [name for name in dirs if (here / name).is_symlink()]  # copied as links, not walked
        for name in (*sorted(set(files) - ignore(top, files)), *linked):
            yield (here / name).relative_to(root).as_posix(), _identity(here / name)


def _identity(path: Path) -> str:
    try:
        if path.is_symlink():
            return f"link {path.readlink()}"
        executable = "x" if path.stat().st_mode & 0o111 else "-"
        return f"file {executable} {sha256_of(path)}"
    except OSError as exc:
        raise FetchError(
            f"{path}: cannot be read to key the source ({exc.strerror or exc})",
            fix="make the source tree readable by this user, or remove the file",
        ) from None
