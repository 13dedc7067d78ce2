"""Releases in the index: publishing what a tag or a nightly built, promotion between
tracks without rebuilding, and the nightly track's retention; the records they write are
``wheelmill.index.records``.

A release publishes the cells built for it (their report.json says for which release) into
the track's channels and records them, with the GPU runners the matrix of its commit names
for each GPU cell (a runner label per GPU kind). Each GPU stage's report is recorded beside
them, per cell and runner. Promotion (``test`` -> ``release``) takes the rc of the final
tag's commit, asks its record for a passed GPU stage of every file of each covered cell on
every runner the record names for it (``gpu_gate``), re-verifies every file against the
index's pages and its own bytes, and publishes it to the release channels: files of
third-party versions as they are, files carrying the repo's version with the final version
stamped into their metadata (the compiled payload is copied byte for byte, and checked to
be). Nothing is compiled. On an object store a file promoted as it is keeps its bytes where
they are: its entry is copied server-side, and no byte passes through the promoting machine;
only the repo's own wheels, re-stamped, are fetched and published anew.
"""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from wheelmill.checks.gpu import GpuOutcome
from wheelmill.errors import IntegrityError, ReleaseError
from wheelmill.index import objects
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.pages import FileEntry, Project
from wheelmill.index.records import (
    GpuRecord,
    Manifest,
    ReleasedFile,
    find_manifest,
    forget,
    manifests,
    record,
)
from wheelmill.index.roots import AnyChannel, Index, copy_file, file_of, publish, remove_files
from wheelmill.index.storage import Storage
from wheelmill.index.store import Channel, Published
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


def gpu_gate(origin: Manifest) -> tuple[GpuRecord, ...]:
    """What promotion carries of the GPU stage, from the release's own record: for each GPU
    cell and each runner the record names for it, a passed stage that passed every file the
    cell has in the record now; "not covered" where the record names no runner for a cell.
    Anything short of that stops promotion, naming each cell and runner."""
    what = f"{origin.track.value} {origin.version}"
    if origin.gpu_runners is None:
        raise ReleaseError(
            f"promote: the record of {what} says no GPU runners (made before they were recorded)",
            fix=f"publish {origin.version} again with this wheelmill, run its GPU stage, then promote",
        )
    recorded = {(g.cell, g.runner): g for g in origin.gpu}
    carried, missing = [], []
    for cell, runners in sorted(origin.gpu_runners.items()):
        files = {f.sha256: f.filename for f in origin.files if f.cell == cell}
        if not runners:
            carried.append(GpuRecord(cell=cell, status=GpuOutcome.NOT_COVERED, note="no GPU runner covers its variant"))
        for runner in runners:
            found = recorded.get((cell, runner))
            problem = _not_passed(found, files) if found else f"{cell} on runner {runner}: no GPU stage recorded"
            missing += [problem] if problem else []
            carried += [found] if found and not problem else []
    if missing:
        raise ReleaseError(
            f"promote: {origin.version} has no passed GPU stage for {'; '.join(missing)}",
            fix="run the GPU stage of each cell on each of its GPU runners (`wheelmill test-gpu --track test "
            f"--runner LABEL`), record it (`wheelmill release record-gpu --track {origin.track.value} "
            f"{origin.version} REPORT...`), promote again",
        )
    return tuple(carried)


def _not_passed(found: GpuRecord, files: Mapping[str, str]) -> str | None:
    """Why a cell's recorded stage on a runner does not let it through, or None: it passed, and
    every file of the cell passed in it (a file published after it ran was never tested)."""
    if not found.passed:
        return found.describe()
    unproven = [
        f"{name} ({found.tested[sha].value if sha in found.tested else 'untested'})"
        for sha, name in sorted(files.items(), key=lambda item: item[1])
        if found.tested.get(sha) is not GpuOutcome.PASSED
    ]
    if unproven:
        return f"{found.cell} on runner {found.runner}: not every file passed: {', '.join(unproven)}"
    return None


@dataclass(frozen=True, kw_only=True)
class BuiltWheel:
    cell: str
    channel: str
    recipe: str
    rule: VersionRule
    path: Path | None  # None: the one build of a serving group, published by another job already
    sha256: str
    key: str | None = None  # its build key, where the report names one
    filename: str = ""  # where ``path`` is None
    listed_in: str = ""  # where ``path`` is None: the channel another job published it into

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else self.filename


# Where a serving group's one build is listed when this output root lacks it: (channel, build
# key) -> the channel of the track that lists it, its filename and sha256; or None. Each build
# job of a fleet publishes its own cell, and a cell of a newer torch finds the one build its
# group's oldest cell published.
Served = Callable[[str, str], tuple[str, str, str] | None]


def collect_built(output: Path, release: Release, *, served: Served | None = None) -> list[BuiltWheel]:
    """The wheels built for ``release`` under ``output`` (``<cell>/report.json`` and
    ``<cell>/dist/``): every such cell must have passed, and nothing built for another
    release may be mixed in. A stable recipe that a cell of a newer torch built only to test
    it (its report's ``unpublished``) is not its to publish: the cell gets the one build a
    cell of the group's oldest torch made (the same build key), which this release must have:
    under ``output``, or (``served``) in the index, where that cell's own job published it."""
    wheels: list[BuiltWheel] = []
    borrowed: list[tuple[BuiltCell, RecipeRecord]] = []
    for layout in built_cells(output):
        built = _release_cell(layout, release)
        if built is None:
            continue  # a plain build; not part of any release
        unpublished = built.facts.get("unpublished", {})
        wheels += [
            _built_wheel(layout, built, r, r.wheel)
            for r in built.recipes
            if r.wheel is not None and r.name not in unpublished
        ]
        borrowed += [(built, r) for r in built.recipes if r.name in unpublished]
    wheels += [_one_build(built, recipe, wheels, served) for built, recipe in borrowed]
    if not wheels:
        raise ReleaseError(
            f"{output}: no wheels built for {release.version}",
            fix="build the cells first: wheelmill release ... --cell CELL --no-publish",
        )
    return wheels


def _release_cell(layout: CellLayout, release: Release) -> BuiltCell | None:
    """The cell's report, where it was built for ``release``; None for a plain build."""
    try:
        built = load_report(layout.report, cell=layout.cell)
    except (OSError, ReportError) as exc:
        raise ReleaseError(
            f"{layout.report}: not a report of a built cell ({exc})", fix=f"remove {layout.root} or build it again"
        ) from None
    built_for = built.release
    if built_for is None:
        return None
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
    return built


def _one_build(
    built: BuiltCell, recipe: RecipeRecord, wheels: Sequence[BuiltWheel], served: Served | None
) -> BuiltWheel:
    """The one build of a stable recipe, made by a cell of its group's oldest torch with the
    same build key, for a cell that built it only to test it."""
    key = built.facts.get("build_keys", {}).get(recipe.name)
    found = next((w for w in wheels if w.recipe == recipe.name and key is not None and w.key == key), None)
    listed = served(built.channel, key) if found is None and served is not None and key is not None else None
    if listed is not None:
        listed_in, filename, sha256 = listed
        return BuiltWheel(
            cell=built.cell,
            channel=built.channel,
            recipe=recipe.name,
            rule=recipe.version_rule,
            path=None,
            filename=filename,
            listed_in=listed_in,
            sha256=sha256,
            key=key,
        )
    if found is None:
        raise ReleaseError(
            f"{built.cell}: {recipe.name} was built there only to be tested (its torch is newer than its serving "
            f"group's oldest), and no cell of this release made its one build (build key {str(key)[:12]})",
            fix="build the cells of its serving group's oldest torch for this release too (where each job "
            "publishes its own cell, `release publish --wait SECONDS` waits for that job's)",
        )
    return replace(found, cell=built.cell, channel=built.channel)


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
        key=built.facts.get("build_keys", {}).get(recipe.name),
    )


def publish_release(
    index: Index,
    release: Release,
    wheels: Sequence[BuiltWheel],
    *,
    gpu_runners: Mapping[str, tuple[str, ...]],
    on_file: Callable[[Published], None],
) -> str:
    """Publish the built wheels into their channels, then record the release, with the GPU
    runners of each of its GPU cells (``gpu_runners``: the matrix's, at the release's commit).
    A version recorded from another commit is refused before anything is published."""
    cells = {wheel.cell for wheel in wheels}
    manifest = Manifest(
        version=release.version,
        track=release.track,
        commit=release.commit,
        tag=release.tag,
        files=(),
        gpu_runners={cell: labels for cell, labels in gpu_runners.items() if cell in cells},
    )
    records = index.storage
    record(records, manifest)  # the release's head, or the refusal of another commit's version
    files = []
    for wheel in wheels:
        if wheel.path is not None:
            on_file(publish(index.channel(wheel.channel), wheel.path, build_key=wheel.key))
        else:  # another job published it: listed in this cell's channel too, the same bytes
            on_file(_listed_too(index, wheel))
        files.append(
            ReleasedFile(
                channel=wheel.channel,
                cell=wheel.cell,
                recipe=wheel.recipe,
                filename=wheel.name,
                sha256=wheel.sha256,
                rule=wheel.rule,
            )
        )
    return record(records, replace(manifest, files=tuple(files)))


def _listed_too(index: Index, wheel: BuiltWheel) -> Published:
    source, target = index.channel(wheel.listed_in), index.channel(wheel.channel)
    project = str(canonicalize_name(parse_wheel_filename(wheel.name)[0]))
    listed = next(
        (f for f in (source.project(project) or Project(name=project, files=())).files if f.filename == wheel.name),
        None,
    )
    if listed is None or listed.sha256 != wheel.sha256:
        raise ReleaseError(
            f"{wheel.listed_in}: {wheel.name} is no longer listed as the one build it was",
            fix="publish the cell of its serving group's oldest torch again, then this one",
        )
    with tempfile.TemporaryDirectory(prefix="wheelmill-served-") as scratch:
        return copy_file(source, target, listed, Path(scratch))


def source_release(records: Storage, source: Track, version: str, *, commit: str | None = None) -> Manifest:
    """The release to promote: ``version`` itself, or for a final version the newest of its
    release candidates; with ``commit``, only a release recorded from that commit (a final tag
    promotes the rc of its own commit, never a newer one made elsewhere)."""
    found = find_manifest(records, source, version)
    if found is not None:
        if commit is not None and found.commit != commit:
            raise ReleaseError(
                f"nothing to promote: {source} {version} was released from commit {found.commit[:12]}, "
                f"not {commit[:12]}",
                fix="promote from a checkout of the release's own commit",
            )
        return found
    try:
        final = Version(version)
    except InvalidVersion:
        raise ReleaseError(f"'{version}' is not a version", fix="give a version such as 2.4.0 or 2.4.0rc1") from None
    candidates = [
        m
        for m in manifests(records, source)
        if Version(m.version).pre and Version(m.version).base_version == final.base_version
    ]
    mine = [m for m in candidates if commit is None or m.commit == commit]
    if not mine:
        known = ", ".join(f"{m.version} ({m.commit[:12]})" for m in manifests(records, source)) or "none"
        at = f" from commit {commit[:12]}" if commit is not None else ""
        raise ReleaseError(
            f"nothing to promote: no {source} release of {version}{at} (there: {known})",
            fix=f"tag and publish a release candidate of this commit first (v{version}-rc1)",
        )
    return mine[0]


def promote(
    index: Index,
    source: Track,
    target: Track,
    version: str,
    *,
    commit: str | None = None,
    tag: str | None = None,
    on_file: Callable[[Published], None],
) -> Manifest:
    """Copy a release's files from one track's channels to another's, re-verified; the
    repo's files get ``version`` stamped in when it differs from theirs. ``commit``: promote
    only what was released from it. Into the release track, promotion waits for the GPU stage
    the origin's own record asks for (``gpu_gate``): no caller can leave it out."""
    if source == target:
        raise ReleaseError(
            f"promote: --from and --to are both {source}",
            fix="promote between two tracks, e.g. --from test --to release",
        )
    if target is Track.RELEASE and commit is None:
        raise ReleaseError(
            f"promote: {version} into the release track from no named commit",
            fix="promote from a checkout of the final tag's commit: its rc is the one promoted",
        )
    origin = source_release(index.storage, source, version, commit=commit)
    gpu = gpu_gate(origin) if target is Track.RELEASE else origin.gpu
    # The repo's own projects, by their version in the origin; they get ``version`` instead.
    repo_files = [parse_wheel_filename(f.filename) for f in origin.files if f.rule is VersionRule.REPO]
    renames: dict[str, str] = (
        {} if version == origin.version else {canonicalize_name(name): str(v) for name, v, _build, _tags in repo_files}
    )
    files = []
    with tempfile.TemporaryDirectory(prefix="wheelmill-promote-") as scratch:
        # Every file is checked before the first is published: a bad one promotes nothing.
        checked = [(entry, verified(index, entry)) for entry in origin.files]
        for entry, listed in checked:
            channel = index.channel(target.channel(entry.channel.rpartition("/")[2]))
            renamed = canonicalize_name(parse_wheel_filename(entry.filename)[0]) in renames
            done, sha256 = _promote_file(
                index.channel(entry.channel),
                channel,
                listed,
                Path(scratch),
                renamed=renamed,
                version=version,
                renames=renames,
            )
            on_file(done)
            files.append(replace(entry, channel=channel.name, filename=done.filename, sha256=sha256))
    for pair in sorted({(entry.channel, file.channel) for entry, file in zip(origin.files, files, strict=True)}):
        promote_mirrored(index.channel(pair[0]), index.channel(pair[1]), on_file=on_file)
    manifest = Manifest(
        version=version,
        track=target,
        commit=origin.commit,
        tag=tag,
        files=tuple(files),
        promoted_from=f"{source}/{origin.version}",
        gpu=gpu,
        gpu_runners=origin.gpu_runners,
    )
    record(index.storage, manifest)
    return manifest


def _promote_file(
    source: AnyChannel,
    target: AnyChannel,
    entry: FileEntry,
    scratch: Path,
    *,
    renamed: bool,
    version: str,
    renames: Mapping[str, str],
) -> tuple[Published, str]:
    """One checked file into the target track's channel, and the sha256 it is listed with
    there: re-stamped where it carries the repo's version, else the same bytes (on an object
    store, its entry copied server-side)."""
    if not renamed:
        return copy_file(source, target, entry, scratch), entry.sha256
    with file_of(source, entry, scratch) as wheel:
        assert wheel is not None  # verified
        stamped = restamp(wheel, scratch, version=version, renames=renames)
        return publish(target, stamped), sha256_of(stamped)


def promote_mirrored(source: AnyChannel, target: AnyChannel, *, on_file: Callable[[Published], None]) -> None:
    """The mirrored runtime closure goes with the wheels: every mirrored file of the source
    channel into the target (another name of the same stored bytes), so the target installs
    on its own too; projects built in the target are never mirrored there."""
    for project in source.projects():
        for entry in project.files:
            if isinstance(source, ObjectChannel) and isinstance(target, ObjectChannel):
                if not entry.built and entry.yanked is None:
                    on_file(objects.promote_file(source, target, project.name, entry.filename))
                continue
            assert isinstance(source, Channel)
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


def verified(index: Index, entry: ReleasedFile) -> FileEntry:
    """The listing of a release record's file, after checking it against the record, the
    channel's page and the stored bytes (a tree's file hashed; an object store's blob is named
    by its sha256, so its name is checked, and its sidecar hashed), and its metadata sidecar
    against the page."""
    channel = index.channel(entry.channel)
    project = channel.project(str(parse_wheel_filename(entry.filename)[0]))
    listed = next((f for f in project.files if f.filename == entry.filename), None) if project else None
    problems = [] if listed is not None else ["not in the channel"]
    if listed is not None:
        problems += _stored(channel, entry, listed)
    if problems:
        raise IntegrityError(
            f"{entry.channel}/{entry.filename}: {problems[0]}",
            fix="restore the channel from the index's storage; nothing was promoted from it",
        )
    assert listed is not None
    return listed


def _stored(channel: AnyChannel, entry: ReleasedFile, listed: FileEntry) -> list[str]:
    if isinstance(channel, ObjectChannel):
        found = objects.verify_file(channel, listed)
        if entry.sha256 != listed.sha256:
            return ["sha256 differs between the release record and the index page"]
        return [f"the stored file: {found[0]}"] if found else []
    path, sidecar = channel.files / entry.filename, channel.files / f"{entry.filename}.metadata"
    if not path.is_file():
        return ["not in the channel"]
    if not (entry.sha256 == listed.sha256 == sha256_of(path)):
        return ["sha256 differs between the release record, the index page and the file"]
    if not sidecar.is_file() or sha256_of(sidecar) != listed.metadata_sha256:
        return ["its .metadata sidecar is missing or differs from the page's hash"]
    return []


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


def prune(index: Index, track: Track, keep: int) -> list[str]:
    """Keep the track's ``keep`` newest releases; remove the files only older ones name."""
    if track is Track.RELEASE:
        raise ReleaseError("prune: the release track is never pruned", fix="yank a release instead (wheelmill yank)")
    if keep < 1:
        raise ReleaseError(f"prune: --keep {keep}", fix="keep at least 1 release")
    records = index.storage
    ordered = manifests(records, track)
    kept, dropped = ordered[:keep], ordered[keep:]
    needed = {(f.channel, f.filename) for m in kept for f in m.files}
    removed = []
    by_project: dict[tuple[str, str], set[str]] = {}
    for manifest in dropped:
        for f in manifest.files:
            if (f.channel, f.filename) not in needed:
                by_project.setdefault((f.channel, str(parse_wheel_filename(f.filename)[0])), set()).add(f.filename)
    for (channel, project), names in sorted(by_project.items()):
        removed += [f"{channel}/{name}" for name in remove_files(index.channel(channel), project, names)]
    for manifest in dropped:
        forget(records, track, manifest.version)
    return removed
