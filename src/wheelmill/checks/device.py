"""GPU device code in the wheel must be exactly what the arch list asked for.

CUDA: ``cuobjdump --list-elf/--list-ptx`` names each cubin and PTX in the embedded
fatbinary (``x.1.sm_80.cubin``). A missing arch means users of that GPU silently get no
kernel; an extra one means the list the wheel claims is not the list it carries.
ROCm: the ``.hip_fatbin`` section is a clang offload bundle whose entry ids name the gfx
targets (``hipv4-amdgcn-amd-amdhsa--gfx90a``).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from wheelmill.checks import CheckResult
from wheelmill.inputs.archs import CudaArchs, RocmArchs
from wheelmill.inputs.variants import Family
from wheelmill.machine.process import capture
from wheelmill.wheel.elf import ElfSummary

_CUBIN = re.compile(r"\.(sm_\d+[af]?)\.cubin\s*$")
_PTX = re.compile(r"\.(sm_\d+[af]?|compute_\d+[af]?)\.ptx\s*$")
_BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
_GFX = re.compile(r"--(gfx[0-9a-f]+)(?::[a-z+-]+)*$")


@dataclass(frozen=True, kw_only=True)
class DeviceCode:
    sass: frozenset[str] = field(default_factory=frozenset)
    ptx: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, kw_only=True)
class Unreadable:
    """A library whose device code could not be read: a verdict, not a crash."""

    reason: str


def find_cuobjdump(toolkit_bin: Path | None) -> Path | None:
    """cuobjdump from the toolkit, else from pip's nvidia-cuda-cuobjdump, else PATH."""
    if toolkit_bin and (toolkit_bin / "cuobjdump").is_file():
        return toolkit_bin / "cuobjdump"
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(location).glob("*/bin/cuobjdump")):
            return candidate
    found = shutil.which("cuobjdump")
    return Path(found) if found else None


def parse_listing(text: str) -> tuple[set[str], set[str]]:
    """SASS and PTX arches from cuobjdump listings.

    >>> parse_listing("ELF file    1: _C.1.sm_80.cubin\\nPTX file    1: _C.1.sm_90.ptx")
    ({'sm_80'}, {'sm_90'})
    """
    sass = {m.group(1) for line in text.splitlines() if (m := _CUBIN.search(line))}
    ptx = {m.group(1).replace("compute_", "sm_") for line in text.splitlines() if (m := _PTX.search(line))}
    return sass, ptx


def cuda_device_code(path: Path, cuobjdump: Path) -> DeviceCode | Unreadable:
    listing = ""
    for flag in ("--list-elf", "--list-ptx"):
        result = capture([cuobjdump, flag, path], timeout=120)
        if result.returncode not in (0, 255):  # 255: no code of that kind
            said = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
            return Unreadable(reason=f"cuobjdump {flag} cannot read it: {said[:200]}")
        listing += result.stdout
    sass, ptx = parse_listing(listing)
    return DeviceCode(sass=frozenset(sass), ptx=frozenset(ptx))


def judge_cuda(found: Mapping[str, DeviceCode | Unreadable], requested: CudaArchs, *, required: bool) -> CheckResult:
    name = "device-code"
    if not found:
        if required:
            return CheckResult.failed(
                name,
                "no library in the wheel carries CUDA device code",
                "check that the CUDA sources were compiled (FORCE_CUDA=1, nvcc on PATH)",
            )
        return CheckResult.skipped(name, "no CUDA device code in the wheel")
    problems = _unreadable(found)
    for lib, code in sorted(found.items()):
        if isinstance(code, DeviceCode):
            problems += _diff(lib, "SASS", code.sass, requested.sass)
            problems += _diff(lib, "PTX", code.ptx, requested.ptx)
    if problems:
        return _failed(
            name,
            requested.text,
            problems,
            found,
            "build with TORCH_CUDA_ARCH_LIST set to the requested list and no extra -gencode flags",
        )
    return CheckResult.passed(name, f"{len(found)} libraries carry exactly {requested.text}")


def _failed(name: str, requested: str, problems: list[str], found: Mapping[str, object], fix: str) -> CheckResult:
    if any(isinstance(code, Unreadable) for code in found.values()):
        fix = "rebuild it: its device code is damaged or was not made by the variant's toolkit; " + fix
    return CheckResult.failed(name, f"requested {requested}: " + "; ".join(problems), fix)


def _unreadable(found: Mapping[str, object]) -> list[str]:
    return [f"{lib}: {code.reason}" for lib, code in sorted(found.items()) if isinstance(code, Unreadable)]


def _diff(lib: str, kind: str, have: frozenset[str], want: frozenset[str]) -> list[str]:
    out = []
    if missing := sorted(want - have):
        out.append(f"{lib} lacks {kind} for {', '.join(missing)}")
    if extra := sorted(have - want):
        out.append(f"{lib} has unrequested {kind} for {', '.join(extra)}")
    return out


def rocm_targets(path: Path) -> frozenset[str] | Unreadable:
    """gfx targets in the ``.hip_fatbin`` offload bundle of a library."""
    try:
        with path.open("rb") as f:
            section = ELFFile(f).get_section_by_name(".hip_fatbin")
            data = section.data() if section is not None else b""
        return frozenset(bundle_targets(data))
    except (ELFError, struct.error, OSError) as exc:
        return Unreadable(reason=f"its .hip_fatbin is not a readable offload bundle ({exc})")


def bundle_targets(data: bytes) -> set[str]:
    """Targets of every clang offload bundle in ``data``.

    Layout: magic, u64 entry count, then per entry u64 offset, u64 size, u64 id length, id.
    """
    targets: set[str] = set()
    start = data.find(_BUNDLE_MAGIC)
    while start != -1:
        pos = start + len(_BUNDLE_MAGIC)
        (count,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        for _ in range(count):
            _offset, _size, id_len = struct.unpack_from("<QQQ", data, pos)
            pos += 24
            entry = data[pos : pos + id_len].decode("ascii", errors="replace")
            pos += id_len
            if match := _GFX.search(entry):
                targets.add(match.group(1))
        start = data.find(_BUNDLE_MAGIC, pos)
    return targets


def judge_rocm(
    found: Mapping[str, frozenset[str] | Unreadable], requested: RocmArchs, *, required: bool
) -> CheckResult:
    name = "device-code"
    if not found:
        if required:
            return CheckResult.failed(
                name, "no library in the wheel carries ROCm code objects", "check that the HIP sources were compiled"
            )
        return CheckResult.skipped(name, "no ROCm device code in the wheel")
    want = frozenset(t.split(":")[0] for t in requested.targets)
    problems = _unreadable(found)
    for lib, have in sorted(found.items()):
        if not isinstance(have, Unreadable):
            problems += _diff(lib, "code object", have, want)
    if problems:
        return _failed(name, requested.text, problems, found, "build with PYTORCH_ROCM_ARCH set to the requested list")
    return CheckResult.passed(name, f"{len(found)} libraries carry exactly {requested.text}")


def carries_cuda(elf: ElfSummary) -> bool:
    return ".nv_fatbin" in elf.sections or "__nv_relfatbin" in elf.sections


def carries_rocm(elf: ElfSummary) -> bool:
    return ".hip_fatbin" in elf.sections


def carries_device_code(elves: Sequence[ElfSummary], family: Family) -> bool:
    """Whether any library carries device code of the cell's family."""
    match family:
        case Family.CPU:
            return False
        case Family.CUDA:
            return any(carries_cuda(e) for e in elves)
        case Family.ROCM:
            return any(carries_rocm(e) for e in elves)


def scan_cuda(elves: Sequence[ElfSummary], root: Path, cuobjdump: Path) -> dict[str, DeviceCode | Unreadable]:
    return {str(e.path.relative_to(root)): cuda_device_code(e.path, cuobjdump) for e in elves if carries_cuda(e)}


def scan_rocm(elves: Sequence[ElfSummary], root: Path) -> dict[str, frozenset[str] | Unreadable]:
    return {str(e.path.relative_to(root)): rocm_targets(e.path) for e in elves if carries_rocm(e)}
