"""What the steps of a build make, by type, in one place: a step returns these in its
Outcome, and a later step looks them up on the cell's board (``Done``) by type. Each entry
of the registry (``wheelmill.building.steps``) declares which of them it makes and which it
needs; a unit test checks that every need is made by an entry before it.

The types a lower layer defines and a step makes as they are: ``Ready`` (a builder image),
``Where`` (where commands run), ``CompilerCache``, ``Closure``, ``Mirrored``, ``WheelRecord``
(a delivered wheel) and ``Published``; ``PRODUCTS`` lists them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wheelmill.building.compiler_cache import CacheStats, CompilerCache
from wheelmill.building.context import Where
from wheelmill.index.channels import Published, PublishOutcome
from wheelmill.index.closure import Closure, Mirrored
from wheelmill.index.pages import FileEntry
from wheelmill.machine.builder_images import Ready
from wheelmill.machine.envs import Env
from wheelmill.machine.package_sources import PackageSources
from wheelmill.machine.probes import TorchInfo
from wheelmill.machine.toolchain import Toolkit
from wheelmill.output.report import Status, WheelRecord
from wheelmill.planning.buildkey import BuildKey
from wheelmill.provenance.record import BuildRecord
from wheelmill.wheel.buildtags import Taken


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    """What builds the cell where its commands run: its Python, and the installed toolkit
    (None for a CPU cell, or where the locked env brings pip's toolkit)."""

    python: Path
    toolkit: Toolkit | None
    compiler: str | None = None  # the C++ compiler as it names itself and its version: ``c++ 12.2.0``

    def facts(self) -> Mapping[str, Any]:
        return {"python": str(self.python), **(_toolkit_facts(self.toolkit) if self.toolkit else {})}


def _toolkit_facts(toolkit: Toolkit) -> Mapping[str, Any]:
    return {"toolkit": {"root": str(toolkit.root), "version": toolkit.version}}


@dataclass(frozen=True, kw_only=True)
class Sources:
    """Where the cell's packages come from (the variant's torch among them), and its lock."""

    packages: PackageSources
    lock_origin: str

    def facts(self) -> Mapping[str, Any]:
        return {
            "lock_origin": self.lock_origin,
            "package_sources": self.packages.describe(),
            "package_source_args": self.packages.uv_args(),
        }


@dataclass(frozen=True, kw_only=True)
class BuildEnv:
    env: Env
    lock: Path
    lock_sha256: str
    pins: Mapping[str, str]

    def facts(self) -> Mapping[str, Any]:
        return {"lock_sha256": self.lock_sha256}


@dataclass(frozen=True, kw_only=True)
class CheckedEnv:
    """The build env's torch, proven the variant's, and the toolkit builds use."""

    torch: TorchInfo
    toolkit: Toolkit | None

    def facts(self) -> Mapping[str, Any]:
        return {**self.torch.facts(), **(_toolkit_facts(self.toolkit) if self.toolkit else {})}


@dataclass(frozen=True, kw_only=True)
class CondaLock:
    """The conda lock the build env is made from (the conda backend's): a copy under the cell."""

    path: Path
    origin: str

    def facts(self) -> Mapping[str, Any]:
        return {"conda_lock": str(self.path), "conda_lock_origin": self.origin}


@dataclass(frozen=True, kw_only=True)
class Fetched:
    """The recipe's source tree, verified, where the build runs it."""

    root: Path


@dataclass(frozen=True, kw_only=True)
class Built:
    wheel: Path
    recipe: str
    max_jobs: int
    nvcc_threads: int | None = None  # the --threads wheelmill gave nvcc; None: none (no nvcc, or the recipe's own)
    cache: CacheStats | None = None  # what the compiler cache did for this build; None: not used

    def facts(self) -> Mapping[str, Any]:
        return {
            "max_jobs": {self.recipe: self.max_jobs},
            "nvcc_threads": {self.recipe: self.nvcc_threads},
            "compiler_cache": {self.recipe: self.cache.as_dict() if self.cache else None},
        }


@dataclass(frozen=True, kw_only=True)
class Stamped:
    wheel: Path
    record: BuildRecord  # what went into it: its SBOM's, and its provenance's when published


@dataclass(frozen=True, kw_only=True)
class Repaired:
    wheel: Path


@dataclass(frozen=True, kw_only=True)
class ShippedAbi:
    """The ABI the repaired wheel's libraries keep to, as the post-repair checks read it
    (``WheelAbi.describe``; None: it has no library), for the report's wheel record."""

    text: str | None


@dataclass(frozen=True, kw_only=True)
class PublishedBuild:
    """A recipe's wheel, published for its build key: the recipe is not built again. One of
    the local index is delivered as it is (a run of this machine tested it); one reused from
    the served index is install-tested here first, as a wheel built here is (``tested_here``):
    another runner's test is not this one's."""

    recipe: str
    key: str
    channel: str
    project: str
    entry: FileEntry
    path: Path  # the local channel's file, linked into dist/; a reused one's copy in the cell's build tree
    torch: str | None  # the torch it pins, for the report's facts where no env says it
    reused_from: str | None = None  # the served index's channel it was fetched from; None: the local index
    provenance: bytes | None = field(default=None, repr=False)  # a reused one's, verified, delivered with it

    @property
    def tested_here(self) -> bool:
        return self.reused_from is not None

    def repaired(self) -> Repaired:
        """A reused wheel, as the repair step would have made it: what its checks after
        repair and its install test take."""
        return Repaired(wheel=self.path)

    @property
    def status(self) -> Status:
        return Status.PUBLISHED if self.reused_from is None else Status.REUSED

    def describe(self) -> str:
        if self.reused_from is not None:
            return f"reused: {self.entry.filename} from {self.reused_from} (build key {self.key[:12]}...)"
        return f"published: {self.entry.filename} (build key {self.key[:12]}...)"

    def made(self) -> tuple[object, ...]:
        """What the recipe's steps would have made: its wheel (the local channel's file, with
        the listed size and sha256) and its publication."""
        assert not self.tested_here, "a reused wheel's record is its install test's"
        wheel = WheelRecord(
            name=self.entry.filename, size=self.entry.size, sha256=self.entry.sha256, path=str(self.path)
        )
        return wheel, Published(
            channel=self.channel, project=self.project, filename=self.entry.filename, outcome=PublishOutcome.UNCHANGED
        )


@dataclass(frozen=True, kw_only=True)
class GroupWheel:
    """A recipe built once for every torch and Python, found in another channel of its
    ABI group: not built here; its wheel goes through this cell's checks after repair,
    its install test where the plan has one, and into this cell's channel."""

    recipe: str
    key: str
    channel: str  # where it was found
    project: str
    entry: FileEntry
    wheel: Path  # that channel's file, linked into the cell's build tree
    tested: bool  # its install test runs here: a corner, or a cell whose own channel does not list it yet
    delivered: Path | None  # linked into dist/ where no install test runs here (the test delivers it)
    served_from: str | None = None  # the served index's channel it was fetched from; None: the local index
    provenance: bytes | None = field(default=None, repr=False)  # the one build's, where it has one

    def describe(self) -> str:
        where = self.served_from or f"channel {self.channel}"
        return f"from the group build: {self.entry.filename} from {where} (build key {self.key[:12]}...)"

    def repaired(self) -> Repaired:
        return Repaired(wheel=self.wheel)

    def delivered_record(self, abi: str | None) -> WheelRecord:
        assert self.delivered is not None, "the group's one build without an install test here is delivered at once"
        return WheelRecord(
            name=self.entry.filename, size=self.entry.size, sha256=self.entry.sha256, path=str(self.delivered), abi=abi
        )


@dataclass(frozen=True, kw_only=True)
class BuildKeys:
    channel: str
    keys: Mapping[str, BuildKey]  # every recipe's, by name
    published: Mapping[str, PublishedBuild]  # the recipes not built again
    from_group: Mapping[str, GroupWheel] = field(default_factory=dict)  # the group's one build, from a sibling channel
    # Recipes built once for their group that this cell builds although not of the group's oldest torch (no channel has
    # the one build, or --rebuild): checked and tested here, never published; why, by recipe.
    unpublished: Mapping[str, str] = field(default_factory=dict)
    # Every file name the channel lists, with its build keys and sha256: a build's new name
    # takes none of them with other bytes (wheelmill.wheel.buildtags).
    taken: Mapping[str, Taken] = field(default_factory=dict)

    @property
    def nothing_to_build(self) -> bool:
        return set(self.published) == set(self.keys)

    @property
    def nothing_to_test(self) -> bool:
        """Nothing to build, and no wheel reused from the served index to install-test here."""
        return self.nothing_to_build and not any(found.tested_here for found in self.published.values())

    def facts(self) -> Mapping[str, Any]:
        """The keys; the torch the published wheels pin, which the env checks say instead
        where a build runs (later facts win); and the recipes built only to be tested, which
        no publisher of this cell's wheels may publish (a --no-publish run has no publish step)."""
        pinned = next((p.torch for p in self.published.values() if p.torch), None)
        return {
            "build_keys": {name: key.digest for name, key in self.keys.items()},
            **({"torch": {"version": pinned}} if pinned else {}),
            **({"unpublished": dict(self.unpublished)} if self.unpublished else {}),
        }


PRODUCTS: tuple[type, ...] = (
    Sources,
    Toolchain,
    Where,
    CondaLock,
    BuildKeys,
    Ready,
    BuildEnv,
    CheckedEnv,
    CompilerCache,
    Fetched,
    Built,
    Stamped,
    Repaired,
    ShippedAbi,
    WheelRecord,
    Published,
    Closure,
    Mirrored,
)

__all__ = [
    "PRODUCTS",
    "BuildEnv",
    "BuildKeys",
    "Built",
    "CheckedEnv",
    "Closure",
    "CompilerCache",
    "CondaLock",
    "Fetched",
    "GroupWheel",
    "Mirrored",
    "Published",
    "PublishedBuild",
    "Ready",
    "Repaired",
    "ShippedAbi",
    "Sources",
    "Stamped",
    "Toolchain",
    "WheelRecord",
    "Where",
]
