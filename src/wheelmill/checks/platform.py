"""The platform tag must not promise more than the binaries keep.

Every versioned symbol a binary needs from the system libraries a manylinux policy allows
(GLIBC_2.34 from libc.so.6, GLIBCXX_3.4.30 from libstdc++.so.6, ...) must be within that
policy; the policies are auditwheel's own data (PEP 600 tags), not a table written here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wheelmill.checks import CheckResult
from wheelmill.inputs.manylinux import (
    MANYLINUX_TAG,
    glibc_of,
    normalize_platform,
    oldest_glibc,
    policies,
    version_key,
)
from wheelmill.wheel.elf import ElfSummary

_VERSIONED = re.compile(r"^([A-Z]+)_(\d+(?:\.\d+)*)$")


def highest_needs(elves: Sequence[ElfSummary]) -> dict[str, str]:
    """The highest version needed per namespace (GLIBC, GLIBCXX, CXXABI, GCC)."""
    best: dict[str, str] = {}
    for elf in elves:
        for _lib, name in elf.version_needs:
            match = _VERSIONED.match(name)
            if not match:
                continue
            ns, version = match.groups()
            if ns not in best or version_key(version) > version_key(best[ns]):
                best[ns] = version
    return best


# A machine (as wheel tags and uname say it) and the ELF e_machine of its code, as pyelftools names it.
ELF_MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}
# GPU code objects shipped as files of their own (a .cubin, a .hsaco): the device-code check's business.
DEVICE_MACHINES = frozenset({"EM_CUDA", "EM_AMDGPU"})


def judge_machine(elves: Sequence[ElfSummary], machine: str, *, root: Path) -> CheckResult:
    """Every ELF file of the wheel is code for the machine the wheel is for: a library of
    another architecture (a prebuilt one a build picked up) would fail to load, and auditwheel
    tags a wheel by the first file it reads."""
    name = "elf-machine"
    wanted = ELF_MACHINES[machine]
    wrong = [elf for elf in elves if elf.machine not in {wanted, *DEVICE_MACHINES}]
    if wrong:
        shown = ", ".join(f"{_inside(elf.path, root)} ({elf.machine.removeprefix('EM_')})" for elf in wrong[:5])
        more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
        return CheckResult.failed(
            name,
            f"{len(wrong)} ELF file(s) are not {machine} code: {shown}{more}",
            f"build them for {machine}, or keep another machine's files out of the wheel",
        )
    return CheckResult.passed(name, f"{len(elves)} ELF file(s), all {machine} (or GPU code objects)")


def _inside(path: Path, root: Path) -> str:
    """A file of the wheel as the wheel names it (``thing/_C.so``), not where it was unpacked."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def judge_platform(elves: Sequence[ElfSummary], platforms: frozenset[str]) -> CheckResult:
    name = "platform-tag"
    manylinux = sorted(normalize_platform(p) for p in platforms if normalize_platform(p).startswith("manylinux_"))
    if not manylinux:
        return CheckResult.failed(
            name, f"platform {', '.join(sorted(platforms))} is not a manylinux tag", "repair the wheel with auditwheel"
        )
    shown = _shown(elves)
    for platform in manylinux:
        problem = _violations(elves, platform)
        if problem:
            return CheckResult.failed(
                name,
                f"{platform} but {problem}",
                "repair with auditwheel (it picks a tag the symbols allow), or build on an older glibc",
            )
    return CheckResult.passed(name, f"{', '.join(manylinux)}; needs at most {shown}")


def _violations(elves: Sequence[ElfSummary], platform: str) -> str | None:
    match = MANYLINUX_TAG.match(platform)
    if not match:
        return f"{platform} is not a PEP 600 tag"
    policy = policies(match.group(3)).get(f"manylinux_{match.group(1)}_{match.group(2)}")
    if policy is None:
        return f"no manylinux policy {platform} is known"
    for elf in elves:
        for lib, version in elf.version_needs:
            ns = _VERSIONED.match(version)
            allowed = policy.symbol_versions.get(ns.group(1)) if ns and lib in policy.libraries else None
            if ns and allowed is not None and ns.group(2) not in allowed:
                return f"{elf.path.name} needs {version} from {lib}"
    return None


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """What a cell's wheels promise: at most the manylinux tag of the glibc they were built on
    (a bootstrapped Debian suite's, a registry base's, this machine's)."""

    tag: str  # manylinux_2_31
    built_on: str  # the bootstrapped Debian bullseye base
    newer: str  # how to build the cell on a newer glibc, which the baseline then follows


def judge_baseline(platforms: frozenset[str], elves: Sequence[ElfSummary], baseline: Baseline) -> CheckResult:
    """Is the wheel tagged within the baseline of what it was built on? A wheel built there
    needs no newer glibc than that base has; one tagged newer carries a library from elsewhere
    (a prebuilt one, another machine's), or a tag its files do not need: either way it would
    break the promise docs/matrix.md makes for the cell, so it fails."""
    name = "glibc-baseline"
    tags = sorted(normalize_platform(p) for p in platforms if MANYLINUX_TAG.match(normalize_platform(p)))
    oldest = oldest_glibc(tags)
    if oldest is None:
        shown = ", ".join(sorted(platforms))
        return CheckResult.failed(name, f"{shown} is no manylinux tag", "repair the wheel with auditwheel")
    tag = next(t for t in tags if glibc_of(t) == oldest)
    if oldest <= glibc_of(baseline.tag):
        return CheckResult.passed(name, f"{tag} is within {baseline.tag}, the baseline of {baseline.built_on}")
    detail = f"{tag} is newer than {baseline.tag}, the baseline of {baseline.built_on}"
    needs = _beyond(elves, baseline.tag, arch=tag.split("_", 3)[3])
    if needs is None:
        return CheckResult.failed(
            name,
            f"{detail}; its files need at most {_shown(elves)}",
            f"leave the tag to auditwheel repair (no --plat): {baseline.tag} holds them",
        )
    return CheckResult.failed(
        name,
        f"{detail}: {needs}",
        f"build that file on {baseline.built_on} (a prebuilt library keeps the glibc it was built on), "
        f"or {baseline.newer}",
    )


def _beyond(elves: Sequence[ElfSummary], baseline: str, *, arch: str) -> str | None:
    """What of the wheel's files the baseline does not meet: the newest GLIBC version past its
    glibc, else a symbol its manylinux policy (where there is one) leaves out."""
    glibc = glibc_of(baseline)
    past = [
        (version_key(match.group(2)), f"{elf.path.name} needs {version} from {lib}")
        for elf in elves
        for lib, version in elf.version_needs
        if (match := _VERSIONED.match(version)) and match.group(1) == "GLIBC"
        if version_key(match.group(2))[:2] > glibc
    ]
    if past:
        return max(past)[1]
    return _violations(elves, f"{baseline}_{arch}") if baseline in policies(arch) else None


def _shown(elves: Sequence[ElfSummary]) -> str:
    needs = highest_needs(elves)
    return (
        ", ".join(f"{ns}_{v}" for ns, v in sorted(needs.items()) if ns in ("GLIBC", "GLIBCXX"))
        or "no versioned symbols"
    )
