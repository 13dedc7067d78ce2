"""Solving and creating conda envs with py-rattler, on this machine: which packages a spec
gets from the configured channels for the given virtual packages (``__cuda`` present or
not), and an env made from them. No conda, no network beyond the channels' URLs."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse
from urllib.request import url2pathname

from wheelmill.conda.envspec import LockedPackage
from wheelmill.errors import EnvError, FetchError, IntegrityError, UsageError
from wheelmill.machine.net import sha256_of

if TYPE_CHECKING:
    from rattler import RepoDataRecord


@dataclass(frozen=True, kw_only=True)
class Picked:
    """One package of a solution, as a solver's summary names it."""

    name: str
    version: str
    build: str
    channel: str

    def __str__(self) -> str:
        return f"{self.name} {self.version} {self.build}"


def solve(
    channels: Sequence[str], specs: Sequence[str], *, cache_dir: Path, cuda: str | None = None
) -> list[RepoDataRecord]:
    """The records ``specs`` resolve to from ``channels`` on linux-64, as on a machine whose
    driver supports CUDA ``cuda`` (``__cuda``), or none where it is None. Channels are not
    ranked: each variant has its own, and a CUDA channel listed first must not hide the CPU
    build from a machine without a GPU (versions and build numbers decide). A served
    channel's repodata is kept in ``cache_dir``: py-rattler's default is the user's home,
    whatever RATTLER_CACHE_DIR says."""
    import rattler  # noqa: PLC0415 - a native module of a tenth of a second: loaded when used
    from rattler.exceptions import GatewayError, InvalidMatchSpecError, SolverError  # noqa: PLC0415

    virtual = (
        [rattler.GenericVirtualPackage(rattler.PackageName("__cuda"), rattler.Version(cuda), rattler.BuildString("0"))]
        if cuda
        else []
    )
    virtual += [
        rattler.GenericVirtualPackage(rattler.PackageName("__unix"), rattler.Version("0"), rattler.BuildString("0"))
    ]
    sources = [rattler.Channel(url) for url in channels]
    unranked = rattler.ChannelPriority.Disabled
    try:
        return asyncio.run(
            rattler.solve(
                sources=sources,
                specs=list(specs),
                platforms=["linux-64", "noarch"],
                virtual_packages=virtual,
                channel_priority=unranked,
                gateway=rattler.Gateway(cache_dir=cache_dir),
            )
        )
    except InvalidMatchSpecError as exc:
        raise UsageError(
            f"conda: not a match spec: {_first(exc)}",
            fix="write specs as conda does: 'torch', 'torch 2.14.*', 'python 3.11.*'",
        ) from None
    except SolverError as exc:
        fix = "seed the channel (wheelmill conda seed) or correct the spec"
        raise EnvError(
            f"conda: {' '.join(specs)} cannot be solved from {', '.join(channels)}: {_first(exc)}", fix=fix
        ) from None
    except GatewayError as exc:  # a channel it could not read: unreachable, not indexed, not a channel
        fix = (
            "check the channel URL (--channel, WHEELMILL_CONDA_CHANNELS) and that it is indexed (wheelmill conda index)"
        )
        raise FetchError(f"conda: cannot read a channel of {', '.join(channels)}: {_first(exc)}", fix=fix) from None


def picked(records: Sequence[RepoDataRecord]) -> list[Picked]:
    return sorted(
        (
            Picked(name=r.name.normalized, version=str(r.version), build=str(r.build), channel=str(r.channel))
            for r in records
        ),
        key=lambda p: p.name,
    )


def locked(records: Sequence[RepoDataRecord]) -> list[LockedPackage]:
    """A solution as a lock names it: subdir, file name, sha256."""
    out = []
    for r in records:
        if r.sha256 is None:
            raise EnvError(
                f"conda: {r.file_name} in {r.channel} has no sha256 in its repodata",
                fix="reindex the channel (wheelmill conda index)",
            )
        out.append(
            LockedPackage(
                subdir=str(r.subdir),
                name=r.name.normalized,
                version=str(r.version),
                build=str(r.build),
                sha256=r.sha256.hex(),
            )
        )
    return out


def find_locked(
    channels: Sequence[str], packages: Sequence[LockedPackage], *, lock: Path, cache_dir: Path
) -> list[RepoDataRecord]:
    """The records of a lock's packages in ``channels``, each with the lock's bytes (sha256):
    a solve of specs that only the locked packages meet, so a channel that lacks one, or is
    unreachable, says so the way any solve does; then the bytes of those in local channels."""
    records = solve(channels, [p.spec for p in packages], cache_dir=cache_dir)
    by_name = {r.name.normalized: r for r in records}
    for package in packages:
        found = by_name.get(package.name)
        digest = found.sha256.hex() if found is not None and found.sha256 is not None else None
        if digest != package.sha256:
            where = found.channel if found else "the channels"
            raise IntegrityError(
                f"conda: {package.subdir}/{package.filename} in {where} has sha256 {digest}, "
                f"{lock} locks {package.sha256}",
                fix="the channel's package changed: check the channel, "
                "or remake the lock (wheelmill conda lock --cell <cell>) if you trust it",
            )
    check_bytes(records, said=f"{lock} locks")  # each record's sha256 is the lock's now
    return records


def check_bytes(records: Sequence[RepoDataRecord], *, said: str = "its channel's repodata lists") -> None:
    """The bytes of each package of a local (``file://``) channel against its record's sha256.
    py-rattler installs a local package without hashing it: one whose bytes changed after the
    channel was indexed would be installed as it is now, or fail to unpack ("Data corruption
    detected") as if the env could not be made."""
    for record in records:
        path = local_file(record.url)
        if path is None or record.sha256 is None or not path.is_file():
            continue  # a remote package: rattler checks its sha256 as it downloads it
        found, expected = sha256_of(path), record.sha256.hex()
        if found != expected:
            raise IntegrityError(
                f"conda: {record.subdir}/{record.file_name} in {record.channel} has sha256 {found}, {said} {expected}",
                fix="the package changed after its channel was indexed: remove it and publish its wheel again "
                "(wheelmill conda package); if you trust its new bytes, run wheelmill conda index and remake the lock",
            )


def local_file(url: str) -> Path | None:
    """The file a ``file://`` URL names, or None for another scheme.

    >>> local_file("file:///srv/conda/cpu/noarch/x-1-0.conda"), local_file("https://conda.example/x-1-0.conda")
    (PosixPath('/srv/conda/cpu/noarch/x-1-0.conda'), None)
    """
    parsed = urlparse(url)
    return Path(url2pathname(parsed.path)) if parsed.scheme == "file" else None


def create(
    prefix: Path, records: Sequence[RepoDataRecord], *, cache_dir: Path, said: str = "its channel's repodata lists"
) -> None:
    """An env at ``prefix`` holding exactly ``records`` (a new one where none is: a failed
    install removes what it made of a new one, so nothing half-made is left as an env). A
    downloaded package whose sha256 is not its record's is an integrity error, named with
    both digests (``said`` names where the expected one comes from: a lock, the repodata)."""
    import rattler  # noqa: PLC0415 - see solve
    from rattler.exceptions import InstallerError, IoError, LinkError, TransactionError  # noqa: PLC0415

    new = not prefix.exists()
    try:
        asyncio.run(
            rattler.install(
                list(records),
                target_prefix=prefix,
                cache_dir=cache_dir,
                show_progress=False,
                execute_link_scripts=False,
            )
        )
    except (InstallerError, IoError, LinkError, TransactionError, OSError) as exc:
        if new:
            shutil.rmtree(prefix, ignore_errors=True)
        if mismatch := _HASH_MISMATCH.search(str(exc)):
            url, expected, found = mismatch.groups()
            raise IntegrityError(
                f"conda: {url} has sha256 {found}, {said} {expected}",
                fix="the channel's package changed after it was indexed: check the channel, and publish its wheel "
                "again there (wheelmill conda package, then wheelmill conda index)",
            ) from None
        raise EnvError(
            f"conda: cannot create the env at {prefix}: {_first(exc)}",
            fix="check the channel's packages (wheelmill conda index) and free space",
        ) from None


# rattler's words for a downloaded package whose bytes are not its record's (py-rattler 0.28)
_HASH_MISMATCH = re.compile(r"hash mismatch when extracting (\S+) to .*?expected ([0-9a-f]{64}), got ([0-9a-f]{64})")


def _first(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines[:3]) if lines else type(exc).__name__
