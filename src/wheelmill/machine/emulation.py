"""Running another machine's code here: which machine this is, how each platform is named
by Debian and by the engines, and whether the kernel runs aarch64 code through qemu-user
(binfmt_misc), which is how an x86_64 machine builds and tests aarch64 wheels in a container.
"""

from __future__ import annotations

import platform
from enum import StrEnum
from pathlib import Path

from wheelmill.inputs.variants import AARCH64, X86_64

# What Debian (debootstrap --arch) and the engines (--platform) call each machine.
DEBIAN_ARCH = {X86_64: "amd64", AARCH64: "arm64"}
OCI_PLATFORM = {X86_64: "linux/amd64", AARCH64: "linux/arm64"}
BINFMT = Path("/proc/sys/fs/binfmt_misc")
# The binfmt_misc entry of each machine, as Debian's qemu-user-static registers it.
QEMU_ENTRY = {X86_64: "qemu-x86_64", AARCH64: "qemu-aarch64"}


class Execution(StrEnum):
    NATIVE = "native"
    EMULATED = "emulated"  # qemu-user, through binfmt_misc


def host_machine() -> str:
    """This machine, as wheel platform tags name it (``uname -m``)."""
    return platform.machine()


def execution(target: str, host: str | None = None) -> Execution:
    """How code for ``target`` runs here."""
    return Execution.NATIVE if target == (host or host_machine()) else Execution.EMULATED


def emulation_problem(target: str, binfmt: Path = BINFMT) -> str | None:
    """Why this machine cannot run ``target`` code in a container, or None where it can: the
    kernel must hand such programs to qemu-user, with the interpreter opened when registered
    (flag F), so that it works inside a container that does not have it."""
    entry = binfmt / QEMU_ENTRY.get(target, f"qemu-{target}")
    if not (binfmt / "status").exists():
        return f"binfmt_misc is not mounted at {binfmt}"
    if not entry.exists():
        return f"no qemu-user emulation of {target} is registered ({entry} is missing)"
    text = entry.read_text(errors="replace")
    if not text.startswith("enabled"):
        return f"the emulation of {target} is registered but disabled ({entry})"
    flags = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("flags:")), "")
    if "F" not in flags:
        return f"the emulation of {target} lacks flag F ({entry}), so containers cannot reach its interpreter"
    return None


def emulation_fix(target: str) -> str:
    return (
        f"run scripts/setup --system as root (it registers qemu-user-static's {QEMU_ENTRY.get(target, target)}), "
        f"or build on a {target} machine"
    )
