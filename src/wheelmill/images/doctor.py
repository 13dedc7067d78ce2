#!/usr/bin/env python3
"""wheelmill doctor: would the GPU code of the installed wheels run on this machine's GPUs?

Every wheel wheelmill builds records the device code it carries in its .dist-info, as
``gpu-archs.json``: ``{"arch_list": "8.0;9.0+PTX", "cell": "cuda130-py311", "family": "cuda"}``
(``null`` and ``"cpu"`` for a wheel without device code). This finds the GPUs (every one
``nvidia-smi`` lists, the GPU agents of ``rocminfo``, or the ones declared with
``--capability``/``WHEELMILL_GPU_CAPABILITY``, which win), reads the record of every
installed distribution, and says for each whether it would run, run after a JIT compile,
or fail, and why. A wheel that would fail makes the exit status ``EXIT_WOULD_FAIL``.

It uses the standard library only and runs on Python 3.9 (the oldest Python of a cell):
it is copied alone into the runtime and devel images as ``/usr/local/bin/wheelmill-doctor``
and runs there with the image's Python, where wheelmill is not installed. That is why its
dataclasses are not keyword-only (3.10) and it has no ``match``. ``wheelmill doctor`` is a
thin wrapper around the same functions.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_USAGE = 2  # wheelmill's UsageError
EXIT_WOULD_FAIL = 21  # wheelmill.errors.DoctorError: a unit test keeps the two equal
EXIT_BUG = 70  # wheelmill's InternalError
ARCH_RECORD = "gpu-archs.json"  # wheelmill.inputs.archs.ARCH_RECORD
RECORD_LIMIT = 64 * 1024  # bytes: a record is a line of some 100; beyond this it is not one
SHOWN = 80  # characters of a bad value a finding shows
CAPABILITY_VARIABLE = "WHEELMILL_GPU_CAPABILITY"
UNKNOWN = "not built by wheelmill or built before arch recording"
FIX = "install it from the slim channel for this arch or a build whose arch list includes {arch}"
TIMEOUT = 30.0

# What doctor says of a wheel: it runs, runs after a JIT compile, fails; it has no record;
# it was not checked, there being no GPU.
OK, JIT, FAILS, UNKNOWN_STATUS, NO_GPU = "ok", "jit", "fails", "unknown", "no-gpu"

_CAPABILITY = re.compile(r"^(\d+)\.(\d+)$")  # nvidia-smi's compute_cap
_GFX = re.compile(r"^(gfx[0-9a-f]{3,5})(?::[a-z]+[+-]?)*$")  # feature suffixes: gfx90a:sramecc+:xnack-
_CUDA_ITEM = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")  # TORCH_CUDA_ARCH_LIST's items
_GPU_LABEL = re.compile(r"^(cu\d+|rocm[\d.]*)$")  # the local version label of a GPU build: +cu130, +rocm6.2
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_AGENT = re.compile(r"^\s*Agent\s+\d+\s*$", re.MULTILINE)
_FAILED = re.compile(r"^\S+ failed \(exit -?\d+\): ")
_GPU_INDEX = re.compile(r"^\d+$")  # the first field of a row of nvidia-smi's GPU list


class Problem(Exception):
    """A declared capability that is none: the command line's fault (exit ``EXIT_USAGE``)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class Gpu:
    family: str  # cuda | rocm
    arch: str  # 8.6 | gfx90a
    name: str = ""  # NVIDIA A10; empty where declared
    index: str = ""  # 0, or 0,1 for identical GPUs; empty where declared
    declared_by: str = ""  # --capability | WHEELMILL_GPU_CAPABILITY

    @property
    def label(self) -> str:
        """What the output calls it: ``GPU 0 (NVIDIA A10, 8.6)``, ``declared 8.6 (--capability)``."""
        if self.declared_by:
            return f"declared {self.arch} ({self.declared_by})"
        named = f"{self.name}, " if self.name else ""
        return f"GPU{'s' if ',' in self.index else ''} {self.index} ({named}{self.arch})"


@dataclass(frozen=True)
class Gpus:
    """The GPUs to check against, and why a tool that was asked found none."""

    found: tuple[Gpu, ...]
    notes: tuple[str, ...]


def declared(text: str, source: str) -> Gpus:
    """GPUs given as capabilities: ``8.6``, ``gfx90a``, or several (``8.6,9.0``).

    >>> [g.label for g in declared("8.6, gfx90a:xnack-", "--capability").found]
    ['declared 8.6 (--capability)', 'declared gfx90a (--capability)']
    """
    gpus = [_declared_one(item, source) for item in re.split(r"[,;\s]+", text.strip()) if item]
    if not gpus:
        raise Problem(f"{source} is empty", fix="give a CUDA compute capability (8.6) or a ROCm gfx name (gfx90a)")
    return Gpus(found=tuple(gpus), notes=())


def _declared_one(item: str, source: str) -> Gpu:
    cuda, rocm = _CAPABILITY.match(item), _GFX.match(item)
    if cuda:
        return Gpu(family="cuda", arch=f"{int(cuda.group(1))}.{int(cuda.group(2))}", declared_by=source)
    if rocm:
        return Gpu(family="rocm", arch=rocm.group(1), declared_by=source)
    raise Problem(
        f"{source}: {item!r} is no GPU capability",
        fix="give a CUDA compute capability as nvidia-smi's compute_cap shows it (8.6) or a ROCm gfx name (gfx90a)",
    )


def visible() -> Gpus:
    """Every GPU nvidia-smi and rocminfo list (either may be missing or fail)."""
    gpus: list[Gpu] = []
    notes: list[str] = []
    for argv, parse in (
        (["nvidia-smi", "--query-gpu=index,name,compute_cap", "--format=csv,noheader"], parse_nvidia_smi),
        (["rocminfo"], parse_rocminfo),
    ):
        text, note = _query(argv)
        found, said = parse(text) if text is not None else ([], [note or ""])
        gpus += found
        notes += said
    return Gpus(found=tuple(_merged(gpus)), notes=tuple(n for n in notes if n))


def _query(argv: list[str]) -> tuple[str | None, str | None]:
    """A tool's output, or why there is none."""
    program = shutil.which(argv[0])
    if program is None:
        return None, f"{argv[0]} not found"
    try:
        done = subprocess.run([program, *argv[1:]], capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{argv[0]} did not answer ({exc})"
    if done.returncode != 0:
        said = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        return None, failed(argv[0], done.returncode, said[-1] if said else "no output")
    return done.stdout, None


def failed(tool: str, code: int, said: str) -> str:
    """The note of a GPU tool that is there but failed: what it printed, on one line."""
    return f"{tool} failed (exit {code}): {' '.join(said.split())[: SHOWN * 2]}"


def tool_failed(note: str) -> bool:
    """Whether a note is a tool's failure (``failed``), not its absence or an odd GPU.

    >>> tool_failed(failed("nvidia-smi", 0, "Failed to initialize NVML")), tool_failed("rocminfo not found")
    (True, False)
    """
    return _FAILED.match(note) is not None


def parse_nvidia_smi(text: str) -> tuple[list[Gpu], list[str]]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,compute_cap --format=csv,noheader``.

    A line that is no row is nvidia-smi's own complaint: with a driver whose kernel module
    and library disagree it prints "Failed to initialize NVML: Driver/library version
    mismatch" and, some versions, exits 0. With no row it failed, and the note says what it
    printed; beside rows, a complaint is of one GPU, noted, and the rest are listed.

    >>> gpus, notes = parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, 9.0\\n1, NVIDIA A10, [N/A]\\n")
    >>> [g.label for g in gpus], notes  # doctest: +NORMALIZE_WHITESPACE
    (['GPU 0 (NVIDIA H100 80GB HBM3, 9.0)'],
     ["nvidia-smi: GPU 1 (NVIDIA A10) has no compute capability ('[N/A]'): declare it with --capability"])
    >>> parse_nvidia_smi("Failed to initialize NVML: Driver/library version mismatch\\nNVML library version: 580.95")
    ... # doctest: +NORMALIZE_WHITESPACE
    ([], ['nvidia-smi failed (exit 0): Failed to initialize NVML: Driver/library version mismatch
           / NVML library version: 580.95'])
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    rows = [line for line in lines if _GPU_INDEX.match(line.partition(",")[0].strip())]
    complaints = [line for line in lines if line not in rows]
    if complaints and not rows:
        return [], [failed("nvidia-smi", 0, " / ".join(complaints))]
    gpus: list[Gpu] = []
    notes = [f"nvidia-smi: {line}" for line in complaints]  # of one GPU (fallen off the bus): the rest are listed
    for line in rows:
        index, _, rest = line.partition(",")
        name, _, capability = rest.rpartition(",")  # a name with a comma in it stays whole
        index, name, capability = index.strip(), name.strip(), capability.strip()
        if _CAPABILITY.match(capability):
            gpus.append(Gpu(family="cuda", arch=capability, name=name, index=index))
        else:
            notes.append(
                f"nvidia-smi: GPU {index} ({name}) has no compute capability ({capability!r}): "
                "declare it with --capability"
            )
    return gpus, notes


def parse_rocminfo(text: str) -> tuple[list[Gpu], list[str]]:
    """The GPU agents of ``rocminfo``: an agent's first ``Name:`` is its gfx target (the
    ISA names further down repeat it with the feature suffixes)."""
    gpus: list[Gpu] = []
    for block in _AGENT.split(text)[1:]:
        name = re.search(r"^\s*Name:\s*(\S+)", block, re.MULTILINE)
        kind = re.search(r"^\s*Device Type:\s*(\S+)", block, re.MULTILINE)
        marketing = re.search(r"^\s*Marketing Name:\s*(.*?)\s*$", block, re.MULTILINE)
        target = _GFX.match(name.group(1)) if name else None
        if kind and kind.group(1) == "GPU" and target:
            gpus.append(
                Gpu(
                    family="rocm",
                    arch=target.group(1),
                    name=marketing.group(1) if marketing else "",
                    index=str(len(gpus)),
                )
            )
    return gpus, ([] if gpus else ["rocminfo lists no GPU agent"])


def _merged(gpus: Sequence[Gpu]) -> list[Gpu]:
    """Identical GPUs once (eight H100s are one verdict), their indexes together."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for gpu in gpus:
        groups.setdefault((gpu.family, gpu.arch, gpu.name), []).append(gpu.index)
    return [
        Gpu(family=family, arch=arch, name=name, index=",".join(indexes))
        for (family, arch, name), indexes in groups.items()
    ]


@dataclass(frozen=True)
class Record:
    """A wheel's ``gpu-archs.json`` (what ``wheelmill.inputs.archs.ArchRecord`` writes)."""

    family: str  # cuda | rocm | cpu
    arch_list: str | None
    cell: str

    def describe(self) -> str:
        return f"{self.family} {self.arch_list}" if self.arch_list else self.family


def parse_record(text: str) -> Record:
    """The record in ``text``; ValueError, saying what is wrong, for anything else.

    >>> parse_record('{"arch_list": "8.0;9.0+PTX", "cell": "cuda130-py311", "family": "cuda"}').describe()
    'cuda 8.0;9.0+PTX'
    """
    if len(text) > RECORD_LIMIT:
        raise ValueError(f"{len(text)} characters, more than a record has ({RECORD_LIMIT})")
    value: Any = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")  # noqa: TRY004 - bad data, caught with bad JSON as ValueError
    family, arch_list, cell = value.get("family"), value.get("arch_list"), value.get("cell")
    if family not in ("cuda", "rocm", "cpu") or not isinstance(cell, str):
        raise ValueError(f"family {_shown(family)} is not cuda, rocm or cpu, or cell {_shown(cell)} is not a string")
    if (family == "cpu") != (arch_list is None) or not isinstance(arch_list, (str, type(None))):
        raise ValueError(f"arch_list {_shown(arch_list)} does not fit family {_shown(family)}")
    if family == "cuda":
        cuda_codes(str(arch_list))
    elif family == "rocm":
        rocm_targets(str(arch_list))
    return Record(family=family, arch_list=arch_list, cell=cell)


def _shown(value: object) -> str:
    """A bad value as a finding shows it: its repr, cut to ``SHOWN`` characters."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


@dataclass(frozen=True)
class Code:
    """One piece of CUDA device code: SASS (``sm_86``) or PTX (``compute_86``)."""

    ptx: bool
    major: int
    minor: int
    suffix: str  # "", "a" (arch-specific) or "f" (family-specific)

    @property
    def name(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.major}{self.minor}{self.suffix}"

    def runs_on(self, major: int, minor: int) -> bool:
        """CUDA's compatibility rules: SASS runs within its major at the same or a higher
        minor (binary compatibility), PTX is JIT-compiled for any capability at least its
        own; an arch-specific one (``a``) runs only on exactly its arch, a family one
        (``f``) within its major at the same or a higher minor."""
        if self.suffix == "a":
            return (major, minor) == (self.major, self.minor)
        if self.ptx and not self.suffix:
            return (major, minor) >= (self.major, self.minor)
        return major == self.major and minor >= self.minor


def cuda_codes(arch_list: str) -> list[Code]:
    """The SASS and PTX a ``TORCH_CUDA_ARCH_LIST`` asks for (``+PTX``: PTX too).

    >>> [c.name for c in cuda_codes("8.0;9.0a;12.0+PTX")]
    ['sm_80', 'sm_90a', 'sm_120', 'compute_120']
    """
    codes = []
    for item in (item for item in re.split(r"[;,\s]+", arch_list.strip()) if item):
        found = _CUDA_ITEM.match(item)
        if not found:
            raise ValueError(f"{_shown(item)} is not a CUDA arch")
        major, minor, suffix = int(found.group(1)), int(found.group(2)), found.group(3)
        codes.append(Code(ptx=False, major=major, minor=minor, suffix=suffix))
        if found.group(4):
            codes.append(Code(ptx=True, major=major, minor=minor, suffix=suffix))
    if not codes:
        raise ValueError("empty CUDA arch list")
    return codes


def rocm_targets(arch_list: str) -> set[str]:
    """The gfx targets of a ``PYTORCH_ROCM_ARCH``, without feature suffixes."""
    targets = set()
    for item in (item for item in re.split(r"[;,\s]+", arch_list.strip()) if item):
        found = _GFX.match(item)
        if not found:
            raise ValueError(f"{_shown(item)} is not a ROCm target")
        targets.add(found.group(1))
    if not targets:
        raise ValueError("empty ROCm arch list")
    return targets


@dataclass(frozen=True)
class Prediction:
    """What doctor predicts of one wheel on one GPU (the GPU stage checks it against what the
    kernels do)."""

    status: str  # OK | JIT | FAILS
    detail: str


def predict(record: Record, gpu: Gpu) -> Prediction:
    if record.family == "cpu":
        return Prediction(status=OK, detail="no GPU code: runs anywhere")
    if record.family != gpu.family:
        return Prediction(
            status=FAILS, detail=f"{gpu.label} is a {gpu.family.upper()} GPU; the wheel carries {record.describe()}"
        )
    if gpu.family == "cuda":
        return _predict_cuda(record, gpu)
    return _predict_rocm(record, gpu)


def _predict_cuda(record: Record, gpu: Gpu) -> Prediction:
    major, minor = (int(part) for part in gpu.arch.split("."))
    codes = cuda_codes(record.arch_list or "")
    sass = [c for c in codes if not c.ptx and c.runs_on(major, minor)]
    if sass:
        best = max(sass, key=lambda c: (c.minor, c.suffix))  # the nearest: sm_86 over sm_80 on 8.6
        return Prediction(status=OK, detail=f"{best.name} SASS on {gpu.label}")
    ptx = [c for c in codes if c.ptx and c.runs_on(major, minor)]
    if ptx:
        best = max(ptx, key=lambda c: (c.major, c.minor))
        return Prediction(
            status=JIT,
            detail=f"no SASS for {gpu.arch}: the driver JIT-compiles its {best.name} PTX on {gpu.label}, "
            "a slower first start",
        )
    other = f"SASS for {major}.0 to {gpu.arch} or " if minor else ""
    return Prediction(
        status=FAILS,
        detail=f"{gpu.label}: the wheel carries {record.describe()}, which lacks sm_{major}{minor} "
        f"({other}PTX for {gpu.arch} or lower would also run)",
    )


def _predict_rocm(record: Record, gpu: Gpu) -> Prediction:
    if gpu.arch in rocm_targets(record.arch_list or ""):
        return Prediction(status=OK, detail=f"{gpu.arch} code object on {gpu.label}")
    return Prediction(
        status=FAILS,
        detail=f"{gpu.label}: the wheel carries {record.describe()}, which lacks {gpu.arch} "
        "(a ROCm code object runs only on its exact gfx target)",
    )


@dataclass(frozen=True)
class Installed:
    """A distribution of the interpreter, and its arch record if it has one."""

    name: str
    version: str
    record: Record | None
    problem: str | None  # why a record that is there cannot be read
    gpu_related: bool  # it may carry GPU code: torch, requires torch, or a +cuXXX/+rocmX.Y label


def installed(paths: Sequence[str] = ()) -> list[Installed]:
    """Every distribution on ``paths`` (default: this interpreter's path), the first of a
    name only (the one that imports), by name; then every wheel file in ``paths`` (a dist/
    folder), each on its own, by file name."""
    found: dict[str, Installed] = {}
    dists = importlib.metadata.distributions(path=list(paths)) if paths else importlib.metadata.distributions()
    for dist in dists:
        name = dist.metadata["Name"] if "Name" in dist.metadata else None  # noqa: SIM401 - PackageMetadata's get() is typed from 3.12 on
        if name and _canonical(name) not in found:
            found[_canonical(name)] = _installed(dist, name)
    files = sorted(wheel for path in paths for wheel in Path(path).glob("*.whl") if wheel.is_file())
    return [found[key] for key in sorted(found)] + [_wheel_file(wheel) for wheel in files]


def _wheel_file(wheel: Path) -> Installed:
    """A wheel file read in place, as its installed distribution would be (its name in the
    output is the file's: a folder may hold builds of one version for several cells)."""
    try:
        with zipfile.ZipFile(wheel) as archive:  # closed once read: _installed reads all it needs
            infos = sorted({n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/METADATA")})
            if len(infos) != 1:
                problem = f"not a wheel: {len(infos)} .dist-info/METADATA files"
                return Installed(name=wheel.name, version="", record=None, problem=problem, gpu_related=True)
            dist = importlib.metadata.PathDistribution(zipfile.Path(archive, at=f"{infos[0]}/"))
            name = dist.metadata["Name"] if "Name" in dist.metadata else wheel.name  # noqa: SIM401 - as in installed()
            found = _installed(dist, name)
    except (OSError, zipfile.BadZipFile) as exc:
        return Installed(name=wheel.name, version="", record=None, problem=f"not a wheel: {exc}", gpu_related=True)
    return Installed(
        name=wheel.name, version="", record=found.record, problem=found.problem, gpu_related=found.gpu_related
    )


def _installed(dist: importlib.metadata.Distribution, name: str) -> Installed:
    version = dist.metadata["Version"] if "Version" in dist.metadata else "(no version)"  # noqa: SIM401 - as for Name
    requires = {_canonical(m.group(1)) for m in (_NAME.match(r) for r in dist.requires or []) if m}
    related = _canonical(name) == "torch" or "torch" in requires or bool(_GPU_LABEL.match(version.partition("+")[2]))
    try:
        text = dist.read_text(ARCH_RECORD)
        record = parse_record(text) if text is not None else None
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return Installed(
            name=name, version=version, record=None, problem=f"its {ARCH_RECORD} is unreadable: {exc}", gpu_related=True
        )
    return Installed(name=name, version=version, record=record, problem=None, gpu_related=related or record is not None)


def _canonical(name: str) -> str:
    """PEP 503's normalized name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Finding:
    """What doctor says of one wheel."""

    name: str
    version: str
    status: str  # OK | JIT | FAILS | UNKNOWN_STATUS | NO_GPU
    detail: str
    fix: str | None
    record: Record | None

    def line(self) -> str:
        said = {
            OK: f"ok ({self.detail})",
            JIT: f"ok, will JIT ({self.detail})",
            FAILS: f"FAILS: {self.detail}; fix: {self.fix}",
        }
        what = f"{self.name} {self.version}" if self.version else self.name  # a wheel file: its name says both
        return f"{what}: {said.get(self.status, self.detail)}"


def examine(wheel: Installed, gpus: Sequence[Gpu]) -> Finding:
    record = wheel.record
    if record is None:
        detail = f"unknown ({wheel.problem or UNKNOWN})"
        return Finding(
            name=wheel.name, version=wheel.version, status=UNKNOWN_STATUS, detail=detail, fix=None, record=None
        )
    if not gpus:
        detail = "no GPU code: runs anywhere" if record.family == "cpu" else f"carries {record.describe()}"
        return Finding(name=wheel.name, version=wheel.version, status=NO_GPU, detail=detail, fix=None, record=record)
    verdicts = [(gpu, predict(record, gpu)) for gpu in gpus]
    status = next(s for s in (FAILS, JIT, OK) if any(v.status == s for _, v in verdicts))
    chosen = [(gpu, v) for gpu, v in verdicts if v.status == status]
    fix = FIX.format(arch=" and ".join(gpu.arch for gpu, _ in chosen)) if status == FAILS else None
    detail = "; ".join(dict.fromkeys(v.detail for _, v in chosen))
    return Finding(name=wheel.name, version=wheel.version, status=status, detail=detail, fix=fix, record=record)


@dataclass(frozen=True)
class Report:
    gpus: Gpus
    findings: tuple[Finding, ...]
    unlisted: int  # distributions with no sign of GPU code, not listed

    @property
    def exit_code(self) -> int:
        return EXIT_WOULD_FAIL if self.failing else EXIT_OK

    @property
    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAILS]

    def count(self, *statuses: str) -> int:
        return sum(1 for f in self.findings if f.status in statuses)

    def summary(self) -> str:
        others = (
            f"; {self.unlisted} other distribution(s) show no sign of GPU code (--all lists them)"
            if self.unlisted
            else ""
        )
        unknown = self.count(UNKNOWN_STATUS)
        if not self.gpus.found:
            carrying = sum(1 for f in self.findings if f.record is not None and f.record.family != "cpu")
            return f"summary: no GPU to check against; {carrying} wheel(s) carry GPU code, {unknown} unknown{others}"
        jit = f" ({self.count(JIT)} by JIT)" if self.count(JIT) else ""
        return (
            f"summary: {len(self.failing)} would fail, {self.count(OK, JIT)} would run{jit}, {unknown} unknown{others}"
        )

    def failure(self) -> tuple[str, str] | None:
        """One line of what would fail and one of the fix; None when nothing would."""
        if not self.failing:
            return None
        names = ", ".join(f"{f.name} {f.version}" for f in self.failing)
        return f"{len(self.failing)} installed wheel(s) would not run on this machine's GPU: {names}", str(
            self.failing[0].fix
        )


def report(gpus: Gpus, wheels: Iterable[Installed], *, list_all: bool = False) -> Report:
    wheels = list(wheels)
    listed = [w for w in wheels if list_all or w.gpu_related]
    findings = tuple(examine(w, gpus.found) for w in listed)
    return Report(gpus=gpus, findings=findings, unlisted=len(wheels) - len(listed))


def format_report(result: Report) -> str:
    """The report as lines: the GPUs, one line a wheel, the summary."""
    if result.gpus.found:
        lines = [f"checking against {', '.join(g.label for g in result.gpus.found)}"]
    else:
        why = "; ".join(result.gpus.notes) or "none found"
        lines = [
            (
                f"no GPU visible ({why}) and none declared: nothing to check against "
                f"(declare one: --capability 8.6, or {CAPABILITY_VARIABLE}=gfx90a)"
            )
        ]
    lines += [f"note: {note}" for note in result.gpus.notes if result.gpus.found]
    lines += [f.line() for f in result.findings]
    lines.append(result.summary())
    return "\n".join(lines) + "\n"


def as_json(result: Report) -> str:
    wheels = [
        {
            "name": f.name,
            "version": f.version,
            "status": f.status,
            "detail": f.detail,
            "fix": f.fix,
            "gpu_archs": asdict(f.record) if f.record else None,
        }
        for f in result.findings
    ]
    gpus = [
        {"family": g.family, "arch": g.arch, "name": g.name, "index": g.index, "label": g.label}
        for g in result.gpus.found
    ]
    data = {
        "gpus": gpus,
        "notes": list(result.gpus.notes),
        "wheels": wheels,
        "summary": result.summary(),
        "exit_code": result.exit_code,
    }
    return json.dumps(data, indent=1) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``wheelmill doctor`` and of ``wheelmill-doctor`` alike."""
    parser.add_argument(
        "--capability",
        action="append",
        metavar="ARCH",
        help="check against this GPU, not the visible ones: a CUDA compute capability (8.6) or gfx name (gfx90a); "
        f"repeatable; default ${CAPABILITY_VARIABLE}",
    )
    parser.add_argument(
        "--path",
        action="append",
        metavar="DIR",
        help="scan the distributions installed in this directory, and the .whl files in it, instead of this "
        "Python's (repeatable)",
    )
    parser.add_argument(
        "--all", action="store_true", help="list every distribution, not only those that may carry GPU code"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object, for machines")


def run(args: argparse.Namespace, environ: Mapping[str, str]) -> Report:
    """Find the GPUs (the declared ones win), scan the distributions, judge each."""
    missing = [path for path in args.path or () if not Path(path).is_dir()]
    if missing:
        raise Problem(
            f"--path {missing[0]}: no such directory",
            fix="give a site-packages directory (python -c 'import site; print(site.getsitepackages())')",
        )
    if args.capability:
        gpus = declared(",".join(args.capability), "--capability")
    elif environ.get(CAPABILITY_VARIABLE, "").strip():
        gpus = declared(environ[CAPABILITY_VARIABLE], CAPABILITY_VARIABLE)
    else:
        gpus = visible()
    found = installed(args.path or ())
    if args.path and not found:
        raise Problem(
            f"--path {', '.join(args.path)}: no installed distribution and no .whl file in it",
            fix="give a site-packages directory or a folder of wheels (dist/)",
        )
    return report(gpus, found, list_all=args.all)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="wheelmill-doctor", description="Would the GPU code of the installed wheels run on this machine's GPUs?"
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        result = run(args, os.environ)
    except Problem as exc:
        print(f"wheelmill-doctor: error: {exc.message}; fix: {exc.fix}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - alone in an image there is no wheelmill boundary: one line, never a traceback
        print(
            f"wheelmill-doctor: error: internal error: {type(exc).__name__}: {exc}; "
            "fix: this is a bug in wheelmill-doctor: report this line",
            file=sys.stderr,
        )
        return EXIT_BUG
    sys.stdout.write(as_json(result) if args.json else format_report(result))
    failure = result.failure()
    if failure is not None:
        print(f"wheelmill-doctor: error: {failure[0]}; fix: {failure[1]}", file=sys.stderr)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
