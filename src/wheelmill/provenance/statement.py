"""The provenance of a published file: an in-toto v1 Statement whose subject is the file
(its name and sha256) and whose predicate is SLSA Provenance v1, made from the build's record
(``wheelmill.provenance.record``) and its build key's inputs, so that a verifier can recompute
the key and hold the wheel's SBOM to the same record.

Three kinds of statement, by ``buildType``: a build's, which says what went in (the cell and
recipe as external parameters; the key's inputs and the record as internal ones; torch, the
toolkit's wheels, the source, the lock, the builder image and the repository's commit as
resolved dependencies, each by digest; whether the tree was dirty); a mirroring's, whose one
resolved dependency is the upstream file by the sha256 the cell's closure lock pinned and the
download was checked against (so a mirrored file is held to that pin, not to its page); and
a promotion's, whose one resolved dependency is the file it was promoted from (by sha256), so
a chain of statements leads from the file served back to the build or the mirroring that
made its bytes or their predecessor's.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import socket
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wheelmill import __version__
from wheelmill.errors import SignatureError
from wheelmill.provenance.record import BuildRecord, Locked

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# What kind of run made the file: the build of a recipe in a cell, or a promotion of a
# released file from one track to another. Documented in docs/provenance.md.
BUILD_TYPE = "urn:wheelmill:build:v1"
PROMOTION_TYPE = "urn:wheelmill:promotion:v1"
MIRROR_TYPE = "urn:wheelmill:mirror:v1"
ORIGINS = (BUILD_TYPE, MIRROR_TYPE)  # what a chain of statements starts with: the file's bytes made or taken
SUFFIX = ".intoto.jsonl"  # the envelopes of a file, one per line, beside it: <file>.intoto.jsonl


@dataclass(frozen=True, kw_only=True)
class Run:
    """Who ran it, and when: the builder's id (a CI run's URL, or this machine's name), an id
    for the run, and its start and end (RFC 3339, UTC)."""

    builder: str
    invocation: str
    started: str
    finished: str


@dataclass(frozen=True, kw_only=True)
class Repository:
    """The repository's state at the build: HEAD's commit, and whether the tree was dirty."""

    commit: str | None  # None: not a git clone
    dirty: bool


@dataclass(frozen=True, kw_only=True)
class Statement:
    """A statement read back: what a verifier holds a file to."""

    subject: str  # the file's name
    sha256: str
    build_type: str
    predicate: Mapping[str, Any]

    @property
    def is_build(self) -> bool:
        return self.build_type == BUILD_TYPE

    @property
    def is_mirror(self) -> bool:
        return self.build_type == MIRROR_TYPE

    @property
    def internal(self) -> Mapping[str, Any]:
        return dict(self.predicate["buildDefinition"].get("internalParameters", {}))

    @property
    def external(self) -> Mapping[str, Any]:
        return dict(self.predicate["buildDefinition"].get("externalParameters", {}))

    def record(self) -> BuildRecord:
        """The build's record (a build's statement only); SignatureError where it is not one."""
        try:
            return BuildRecord.from_dict(self.internal["record"])
        except (KeyError, TypeError) as exc:
            raise SignatureError(
                f"{self.subject}: its build statement holds no readable build record ({exc})",
                fix="publish the file again from a build of this wheelmill",
            ) from None

    @property
    def key_inputs(self) -> Mapping[str, Any]:
        return dict(self.internal.get("buildKey", {}).get("inputs", {}))

    @property
    def key(self) -> str | None:
        digest = self.internal.get("buildKey", {}).get("digest")
        return None if digest is None else str(digest)

    def placed_in(self) -> tuple[str, ...] | None:
        """The channels this statement puts its file in: a promotion's target, or the channels
        a build published to (a group build goes to each of its group's); None
        for a build's statement from before builds named them, and for a mirroring's (an
        upstream file is the same file in every channel)."""
        if self.is_mirror:
            return None
        if self.build_type == PROMOTION_TYPE:
            return (str(self.external.get("to")),)
        channels = self.external.get("channels")
        return None if channels is None else tuple(str(c) for c in channels)

    @property
    def dirty(self) -> bool:
        return bool(self.external.get("repository", {}).get("dirty", False))

    def depends_on(self) -> list[tuple[str, str]]:
        """(uri, sha256) of each resolved dependency that names one."""
        found = []
        for dependency in self.predicate["buildDefinition"].get("resolvedDependencies", ()):
            sha256 = dependency.get("digest", {}).get("sha256")
            if sha256:
                found.append((str(dependency.get("uri") or dependency.get("name")), str(sha256)))
        return found


def beside(file: Path) -> Path:
    """Where a file's provenance is kept: ``<file>.intoto.jsonl``, beside it."""
    return file.with_name(file.name + SUFFIX)


def read_beside(file: Path) -> bytes | None:
    """The provenance kept beside ``file``; None where it has none."""
    path = beside(file)
    return path.read_bytes() if path.is_file() else None


def this_run(*, ci_run: str | None, started: str) -> Run:
    """The run now ending: a CI run by its URL, else this machine by its name."""
    finished = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    builder = ci_run or f"urn:wheelmill:host:{socket.gethostname()}"
    return Run(builder=builder, invocation=str(uuid.uuid4()), started=started, finished=finished)


def key_digest(inputs: Mapping[str, Any]) -> str:
    """The build key of its inputs: the hash ``wheelmill.planning.buildkey.BuildKey`` takes."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def build_statement(
    *,
    filename: str,
    sha256: str,
    record: BuildRecord,
    key_inputs: Mapping[str, Any],
    repository: Repository,
    run: Run,
    channels: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The statement of a file a build made, for ``channels``, the channels it publishes to
    (None: not said, as a statement from before builds said it)."""
    where = {} if channels is None else {"channels": list(channels)}
    definition = {
        "buildType": BUILD_TYPE,
        "externalParameters": {
            "cell": record.cell,
            "recipe": record.recipe,
            "repository": {"commit": repository.commit, "dirty": repository.dirty},
            **where,
        },
        "internalParameters": {
            "buildKey": {"digest": record.build_key, "inputs": dict(key_inputs)},
            "record": record.as_dict(),
        },
        "resolvedDependencies": _resolved(record, repository),
    }
    return _statement(filename, sha256, definition, run)


def promotion_statement(
    *, filename: str, sha256: str, source_channel: str, source: str, source_sha256: str, target_channel: str, run: Run
) -> dict[str, Any]:
    """The statement a promotion adds: this file is ``source`` of ``source_channel`` (the
    same bytes, or re-stamped with the release's version)."""
    definition = {
        "buildType": PROMOTION_TYPE,
        "externalParameters": {"from": source_channel, "to": target_channel},
        "resolvedDependencies": [
            {
                "uri": f"{source_channel}/{urllib.parse.quote(source)}",
                "name": source,
                "digest": {"sha256": source_sha256},
            }
        ],
    }
    return _statement(filename, sha256, definition, run)


def mirror_statement(*, filename: str, sha256: str, upstream: str, channel: str, run: Run) -> dict[str, Any]:
    """The statement of a file mirrored into ``channel``: it is ``upstream``'s file, whose
    sha256 the closure lock pinned and the download was checked against."""
    definition = {
        "buildType": MIRROR_TYPE,
        "externalParameters": {"from": upstream, "to": channel},
        "resolvedDependencies": [{"uri": upstream, "name": filename, "digest": {"sha256": sha256}}],
    }
    return _statement(filename, sha256, definition, run)


def _statement(filename: str, sha256: str, definition: Mapping[str, Any], run: Run) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": filename, "digest": {"sha256": sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": dict(definition),
            "runDetails": {
                "builder": {"id": run.builder, "version": {"wheelmill": __version__}},
                "metadata": {"invocationId": run.invocation, "startedOn": run.started, "finishedOn": run.finished},
            },
        },
    }


def _resolved(record: BuildRecord, repository: Repository) -> list[dict[str, Any]]:
    """What the build used, each by digest where one names its bytes."""
    found = [_package(p) for p in (record.torch, *record.toolkit_packages) if p is not None]
    source = record.source
    if source.kind == "git" and source.url and source.commit:
        found.append({"uri": f"git+{source.url}@{source.commit}", "digest": {"gitCommit": source.commit}})
    elif source.sha256:
        uri = source.url or f"path:{record.recipe}"
        found.append({"uri": uri, "name": f"{record.recipe} source", "digest": {"sha256": source.sha256}})
    found += [{"name": f"patch {n}", "digest": {"sha256": d}} for n, d in enumerate(source.patches, 1)]
    found.append({"name": "build env lock", "digest": {"sha256": record.lock_sha256}})
    builder = record.builder
    if builder.image_id:
        found.append({"uri": f"oci:{builder.tag}", "digest": {"sha256": builder.image_id.removeprefix("sha256:")}})
    if repository.commit:
        found.append({"name": "wheelmill repository", "digest": {"gitCommit": repository.commit}})
    return found


def _package(locked: Locked) -> dict[str, Any]:
    """A locked package: by its one digest where the lock allows one file; where it allows
    several (one per platform), each is named, and none is the digest."""
    found: dict[str, Any] = {"uri": f"pkg:pypi/{locked.name}@{urllib.parse.quote(locked.version, safe='')}"}
    if len(locked.sha256) == 1:
        found["digest"] = {"sha256": locked.sha256[0]}
    else:
        found["annotations"] = {"sha256": list(locked.sha256)}
    return found


def read_statement(payload: bytes, *, source: str) -> Statement:
    """A statement from an envelope's payload; SignatureError where it is not one of ours."""
    try:
        data = json.loads(payload)
        subject = data["subject"][0]
        statement = Statement(
            subject=str(subject["name"]),
            sha256=str(subject["digest"]["sha256"]),
            build_type=str(data["predicate"]["buildDefinition"]["buildType"]),
            predicate=data["predicate"],
        )
        kinds = (data["_type"], data["predicateType"])
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
        raise SignatureError(
            f"{source}: its signed payload is not an in-toto v1 SLSA provenance statement ({exc})",
            fix="publish the file again: its provenance is not one wheelmill wrote",
        ) from None
    if kinds != (STATEMENT_TYPE, PREDICATE_TYPE):
        raise SignatureError(
            f"{source}: a statement of type {kinds[0]} with a {kinds[1]} predicate, not in-toto v1 SLSA provenance",
            fix="publish the file again: its provenance is not one wheelmill wrote",
        )
    return statement


def chain_problems(
    statements: Sequence[Statement], filename: str, sha256: str, *, origin: str = BUILD_TYPE
) -> list[str]:
    """What is wrong with a file's statements as a chain: the last names the file; each
    promotion names the one before it; the first is a build's (``origin``: a mirroring's
    for a mirrored file)."""
    if not statements:
        return [f"{filename}: no statement"]
    problems = []
    last = statements[-1]
    if (last.subject, last.sha256) != (filename, sha256):
        problems.append(
            f"{filename}: its provenance is for {last.subject} (sha256 {last.sha256[:16]}...), "
            f"not this file (sha256 {sha256[:16]}...)"
        )
    if statements[0].build_type != origin:
        said = "a mirroring's" if origin == MIRROR_TYPE else "a build's"
        problems.append(f"{filename}: its first statement is a {statements[0].build_type}, not {said}")
    for before, after in itertools.pairwise(statements):
        if after.build_type in ORIGINS or (before.subject, before.sha256) not in _promoted_from(after):
            problems.append(
                f"{filename}: the statement for {after.subject} does not follow from the one for {before.subject}"
            )
    return problems


def _promoted_from(statement: Statement) -> set[tuple[str, str]]:
    return {
        (str(d.get("name")), str(d.get("digest", {}).get("sha256")))
        for d in statement.predicate["buildDefinition"].get("resolvedDependencies", ())
    }
