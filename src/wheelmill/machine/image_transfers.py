"""Where an image comes from (the engine's own, a registry's, made here: ``obtain``), and
pulling it from a registry and pushing it there, through the engine, with what each
attempt said read into one of a few answers: the registry has no such image (not a
failure: the caller makes it), the registry cannot be reached or will not serve it (a
warning: the caller makes it too), or a network hiccup (retried with the run's policy).

Every command goes through the step's log. A registry on loopback is spoken to over plain
http (``insecure_registry``); any other over TLS, with the engine's own login.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from wheelmill.errors import CommandFailed
from wheelmill.machine.engine import Engine, insecure_registry
from wheelmill.machine.process import HostRunner, StepLog, base_environment, capture
from wheelmill.retry import RetryPolicy, TransientError, with_retries


class Miss(StrEnum):
    """Why an image did not come from the registry."""

    ABSENT = "absent"  # the registry answers and has no such tag: the caller makes the image
    UNREACHABLE = "unreachable"  # nothing answers there (refused, no such host, gave up retrying)
    REFUSED = "refused"  # it answers but will not (denied, unauthorized), or said something else


# What the engines print (podman's containers/image, docker's daemon), lowercased, per answer;
# the first that matches decides. A transient one (None) is tried again before it counts.
# Phrases only, never a bare status code: a loopback registry's port can hold "404".
_SAYINGS: tuple[tuple[Miss | None, tuple[str, ...]], ...] = (
    (Miss.ABSENT, ("manifest unknown", "not found", "name unknown")),
    (Miss.REFUSED, ("denied", "unauthorized", "forbidden", "authentication required")),
    (Miss.UNREACHABLE, ("connection refused", "no such host", "network is unreachable", "no route to host")),
    (
        None,
        (
            "timeout",
            "timed out",
            "connection reset",
            "broken pipe",
            "unexpected eof",
            ": eof",
            "temporary failure",
            "too many requests",
            "internal server error",
            "bad gateway",
            "service unavailable",
        ),
    ),
)


def classify(said: str) -> Miss | None:
    """What a failed pull or push means, from the engine's words; None: transient, worth another try.

    >>> classify("reading manifest t in 127.0.0.1:5000/w/x: manifest unknown: manifest unknown")
    <Miss.ABSENT: 'absent'>
    >>> classify('pinging container registry 127.0.0.1:40404: dial tcp 127.0.0.1:40404: connect: connection refused')
    <Miss.UNREACHABLE: 'unreachable'>
    >>> classify("received unexpected HTTP status: 503 Service Unavailable") is None
    True
    >>> classify("something else entirely")
    <Miss.REFUSED: 'refused'>
    """
    lowered = said.lower()
    for answer, phrases in _SAYINGS:
        if any(phrase in lowered for phrase in phrases):
            return answer
    return Miss.REFUSED


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """An image that moved between this machine's engine and the registry."""

    image: str  # what it is to the caller: builder, base
    action: str  # pulled | pushed
    reference: str  # <registry>/<repository>:<tag>
    digest: str  # sha256:... of its manifest, as the registry serves it

    def describe(self) -> str:
        """``pushed to <ref> (digest sha256:...)``, ``pulled from <ref> (digest sha256:...)``."""
        way = "to" if self.action == "pushed" else "from"
        return f"{self.action} {way} {self.reference} (digest {self.digest})"

    def facts(self) -> dict[str, str]:
        return {"image": self.image, "action": self.action, "reference": self.reference, "digest": self.digest}


@dataclass(frozen=True, kw_only=True)
class Missed:
    """An image that did not move, and why (``detail``: the engine's last line)."""

    image: str
    action: str  # pull | push
    reference: str
    why: Miss
    detail: str

    @property
    def warning(self) -> bool:
        """Whether it is worth a warning: an absent image is the normal first time."""
        return self.why is not Miss.ABSENT

    def describe(self) -> str:
        if self.why is Miss.ABSENT:
            return f"{self.reference}: not in the registry"
        return f"could not {self.action} {self.reference} ({self.why}): {self.detail}"


class Origin(StrEnum):
    """Where an image of this machine's engine came from."""

    REUSED = "reused"  # the engine had it
    PULLED = "pulled"  # from the shared registry
    BUILT = "built"  # made here: a builder built, a base bootstrapped
    PINNED = "pinned"  # a registry base, named by digest: the engine fetches it for FROM


@dataclass(frozen=True, kw_only=True)
class Sourced:
    """How one image came to be here, and what moved (or failed to) on the way."""

    origin: Origin
    moves: tuple[Transfer | Missed, ...] = ()

    @property
    def unreachable(self) -> bool:
        return any(isinstance(m, Missed) and m.why is Miss.UNREACHABLE for m in self.moves)


def obtain(*, present: bool, fetch: Callable[[], Transfer | Missed] | None, make: Callable[[], None]) -> Sourced:
    """The order every image is got in: the engine's own, else the registry's (where there is
    one), else made here. A pull that finds nothing, or no registry at all, falls through."""
    if present:
        return Sourced(origin=Origin.REUSED)
    moved = fetch() if fetch is not None else None
    if isinstance(moved, Transfer):
        return Sourced(origin=Origin.PULLED, moves=(moved,))
    make()
    return Sourced(origin=Origin.BUILT, moves=(moved,) if moved is not None else ())


def pull(
    engine: Engine,
    reference: str,
    *,
    image: str,
    local: str,
    platform: str | None,
    policy: RetryPolicy,
    log: StepLog,
) -> Transfer | Missed:
    """Pull ``reference`` and tag it ``local``; retried where the network hiccups."""

    def attempt(_number: int) -> Transfer | Missed:
        try:
            _run(engine.pull(reference, insecure=insecure_registry(reference), platform=platform), log)
        except CommandFailed as failed:
            return _missed(failed, image=image, action="pull", reference=reference)
        _run(engine.tag(reference, local), log)
        digest = repo_digest(engine, reference)
        _forget(engine, reference, log)
        return Transfer(image=image, action="pulled", reference=reference, digest=digest)

    return _with_retries(attempt, image=image, action="pull", reference=reference, policy=policy, log=log)


def push(
    engine: Engine, local: str, reference: str, *, image: str, policy: RetryPolicy, log: StepLog
) -> Transfer | Missed:
    """Tag ``local`` as ``reference`` and push it; retried where the network hiccups."""
    _run(engine.tag(local, reference), log)
    try:
        return _pushed(engine, reference, image=image, policy=policy, log=log)
    finally:
        _forget(engine, reference, log)


def _forget(engine: Engine, reference: str, log: StepLog) -> None:
    """The registry's name for an image moved, gone from this engine again: the image is
    known by its local tag, and a name per registry and port would pile up."""
    capture(engine.untag(reference), timeout=60)
    log.note(f"untagged {reference}")


def _pushed(engine: Engine, reference: str, *, image: str, policy: RetryPolicy, log: StepLog) -> Transfer | Missed:
    with tempfile.TemporaryDirectory(prefix="wheelmill-push-") as tmp:
        digest_file = Path(tmp) / "digest"

        def attempt(_number: int) -> Transfer | Missed:
            try:
                _run(engine.push(reference, digest_file=digest_file, insecure=insecure_registry(reference)), log)
            except CommandFailed as failed:
                return _missed(failed, image=image, action="push", reference=reference)
            # podman writes the digest it pushed; docker records it with the image
            written = digest_file.read_text(encoding="utf-8").strip() if digest_file.is_file() else ""
            digest = written or repo_digest(engine, reference)
            return Transfer(image=image, action="pushed", reference=reference, digest=digest)

        return _with_retries(attempt, image=image, action="push", reference=reference, policy=policy, log=log)


def repo_digest(engine: Engine, reference: str) -> str:
    """The registry's digest of the local image ``reference`` names, for its repository; ""
    where the engine recorded none."""
    repository = reference.rsplit(":", 1)[0] if ":" in reference.rsplit("/", 1)[-1] else reference
    lines = capture(engine.repo_digests(reference), timeout=60).stdout.split()
    return next((line.split("@", 1)[1] for line in lines if line.startswith(f"{repository}@")), "")


def rootfs_layers(engine: Engine, reference: str) -> tuple[str, ...] | None:
    """The local image's layers as diff ids, or None when the engine has no such image."""
    result = capture(engine.rootfs_layers(reference), timeout=60)
    if result.returncode != 0:
        return None
    layers = tuple(result.stdout.split())
    return layers or None


def _run(argv: list[str], log: StepLog) -> None:
    HostRunner().run(argv, env=base_environment([]), log=log)


def _missed(failed: CommandFailed, *, image: str, action: str, reference: str) -> Missed:
    # the engine's error is its last line, whole (progress lines before it say nothing of it)
    why = classify(next((line for line in reversed(failed.tail) if line.strip()), ""))
    if why is None:
        raise TransientError(f"{action} {reference}: {failed.last_line()}")
    if why is Miss.ABSENT and action == "push":  # "not found" of a push is a refusal, never the normal case
        why = Miss.REFUSED
    return Missed(image=image, action=action, reference=reference, why=why, detail=failed.last_line())


def _with_retries(
    attempt: Callable[[int], Transfer | Missed],
    *,
    image: str,
    action: str,
    reference: str,
    policy: RetryPolicy,
    log: StepLog,
) -> Transfer | Missed:
    def said(number: int, error: Exception, pause: float) -> None:
        log.note(f"{action} attempt {number} failed: {error}; retrying in {pause:.1f}s")

    try:
        return with_retries(attempt, policy=policy, on_retry=said)[0]
    except TransientError as exc:
        return Missed(
            image=image,
            action=action,
            reference=reference,
            why=Miss.UNREACHABLE,
            detail=f"gave up after {policy.attempts} attempts: {exc}",
        )
