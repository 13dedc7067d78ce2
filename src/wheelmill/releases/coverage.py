"""Which wheel exists, for whom: every recipe of the matrix in every variant and Python, for
one release of a track, marked by what the matrix, the index's release records and the GPU
stages say, and nothing else (no output root, no log of a runner: what any machine reading
the index sees).

    built      the cell's own job built it; its file is listed in the cell's channel
    served     its ABI group's one build, made by another cell's job, listed here too
    failed     the cell's build failed: its step, its error's first line, its log's end
    planned    the release plans it, and nothing is recorded for it (yet)
    opt-in     the recipe applies to the cell and is built only where named (never by a release)
    absent     not in the matrix: the recipe does not apply, or the variant has no such Python

Each CUDA or ROCm file carries its GPU stage on each runner its cell needs (passed, failed,
import-only, not-run, ...), from the release's GPU records. ``Coverage.as_dict`` is the JSON
``wheelmill coverage --json`` prints and the coverage page reads, held to
``schema/coverage.schema.json``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from wheelmill.errors import ReleaseError
from wheelmill.index.storage import Storage
from wheelmill.inputs.matrix import Matrix
from wheelmill.inputs.recipes import Recipe, select
from wheelmill.inputs.variants import Cell, Family, Variant
from wheelmill.inputs.versions import Track
from wheelmill.releases.records import FailedBuild, GpuRecord, Manifest, ReleasedFile, load_manifest, manifests

COVERAGE_SCHEMA = 1
COVERAGE_SCHEMA_PATH = Path(__file__).parent / "schema" / "coverage.schema.json"
NO_RECORD = "not-run"  # a file's GPU stage on a runner that has recorded none for its cell


class Mark(StrEnum):
    BUILT = "built"
    SERVED = "served"
    FAILED = "failed"
    PLANNED = "planned"
    OPT_IN = "opt-in"
    ABSENT = "absent"


@dataclass(frozen=True, kw_only=True)
class CoveredFile:
    """A released file of a recipe in a cell, and its GPU stage on each runner of the cell."""

    filename: str
    sha256: str
    gpu: Mapping[str, str] = field(default_factory=dict)  # runner -> outcome; empty for a CPU cell

    def as_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "sha256": self.sha256, "gpu": dict(sorted(self.gpu.items()))}


@dataclass(frozen=True, kw_only=True)
class Spot:
    """One recipe in one variant and Python: what exists there, or why nothing does."""

    recipe: str
    variant: str
    python: str
    mark: Mark
    cell: str | None = None  # None: the variant has no such Python
    channel: str | None = None  # the channel its file is (or would be) in
    files: tuple[CoveredFile, ...] = ()
    failure: FailedBuild | None = None
    why: str = ""  # for planned, opt-in and absent: in words

    def as_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "variant": self.variant,
            "python": self.python,
            "cell": self.cell,
            "mark": self.mark.value,
            "channel": self.channel,
            "files": [f.as_dict() for f in self.files],
            "failure": None if self.failure is None else self.failure.as_dict(),
            "why": self.why,
        }


@dataclass(frozen=True, kw_only=True)
class VariantFacts:
    """What a user picks a wheel by: the variant's torch, accelerator and platform."""

    name: str
    family: Family
    torch: str
    accelerator: str  # "cpu", "cuda 13.0", "rocm 6.4"
    platform: str
    channel: str
    archs: str | None

    @classmethod
    def of(cls, variant: Variant, channel: str) -> VariantFacts:
        accelerator = "cpu" if variant.family is Family.CPU else f"{variant.family.value} {variant.toolkit_short}"
        return cls(
            name=variant.name,
            family=variant.family,
            torch=variant.torch,
            accelerator=accelerator,
            platform=variant.platform,
            channel=channel,
            archs=variant.arch_list,
        )

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "family": self.family.value}


@dataclass(frozen=True, kw_only=True)
class Coverage:
    """A release's coverage: the matrix's variants and Pythons, and a spot for each recipe in each."""

    track: Track
    version: str
    commit: str
    pythons: tuple[str, ...]
    variants: tuple[VariantFacts, ...]
    recipes: tuple[str, ...]
    spots: tuple[Spot, ...]

    def spot(self, recipe: str, variant: str, python: str) -> Spot:
        return next(s for s in self.spots if (s.recipe, s.variant, s.python) == (recipe, variant, python))

    def counts(self) -> dict[str, int]:
        """How many spots of each mark, absent ones left out."""
        counted = {mark.value: 0 for mark in Mark if mark is not Mark.ABSENT}
        for spot in self.spots:
            if spot.mark is not Mark.ABSENT:
                counted[spot.mark.value] += 1
        return counted

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": COVERAGE_SCHEMA,
            "track": self.track.value,
            "version": self.version,
            "commit": self.commit,
            "pythons": list(self.pythons),
            "variants": [v.as_dict() for v in self.variants],
            "recipes": list(self.recipes),
            "counts": self.counts(),
            "spots": [s.as_dict() for s in self.spots],
        }


def release_of(storage: Storage, track: Track, version: str | None) -> Manifest:
    """The release to cover: ``version`` of ``track``, or the track's newest."""
    if version is not None:
        return load_manifest(storage, track, version)
    found = manifests(storage, track)
    if not found:
        raise ReleaseError(
            f"the {track} track of {storage.location} has no release",
            fix="publish one (`wheelmill release publish --tag vX.Y.Z-rcN`), or give --track with one that has",
        )
    return found[0]


def coverage(
    matrix: Matrix, recipes: Mapping[str, Recipe], manifest: Manifest, *, only: Collection[str] = ()
) -> Coverage:
    """Every recipe of ``recipes`` (or those ``only`` names) in every variant and Python of
    ``matrix``, for ``manifest``'s release."""
    track = manifest.track
    variants = tuple(VariantFacts.of(v, track.channel(v.channel)) for v in matrix.variants.values())
    chosen = sorted(name for name in recipes if not only or name in only)
    reading = _Reading(matrix, recipes, manifest)
    spots = tuple(
        _spot(reading, name, variant, python)
        for name in chosen
        for variant in matrix.variants.values()
        for python in matrix.pythons
    )
    return Coverage(
        track=track,
        version=manifest.version,
        commit=manifest.commit,
        pythons=matrix.pythons,
        variants=variants,
        recipes=tuple(chosen),
        spots=spots,
    )


@dataclass(frozen=True)
class _Reading:
    """What each spot is read from."""

    matrix: Matrix
    recipes: Mapping[str, Recipe]
    manifest: Manifest


def _spot(reading: _Reading, name: str, variant: Variant, python: str) -> Spot:
    spot = Spot(recipe=name, variant=variant.name, python=python, mark=Mark.ABSENT)
    if python not in variant.pythons:
        return replace(spot, why=f"{variant.name} is not built for Python {python}")
    cell = Cell(variant=variant, python=python)
    if not reading.recipes[name].applies_to(cell):
        return replace(spot, cell=cell.id, why=f"{name} is not built for {cell.id}")
    manifest = reading.manifest
    spot = replace(spot, cell=cell.id, channel=manifest.track.channel(variant.channel))
    released = [f for f in manifest.files if f.cell == cell.id and f.recipe == name]
    if released:
        mark = Mark.SERVED if all(f.from_group for f in released) else Mark.BUILT
        return replace(spot, mark=mark, files=tuple(_covered(f, manifest, reading.matrix, cell) for f in released))
    if name not in select(reading.recipes, cell, ()):
        return replace(spot, mark=Mark.OPT_IN, why=f"opt-in: wheelmill build --cell {cell.id} --recipe {name}")
    failure = next((f for f in manifest.failed if f.cell == cell.id), None)
    if failure is not None:
        return replace(spot, mark=Mark.FAILED, failure=failure)
    return replace(spot, mark=Mark.PLANNED, why="planned; nothing recorded")


def _covered(released: ReleasedFile, manifest: Manifest, matrix: Matrix, cell: Cell) -> CoveredFile:
    """The file, with its GPU stage on each runner its cell needs (as the record names them,
    else as the matrix does)."""
    if cell.variant.family is Family.CPU:
        return CoveredFile(filename=released.filename, sha256=released.sha256)
    named = (manifest.gpu_runners or {}).get(cell.id)
    runners = named if named is not None else matrix.gpu_runners_of(cell)
    stages = {g.runner: g for g in manifest.gpu if g.cell == cell.id}
    gpu = {runner: _outcome(stages.get(runner), released.sha256) for runner in runners}
    return CoveredFile(filename=released.filename, sha256=released.sha256, gpu=gpu or {"": "not-covered"})


def _outcome(stage: GpuRecord | None, sha256: str) -> str:
    """The file's outcome in a runner's newest stage for its cell; not-run where none tested it."""
    if stage is None:
        return NO_RECORD
    found = stage.tested.get(sha256)
    return found.value if found is not None else NO_RECORD


def failures(found: Coverage) -> list[Spot]:
    """The failed spots, one per cell (a cell's failure marks each recipe it was to build)."""
    seen: dict[str, Spot] = {}
    for spot in found.spots:
        if spot.mark is Mark.FAILED and spot.cell is not None:
            seen.setdefault(spot.cell, spot)
    return list(seen.values())


def by_recipe(found: Coverage) -> dict[str, list[tuple[VariantFacts, Sequence[Spot]]]]:
    """For each recipe, the variants where it has any spot that is not absent, with that
    variant's spots in the matrix's order of Pythons: the grid's lines."""
    lines: dict[str, list[tuple[VariantFacts, Sequence[Spot]]]] = {}
    index = {(s.recipe, s.variant, s.python): s for s in found.spots}
    for recipe in found.recipes:
        for variant in found.variants:
            row = [index[recipe, variant.name, python] for python in found.pythons]
            if any(s.mark is not Mark.ABSENT for s in row):
                lines.setdefault(recipe, []).append((variant, row))
    return lines
