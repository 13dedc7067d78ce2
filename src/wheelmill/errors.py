"""The one error family of wheelmill.

Every failure a user can cause or meet is a ``WheelmillError`` subclass with its own exit
code. The CLI (and the nox session wrapper, which calls it) is the only place that turns
them into a one-line message and an exit status; nothing else prints a traceback.

The error line and everything else wheelmill writes where a person or a CI artifact reads it
(the terminal, step logs, crash logs, the JSON reports) pass one redaction, ``redact``:
whatever carries a credential is masked whatever the credential is (a password in a URL, an
Authorization header, a token after its scheme), and so is every secret this process was
given (the values of its environment's credential variables, the key material it read).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

# The names of the variables whose values are credentials: never written anywhere.
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|CREDENTIAL|CONNECTION_STRING|SIGNING_KEY$", re.IGNORECASE)
# What carries a credential in what a command or a server says, whatever the credential is:
# an Authorization header (a server may echo it in an error page), a token after its scheme,
# a password in a URL, a long token given as a URL's user alone.
_CARRIERS = (
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)[^\s\"'<>,;]+(\s+[^\s\"'<>,;]+)?"), r"\1***"),
    (re.compile(r"\b(Basic|Bearer)\s+(?=[A-Za-z0-9+/._~-]*[0-9+/=])[A-Za-z0-9+/._~-]{12,}=*"), r"\1 ***"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]+):[^/\s@]+@"), r"\1:***@"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[A-Za-z0-9._~%+-]{20,}@"), r"\1***@"),
)
# Shorter values are not masked on their own: "1" or "true" would mask half of every line.
_SHORTEST = 8
_known: set[str] = set()


def remember(secrets: Iterable[str | None]) -> None:
    """Mask these values in everything redacted from now on in this process; a multi-line
    secret (a PEM key) by each of its lines too, so that a part of it quoted alone is masked."""
    for secret in secrets:
        if not secret:
            continue
        text = secret.strip()
        parts = [text, *(line.strip() for line in text.splitlines())]
        _known.update(part for part in parts if len(part) >= _SHORTEST and not part.startswith("-----"))


def remember_environment(environ: Mapping[str, str]) -> None:
    """Every credential variable's value (``SECRET_NAME``): they are masked wherever they appear."""
    remember(value for key, value in environ.items() if SECRET_NAME.search(key))


def redact(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` with every known secret, and whatever carries a credential, as ``***``.

    >>> redact("401: Authorization: Basic dXNlcjpodW50ZXIy sent by https://me:hunter2@host/x", ["hunter2"])
    '401: Authorization: *** sent by https://me:***@host/x'
    >>> redact("pulled https://ghp_0123456789abcdefghijklmn@git.example/r.git")
    'pulled https://***@git.example/r.git'
    """
    # the longest first: a secret that holds another is masked whole
    for secret in sorted({*(s for s in secrets if s), *_known}, key=len, reverse=True):
        text = text.replace(secret, "***")
    for pattern, replacement in _CARRIERS:
        text = pattern.sub(replacement, text)
    return text


def redact_data(value: Any) -> Any:
    """``value`` (what JSON holds) with every string in it redacted, keys included."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact_data(key): redact_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(item) for item in value]
    return value


class WheelmillError(Exception):
    """Base class: a message that says what happened, and a fix that says what to do."""

    exit_code: ClassVar[int] = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def one_line(self) -> str:
        text = self.message if not self.fix else f"{self.message}; fix: {self.fix}"
        return redact(" ".join(text.split()))  # a URL or a key quoted in it masked


class UsageError(WheelmillError):
    """The command line itself is wrong."""

    exit_code = 2


class ConfigError(WheelmillError):
    """A recipe, the matrix or a setting is malformed: names the file and the key."""

    exit_code = 3


class SelectionError(WheelmillError):
    """An unknown or unsupported cell, variant, Python or recipe was asked for."""

    exit_code = 4


class PrecheckError(WheelmillError):
    """The cell cannot be built here: a toolchain, Python or torch is missing or wrong."""

    exit_code = 5


class FetchError(WheelmillError):
    """A source or index could not be downloaded (after retries, where retrying helps)."""

    exit_code = 6


class IntegrityError(WheelmillError):
    """Downloaded bytes do not match their pinned sha256. Never retried."""

    exit_code = 7


class EnvError(WheelmillError):
    """The level-2 environment (locked build or test env) could not be made."""

    exit_code = 8


class BuildError(WheelmillError):
    """The recipe's build command failed. Never retried: compile errors are not flaky."""

    exit_code = 9


class CheckError(WheelmillError):
    """A post-build check found a defect in the wheel."""

    exit_code = 10


class RepairError(WheelmillError):
    """auditwheel could not repair the wheel."""

    exit_code = 11


class InstallTestError(WheelmillError):
    """The wheel did not install, import or pass its smoke command in a clean env."""

    exit_code = 12


class BusyError(WheelmillError):
    """Another wheelmill process holds the cell's output directory."""

    exit_code = 13


# What to do about other bytes under a published name: a build of new inputs is named apart
# by its build (wheelmill.wheel.buildtags), so building it again gets it a name.
NAME_TAKEN_FIX = (
    "published files are immutable: build it again (a build names other bytes of one version apart with a build tag) "
    "or bump the version"
)
# The same for a conda package: a wheel's build tag is its package's build number.
PACKAGE_TAKEN_FIX = (
    "published packages are immutable: build the wheel again (a rebuild of one version is named apart, and its "
    "package's build number with it) or bump the version"
)


class IndexConflict(WheelmillError):
    """A file name already published with different bytes: published files are immutable."""

    exit_code = 14


class ChannelError(WheelmillError):
    """The index cannot take this: not a wheel, an unknown channel or project, a bad tree."""

    exit_code = 15


class PublishError(WheelmillError):
    """Uploading to an external index failed (after retries, where retrying helps)."""

    exit_code = 16


class ReleaseError(WheelmillError):
    """A release cannot be made from this state of git: no tag at HEAD, a malformed tag, a
    dirty tree, nothing to promote."""

    exit_code = 17


class ReleasePending(ReleaseError):
    """A promotion that time may let through: its rc is not recorded yet, or a GPU stage its
    record asks for has not been recorded yet (none failed). ``release promote --wait`` waits
    on this one alone."""


class InvalidWheel(ChannelError):
    """A file is not a valid wheel: its name, its zip, its one .dist-info or its METADATA.
    Wherever a wheel is read (a build's output, a publish, a promotion) this is the error,
    with the index's exit code: the index refuses such a file for the same reason."""


class CommandFailed(WheelmillError):
    """A command exited non-zero (or could not start: returncode 127). Inside a step it
    becomes that step's own error (a failed compile is a ``BuildError``); where nothing
    says what it means, it is reported as it is, with its own exit code."""

    exit_code = 18

    def __init__(self, argv: Sequence[str], returncode: int, log: Path | None, tail: Sequence[str]) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.log = log
        self.tail = tuple(tail)
        program = Path(self.argv[0]).name if self.argv else "command"
        super().__init__(
            f"{program} exited with {returncode}: {self.last_line()}",
            fix=f"read {log}" if log else "run it by hand to see why",
        )

    def last_line(self) -> str:
        lines = [line for line in self.tail if line.strip()]
        return lines[-1].strip()[:200] if lines else "(no output)"

    def child_error(self) -> tuple[str, str]:
        """What a wheelmill command run as a child process says failed, and its fix: its
        error line, whole (``last_line`` shortens it)."""
        lines = [line.strip() for line in self.tail if line.strip()]
        what, _, fix = (lines[-1] if lines else "(no output)").removeprefix("wheelmill: error: ").partition("; fix: ")
        return what, fix


class IndexWriteError(WheelmillError):
    """The index could not be written: a full disk, a read-only or unwritable tree. Every
    write is atomic and staged before the first rename, so the index is as it was."""

    exit_code = 19


class ImageError(WheelmillError):
    """An image could not be built, or one built fails its smoke tests; what this command
    built is removed again."""

    exit_code = 20


class DoctorError(WheelmillError):
    """``wheelmill doctor``: an installed wheel would not run on this machine's GPU (it lacks
    the GPU's arch). ``wheelmill/doctor.py`` is standard library only, so it holds this code
    itself, as ``EXIT_WOULD_FAIL``; a test keeps the two equal, and this class keeps the
    code apart from the others."""

    exit_code = 21


class NoGpuError(WheelmillError):
    """The GPU stage found no GPU to run kernels on: none visible to the machine (nvidia-smi,
    rocminfo), or none visible to the env's torch. Nothing was proven; nothing is passed."""

    exit_code = 22


class GpuCheckError(WheelmillError):
    """The GPU stage: a wheel's GPU checks (or its import on the GPU machine) failed, where
    doctor predicted it or the error is not a missing kernel image (an import error, a wrong
    number), or the wheel could not be judged (not the channel's file, no arch record)."""

    exit_code = 23


class GpuVerdictMismatch(GpuCheckError):
    """The GPU stage: doctor's verdict and the kernels disagree: doctor said a wheel runs on
    this GPU and its kernels found no kernel image for it, or said it fails and its kernels
    ran. Either way a promise wheelmill makes (its arch records, doctor's rules) is wrong."""

    exit_code = 24


class GpuUnproven(WheelmillError):
    """The GPU stage proved nothing of a wheel: its recipe has no GPU check (it only
    imported), or its check's tests were skipped, expected to fail, or none ran. Not a pass,
    so promotion refuses it too."""

    exit_code = 25


class SignatureError(WheelmillError):
    """A file's provenance is missing where one is required, or its signature verifies
    against none of the team's public keys (another key signed it, or its bytes changed)."""

    exit_code = 26


class SubjectMismatch(WheelmillError):
    """A provenance names another file: its subject's name or sha256 is not the file's."""

    exit_code = 27


class SbomError(WheelmillError):
    """A wheel's SBOM is missing, invalid against CycloneDX's schema, or says other inputs
    than its provenance."""

    exit_code = 28


class BuildKeyMismatch(WheelmillError):
    """The build key recorded for a file is not the hash of the inputs recorded beside it,
    or not the key its channel lists."""

    exit_code = 29


class InternalError(WheelmillError):
    """Something wheelmill did not expect: a bug. The traceback goes to a log, never to the
    terminal; the line says where."""

    exit_code = 70  # EX_SOFTWARE (sysexits.h)


class Interrupted(WheelmillError):
    """Ctrl-C or SIGTERM: everything started was stopped and cleaned up."""

    exit_code = 130


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """The "Perhaps you meant ...?" suffix for a typo, or an empty string.

    >>> did_you_mean("cuda18", ["cpu", "cuda118", "cuda121"])
    " (perhaps you meant 'cuda118'?)"
    >>> did_you_mean("zzz", ["cpu"])
    ''
    """
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (perhaps you meant '{close[0]}'?)" if close else ""
