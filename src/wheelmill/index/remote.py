"""Publishing to an external index (Artifactory, devpi, pypiserver, ...) through its upload
API, idempotently and with retries.

Before each upload the index's simple page is read: the same file name with the same
sha256 is skipped, with another sha256 refused (``IndexConflict``). The upload itself is
``uv publish`` (the field's tool), retried with backoff on transient failures (twine does
not retry); afterwards the page is read again to confirm the bytes arrived. Credentials
come from WHEELMILL_PUBLISH_USERNAME / WHEELMILL_PUBLISH_PASSWORD and reach uv through its
environment, never its command line, and are never logged.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from wheelmill.errors import NAME_TAKEN_FIX, CommandFailed, IndexConflict, PublishError
from wheelmill.machine.net import is_transient, project_files, sha256_of, split_credentials, upload_refusal
from wheelmill.machine.process import Runner, StepLog, base_environment
from wheelmill.machine.tools import uv_bin
from wheelmill.retry import RetryPolicy, TransientError, with_retries
from wheelmill.settings import Settings
from wheelmill.wheel.wheelfile import read_wheel

_STATUS = re.compile(r"status code (\d{3})")
CREDENTIALS_FIX = "set WHEELMILL_PUBLISH_USERNAME and WHEELMILL_PUBLISH_PASSWORD to an account that may upload there"


class Upload(StrEnum):
    UPLOADED = "uploaded"
    SKIPPED = "skipped"  # already there, same bytes


@dataclass(frozen=True, kw_only=True)
class Remote:
    """Another index: where uploads go and its simple API, without credentials (which are
    taken out of the URLs and kept apart, so no message can carry them)."""

    url: str  # the upload endpoint
    check_url: str  # its simple API
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, url: str, check_url: str | None, settings: Settings) -> Remote:
        """From the command line's URLs; credentials in a URL win over the settings'."""
        bare, username, password = split_credentials(url)
        check = split_credentials(check_url)[0] if check_url else bare.rstrip("/") + "/simple/"
        return cls(
            url=bare,
            check_url=check,
            username=username or settings.publish_username,
            password=password or settings.publish_password,
        )

    def environment(self) -> dict[str, str]:
        """The credentials as uv reads them: from its environment, never its command line."""
        given = {"UV_PUBLISH_USERNAME": self.username, "UV_PUBLISH_PASSWORD": self.password}
        return {key: value for key, value in given.items() if value}

    @property
    def secrets(self) -> tuple[str, ...]:
        """What must never reach a log or a terminal: the password and the Basic token."""
        if not self.password:
            return ()
        token = base64.b64encode(f"{self.username or ''}:{self.password}".encode()).decode()
        return (self.password, urllib.parse.quote(self.password, safe=""), token)

    @property
    def auth(self) -> tuple[str, str] | None:
        return (self.username or "", self.password) if self.password else None


def remote_sha256(remote: Remote, wheel: Path) -> str | None:
    """The sha256 the index lists for this file name, or None when it has no such file."""
    for file in project_files(remote.check_url, read_wheel(wheel).name, auth=remote.auth):
        if file.filename == wheel.name:
            if not file.sha256:
                raise PublishError(
                    f"{remote.check_url}: {wheel.name} is listed without a sha256",
                    fix="configure the index to publish sha256 hashes",
                )
            return file.sha256
    return None


def upload(
    remote: Remote,
    wheel: Path,
    *,
    runner: Runner,
    log: StepLog,
    policy: RetryPolicy,
    on_retry: Callable[[int, Exception, float], None],
) -> tuple[Upload, int]:
    """Upload one wheel unless it is there already; return what happened and the attempts."""
    local = sha256_of(wheel)

    def attempt(_number: int) -> Upload:
        existing = remote_sha256(remote, wheel)
        if existing == local:
            return Upload.SKIPPED
        if existing is not None:
            raise IndexConflict(
                f"{remote.check_url}: {wheel.name} is already there with other bytes "
                f"(sha256 {existing[:16]}..., this one {local[:16]}...)",
                fix=NAME_TAKEN_FIX,
            )
        _uv_publish(remote, wheel, runner=runner, log=log)
        if remote_sha256(remote, wheel) != local:
            raise TransientError(f"{wheel.name}: not listed with its sha256 after the upload")
        return Upload.UPLOADED

    try:
        return with_retries(attempt, policy=policy, on_retry=on_retry)
    except TransientError as exc:
        fix = "check the index and the network; WHEELMILL_RETRIES sets the attempts"
        raise PublishError(
            f"{remote.url}: gave up on {wheel.name} after {policy.attempts} attempts: {exc}", fix=fix
        ) from None


def _uv_publish(remote: Remote, wheel: Path, *, runner: Runner, log: StepLog) -> None:
    # uv's own retries off: this module's retry policy is the one that counts attempts.
    env = base_environment([], {"UV_NO_PROGRESS": "1", "UV_HTTP_RETRIES": "0", **remote.environment()})
    argv = [
        uv_bin(),
        "publish",
        "--no-config",
        "--publish-url",
        remote.url,
        "--check-url",
        remote.check_url,
        str(wheel),
    ]
    try:
        runner.run(argv, env=env, log=log)
    except CommandFailed as failed:
        failure = upload_failure(remote, wheel.name, failed)
        if isinstance(failure, TransientError) and "broken pipe" in str(failure).lower():
            failure = _refused(remote, wheel.name) or failure
        raise failure from None


def _refused(remote: Remote, name: str) -> PublishError | None:
    """An index that refuses the credentials may close the connection before it has read
    the upload, and uv then sees a broken pipe, not the status: ask the index once more,
    without the file, so a refusal is told as one and not retried."""
    status = upload_refusal(remote.url, remote.auth)
    return (
        None
        if status is None
        else PublishError(f"{remote.url}: the index refused the upload of {name}: {status}", fix=CREDENTIALS_FIX)
    )


def upload_failure(remote: Remote, name: str, failed: CommandFailed) -> PublishError | TransientError:
    """What a failed ``uv publish`` means: a refusal of the credentials, a network fault worth
    another attempt, or anything else (which the log explains)."""
    cause = upload_cause(failed.tail) or failed.last_line()
    status = _STATUS.search(cause)
    if status and status.group(1) in {"401", "403"}:
        return PublishError(f"{remote.url}: the index refused the upload of {name}: {cause}", fix=CREDENTIALS_FIX)
    if is_transient(cause):
        return TransientError(f"uv publish: {cause}")
    return PublishError(f"{remote.url}: uploading {name} failed: {cause}", fix=f"read {failed.log}")


def upload_cause(output: Sequence[str]) -> str | None:
    """uv's chain of ``cause:`` lines (a status, or a network error down to the OS), without
    the server's HTML page that follows a status."""
    causes = [line.strip().removeprefix("cause:").strip() for line in output if line.strip().startswith("cause:")]
    causes = [cause.removesuffix("Server says:").strip() for cause in causes]
    return ": ".join(causes)[:240] or None
