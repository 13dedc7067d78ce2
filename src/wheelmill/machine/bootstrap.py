"""A builder image's base made from a Debian mirror, imported into the engine: by debootstrap
where this is root (it chroots and mounts), by mmdebstrap's unshare mode where it is not (a
user namespace maps the user's subordinate ids to the root file system's owners, so no step
needs root). Both install the same pinned suite and variant from the same mirror, and both
write the tree with ``SOURCE_DATE_EPOCH``'s times; their tarballs are not the same bytes
(each tool installs and orders a little differently), so the base each makes has its own
root file system identity, and the builder image made FROM it its own tag.
"""

from __future__ import annotations

import getpass
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wheelmill.errors import CommandFailed, PrecheckError
from wheelmill.machine.emulation import DEBIAN_ARCH
from wheelmill.machine.engine import Engine
from wheelmill.machine.process import HostRunner, StepLog, base_environment

if TYPE_CHECKING:
    from wheelmill.machine.builder_images import Base

SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"
SETUP = "run scripts/setup --system as root once (it installs debootstrap, mmdebstrap and uidmap)"


@dataclass(frozen=True, kw_only=True)
class Bootstrapper:
    """How this machine makes a base: the tool, and whether it needs root."""

    tool: str  # debootstrap | mmdebstrap
    path: str

    @property
    def rootless(self) -> bool:
        return self.tool == "mmdebstrap"

    def commands(self, base: Base, *, mirror: str, tarball: Path) -> list[list[str]]:
        """The commands that leave the base's root file system in ``tarball``."""
        variant, arch = f"--variant={base.bootstrap_variant}", DEBIAN_ARCH[base.platform]
        if self.rootless:
            return [
                [self.path, "--mode=unshare", variant, f"--architectures={arch}", str(base.suite), str(tarball), mirror]
            ]
        # another machine's suite: debootstrap runs its second stage through qemu-user
        rootfs = tarball.with_name("rootfs")
        return [
            [self.path, variant, f"--arch={arch}", str(base.suite), str(rootfs), mirror],
            ["tar", "-C", str(rootfs), "-cf", str(tarball), "."],
        ]


def bootstrapper(*, root: bool | None = None, user: str | None = None, etc: Path = Path("/etc")) -> Bootstrapper:
    """debootstrap for root, mmdebstrap's unshare mode for anyone else; a PrecheckError that
    names what is missing where neither can run."""
    root = os.geteuid() == 0 if root is None else root
    debootstrap, mmdebstrap = shutil.which("debootstrap", path=SBIN), shutil.which("mmdebstrap", path=SBIN)
    if root and debootstrap:
        return Bootstrapper(tool="debootstrap", path=debootstrap)
    if root and mmdebstrap:
        return Bootstrapper(tool="mmdebstrap", path=mmdebstrap)
    missing = _rootless_missing(mmdebstrap, user or getpass.getuser(), etc) if not root else ["debootstrap"]
    if not missing and mmdebstrap:
        return Bootstrapper(tool="mmdebstrap", path=mmdebstrap)
    raise PrecheckError(
        f"the builder image's base cannot be bootstrapped here: {'; '.join(missing)}",
        fix=f"{SETUP}, or set WHEELMILL_IMAGE_REGISTRY to a registry that holds the base, or build with --engine none",
    )


def _rootless_missing(mmdebstrap: str | None, user: str, etc: Path) -> list[str]:
    """What mmdebstrap's unshare mode lacks for ``user``: the tool, newuidmap and newgidmap
    (uidmap), and the user's subordinate ids."""
    missing = [] if mmdebstrap else ["not root, and no mmdebstrap (Debian's mmdebstrap)"]
    missing += [
        f"no {tool} (Debian's uidmap)" for tool in ("newuidmap", "newgidmap") if not shutil.which(tool, path=SBIN)
    ]
    missing += [
        f"no subordinate ids for {user} in {etc / name}"
        for name in ("subuid", "subgid")
        if not _has_ids(etc / name, user)
    ]
    return missing


def _has_ids(path: Path, user: str) -> bool:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return False
    uid = str(os.getuid())
    return any(line.split(":", 1)[0] in {user, uid} for line in lines if ":" in line)


def bootstrap_base(engine: Engine, base: Base, *, mirror: str, work: Path, log: StepLog) -> Bootstrapper:
    """Bootstrap the base suite and import it into the engine as ``base.reference``; how."""
    how = bootstrapper()
    log.note(f"bootstrapping {base.reference} with {how.tool}{' (rootless: unshare mode)' if how.rootless else ''}")
    runner, env = HostRunner(), base_environment([])
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheelmill-bootstrap-", dir=work) as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        try:
            for argv in how.commands(base, mirror=mirror, tarball=tarball):
                runner.run(argv, env=env, log=log)
            runner.run(
                engine.import_rootfs(tarball=tarball, tag=base.reference, platform=base.platform), env=env, log=log
            )
        except CommandFailed as failed:
            raise PrecheckError(
                f"bootstrapping {base.reference} with {how.tool} failed: {failed.last_line()}", fix=f"read {failed.log}"
            ) from None
    return how
