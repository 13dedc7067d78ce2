"""The files an install is about to take from a channel (an image's, the GPU stage's env's),
held to their signed provenance first (``wheelmill.releases.attested``) where the team's keys
are configured: a file that does not verify is never installed. Where no key is configured
nothing is verified, and the caller says so in one line rather than pass in silence.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from wheelmill.errors import FetchError, SignatureError
from wheelmill.index.pages import Project
from wheelmill.provenance.signing import TrustedKey
from wheelmill.provenance.verification import Failure, Verdict
from wheelmill.releases.attested import Source, verify_channel

NOT_VERIFIED = "not verified: no trusted key"
NO_KEY_LINE = f"provenance: {NOT_VERIFIED} (WHEELMILL_TRUSTED_KEYS)"


@dataclass(frozen=True, kw_only=True)
class Checked:
    """What was held to its provenance before an install: the trusted keys' ids (none: not
    verified) and a verdict per file, in the order they were reached."""

    keys: tuple[str, ...]
    verdicts: tuple[Verdict, ...] = ()
    unlisted: tuple[Failure, ...] = ()  # files to install that the channel's pages do not list

    @property
    def failures(self) -> tuple[Failure, ...]:
        return (*(f for v in self.verdicts for f in v.failures), *self.unlisted)

    @property
    def code(self) -> int:
        """The first failure's exit code; 0 where every file verified (or none was checked)."""
        return self.failures[0].code if self.failures else 0

    @property
    def verified(self) -> tuple[str, ...]:
        return tuple(v.filename for v in self.verdicts if v.ok)

    def line(self) -> str:
        """The one line a command prints of it."""
        if not self.keys:
            return NO_KEY_LINE
        keys = ", ".join(k[:19] + "..." for k in self.keys)
        if not self.verdicts and not self.unlisted:
            return f"provenance: nothing built here to verify; keys {keys}"
        if self.failures:
            failed, total = len(self.verdicts) - len(self.verified) + len(self.unlisted), len(self.verdicts)
            return f"provenance: {failed} of {total + len(self.unlisted)} file(s) failed; trusted keys {keys}"
        return f"provenance: {len(self.verified)} file(s) built here verified ({', '.join(self.verified)}); keys {keys}"

    def record(self) -> dict[str, Any] | str:
        """For a report: how many verified, and against which keys; or why none was."""
        if not self.keys:
            return NOT_VERIFIED
        return {
            "verified": len(self.verified),
            "files": list(self.verified),
            "keys": list(self.keys),
            "failed": [f.line for f in self.failures],
        }


def verify_before_install(
    source: Source,
    filenames: Collection[str],
    *,
    trusted: tuple[TrustedKey, ...],
    on_failure: Callable[[str], None],
    required: bool = False,
) -> Checked:
    """Each of ``filenames`` (files built here) held to its provenance in ``source``, where
    ``trusted`` names keys; each failure's line given to ``on_failure`` as it is reached.
    ``required`` (``WHEELMILL_SIGNATURES=required``): with no key, nothing is installed."""
    if not trusted:
        if not required or not filenames:
            return Checked(keys=())
        refused = Failure(
            error=SignatureError(
                f"{len(filenames)} file(s) built here to be installed, and WHEELMILL_SIGNATURES=required "
                "with no trusted key to verify them",
                fix="set WHEELMILL_TRUSTED_KEYS to the team's public keys",
            )
        )
        on_failure(refused.line)
        return Checked(keys=(), unlisted=(refused,))
    wanted = frozenset(filenames)

    def said(verdict: Verdict) -> None:
        for failure in verdict.failures:
            on_failure(failure.line)

    verdicts = verify_channel(_only(source, wanted), trusted=trusted, on_verdict=said)
    reached = {v.filename for v in verdicts}
    unlisted = tuple(
        Failure(
            error=FetchError(
                f"{name}: to be installed, but {source.name}'s pages do not list it as built here",
                fix="publish it from its build (with its provenance) again",
            )
        )
        for name in sorted(wanted - reached)
    )
    for failure in unlisted:
        on_failure(failure.line)
    return Checked(keys=tuple(k.key_id for k in trusted), verdicts=tuple(verdicts), unlisted=unlisted)


def _only(source: Source, filenames: frozenset[str]) -> Source:
    """``source``, its projects those of ``filenames``, listing only them: the rest of the
    channel is not what this install takes, and is neither read nor fetched."""
    names = sorted({canonicalize_name(parse_wheel_filename(name)[0]) for name in filenames})

    def projects() -> Iterator[Project]:
        for found in filter(None, map(source.project, names)):
            files = tuple(f for f in found.files if f.filename in filenames)
            if files:
                yield replace(found, files=files)

    return replace(source, projects=projects)
