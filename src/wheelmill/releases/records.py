"""Release records in the index: what a tag or a nightly published, the GPU runners each
of its GPU cells needs, the GPU stages run on them, and the images pushed from it.

A release's record is a set of objects, each created once and never changed, read together
(issue 43: many jobs write one release at once, on many machines, with no lock):

    releases/<track>/<version>/release.json                 the version, its commit and tag
    releases/<track>/<version>/files/<cell>/<stamp>.json     the files one publish put in a
                                                             channel for the cell, and its
                                                             GPU runners
    releases/<track>/<version>/gpu/<cell>/<runner>/<stamp>.json    a GPU stage's result
    releases/<track>/<version>/images/<cell>/<kind>/<stamp>.json   an image pushed
    releases/<track>/<version>/failed/<cell>/<stamp>.json    a build of the cell that failed,
                                                             and <stamp>.log: its log's end

A stamp orders the objects of one thing by when they were made: the newest GPU result of a
cell on a runner, and the newest image of a kind, are the ones that count. A record an
older wheelmill wrote whole (``releases/<track>/<version>.json``) is read as one more part.
Writes go through the index's storage (``wheelmill.index.storage``), so the records hold
on a tree and in a bucket alike.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.version import InvalidVersion, Version

from wheelmill.checks.gpu import GpuOutcome
from wheelmill.errors import ReleaseError, UsageError
from wheelmill.index.channels import RECORDS_DIR
from wheelmill.index.storage import Storage
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
    # True: the ABI group's one build, made by the job of another cell (the group's oldest
    # torch) and listed in this cell's channel too; False: built by this cell's own job, or
    # recorded before the two were told apart.
    from_group: bool = False


@dataclass(frozen=True, kw_only=True)
class FailedBuild:
    """A cell's build for a release that failed, as its job recorded it: the step that
    stopped it, the first line of its error, and where its log is."""

    cell: str
    step: str  # the step's kind: lock, build, checks-after, ...
    recipe: str | None  # the step's recipe; None for a step of the whole cell
    error: str  # the error's first line
    exit_code: int
    log: str | None = None  # the log's end, kept in the index: its key beside the record
    run: str | None = None  # the CI run that built it, by its URL

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


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
    # The runner's signed statement of the above (a DSSE envelope, wheelmill.releases.gpu_attestation)
    # and the id of the trusted key it verified with; None: recorded unsigned.
    envelope: Mapping[str, Any] | None = None
    signed_by: str | None = None

    @property
    def passed(self) -> bool:
        return self.status.passed

    def describe(self) -> str:
        runner = f" on runner {self.runner}" if self.runner else ""
        where = f" ({', '.join(self.gpus)})" if self.gpus else ""
        return f"{self.cell}: {self.status.value}{runner}{where}" + (f": {self.note}" if self.note else "")

    def facts(self) -> dict[str, Any]:
        """What the stage found, as its runner signs it: everything but the signature."""
        return {
            "cell": self.cell,
            "status": self.status.value,
            "runner": self.runner,
            "gpus": list(self.gpus),
            "torch": self.torch,
            "tested": {sha: outcome.value for sha, outcome in sorted(self.tested.items())},
            "note": self.note,
        }

    def as_dict(self) -> dict[str, Any]:
        return {**self.facts(), "signed_by": self.signed_by, "envelope": self.envelope}


def gpu_record_from(data: Mapping[str, Any]) -> GpuRecord:
    """A GPU record from its dict (``as_dict``, or a signed statement's ``facts``)."""
    envelope = data.get("envelope")
    return GpuRecord(
        cell=data["cell"],
        status=GpuOutcome(data["status"]),
        runner=data.get("runner"),
        gpus=tuple(data["gpus"]),
        torch=data.get("torch"),
        tested={sha: GpuOutcome(outcome) for sha, outcome in dict(data["tested"]).items()},
        note=data.get("note", ""),
        envelope=dict(envelope) if isinstance(envelope, Mapping) else None,
        signed_by=data.get("signed_by"),
    )


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A release's record, read whole from its objects."""

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
    # The newest failed build of each cell that recorded one (a cell built later has its
    # files recorded too: its files count over its failure).
    failed: tuple[FailedBuild, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": MANIFEST_SCHEMA,
            "version": self.version,
            "track": self.track.value,
            "commit": self.commit,
            "tag": self.tag,
            "promoted_from": self.promoted_from,
            "files": [_file_dict(f) for f in self.files],
            "images": [vars(i) for i in self.images],
            "gpu-runners": None
            if self.gpu_runners is None
            else {cell: list(labels) for cell, labels in sorted(self.gpu_runners.items())},
            "gpu": [g.as_dict() for g in self.gpu],
            "failed": [f.as_dict() for f in self.failed],
        }


def record_prefix(track: Track, version: str) -> str:
    """Where a release's objects are: a version names a place there and nothing else (``..``,
    a ``/`` or anything but a PEP 440 version, which has neither, never reaches outside the
    records)."""
    try:
        Version(version)
    except InvalidVersion:
        raise UsageError(
            f"'{version}' is not a release version", fix="give the version as the release records it, e.g. 1.4.0"
        ) from None
    return f"{RECORDS_DIR}/{track.value}/{version}/"


def find_manifest(storage: Storage, track: Track, version: str) -> Manifest | None:
    """The release's record, read from its objects; None where it has none."""
    return _found(storage, track, version, storage.keys_under(record_prefix(track, version)))


def _found(storage: Storage, track: Track, version: str, keys: Sequence[str]) -> Manifest | None:
    """The release's record from its objects' keys, listed already."""
    prefix = record_prefix(track, version)
    legacy = _json(storage, _legacy_key(prefix))
    head = _json(storage, f"{prefix}release.json") or legacy
    if head is None:
        if keys:
            raise ReleaseError(
                f"{storage.location}: {track.value} {version} has objects but no release.json",
                fix="restore it from the index's storage, or publish the release again",
            )
        return None
    try:
        return _assembled(storage, head, legacy, keys, prefix)
    except (ValueError, KeyError, TypeError) as exc:
        raise ReleaseError(
            f"{storage.location}: {track.value} {version}: not a release record ({exc})",
            fix="restore it from the index's storage",
        ) from None


def load_manifest(storage: Storage, track: Track, version: str) -> Manifest:
    """The release's record; a ``ReleaseError`` that lists the track's releases where it has none."""
    found = find_manifest(storage, track, version)
    if found is None:
        known = ", ".join(m.version for m in manifests(storage, track)) or "none"
        raise ReleaseError(
            f"the {track} track has no release {version} (there: {known})", fix="give a recorded release"
        )
    return found


def manifests(storage: Storage, track: Track) -> list[Manifest]:
    """The track's releases, newest version first."""
    by_version: dict[str, list[str]] = {}
    for key in storage.keys_under(f"{RECORDS_DIR}/{track.value}/"):  # listed once, for every release
        _, _, name, *inside = key.split("/")
        # an object of the release's own (releases/<track>/<version>/...), or the whole record
        # an older wheelmill wrote beside them (releases/<track>/<version>.json)
        keys = by_version.setdefault(name.removesuffix(".json") if not inside else name, [])
        keys += [key] if inside else []
    found = [_found(storage, track, version, keys) for version, keys in by_version.items() if _is_version(version)]
    return sorted((m for m in found if m is not None), key=lambda m: Version(m.version), reverse=True)


def record(storage: Storage, manifest: Manifest) -> str:
    """Record (or extend: cells of one release may be published apart, by many jobs at once)
    a release: its head once, the files of this publish and its GPU results as new objects.
    Where the release is recorded from another commit, nothing is written."""
    prefix = record_prefix(manifest.track, manifest.version)
    existing = _json(storage, f"{prefix}release.json") or _json(storage, _legacy_key(prefix))
    head = {k: v for k, v in manifest.as_dict().items() if k in _HEAD}
    head["gpu-runners-recorded"] = manifest.gpu_runners is not None
    if existing is None and not storage.create(f"{prefix}release.json", _encoded(head)):
        existing = _json(storage, f"{prefix}release.json")  # another writer made it first
    if existing is not None and existing.get("commit") != manifest.commit:
        raise ReleaseError(
            f"{storage.location}: {manifest.version} was released from commit {str(existing.get('commit'))[:12]}, "
            f"not {manifest.commit[:12]}",
            fix="a version names one commit: tag a new version",
        )
    runners = manifest.gpu_runners or {}
    for cell in sorted({f.cell for f in manifest.files}):
        part = {
            "files": [_file_dict(f) for f in manifest.files if f.cell == cell],
            "gpu-runners": list(runners[cell]) if cell in runners else None,  # None: a CPU cell
        }
        storage.create(f"{prefix}files/{cell}/{_stamp()}.json", _encoded(part))
    for result in manifest.gpu:
        _create_gpu(storage, prefix, result)
    return _where(storage, prefix)


def record_images(storage: Storage, track: Track, version: str, images: Sequence[ReleasedImage]) -> str:
    """Add pushed images to a release's record (a newer push of a cell's kind counts over
    the older one)."""
    load_manifest(storage, track, version)  # the release is there
    prefix = record_prefix(track, version)
    for image in images:
        storage.create(f"{prefix}images/{image.cell}/{image.kind}/{_stamp()}.json", _encoded(vars(image)))
    return _where(storage, prefix)


def record_gpu(storage: Storage, track: Track, version: str, found: Sequence[GpuRecord]) -> str:
    """Add GPU stage results to a release's record, passed or not (a newer one of a cell on a
    runner counts over the older). Each must be of a runner the record names for its cell,
    and a passed one must have tested every file the record names for its cell: a stage that
    ran on another state of the channel proves nothing about this release."""
    manifest = load_manifest(storage, track, version)
    for result in found:
        _check_recordable(manifest, result)
    prefix = record_prefix(track, version)
    for result in found:
        _create_gpu(storage, prefix, result)
    return _where(storage, prefix)


def record_failure(storage: Storage, head: Manifest, failed: FailedBuild, log: bytes | None) -> str:
    """Record that a cell's build for the release ``head`` names failed, with its log's end
    (``log``) beside it; the release's head is made where this is its first object. A newer
    failure of the cell counts over the older, and the cell's files, once recorded, over both."""
    record(storage, replace(head, files=(), gpu=()))  # the head, or the refusal of another commit's version
    where = f"{record_prefix(head.track, head.version)}failed/{failed.cell}/{_stamp()}"
    kept = replace(failed, log=f"{where}.log" if log is not None else None)
    if log is not None:
        storage.create(kept.log or "", log)
    storage.create(f"{where}.json", _encoded(kept.as_dict()))
    return _where(storage, f"{where}.json")


def forget(storage: Storage, track: Track, version: str) -> None:
    """Every object of a release's record gone (its files are the caller's)."""
    prefix = record_prefix(track, version)
    for key in storage.keys_under(prefix):
        storage.delete(key)
    storage.delete(_legacy_key(prefix))


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


# What release.json holds; the rest of a record is in its other objects.
_HEAD = ("schema", "version", "track", "commit", "tag", "promoted_from")  # and gpu-runners-recorded


def _assembled(
    storage: Storage, head: Mapping[str, Any], legacy: Mapping[str, Any] | None, keys: Sequence[str], prefix: str
) -> Manifest:
    """A record from its head and its objects, and the whole record an older wheelmill wrote."""
    parts = [_json(storage, key) or {} for key in keys if key.startswith(f"{prefix}files/")]
    files: dict[tuple[str, str], ReleasedFile] = {}
    for part in [*([legacy] if legacy else []), *parts]:
        for data in part.get("files", []):
            released = ReleasedFile(**{**data, "rule": VersionRule(data["rule"])})
            files.setdefault((released.channel, released.filename), released)
    gpu = {(g.cell, g.runner): g for g in _legacy_gpu(legacy)}
    gpu |= {
        (g.cell, g.runner): g for g in (gpu_record_from(_json(storage, k) or {}) for k in _newest(keys, prefix, "gpu/"))
    }
    images = {(i["cell"], i["kind"]): ReleasedImage(**i) for i in (legacy or {}).get("images", [])}
    for key in _newest(keys, prefix, "images/"):
        image = ReleasedImage(**(_json(storage, key) or {}))
        images[image.cell, image.kind] = image
    failed = [FailedBuild(**(_json(storage, k) or {})) for k in _newest(keys, prefix, "failed/")]
    return Manifest(
        version=head["version"],
        track=Track(head["track"]),
        commit=head["commit"],
        tag=head["tag"],
        files=tuple(files.values()),
        promoted_from=head.get("promoted_from"),
        images=tuple(images.values()),
        gpu=tuple(gpu.values()),
        gpu_runners=_runners(head, legacy, parts),
        failed=tuple(failed),
    )


def _runners(
    head: Mapping[str, Any], legacy: Mapping[str, Any] | None, parts: Sequence[Mapping[str, Any]]
) -> dict[str, tuple[str, ...]] | None:
    """Each GPU cell's runners, from every part that says them, each part adding to what the
    parts before it named and none taking any away (a later part with ``gpu-runners: []``
    does not lift the gate); None where the release was recorded without them (by an older
    wheelmill): no gate lets such a record through."""
    recorded = head.get("gpu-runners-recorded", head.get("gpu-runners") is not None)
    if not recorded or (legacy is not None and legacy.get("gpu-runners") is None):
        return None
    runners = {cell: tuple(labels) for cell, labels in ((legacy or {}).get("gpu-runners") or {}).items()}
    for part in parts:
        if part.get("gpu-runners") is not None and part.get("files"):
            cell = part["files"][0]["cell"]
            named = runners.get(cell, ())
            runners[cell] = (*named, *(label for label in part["gpu-runners"] if label not in named))
    return runners


def _legacy_gpu(legacy: Mapping[str, Any] | None) -> list[GpuRecord]:
    """The GPU results of a whole record; a schema 1 one kept no runner or outcome: none counts."""
    if legacy is None or legacy.get("schema", 1) < 2:
        return []
    return [gpu_record_from(g) for g in legacy.get("gpu", [])]


def _newest(keys: Sequence[str], prefix: str, kind: str) -> list[str]:
    """Of the numbered objects under ``kind`` (``gpu/<cell>/<runner>/<number>-....json``), the
    newest of each thing (each cell and runner): the highest number, in key order."""
    newest: dict[str, str] = {}
    ours = (k for k in keys if k.startswith(prefix + kind) and k.endswith(".json"))  # a failure's .log is beside
    for key in sorted(ours, key=lambda k: (_sequence(k), k)):
        newest[key.rpartition("/")[0]] = key  # in the record's order: the last is the newest
    return sorted(newest.values())


def _create_gpu(storage: Storage, prefix: str, result: GpuRecord) -> None:
    """A GPU result, numbered one past the highest its cell and runner have: the record's own
    order, not a clock the writer reads, so a result written after another always counts over
    it (a far-future number written by hand does not pin a pass: the next result is past it)."""
    runner = result.runner or "-"  # no runner: a promoted release's "not covered" (a label starts alphanumeric)
    where = f"{prefix}gpu/{result.cell}/{runner}/"
    number = max((_sequence(key) + 1 for key in storage.keys_under(where)), default=time.time_ns())
    storage.create(f"{where}{number:020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json", _encoded(result.as_dict()))


def _sequence(key: str) -> int:
    """The number a record object's name begins with (its stamp, or its place); -1 for none."""
    digits = key.rpartition("/")[2].partition("-")[0]
    return int(digits) if digits.isdigit() else -1


def _legacy_key(prefix: str) -> str:
    """Where an older wheelmill wrote the release's whole record: ``releases/<track>/<version>.json``."""
    return f"{prefix.removesuffix('/')}.json"


def _where(storage: Storage, prefix: str) -> str:
    """A release's record as a person names it: ``<index root>/releases/<track>/<version>/``."""
    return f"{storage.location.rstrip('/')}/{prefix}"


def _stamp() -> str:
    """A name that sorts by when it was made, unique across processes and machines."""
    return f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _file_dict(released: ReleasedFile) -> dict[str, Any]:
    return {**vars(released), "rule": released.rule.value}


def _json(storage: Storage, key: str) -> dict[str, Any] | None:
    found = storage.get(key)
    if found is None:
        return None
    try:
        data = json.loads(found.data)
    except ValueError as exc:
        raise ReleaseError(
            f"{storage.location}: {key}: not a release record ({exc})", fix="restore it from the index's storage"
        ) from None
    if not isinstance(data, dict):
        raise ReleaseError(
            f"{storage.location}: {key}: not a release record", fix="restore it from the index's storage"
        )
    return data


def _encoded(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True
