"""Promotion between tracks, without rebuilding: a release's files copied from one track's
channels to another's, re-verified.

Promotion (``test`` -> ``release``) takes the rc of the final tag's commit, asks its record
for a passed GPU stage of every file of each covered cell on every runner the record names
for it (``gpu_gate``; each GPU stage's report is recorded per cell and runner), re-verifies
every file against the index's pages and its stored bytes, and publishes it to the release
channels: files of third-party versions as they are, files carrying the repo's version with
the final version stamped into their metadata (the compiled payload is copied byte for
byte, and checked to be). Nothing is compiled. On an object store a file promoted as it is
keeps its bytes where they are: its entry is copied server-side, and no byte passes through
the promoting machine; only the repo's own wheels, re-stamped, are fetched and published
anew.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from wheelmill.checks.gpu import GpuOutcome
from wheelmill.errors import IntegrityError, ReleaseError, ReleasePending
from wheelmill.index import objects
from wheelmill.index.channels import Published
from wheelmill.index.objects import Staging
from wheelmill.index.pages import FileEntry
from wheelmill.index.roots import AnyChannel, Index, copy_file, file_of, provenance_of, publish
from wheelmill.index.storage import Storage
from wheelmill.inputs.versions import Track, VersionRule
from wheelmill.machine.net import sha256_of
from wheelmill.provenance.signing import SigningKey, TrustedKey, envelope_line, sign_envelope
from wheelmill.provenance.statement import promotion_statement, this_run
from wheelmill.provenance.verification import refuse_unverified
from wheelmill.releases.gpu_attestation import check_signed
from wheelmill.releases.records import GpuRecord, Manifest, ReleasedFile, find_manifest, manifests, record
from wheelmill.wheel.wheelfile import read_wheel, rewrite_metadata


def gpu_gate(origin: Manifest, *, trusted: Sequence[TrustedKey] = (), required: bool = False) -> tuple[GpuRecord, ...]:
    """What promotion carries of the GPU stage, from the release's own record: for each GPU
    cell and each runner the record names for it, a passed stage that passed every file the
    cell has in the record now; "not covered" where the record names no runner for a cell.
    Anything short of that stops promotion, naming each cell and runner. Where a GPU runner's
    key is trusted (``trusted``) or signatures are ``required``, each stage counted must be
    one its runner signed (``gpu_attestation.check_signed``): a record written by hand is not."""
    what = f"{origin.track.value} {origin.version}"
    if origin.gpu_runners is None:
        raise ReleaseError(
            f"promote: the record of {what} says no GPU runners (made before they were recorded)",
            fix=f"publish {origin.version} again with this wheelmill, run its GPU stage, then promote",
        )
    recorded = {(g.cell, g.runner): g for g in origin.gpu}
    carried, missing, failed = [], [], False
    for cell, runners in sorted(origin.gpu_runners.items()):
        files = {f.sha256: f.filename for f in origin.files if f.cell == cell}
        if not runners:
            carried.append(GpuRecord(cell=cell, status=GpuOutcome.NOT_COVERED, note="no GPU runner covers its variant"))
        for runner in runners:
            found = recorded.get((cell, runner))
            if found is not None and found.passed:
                check_signed(found, trusted=trusted, required=required)
            problem = _not_passed(found, files) if found else f"{cell} on runner {runner}: no GPU stage recorded"
            missing += [problem] if problem else []
            failed = failed or (problem is not None and found is not None)
            carried += [found] if found and not problem else []
    if missing:
        # A stage not recorded yet may be running now; one that failed, or missed a file, stays so.
        raise (ReleaseError if failed else ReleasePending)(
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
        raise ReleasePending(
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
    signer: Signer | None = None,
    trusted: Sequence[TrustedKey] = (),
    gpu_trusted: Sequence[TrustedKey] = (),
    required: bool = False,
) -> Manifest:
    """Copy a release's files from one track's channels to another's, re-verified; the
    repo's files get ``version`` stamped in when it differs from theirs. ``commit``: promote
    only what was released from it. Into the release track, promotion waits for the GPU stage
    the origin's own record asks for (``gpu_gate``): no caller can leave it out. A built file's
    provenance goes with it, with ``signer``'s statement of the promotion after the build's,
    once it verifies against ``trusted`` (wherever keys are given; under ``required`` a built
    file must have provenance, and keys to verify it): nothing is countersigned unchecked. The GPU
    stages counted must verify against ``gpu_trusted``, the GPU runners' keys, on the same terms."""
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
    gpu = gpu_gate(origin, trusted=gpu_trusted, required=required) if target is Track.RELEASE else origin.gpu
    # The repo's own projects, by their version in the origin; they get ``version`` instead.
    repo_files = [parse_wheel_filename(f.filename) for f in origin.files if f.rule is VersionRule.REPO]
    renames: dict[str, str] = (
        {} if version == origin.version else {canonicalize_name(name): str(v) for name, v, _build, _tags in repo_files}
    )
    files = []
    # All or nothing: the built files staged, the record written, then listed at one commit
    # point; a refusal midway removes what it staged, and a run killed midway is committed by
    # its retry (the same transaction). The mirrored closure is listed as it goes: shared by
    # every release of the channel, it names no release.
    with (
        Staging(f"promote/{target}/{version}") as staging,
        tempfile.TemporaryDirectory(prefix="wheelmill-promote-") as scratch,
    ):
        # Every file is checked before the first is published: a bad one promotes nothing.
        checked = [(entry, verified(index, entry)) for entry in origin.files]
        for entry, listed in checked:
            if listed.built:
                _attested(index.channel(entry.channel), listed, Path(scratch), trusted=trusted, required=required)
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
                signer=signer,
                staging=staging,
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
    signer: Signer | None = None,
    staging: Staging | None = None,
) -> tuple[Published, str]:
    """One checked file into the target track's channel, and the sha256 it is listed with
    there: re-stamped where it carries the repo's version, else the same bytes (on an object
    store, its entry copied server-side); its provenance with the promotion's statement."""
    built = provenance_of(source, entry) if entry.built else None

    def attested(filename: str, sha256: str) -> bytes | None:
        if built is None or signer is None:
            return built
        return built + signer(source=source.name, entry=entry, target=target.name, filename=filename, sha256=sha256)

    if not renamed:
        return copy_file(
            source, target, entry, scratch, provenance=attested(entry.filename, entry.sha256), staging=staging
        ), entry.sha256
    with file_of(source, entry, scratch) as wheel:
        assert wheel is not None  # verified
        stamped = restamp(wheel, scratch, version=version, renames=renames)
        sha256 = sha256_of(stamped)
        return publish(target, stamped, provenance=attested(stamped.name, sha256), staging=staging), sha256


class Signer(Protocol):
    """Signs the statement of one file's promotion: an envelope's line (``wheelmill.provenance``)."""

    def __call__(self, *, source: str, entry: FileEntry, target: str, filename: str, sha256: str) -> bytes: ...


def signer_of(key: SigningKey, *, ci_run: str | None) -> Signer:
    """A ``Signer`` with ``key``, for a promotion starting now (by ``ci_run``, or this machine)."""
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def sign(*, source: str, entry: FileEntry, target: str, filename: str, sha256: str) -> bytes:
        statement = promotion_statement(
            filename=filename,
            sha256=sha256,
            source_channel=source,
            source=entry.filename,
            source_sha256=entry.sha256,
            target_channel=target,
            run=this_run(ci_run=ci_run, started=started),
        )
        return envelope_line(sign_envelope(json.dumps(statement, sort_keys=True).encode(), key)).encode()

    return sign


def promote_mirrored(source: AnyChannel, target: AnyChannel, *, on_file: Callable[[Published], None]) -> None:
    """The mirrored runtime closure goes with the wheels: every mirrored file of the source
    channel into the target (its entry copied: the same stored bytes), so the target installs
    on its own too; projects built in the target are never mirrored there."""
    for project in source.projects():
        for entry in project.files:
            if not entry.built and entry.yanked is None:
                on_file(objects.promote_file(source, target, project.name, entry.filename))


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


def _attested(
    channel: AnyChannel, listed: FileEntry, scratch: Path, *, trusted: Sequence[TrustedKey], required: bool
) -> None:
    """A built file's provenance held to the trusted keys before its promotion is signed over it."""
    provenance = provenance_of(channel, listed)
    with file_of(channel, listed, scratch) as wheel:
        assert wheel is not None  # verified: stored as listed
        refuse_unverified(wheel, provenance, trusted=trusted, required=required, channel=channel.name)


def _stored(channel: AnyChannel, entry: ReleasedFile, listed: FileEntry) -> list[str]:
    """The file and its sidecar stored as listed; a file this machine holds is hashed too."""
    if entry.sha256 != listed.sha256:
        return ["sha256 differs between the release record and the index page"]
    found = objects.verify_file(channel, listed, hashes=channel.local_file(listed) is not None)
    return [f"the stored file: {found[0]}"] if found else []


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
