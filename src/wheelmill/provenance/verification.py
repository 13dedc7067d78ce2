"""A file held to what is said of it: its sha256 to the page's, its envelopes to the team's
keys, their statements to the file (the last names it, each before it the file it came
from), its SBOM to the build's record, and the build key to the inputs recorded beside it.

Every check runs and each failure is one line with its own exit code (the error class that
says it), so one run names everything wrong with a file; none raises.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from wheelmill.errors import (
    BuildKeyMismatch,
    IntegrityError,
    InvalidWheel,
    SbomError,
    SignatureError,
    SubjectMismatch,
    WheelmillError,
)
from wheelmill.machine.net import sha256_of
from wheelmill.provenance.sbom import SBOM_FILE, sbom_differences, validate_sbom
from wheelmill.provenance.signing import TrustedKey, open_envelope, read_envelopes
from wheelmill.provenance.statement import MIRROR_TYPE, Statement, chain_problems, key_digest, read_statement
from wheelmill.wheel.wheelfile import read_wheel

_REPUBLISH = "publish the file again from its build; never edit a published file"
_REMIRROR = "mirror the file again from upstream (`wheelmill mirror --cell CELL`); never edit a published file"


@dataclass(frozen=True, kw_only=True)
class Failure:
    """One thing wrong with a file, as the error that says it (its class gives the code)."""

    error: WheelmillError

    @property
    def code(self) -> int:
        return self.error.exit_code

    @property
    def line(self) -> str:
        return self.error.one_line()


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What verification found of one file."""

    filename: str
    failures: tuple[Failure, ...]
    signed_by: tuple[str, ...] = ()  # the key ids whose signatures verified, one a statement
    statements: int = 0
    checked: str = ""  # what was checked, in words, for the summary

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass(frozen=True, kw_only=True)
class Claims:
    """What is said of a file besides its bytes: the page's sha256 and build keys (None: not
    listed on a page), and its provenance (None: none was found)."""

    filename: str
    sha256: str | None = None
    build_keys: tuple[str, ...] = ()
    provenance: bytes | None = None
    source: str = ""  # where the provenance came from, for messages
    channel: str | None = None  # the channel it is listed in (None: not read from one)


def verify_file(wheel: Path, claims: Claims, *, trusted: Sequence[TrustedKey]) -> Verdict:
    """Every check of a built wheel; the failures, in the order they are checked."""
    sha256 = sha256_of(wheel)
    failures: list[WheelmillError] = []
    if claims.sha256 is not None and claims.sha256 != sha256:
        failures.append(
            IntegrityError(
                f"{claims.filename}: sha256 {sha256[:16]}... but its page lists {claims.sha256[:16]}...",
                fix="the file or its page was changed after publishing; publish it again from its build",
            )
        )
    if claims.provenance is None:
        failures.append(
            SignatureError(
                f"{claims.filename}: no provenance was published with it",
                fix="publish it from a build with WHEELMILL_SIGNING_KEY set",
            )
        )
        return Verdict(filename=claims.filename, failures=_failures(failures), checked="sha256")
    statements, signed_by = _opened(claims, trusted, failures)
    if statements:
        failures += [SubjectMismatch(p, fix=_REPUBLISH) for p in chain_problems(statements, claims.filename, sha256)]
        build = statements[0]
        if build.is_build:
            failures += _sbom_failures(wheel, claims.filename, build)
            failures += _metadata_failures(wheel, claims.filename, build, promoted=len(statements) > 1)
            failures += _key_failures(claims, build)
            failures += _channel_failures(claims, statements)
    return Verdict(
        filename=claims.filename,
        failures=_failures(failures),
        signed_by=tuple(signed_by),
        statements=len(statements),
        checked="sha256, signature, subject, SBOM, build key",
    )


def verify_mirrored(wheel: Path, claims: Claims, *, trusted: Sequence[TrustedKey]) -> Verdict:
    """A mirrored file held to the statement its mirroring signed: its bytes to the upstream
    pin that statement names (a page and its file rewritten together still fail), the
    statement to the team's keys; the page's sha256 too."""
    sha256 = sha256_of(wheel)
    failures: list[WheelmillError] = []
    if claims.sha256 is not None and claims.sha256 != sha256:
        failures.append(
            IntegrityError(
                f"{claims.filename}: sha256 {sha256[:16]}... but its page lists {claims.sha256[:16]}...",
                fix=_REMIRROR,
            )
        )
    if claims.provenance is None:
        failures.append(
            SignatureError(
                f"{claims.filename}: mirrored with no signed statement of its upstream sha256, so only its page "
                "vouches for it",
                fix="mirror it again with WHEELMILL_SIGNING_KEY set (`wheelmill mirror --cell CELL`)",
            )
        )
        return Verdict(filename=claims.filename, failures=_failures(failures), checked="sha256 (mirrored)")
    statements, signed_by = _opened(claims, trusted, failures)
    if statements:
        problems = chain_problems(statements, claims.filename, sha256, origin=MIRROR_TYPE)
        failures += [SubjectMismatch(p, fix=_REMIRROR) for p in problems]
    return Verdict(
        filename=claims.filename,
        failures=_failures(failures),
        signed_by=tuple(signed_by),
        statements=len(statements),
        checked="sha256 against its signed mirroring, signature",
    )


def verify_either(wheel: Path, claims: Claims, *, trusted: Sequence[TrustedKey]) -> Verdict:
    """A file of no known origin (``wheelmill verify x.whl``): held as mirrored where its
    trusted provenance opens with a mirroring's statement, else as built. Only this door
    chooses: a door that expects a build (fleet reuse, publish) keeps ``verify_file``."""
    statements, _signed_by = _opened(claims, trusted, [])
    mirrored = bool(statements) and statements[0].is_mirror
    return (verify_mirrored if mirrored else verify_file)(wheel, claims, trusted=trusted)


def refuse_unverified(
    wheel: Path,
    provenance: bytes | None,
    *,
    trusted: Sequence[TrustedKey],
    required: bool,
    channel: str | None = None,
) -> None:
    """Raise the first failure of a file about to enter ``channel`` from outside a build
    (``publish``): where trusted keys are set, the provenance given with it must verify, and
    put it there; under ``required`` there must be one, and keys to verify it. A file with no
    provenance and no such demand passes."""
    if provenance is None and not required:
        return
    if not trusted:
        if required:
            raise SignatureError(
                f"{wheel.name}: WHEELMILL_SIGNATURES=required, and no trusted key to verify its provenance",
                fix="set WHEELMILL_TRUSTED_KEYS to the team's public keys",
            )
        return
    claims = Claims(filename=wheel.name, provenance=provenance, source=f"{wheel.name}.intoto.jsonl", channel=channel)
    verdict = verify_file(wheel, claims, trusted=trusted)
    if not verdict.ok:
        raise verdict.failures[0].error


def _opened(
    claims: Claims, trusted: Sequence[TrustedKey], failures: list[WheelmillError]
) -> tuple[list[Statement], list[str]]:
    """The statements whose signatures verify, in order; a failure for each that does not.
    A chain with a link that does not verify is not read past it."""
    source = claims.source or f"{claims.filename}'s provenance"
    try:
        envelopes = read_envelopes(
            claims.provenance.decode("utf-8", "replace") if claims.provenance else "", source=source
        )
    except SignatureError as error:
        failures.append(error)
        return [], []
    statements, signed_by = [], []
    for number, envelope in enumerate(envelopes, 1):
        try:
            payload, key = open_envelope(envelope, trusted)
            statements.append(read_statement(payload, source=f"{source}, line {number}"))
        except SignatureError as error:
            failures.append(SignatureError(f"{claims.filename}: statement {number}: {error.message}", fix=error.fix))
            return [], []  # the chain is read no further: the lines after would only echo this one
        signed_by.append(key.key_id)
    if not envelopes:
        failures.append(SignatureError(f"{source}: holds no envelope", fix=_REPUBLISH))
    return statements, signed_by


def _sbom_failures(wheel: Path, filename: str, build: Statement) -> list[WheelmillError]:
    try:
        data = _sbom(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        return [InvalidWheel(f"{filename}: not a readable wheel ({exc})", fix=_REPUBLISH)]
    if data is None:
        return [SbomError(f"{filename}: has no {SBOM_FILE} in its .dist-info", fix=_REPUBLISH)]
    invalid = validate_sbom(data)
    if invalid:
        return [SbomError(f"{filename}: its SBOM is not valid CycloneDX: {invalid[0]}", fix=_REPUBLISH)]
    try:
        record = build.record()
        differences = sbom_differences(data, record.carried())
    except (SbomError, SignatureError) as error:
        return [error]
    return [SbomError(f"{filename}: its SBOM and its provenance differ: {d}", fix=_REPUBLISH) for d in differences]


def _metadata_failures(wheel: Path, filename: str, build: Statement, *, promoted: bool) -> list[WheelmillError]:
    """The wheel's METADATA held to its signed record: its name, and its torch pin, always; its
    version and every Requires-Dist too where the file is the build's own (a promotion
    re-stamps the repo's version, and the pins on its siblings with it)."""
    try:
        info, record = read_wheel(wheel), build.record()
    except (InvalidWheel, SignatureError) as error:
        return [error]
    said = {
        "name": (canonicalize_name(info.metadata_name or ""), canonicalize_name(record.project)),
        "torch pin": (_torch_pins(info.requires_dist), _torch_pins(record.requires)),
    }
    if not promoted:
        said["version"] = (str(info.version), record.version)
        said["Requires-Dist"] = (_normalized(info.requires_dist), _normalized(record.requires))
    return [
        SubjectMismatch(f"{filename}: its METADATA's {what} is {found}, its signed record's {recorded}", fix=_REPUBLISH)
        for what, (found, recorded) in said.items()
        if found != recorded
    ]


def _normalized(requirements: Sequence[str], *, only: str | None = None) -> list[str]:
    """Requirements as packaging writes them, sorted (``only``: those of that project)."""
    found = []
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            found += [] if only else [text]
            continue
        if only is None or canonicalize_name(requirement.name) == only:
            found.append(str(requirement))
    return sorted(found)


def _torch_pins(requirements: Sequence[str]) -> list[str]:
    return _normalized(requirements, only="torch")


def _channel_failures(claims: Claims, statements: Sequence[Statement]) -> list[WheelmillError]:
    """The channel the file is in against where its provenance puts it: a promoted file where
    a promotion took it, any other where its build published it (a build's statement from
    before builds named their channels says nothing of it); and a file promoted, or in a
    test or nightly channel, built from a tree that is not its commit."""
    channel = claims.channel
    if channel is None:
        return []
    build, promotions = statements[0], [s for s in statements[1:] if not s.is_build]
    failures: list[WheelmillError] = []
    placed = sorted({c for s in promotions for c in s.placed_in() or ()}) if promotions else build.placed_in()
    if placed is not None and channel not in placed:
        how = "promoted into" if promotions else "built for"
        alone = "" if promotions or "/" in channel else "; a release channel takes files by promotion alone"
        failures.append(
            SubjectMismatch(
                f"{claims.filename}: listed in channel {channel}, but {how} {', '.join(placed)}{alone}",
                fix="remove it from this channel; publish or promote it where it belongs",
            )
        )
    if build.dirty and (promotions or "/" in channel):
        failures.append(
            SubjectMismatch(
                f"{claims.filename}: in channel {channel}, built from a tree that was not its commit (dirty)",
                fix="remove it; a release or nightly is built from a clean checkout of its commit",
            )
        )
    return failures


def _key_failures(claims: Claims, build: Statement) -> list[WheelmillError]:
    recomputed = key_digest(build.key_inputs)
    failures: list[WheelmillError] = []
    if build.key is None or recomputed != build.key:
        failures.append(
            BuildKeyMismatch(
                f"{claims.filename}: its recorded build key {str(build.key)[:12]}... is not the hash of its "
                f"recorded inputs ({recomputed[:12]}...)",
                fix=_REPUBLISH,
            )
        )
    elif claims.build_keys and build.key not in claims.build_keys:
        listed = ", ".join(k[:12] + "..." for k in claims.build_keys)
        failures.append(
            BuildKeyMismatch(
                f"{claims.filename}: built for key {build.key[:12]}..., which its page does not list ({listed})",
                fix=_REPUBLISH,
            )
        )
    return failures


def _sbom(wheel: Path) -> bytes | None:
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            top, _, rest = name.partition("/")
            if top.endswith(".dist-info") and rest == SBOM_FILE:
                return archive.read(name)
    return None


def _failures(errors: Sequence[WheelmillError]) -> tuple[Failure, ...]:
    return tuple(Failure(error=e) for e in errors)
