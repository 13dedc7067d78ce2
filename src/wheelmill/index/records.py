"""Release records in the index: what a tag or a nightly published, the GPU runners each
of its GPU cells needs, the GPU stages run on them, and the images pushed from it.

    <index root>/releases/<track>/<version>.json   one record per release: every file it
                                                   put in a channel, with its sha256

One writer at a time per track (a lock beside the records), every record written
atomically: a failure leaves the records as they were.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from wheelmill.checks.gpu import GpuOutcome
from wheelmill.errors import IndexWriteError, ReleaseError, UsageError
from wheelmill.files import file_lock, write_atomic
from wheelmill.index.store import RECORDS_DIR
from wheelmill.inputs.versions import Track, VersionRule

# 2: the GPU runners of each GPU cell, and GPU records per cell and runner with each file's outcome
MANIFEST_SCHEMA = 2


@dataclass(frozen=True, kw_only=True)
class ReleasedFile:
    channel: str
    cell: str
    recipe: str
    filename: str
    sha256: str
    rule: VersionRule


@dataclass(frozen=True, kw_only=True)
class ReleasedImage:
    """An image of a release's cell, as pushed: installs from the release's channel."""

    cell: str
    kind: str  # runtime | devel | runtime-extras | devel-extras
    reference: str  # registry/wheelmill@sha256:...


@dataclass(frozen=True, kw_only=True)
class GpuRecord:
    """A cell's GPU stage on one runner (a GPU kind), as a release records it: its status, the
    GPUs it ran on and each file it tested (by sha256) with its outcome; or that no GPU runner
    covers the cell."""

    cell: str
    status: GpuOutcome  # the stage's; not-covered where no runner covers the cell
    runner: str | None = None  # the CI runner label it ran on
    gpus: tuple[str, ...] = ()
    torch: str | None = None
    tested: Mapping[str, GpuOutcome] = field(default_factory=dict)  # each file's sha256, and its outcome
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.status.passed

    def describe(self) -> str:
        runner = f" on runner {self.runner}" if self.runner else ""
        where = f" ({', '.join(self.gpus)})" if self.gpus else ""
        return f"{self.cell}: {self.status.value}{runner}{where}" + (f": {self.note}" if self.note else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "status": self.status.value,
            "runner": self.runner,
            "gpus": list(self.gpus),
            "torch": self.torch,
            "tested": {sha: outcome.value for sha, outcome in sorted(self.tested.items())},
            "note": self.note,
        }


def _gpu_record(data: Mapping[str, Any]) -> GpuRecord:
    return GpuRecord(
        cell=data["cell"],
        status=GpuOutcome(data["status"]),
        runner=data.get("runner"),
        gpus=tuple(data["gpus"]),
        torch=data.get("torch"),
        tested={sha: GpuOutcome(outcome) for sha, outcome in dict(data["tested"]).items()},
        note=data.get("note", ""),
    )


@dataclass(frozen=True, kw_only=True)
class Manifest:
    version: str
    track: Track
    commit: str
    tag: str | None
    files: tuple[ReleasedFile, ...]
    promoted_from: str | None = None
    images: tuple[ReleasedImage, ...] = ()
    gpu: tuple[GpuRecord, ...] = ()
    # Each GPU cell of the release and the runner labels whose GPU stage it needs, as the
    # matrix of its commit says (none: no runner covers it); None in a record made before.
    gpu_runners: Mapping[str, tuple[str, ...]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": MANIFEST_SCHEMA,
            "version": self.version,
            "track": self.track.value,
            "commit": self.commit,
            "tag": self.tag,
            "promoted_from": self.promoted_from,
            "files": [{**vars(f), "rule": f.rule.value} for f in self.files],
            "images": [vars(i) for i in self.images],
            "gpu-runners": None
            if self.gpu_runners is None
            else {cell: list(labels) for cell, labels in sorted(self.gpu_runners.items())},
            "gpu": [g.as_dict() for g in self.gpu],
        }


def manifest_path(root: Path, track: Track, version: str) -> Path:
    """Where a release's record is: a version names a file there and nothing else (``..``,
    a ``/`` or anything but a PEP 440 version, which has neither, never reaches a path outside
    the records)."""
    try:
        Version(version)
    except InvalidVersion:
        raise UsageError(
            f"'{version}' is not a release version", fix="give the version as the release records it, e.g. 1.4.0"
        ) from None
    return root / RECORDS_DIR / track.value / f"{version}.json"


def load_manifest(path: Path) -> Manifest:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = tuple(ReleasedFile(**{**f, "rule": VersionRule(f["rule"])}) for f in data["files"])
        images = tuple(ReleasedImage(**i) for i in data.get("images", []))
        # A record of schema 1 kept no runner and no outcome per file: none of it passes a gate.
        gpu = tuple(_gpu_record(g) for g in data.get("gpu", [])) if data.get("schema", 1) >= 2 else ()
        runners = data.get("gpu-runners")
        return Manifest(
            version=data["version"],
            track=Track(data["track"]),
            commit=data["commit"],
            tag=data["tag"],
            files=files,
            promoted_from=data.get("promoted_from"),
            images=images,
            gpu=gpu,
            gpu_runners=None if runners is None else {cell: tuple(labels) for cell, labels in runners.items()},
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReleaseError(f"{path}: not a release record ({exc})", fix="restore it from the index's storage") from None


def manifests(root: Path, track: Track) -> list[Manifest]:
    """The track's releases, newest version first."""
    found = [load_manifest(p) for p in sorted((root / RECORDS_DIR / track.value).glob("*.json"))]
    return sorted(found, key=lambda m: Version(m.version), reverse=True)


@contextmanager
def records_lock(root: Path, track: Track) -> Iterator[Path]:
    """The one writer of a track's records; an OS error while writing them is one line
    (every record is written atomically, so the records are as they were)."""
    directory = root / RECORDS_DIR / track.value
    try:
        with file_lock(directory / ".lock"):
            yield directory
    except OSError as exc:
        raise IndexWriteError(
            f"{directory}: cannot write the release records: {exc.strerror or exc} ({exc.filename or directory})",
            fix="free space, or make the index root writable (WHEELMILL_INDEX_ROOT); the records are as they were",
        ) from None


def record(root: Path, manifest: Manifest) -> Path:
    """Write (or extend: cells of one release may be published apart) a release's record."""
    path = manifest_path(root, manifest.track, manifest.version)
    with records_lock(root, manifest.track) as directory:
        if path.is_file():
            old = load_manifest(path)
            if old.commit != manifest.commit:
                raise ReleaseError(
                    f"{path}: {manifest.version} was released from commit {old.commit[:12]}, "
                    f"not {manifest.commit[:12]}",
                    fix="a version names one commit: tag a new version",
                )
            known = {(f.channel, f.filename) for f in old.files}
            manifest = replace(
                old,
                files=old.files + tuple(f for f in manifest.files if (f.channel, f.filename) not in known),
                gpu=manifest.gpu or old.gpu,  # a promotion again says what its gate found now
                gpu_runners=_merged_runners(old.gpu_runners, manifest.gpu_runners),
            )
        write_atomic(directory / path.name, (json.dumps(manifest.as_dict(), indent=2) + "\n").encode())
    return path


def _merged_runners(
    old: Mapping[str, tuple[str, ...]] | None, new: Mapping[str, tuple[str, ...]] | None
) -> Mapping[str, tuple[str, ...]] | None:
    """The GPU runners of a release published in parts: every part's cells (one commit, one
    matrix, so a cell's runners are the same in each)."""
    if old is None or new is None:
        return new if old is None else old
    return {**old, **new}


def record_images(root: Path, track: Track, version: str, images: Sequence[ReleasedImage]) -> Path:
    """Add pushed images to a release's record (a newer push of a cell's kind replaces the
    older one)."""
    path = manifest_path(root, track, version)
    with records_lock(root, track) as directory:
        if not path.is_file():
            raise ReleaseError(
                f"{path}: no record of {track.value} {version}", fix="publish the release before its images"
            )
        old = load_manifest(path)
        kept = tuple(i for i in old.images if (i.cell, i.kind) not in {(n.cell, n.kind) for n in images})
        write_atomic(
            directory / path.name,
            (json.dumps(replace(old, images=kept + tuple(images)).as_dict(), indent=2) + "\n").encode(),
        )
    return path


def record_gpu(root: Path, track: Track, version: str, found: Sequence[GpuRecord]) -> Path:
    """Add GPU stage results to a release's record, passed or not (a newer one of a cell on a
    runner replaces the older). Each must be of a runner the record names for its cell, and a
    passed one must have tested every file the record names for its cell: a stage that ran on
    another state of the channel proves nothing about this release."""
    path = manifest_path(root, track, version)
    with records_lock(root, track) as directory:
        if not path.is_file():
            raise ReleaseError(f"{path}: no record of {track.value} {version}", fix="publish the release first")
        old = load_manifest(path)
        for result in found:
            _check_recordable(old, result)
        replaced = {(r.cell, r.runner) for r in found}
        kept = tuple(g for g in old.gpu if (g.cell, g.runner) not in replaced)
        write_atomic(
            directory / path.name,
            (json.dumps(replace(old, gpu=kept + tuple(found)).as_dict(), indent=2) + "\n").encode(),
        )
    return path


def _check_recordable(manifest: Manifest, result: GpuRecord) -> None:
    what = f"{manifest.track.value} {manifest.version}"
    named = {f.sha256 for f in manifest.files if f.cell == result.cell}
    if not named:
        raise ReleaseError(f"{what} has no file of {result.cell}", fix="record reports of the release's cells")
    runners = (manifest.gpu_runners or {}).get(result.cell, ())
    if result.runner not in runners:
        expected = ", ".join(runners) or "none: no GPU runner covers the cell"
        raise ReleaseError(
            f"{result.cell}: its GPU stage ran on runner {result.runner or '(not named)'}, which the record of {what} "
            f"does not name for it (it names {expected})",
            fix=f"run `wheelmill test-gpu --cell {result.cell} --runner LABEL` on each runner the record names",
        )
    if result.passed and not named <= set(result.tested):
        raise ReleaseError(
            f"{result.cell}: its GPU stage tested other files than {what} names "
            f"({len(named - set(result.tested))} of its {len(named)} untested)",
            fix=f"run `wheelmill test-gpu --cell {result.cell} --track {manifest.track.value}` on its channel now",
        )
