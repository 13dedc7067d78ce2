"""The files of a channel held to their provenance (``wheelmill.provenance.verification``):
a channel of this machine's index (a tree or a bucket) or of an index served over HTTP,
read through its pages as an installer reads them. Each file built here is fetched, hashed
and verified; a mirrored file, built upstream, is checked where asked against the statement
its mirroring signed (the sha256 the closure lock pinned), not against its page alone.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from wheelmill.errors import FetchError, IntegrityError
from wheelmill.index.http_channel import HttpChannel
from wheelmill.index.pages import FileEntry, Project
from wheelmill.index.roots import AnyChannel, file_of, provenance_of
from wheelmill.machine.net import fetch_bytes, fetch_unchecked, split_credentials
from wheelmill.provenance.signing import TrustedKey
from wheelmill.provenance.verification import Claims, Failure, Verdict, verify_file, verify_mirrored
from wheelmill.retry import TransientError

Fetch = Callable[[Project, FileEntry, Path], AbstractContextManager[Path | None]]
Provenance = Callable[[Project, FileEntry], bytes | None]


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where a channel's files and their provenance are read from."""

    name: str  # for messages: the channel's name or address
    channel: str  # the channel's name in its index (test/cu130): where its files' provenance must put them
    projects: Callable[[], Iterator[Project]]
    project: Callable[[str], Project | None]  # one project's page, by its name
    fetch: Fetch
    provenance: Provenance


def local_source(channel: AnyChannel) -> Source:
    """A channel of this machine's index: its own files."""
    return Source(
        name=channel.name,
        channel=channel.name,
        projects=channel.projects,
        project=channel.project,
        fetch=lambda _project, entry, scratch: file_of(channel, entry, scratch),
        provenance=lambda _project, entry: provenance_of(channel, entry),
    )


def served_source(channel: HttpChannel) -> Source:
    """A channel served over HTTP: files and provenance by the URLs its pages give."""

    @contextmanager
    def fetch(project: Project, entry: FileEntry, scratch: Path) -> Iterator[Path | None]:
        target = scratch / entry.filename
        try:
            fetch_unchecked(channel.file_url(project.name, entry), target)
            yield target
        finally:
            target.unlink(missing_ok=True)

    def provenance(project: Project, entry: FileEntry) -> bytes | None:
        url = channel.provenance_url(project.name, entry)
        return None if url is None else fetch_bytes(url)

    name = split_credentials(channel.simple)[0]
    return Source(
        name=name,
        channel=channel.name,
        projects=channel.projects,
        project=channel.project,
        fetch=fetch,
        provenance=provenance,
    )


def verify_channel(
    source: Source,
    *,
    trusted: tuple[TrustedKey, ...],
    mirrored: bool = False,
    project: str | None = None,
    on_verdict: Callable[[Verdict], None],
) -> list[Verdict]:
    """Every file of the channel (or of ``project``) built here verified; mirrored ones too
    where ``mirrored``, against their signed mirroring; a verdict for each, as it is reached."""
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="wheelmill-verify-") as scratch:
        for found in source.projects():
            if project is not None and found.name != project:
                continue
            for entry in found.files:
                if entry.built or mirrored:
                    verdict = _verify_entry(source, found, entry, Path(scratch), trusted)
                    on_verdict(verdict)
                    verdicts.append(verdict)
    return verdicts


def _verify_entry(
    source: Source, project: Project, entry: FileEntry, scratch: Path, trusted: tuple[TrustedKey, ...]
) -> Verdict:
    try:
        with source.fetch(project, entry, scratch) as wheel:
            if wheel is None:
                return _failed(entry, FetchError(f"{entry.filename}: listed but not stored", fix="publish it again"))
            claims = Claims(
                filename=entry.filename,
                sha256=entry.sha256,
                build_keys=entry.build_keys,
                provenance=source.provenance(project, entry),
                source=f"{source.name}: {entry.filename}'s provenance",
                channel=source.channel,
            )
            return (verify_file if entry.built else verify_mirrored)(wheel, claims, trusted=trusted)
    except FetchError as error:
        return _failed(entry, error)
    except TransientError as error:  # tried once: a verifier says what it could not read, and goes on
        return _failed(entry, FetchError(f"{entry.filename}: {error}", fix="check the index's address, then retry"))


def _failed(entry: FileEntry, error: FetchError | IntegrityError) -> Verdict:
    return Verdict(filename=entry.filename, failures=(Failure(error=error),))
