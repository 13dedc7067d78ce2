"""Releases in the index: what a tag or a nightly published, promotion between tracks
without rebuilding, and the nightly track's retention.

    <index root>/releases/<track>/<version>.json   one record per release: every file it
                                                   put in a channel, with its sha256

A release publishes the cells built for it (their report.json says for which release) into
the track's channels and records them. Promotion (``test`` -> ``release``) reads the rc's
record, re-verifies every file against the index's pages and its own bytes, and publishes
it to the release channels: files of third-party versions as they are, files carrying the
repo's version with the final version stamped into their metadata (the compiled payload is
copied byte for byte, and checked to be). Nothing is compiled.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from wheelmill.errors import IndexWriteError, IntegrityError, ReleaseError, UsageError
from wheelmill.files import file_lock, write_atomic
from wheelmill.index.store import RECORDS_DIR, Channel, Published, publish, remove_files
from wheelmill.inputs.versions import Release, Track, VersionRule
from wheelmill.machine.net import sha256_of
from wheelmill.output.layout import CellLayout, built_cells
from wheelmill.output.report import (
    BuiltCell,
    RecipeRecord,
    ReportError,
    Status,
    WheelRecord,
    found_beside,
    load_report,
)
from wheelmill.wheel.wheelfile import read_wheel, rewrite_metadata

MANIFEST_SCHEMA = 1


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
    """A cell's GPU stage, as a release records it: its status, the GPUs it ran on and the
    files it tested (by sha256); or that no GPU runner covers the cell."""

    cell: str
    status: str  # the stage's: passed | skipped | not-run | failed | mismatch | no-gpu; or not-covered
    gpus: tuple[str, ...] = ()
    torch: str | None = None
    tested: tuple[str, ...] = ()  # the sha256 of each file it tested
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def describe(self) -> str:
        where = f" on {', '.join(self.gpus)}" if self.gpus else ""
        return f"{self.cell}: {self.status}{where}" + (f" ({self.note})" if self.note else "")


PASSED = "passed"
NOT_COVERED = "not-covered"


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
            "gpu": [{**vars(g), "gpus": list(g.gpus), "tested": list(g.tested)} for g in self.gpu],
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
        gpu = tuple(
            GpuRecord(**{**g, "gpus": tuple(g["gpus"]), "tested": tuple(g["tested"])}) for g in data.get("gpu", [])
        )
        return Manifest(
            version=data["version"],
            track=Track(data["track"]),
            commit=data["commit"],
            tag=data["tag"],
            files=files,
            promoted_from=data.get("promoted_from"),
            images=images,
            gpu=gpu,
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReleaseError(f"{path}: not a release record ({exc})", fix="restore it from the index's storage") from None


def manifests(root: Path, track: Track) -> list[Manifest]:
    """The track's releases, newest version first."""
    found = [load_manifest(p) for p in sorted((root / RECORDS_DIR / track.value).glob("*.json"))]
    return sorted(found, key=lambda m: Version(m.version), reverse=True)


@contextmanager
def _records_lock(root: Path, track: Track) -> Iterator[Path]:
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
    with _records_lock(root, manifest.track) as directory:
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
            )
        write_atomic(directory / path.name, (json.dumps(manifest.as_dict(), indent=2) + "\n").encode())
    return path


def record_images(root: Path, track: Track, version: str, images: Sequence[ReleasedImage]) -> Path:
    """Add pushed images to a release's record (a newer push of a cell's kind replaces the
    older one)."""
    path = manifest_path(root, track, version)
    with _records_lock(root, track) as directory:
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
    """Add GPU stage results to a release's record (a newer one of a cell replaces the older).
    A passed one must have tested every file the record names for its cell: a stage that ran
    on another state of the channel proves nothing about this release."""
    path = manifest_path(root, track, version)
    with _records_lock(root, track) as directory:
        if not path.is_file():
            raise ReleaseError(f"{path}: no record of {track.value} {version}", fix="publish the release first")
        old = load_manifest(path)
        for result in found:
            named = {f.sha256 for f in old.files if f.cell == result.cell}
            if not named:
                raise ReleaseError(
                    f"{track.value} {version} has no file of {result.cell}", fix="record reports of the release's cells"
                )
            if result.passed and not named <= set(result.tested):
                raise ReleaseError(
                    f"{result.cell}: its GPU stage tested other files than {track.value} {version} names "
                    f"({len(named - set(result.tested))} of its {len(named)} untested)",
                    fix=f"run `wheelmill test-gpu --cell {result.cell} --track {track.value}` on the release's channel",
                )
        kept = tuple(g for g in old.gpu if g.cell not in {r.cell for r in found})
        write_atomic(
            directory / path.name,
            (json.dumps(replace(old, gpu=kept + tuple(found)).as_dict(), indent=2) + "\n").encode(),
        )
    return path


def gpu_gate(origin: Manifest, runners: Mapping[str, str | None]) -> tuple[GpuRecord, ...]:
    """What promotion carries of the GPU stage: each GPU cell's passed record, or "not
    covered" where no GPU runner covers its variant (``runners``: each GPU cell of the
    release, and its runner label). A covered cell without a passed stage stops promotion."""
    recorded = {g.cell: g for g in origin.gpu}
    missing = [
        recorded[cell].describe() if cell in recorded else f"{cell}: no GPU stage recorded"
        for cell, runner in sorted(runners.items())
        if runner is not None and not (cell in recorded and recorded[cell].passed)
    ]
    if missing:
        raise ReleaseError(
            f"promote: {origin.version} has no passed GPU stage for {'; '.join(missing)}",
            fix="run the GPU stage of each cell on its GPU runner (`wheelmill test-gpu --track test`), record it "
            f"(`wheelmill release record-gpu --track {origin.track.value} {origin.version} REPORT...`), promote again",
        )
    return tuple(
        recorded[cell]
        if runner is not None
        else GpuRecord(cell=cell, status=NOT_COVERED, note="no GPU runner covers its variant")
        for cell, runner in sorted(runners.items())
    )


@dataclass(frozen=True, kw_only=True)
class BuiltWheel:
    cell: str
    channel: str
    recipe: str
    rule: VersionRule
    path: Path
    sha256: str


def collect_built(output: Path, release: Release) -> list[BuiltWheel]:
    """The wheels built for ``release`` under ``output`` (``<cell>/report.json`` and
    ``<cell>/dist/``): every such cell must have passed, and nothing built for another
    release may be mixed in."""
    wheels: list[BuiltWheel] = []
    for layout in built_cells(output):
        try:
            built = load_report(layout.report, cell=layout.cell)
        except (OSError, ReportError) as exc:
            raise ReleaseError(
                f"{layout.report}: not a report of a built cell ({exc})", fix=f"remove {layout.root} or build it again"
            ) from None
        built_for = built.release
        if built_for is None:
            continue  # a plain build; not part of any release
        if (built_for.version, built_for.track, built_for.commit) != (release.version, release.track, release.commit):
            raise ReleaseError(
                f"{layout.root}: built for {built_for.version} ({built_for.commit[:12]}), "
                f"not {release.version} ({release.commit[:12]})",
                fix=f"remove {layout.root} or rebuild it for this release",
            )
        if built.status is not Status.OK:
            raise ReleaseError(
                f"{layout.root}: the cell's build {built.status}; a release publishes complete cells only",
                fix="fix and rebuild it",
            )
        wheels += [_built_wheel(layout, built, r, r.wheel) for r in built.recipes if r.wheel is not None]
    if not wheels:
        raise ReleaseError(
            f"{output}: no wheels built for {release.version}",
            fix="build the cells first: wheelmill release ... --cell CELL --no-publish",
        )
    return wheels


def _built_wheel(layout: CellLayout, built: BuiltCell, recipe: RecipeRecord, wheel: WheelRecord) -> BuiltWheel:
    path = found_beside(layout, wheel)
    if path is None:
        missing = layout.dist / wheel.name
        raise IntegrityError(
            f"{missing}: missing, or not the wheel its report.json describes (sha256)",
            fix="rebuild the cell; never edit dist/ by hand",
        )
    return BuiltWheel(
        cell=built.cell,
        channel=built.channel,
        recipe=recipe.name,
        rule=recipe.version_rule,
        path=path,
        sha256=wheel.sha256,
    )


def publish_release(
    root: Path, release: Release, wheels: Sequence[BuiltWheel], *, on_file: Callable[[Published], None]
) -> Path:
    """Publish the built wheels into their channels, then record the release."""
    files = []
    for wheel in wheels:
        done = publish(Channel(root, wheel.channel), wheel.path)
        on_file(done)
        files.append(
            ReleasedFile(
                channel=wheel.channel,
                cell=wheel.cell,
                recipe=wheel.recipe,
                filename=wheel.path.name,
                sha256=wheel.sha256,
                rule=wheel.rule,
            )
        )
    return record(
        root,
        Manifest(
            version=release.version, track=release.track, commit=release.commit, tag=release.tag, files=tuple(files)
        ),
    )


def source_release(root: Path, source: Track, version: str) -> Manifest:
    """The release to promote: ``version`` itself, or for a final version the newest of its
    release candidates."""
    exact = manifest_path(root, source, version)
    if exact.is_file():
        return load_manifest(exact)
    try:
        final = Version(version)
    except InvalidVersion:
        raise ReleaseError(f"'{version}' is not a version", fix="give a version such as 2.4.0 or 2.4.0rc1") from None
    candidates = [
        m
        for m in manifests(root, source)
        if Version(m.version).pre and Version(m.version).base_version == final.base_version
    ]
    if not candidates:
        known = ", ".join(m.version for m in manifests(root, source)) or "none"
        raise ReleaseError(
            f"nothing to promote: no {source} release of {version} (there: {known})",
            fix=f"tag and publish a release candidate first (v{version}-rc1)",
        )
    return candidates[0]


def promote(
    root: Path,
    source: Track,
    target: Track,
    version: str,
    *,
    tag: str | None = None,
    on_file: Callable[[Published], None],
    gpu_runners: Mapping[str, str | None] | None = None,
) -> Manifest:
    """Copy a release's files from one track's channels to another's, re-verified; the
    repo's files get ``version`` stamped in when it differs from theirs. ``gpu_runners``
    (each GPU cell, and the runner that covers it): promotion waits for their GPU stage."""
    if source == target:
        raise ReleaseError(
            f"promote: --from and --to are both {source}",
            fix="promote between two tracks, e.g. --from test --to release",
        )
    origin = source_release(root, source, version)
    gpu = (
        gpu_gate(origin, {c: r for c, r in gpu_runners.items() if any(f.cell == c for f in origin.files)})
        if gpu_runners
        else origin.gpu
    )
    # The repo's own projects, by their version in the origin; they get ``version`` instead.
    repo_files = [parse_wheel_filename(f.filename) for f in origin.files if f.rule is VersionRule.REPO]
    renames: dict[str, str] = (
        {} if version == origin.version else {canonicalize_name(name): str(v) for name, v, _build, _tags in repo_files}
    )
    # Every file is checked before the first is published: a bad one promotes nothing.
    checked = [(entry, verified(root, entry)) for entry in origin.files]
    files = []
    with tempfile.TemporaryDirectory(prefix="wheelmill-promote-") as scratch:
        for entry, wheel in checked:
            channel = Channel(root, target.channel(entry.channel.rpartition("/")[2]))
            if canonicalize_name(parse_wheel_filename(entry.filename)[0]) in renames:
                wheel = restamp(wheel, Path(scratch), version=version, renames=renames)  # noqa: PLW2901 - the file to publish
            done = publish(channel, wheel)
            on_file(done)
            files.append(
                replace(entry, channel=channel.name, filename=wheel.name, sha256=sha256_of(channel.files / wheel.name))
            )
    for pair in sorted({(entry.channel, file.channel) for entry, file in zip(origin.files, files, strict=True)}):
        promote_mirrored(Channel(root, pair[0]), Channel(root, pair[1]), on_file=on_file)
    manifest = Manifest(
        version=version,
        track=target,
        commit=origin.commit,
        tag=tag,
        files=tuple(files),
        promoted_from=f"{source}/{origin.version}",
        gpu=gpu,
    )
    record(root, manifest)
    return manifest


def promote_mirrored(source: Channel, target: Channel, *, on_file: Callable[[Published], None]) -> None:
    """The mirrored runtime closure goes with the wheels: every mirrored file of the source
    channel into the target (another name of the same stored bytes), so the target installs
    on its own too; projects built in the target are never mirrored there."""
    for project in source.projects():
        for entry in project.files:
            if not entry.built and entry.yanked is None:
                on_file(
                    publish(
                        target,
                        source.files / entry.filename,
                        upload_time=entry.upload_time,
                        mirrored_from=entry.mirrored_from,
                        sha256=entry.sha256,
                    )
                )


def verified(root: Path, entry: ReleasedFile) -> Path:
    """The file of a release record, after checking it against the record, the channel's
    page and its own bytes, and its metadata sidecar against the page."""
    channel = Channel(root, entry.channel)
    path = channel.files / entry.filename
    project = channel.project(str(parse_wheel_filename(entry.filename)[0]))
    listed = next((f for f in project.files if f.filename == entry.filename), None) if project else None
    sidecar = channel.files / f"{entry.filename}.metadata"
    problems = []
    if listed is None or not path.is_file():
        problems.append("not in the channel")
    elif not (entry.sha256 == listed.sha256 == sha256_of(path)):
        problems.append("sha256 differs between the release record, the index page and the file")
    elif not sidecar.is_file() or sha256_of(sidecar) != listed.metadata_sha256:
        problems.append("its .metadata sidecar is missing or differs from the page's hash")
    if problems:
        raise IntegrityError(
            f"{entry.channel}/{entry.filename}: {problems[0]}",
            fix="restore the channel from the index's storage; nothing was promoted from it",
        )
    return path


def restamp(wheel: Path, scratch: Path, *, version: str, renames: Mapping[str, str]) -> Path:
    """``wheel`` with ``version`` (and its local label) in its metadata, and its exact pins on
    re-versioned siblings following them; every other member byte for byte the same."""
    info = read_wheel(wheel)
    local = f"+{info.version.local}" if info.version.local else ""
    pins = {}
    for line in info.requires_dist:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        name = canonicalize_name(requirement.name)
        if name in renames and requirement.marker is None:
            sibling_local = Version(renames[name]).local
            pins[requirement.name] = f"{version}+{sibling_local}" if sibling_local else version
    out = rewrite_metadata(wheel, scratch, version=f"{version}{local}", pins=pins)
    if not same_payload(wheel, out):
        raise IntegrityError(
            f"{wheel.name}: re-stamping changed more than its metadata", fix="report this; nothing was promoted"
        )
    return out


def same_payload(a: Path, b: Path) -> bool:
    """Every member outside the .dist-info directory is the same (name, size, CRC-32)."""

    def payload(path: Path) -> set[tuple[str, int, int]]:
        with zipfile.ZipFile(path) as zf:
            return {
                (i.filename, i.file_size, i.CRC)
                for i in zf.infolist()
                if not i.filename.split("/", 1)[0].endswith(".dist-info")
            }

    return payload(a) == payload(b)


def prune(root: Path, track: Track, keep: int) -> list[str]:
    """Keep the track's ``keep`` newest releases; remove the files only older ones name."""
    if track is Track.RELEASE:
        raise ReleaseError("prune: the release track is never pruned", fix="yank a release instead (wheelmill yank)")
    if keep < 1:
        raise ReleaseError(f"prune: --keep {keep}", fix="keep at least 1 release")
    ordered = manifests(root, track)
    kept, dropped = ordered[:keep], ordered[keep:]
    needed = {(f.channel, f.filename) for m in kept for f in m.files}
    removed = []
    by_project: dict[tuple[str, str], set[str]] = {}
    for manifest in dropped:
        for f in manifest.files:
            if (f.channel, f.filename) not in needed:
                by_project.setdefault((f.channel, str(parse_wheel_filename(f.filename)[0])), set()).add(f.filename)
    for (channel, project), names in sorted(by_project.items()):
        removed += [f"{channel}/{name}" for name in remove_files(Channel(root, channel), project, names)]
    with _records_lock(root, track):
        for manifest in dropped:
            manifest_path(root, track, manifest.version).unlink(missing_ok=True)
    return removed
