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


def foreign_platform(machine: str) -> str | None:
    """The OCI platform (``linux/arm64``) an engine must be told for an image of ``machine``;
    None for x86_64, the engines' own default."""
    return None if machine == X86_64 else OCI_PLATFORM[machine]


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


# Where Linux describes the CPUs, and the identification register of the aarch64 CPU that a
# stand-in reports: Neoverse V2, the Grace CPU (implementer 0x41 Arm, part 0xd4f).
CPU_SYSFS = Path("/sys/devices/system/cpu")
GRACE_MIDR = "0x00000000410fd4f0"


def cpu_standin(directory: Path, host: Path = CPU_SYSFS) -> Path:
    """A stand-in of ``/sys/devices/system/cpu`` for aarch64 code under qemu-user, which
    sees this machine's sysfs: the host's CPU lists (``online``, ``possible``, ``present``),
    and each CPU's identification registers as an aarch64 kernel exposes them. Libraries
    that read MIDR_EL1 there when they load (oneDNN's xbyak_aarch64 in torch 2.11 and newer)
    crash without it; with it they take the CPU for a Grace's."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("online", "possible", "present", "kernel_max"):
        if (host / name).is_file():
            (directory / name).write_text((host / name).read_text())
    online = (host / "online").read_text().strip() if (host / "online").is_file() else "0"
    for cpu in _cpus(online):
        registers = directory / f"cpu{cpu}" / "regs" / "identification"
        registers.mkdir(parents=True, exist_ok=True)
        (registers / "midr_el1").write_text(GRACE_MIDR + "\n")
        (registers / "revidr_el1").write_text("0x0000000000000000\n")
    return directory


def emulated_cpu(target: str, directory: Path) -> Path | None:
    """The CPU stand-in (made in ``directory``) that ``target`` code run here needs: for
    aarch64 under emulation; None where the code runs natively."""
    if target != AARCH64 or execution(target) is Execution.NATIVE:
        return None
    return cpu_standin(directory)


def _cpus(ranges: str) -> list[int]:
    """``0-3,6`` -> [0, 1, 2, 3, 6], as sysfs lists CPUs.

    >>> _cpus("0-3,6"), _cpus("0")
    ([0, 1, 2, 3, 6], [0])
    """
    found: list[int] = []
    for part in filter(None, ranges.split(",")):
        first, _, last = part.partition("-")
        found += range(int(first), int(last or first) + 1)
    return found
