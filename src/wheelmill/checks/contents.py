"""What is inside the wheel and what it declares: no driver or torch library bundled,
exact pins on torch and on sibling recipes, the variant's version label, the GPU arch
record, a size gate."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from wheelmill.checks import CheckResult
from wheelmill.config import format_size
from wheelmill.inputs.archs import ARCH_RECORD, ArchRecord
from wheelmill.wheel.elf import ElfSummary
from wheelmill.wheel.wheelfile import WheelInfo

# auditwheel renames grafted libraries libfoo.so.1 -> libfoo-1a2b3c4d.so.1
_GRAFT_HASH = re.compile(r"-[0-9a-f]{8}(?=\.so)")


def unhashed(name: str) -> str:
    """The library name before auditwheel's rename.

    >>> unhashed("libcuda-3f2a1b4c.so.1")
    'libcuda.so.1'
    """
    return _GRAFT_HASH.sub("", name)


def judge_bundled(elves: Sequence[ElfSummary], forbidden: Sequence[str]) -> CheckResult:
    name = "bundled-libraries"
    found = []
    for elf in elves:
        names = {unhashed(elf.path.name)} | ({unhashed(elf.dynamic.soname)} if elf.dynamic.soname else set())
        hits = sorted({pattern for pattern in forbidden for n in names if fnmatch.fnmatchcase(n, pattern)})
        if hits:
            found.append(f"{elf.path.name} (matches {', '.join(hits)})")
    if found:
        return CheckResult.failed(
            name,
            "must come from the machine, torch or the nvidia-* wheels, not the wheel: " + ", ".join(found),
            "exclude them from repair ([repair] exclude) and do not copy them into the package",
        )
    return CheckResult.passed(name, f"no driver, torch or runtime library among {len(elves)} ELF files")


def judge_pins(wheel: WheelInfo, pins: Mapping[str, str]) -> CheckResult:
    """Each pinned project appears in Requires-Dist as exactly ``==<version>``."""
    name = "requires-dist"
    if not pins:
        return CheckResult.skipped(name, "the recipe pins nothing")
    requirements = {canonicalize_name(r.name): r for r in wheel.requirements() if r.marker is None}
    problems = []
    for project, exact in pins.items():
        req = requirements.get(canonicalize_name(project))
        if req is None:
            problems.append(f"no Requires-Dist on {project}")
        elif req.specifier != SpecifierSet(f"=={exact}"):
            problems.append(f"Requires-Dist: {req} is not {project}=={exact}")
    if problems:
        return CheckResult.failed(
            name, "; ".join(problems), 'pin it exactly (the stamp step does this unless requirements.torch = "none")'
        )
    return CheckResult.passed(name, ", ".join(f"{p}=={v}" for p, v in pins.items()))


def judge_label(wheel: WheelInfo, label: str | None) -> CheckResult:
    name = "version-label"
    if label is None:
        return CheckResult.skipped(name, "the recipe keeps its version as built")
    if wheel.version.local != label:
        have = wheel.version.local or "none"
        return CheckResult.failed(
            name,
            f"version {wheel.version} carries label {have}, not {label}",
            "let the stamp step add it, or set the build's own version suffix to +" + label,
        )
    return CheckResult.passed(name, f"{wheel.version}")


def judge_size(size: int, limit: int) -> CheckResult:
    name = "wheel-size"
    if size > limit:
        return CheckResult.failed(
            name,
            f"{format_size(size)} is over the {format_size(limit)} gate",
            "build fewer archs, strip debug info, or raise checks.max-wheel-size",
        )
    return CheckResult.passed(name, f"{format_size(size)} <= {format_size(limit)}")


def judge_arch_record(wheel: WheelInfo, expected: ArchRecord) -> CheckResult:
    """The wheel says which GPUs it runs on (``gpu-archs.json``), and says it truly: what
    the index shows and ``wheelmill doctor`` checks."""
    name = "gpu-archs"
    where = f"{wheel.path.name}: {wheel.dist_info}/{ARCH_RECORD}"
    fix = (
        "rebuild it with this wheelmill: the stamp step writes the file from the recipe's arch list, "
        "and repair keeps it"
    )
    if wheel.arch_record is None:
        return CheckResult.failed(name, f"{where} is missing", fix)
    try:
        found = ArchRecord.parse(wheel.arch_record)
    except ValueError as exc:
        return CheckResult.failed(name, f"{where} is not an arch record: {exc}", fix)
    if found != expected:
        return CheckResult.failed(
            name,
            f"{where} says {found.describe()} (cell {found.cell}), "
            f"the build is {expected.describe()} (cell {expected.cell})",
            fix,
        )
    return CheckResult.passed(name, f"{expected.describe()} (cell {expected.cell})")
