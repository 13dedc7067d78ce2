"""A release's publish into the index: what a tag or a nightly built, and the retention of
the nightly and test tracks; promotion between tracks is ``wheelmill.releases.promotion``,
and the records they all write are ``wheelmill.releases.records``.

A release publishes the cells built for it (their report.json says for which release) into
the track's channels and records them, with the GPU runners the matrix of its commit names
for each GPU cell (a runner label per GPU kind). Each build job of a fleet publishes its own
cell: a cell of a newer torch lists its ABI group's group build, which another job
published (a ``GroupBuildLookup`` finds it), and records it as its own.
"""

from __future__ import annotations

import base64
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from wheelmill.errors import (
    CommandFailed,
    IndexConflict,
    IndexWriteError,
    IntegrityError,
    ReleaseError,
    SignatureError,
    redact,
)
from wheelmill.index.channels import Published, keyed_files
from wheelmill.index.objects import Staging
from wheelmill.index.pages import Project
from wheelmill.index.roots import Index, copy_file, publish, remove_files
from wheelmill.inputs.versions import Release, Track, VersionRule
from wheelmill.machine.process import HostRunner, StepLog, base_environment, wheelmill_command
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
from wheelmill.provenance.signing import TrustedKey, read_envelopes
from wheelmill.provenance.statement import Statement, beside, read_statement
from wheelmill.provenance.verification import refuse_unverified
from wheelmill.releases.records import (
    FailedBuild,
    Manifest,
    ReleasedFile,
    forget,
    manifests,
    record,
)
from wheelmill.settings import Settings


@dataclass(frozen=True, kw_only=True)
class BuiltWheel:
    cell: str
    channel: str
    recipe: str
    rule: VersionRule
    path: Path | None  # None: the group build of an ABI group, published by another job already
    sha256: str
    key: str | None = None  # its build key, where the report names one
    filename: str = ""  # where ``path`` is None
    listed_in: str = ""  # where ``path`` is None: the channel another job published it into
    from_group: bool = False  # its ABI group's one build, made for another cell of the group

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else self.filename


# Where an ABI group's group build is listed when this output root lacks it: (cell, project,
# build key) -> the channel of the track that lists it, its filename and sha256; or None. Each
# build job of a fleet publishes its own cell, and a cell of a newer torch finds the one build
# its group's oldest cell published.
GroupBuildLookup = Callable[[str, str, str], tuple[str, str, str] | None]
POLL_SECONDS = 15.0  # how often a waiting job reads the one page again


def collect_built(output: Path, release: Release, *, lookup: GroupBuildLookup | None = None) -> list[BuiltWheel]:
    """The wheels built for ``release`` under ``output`` (``<cell>/report.json`` and
    ``<cell>/dist/``): every such cell must have passed, and nothing built for another
    release may be mixed in. A stable recipe that a cell of a newer torch built only to test
    it (its report's ``unpublished``) is not its to publish: the cell gets the one build a
    cell of the group's oldest torch made (the same build key), which this release must have:
    under ``output``, or (``lookup``) in the index, where that cell's own job published it."""
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
    wheels += [_one_build(built, recipe, wheels, lookup) for built, recipe in borrowed]
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
    built: BuiltCell, recipe: RecipeRecord, wheels: Sequence[BuiltWheel], lookup: GroupBuildLookup | None
) -> BuiltWheel:
    """The one build of a stable recipe, made by a cell of its group's oldest torch with the
    same build key, for a cell that built it only to test it."""
    key = built.facts.get("build_keys", {}).get(recipe.name)
    found = next((w for w in wheels if w.recipe == recipe.name and key is not None and w.key == key), None)
    listed = None
    if found is None and lookup is not None and key is not None and recipe.wheel is not None:
        listed = lookup(built.cell, parse_wheel_filename(recipe.wheel.name)[0], key)
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
            from_group=True,
        )
    if found is None:
        raise ReleaseError(
            f"{built.cell}: {recipe.name} was built there only to be tested (its torch is newer than its ABI "
            f"group's oldest), and no cell of this release made its one build (build key {str(key)[:12]})",
            fix="build the cells of its ABI group's oldest torch for this release too (where each job "
            "publishes its own cell, `release publish --wait SECONDS` waits for that job's)",
        )
    return replace(found, cell=built.cell, channel=built.channel, from_group=True)


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


def refuse_unattested(wheels: Sequence[BuiltWheel], *, required: bool, trusted: Sequence[TrustedKey] = ()) -> None:
    """Before anything is published: a wheel whose provenance says it was built from a dirty
    tree is refused (a released version names one commit, and a dirty tree is not one), and
    so is one whose provenance cannot be read; where signatures are required, a wheel built
    here without a provenance beside it; and where ``trusted`` keys are given, one whose
    provenance does not verify against them."""
    for wheel in wheels:
        if wheel.path is None:  # another job published it, and refused it there if it had to
            continue
        kept = beside(wheel.path)
        if not kept.is_file():
            if required:
                raise SignatureError(
                    f"{wheel.name}: no signed provenance beside it, and WHEELMILL_SIGNATURES is required",
                    fix=f"build cell {wheel.cell} again with WHEELMILL_SIGNING_KEY set",
                )
            continue
        if trusted:
            refuse_unverified(wheel.path, kept.read_bytes(), trusted=trusted, required=required, channel=wheel.channel)
        statement = first_statement(kept)
        if statement is None:  # no statement to read its tree from: not one to release
            raise SignatureError(
                f"{wheel.name}: its provenance beside it cannot be read",
                fix=f"build cell {wheel.cell} again; a build writes its provenance whole",
            )
        if statement.dirty:
            raise ReleaseError(
                f"{wheel.name}: its provenance says cell {wheel.cell} was built from a dirty tree",
                fix="commit the changes, then build the cell again from the clean tree",
            )


def first_statement(provenance: Path) -> Statement | None:
    """The build's statement of a provenance file, unverified (what it claims, for a check
    that refuses; ``wheelmill verify`` is what proves it); None where it cannot be read."""
    try:
        envelopes = read_envelopes(provenance.read_text(encoding="utf-8"), source=str(provenance))
        return read_statement(base64.b64decode(envelopes[0]["payload"]), source=str(provenance)) if envelopes else None
    except (SignatureError, ValueError, KeyError, OSError):
        return None


LOG_END = 64 * 1024  # how much of a failed step's log its record keeps: its end, where the error is


def failed_build(layout: CellLayout, release: Release, *, run: str | None) -> tuple[FailedBuild, bytes | None]:
    """What the cell's report says of its failed build for ``release``: the step that stopped
    it, its error's first line, and the end of its log (redacted, as every log is written)."""
    try:
        built = load_report(layout.report, cell=layout.cell)
    except FileNotFoundError:  # the job stopped before its build wrote one (cancelled, out of time)
        stopped = "no report: the job stopped before the build wrote one"
        return FailedBuild(cell=layout.cell, step="(none)", recipe=None, error=stopped, exit_code=1, run=run), None
    except (OSError, ReportError) as exc:
        raise ReleaseError(
            f"{layout.report}: not a report of a built cell ({exc})", fix="build the cell again"
        ) from None
    if built.release is None or (built.release.version, built.release.commit) != (release.version, release.commit):
        raise ReleaseError(
            f"{layout.root}: not built for {release.version} ({release.commit[:12]})",
            fix=f"record the failure of a build for this release (`wheelmill release ... --cell {layout.cell}`)",
        )
    if built.status is Status.OK:
        raise ReleaseError(f"{layout.cell}: its build for {release.version} passed", fix="publish it instead")
    step = next((s for s in built.steps if s.get("status") in (Status.FAILED, Status.INTERRUPTED)), {})
    error = str(step.get("error") or f"the build {built.status}").strip().splitlines() or [""]
    failed = FailedBuild(
        cell=layout.cell,
        step=str(step.get("step", "(none)")),
        recipe=step.get("recipe"),
        error=redact(error[0])[:500],
        exit_code=int(step.get("exit_code") or built.exit_code or 1),
        run=run,
    )
    return failed, _log_end(step.get("log"), layout)


def _log_end(logged: object, layout: CellLayout) -> bytes | None:
    """The end of a step's log, found under the cell's ``logs/`` by name (reports travel between
    machines, as CI artifacts: the path it was written to is another machine's)."""
    if not isinstance(logged, str):
        return None
    path = layout.logs / Path(logged).name
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - LOG_END))
            data = log.read()
    except OSError:
        return None
    return data[data.find(b"\n") + 1 :] if len(data) == LOG_END else data


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
    A version recorded from another commit is refused before anything is published. All or
    nothing: the wheels are staged, recorded, then listed at one commit point; a refusal
    midway removes what it staged, and a run killed midway is committed by its retry."""
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
    with Staging(f"release/{release.track}/{release.version}/{'+'.join(sorted(cells))}") as staging:
        for wheel in wheels:
            if wheel.path is not None:
                on_file(publish(index.channel(wheel.channel), wheel.path, build_key=wheel.key, staging=staging))
            else:  # another job published it: listed in this cell's channel too, the same bytes
                on_file(_listed_too(index, wheel, staging))
            files.append(
                ReleasedFile(
                    channel=wheel.channel,
                    cell=wheel.cell,
                    recipe=wheel.recipe,
                    filename=wheel.name,
                    sha256=wheel.sha256,
                    rule=wheel.rule,
                    from_group=wheel.from_group,
                )
            )
        # Recorded before the commit point: no listed file of it is ever without its record.
        return record(records, replace(manifest, files=tuple(files)))


def _listed_too(index: Index, wheel: BuiltWheel, staging: Staging) -> Published:
    source, target = index.channel(wheel.listed_in), index.channel(wheel.channel)
    project = str(canonicalize_name(parse_wheel_filename(wheel.name)[0]))
    listed = next(
        (f for f in (source.project(project) or Project(name=project, files=())).files if f.filename == wheel.name),
        None,
    )
    if listed is None or listed.sha256 != wheel.sha256:
        raise ReleaseError(
            f"{wheel.listed_in}: {wheel.name} is no longer listed as the one build it was",
            fix="publish the cell of its ABI group's oldest torch again, then this one",
        )
    with tempfile.TemporaryDirectory(prefix="wheelmill-one-build-") as scratch:
        return copy_file(source, target, listed, Path(scratch), staging=staging)


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


def one_build_lookup(
    index: Index, builders_of: Callable[[str], Sequence[str]], wait: float, say: Callable[[str], None]
) -> GroupBuildLookup:
    """The group build of an ABI group, by its build key, as the channel of the group's
    oldest torch lists it (``builders_of``: a cell's channels of that torch, in the release's
    track): looked up once, or every 15 seconds for ``wait`` seconds (the job of that torch's
    cell runs beside this one, and publishes it when its build passed). Each look reads one
    page, the project's in that channel, whatever the size of the index: what a fleet's
    waiting jobs cost the bucket (docs/releases.md)."""

    def lookup(cell: str, project: str, key: str) -> tuple[str, str, str] | None:
        channels = builders_of(cell)
        deadline = time.monotonic() + wait
        while True:
            for name in channels:
                listed = keyed_files(index.channel(name).project(project))
                entry = next((f for f in listed if key in f.build_keys), None)
                if entry is not None:
                    say(f"{cell}: the one build {name}/{entry.filename}")
                    return name, entry.filename, entry.sha256
            if time.monotonic() >= deadline:
                return None
            say(f"{cell}: waiting for the one build of {project} (key {key[:12]}) in {', '.join(channels)}...")
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    return lookup


def publish_conda_packages(built: list[BuiltWheel], settings: Settings, say: Callable[[str], None]) -> None:
    """Each wheel this job published, as a conda package into its channel's conda channel
    beside the index (a directory, or the bucket's ``conda/<channel>``), by ``wheelmill
    conda package`` in a process of its own (py-rattler's threads may outlive a call)."""
    for wheel in (w for w in built if w.path is not None):
        target = Index.of(settings).conda_channel(wheel.channel)
        argv = wheelmill_command(
            "conda", "package", "--cell", wheel.cell, "--channel", target, str(wheel.path), recipes=settings.recipes
        )
        aws = {key: value for key, value in os.environ.items() if key.startswith("AWS_")}
        with StepLog(settings.output / "logs" / "release-conda.log") as log:
            try:
                done = HostRunner().run(argv, env=base_environment([], aws), log=log, keep_output=True)
            except CommandFailed as failed:
                what, fix = failed.child_error()
                raise (IndexConflict if failed.returncode == IndexConflict.exit_code else IndexWriteError)(
                    f"conda package {wheel.name}: {what}", fix=fix or f"read {log.path}"
                ) from None
        say(f"conda: {done.output.strip().splitlines()[-1]} in {target}")
