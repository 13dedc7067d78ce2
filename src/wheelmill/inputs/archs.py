"""GPU arch lists as values: ``TORCH_CUDA_ARCH_LIST`` and ``PYTORCH_ROCM_ARCH``.

An arch list says which device code a wheel must carry: SASS (cubin) for every listed CUDA
arch, and PTX for those marked ``+PTX`` (PyTorch's own notation), or one code object per
ROCm gfx target. Every wheel wheelmill builds records the list it carries in
``<name>-<version>.dist-info/gpu-archs.json`` (``ArchRecord``): the index shows it, and
``wheelmill doctor`` checks it against the GPUs of a machine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from wheelmill.inputs.variants import Family

_CUDA_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")
_ROCM_ARCH = re.compile(r"^gfx[0-9a-f]{3,5}(:[a-z+-]+)?$")


@dataclass(frozen=True, kw_only=True)
class CudaArchs:
    """The device code a CUDA arch list asks for, as cuobjdump names it (``sm_90a``).

    >>> a = CudaArchs.parse("8.0;9.0+PTX")
    >>> sorted(a.sass), sorted(a.ptx)
    (['sm_80', 'sm_90'], ['sm_90'])
    >>> CudaArchs.parse("7.5 8.6").text
    '7.5;8.6'
    """

    sass: frozenset[str]
    ptx: frozenset[str]
    text: str

    @classmethod
    def parse(cls, text: str) -> CudaArchs:
        items = [item for item in re.split(r"[;,\s]+", text.strip()) if item]
        if not items:
            raise ValueError("empty CUDA arch list")
        _unique([item.removesuffix("+PTX") for item in items])
        sass: set[str] = set()
        ptx: set[str] = set()
        for item in items:
            match = _CUDA_ARCH.match(item)
            if not match:
                raise ValueError(f"{item!r} is not a CUDA arch (write 8.0, 9.0a or 12.0+PTX)")
            name = f"sm_{match.group(1)}{match.group(2)}{match.group(3)}"
            sass.add(name)
            if match.group(4):
                ptx.add(name)
        return cls(sass=frozenset(sass), ptx=frozenset(ptx), text=";".join(items))


@dataclass(frozen=True, kw_only=True)
class RocmArchs:
    """A ``PYTORCH_ROCM_ARCH`` list.

    >>> sorted(RocmArchs.parse("gfx90a;gfx942").targets)
    ['gfx90a', 'gfx942']
    """

    targets: frozenset[str]
    text: str

    @classmethod
    def parse(cls, text: str) -> RocmArchs:
        items = [item for item in re.split(r"[;,\s]+", text.strip()) if item]
        if not items:
            raise ValueError("empty ROCm arch list")
        _unique(items)
        for item in items:
            if not _ROCM_ARCH.match(item):
                raise ValueError(f"{item!r} is not a ROCm target (write gfx90a, gfx942)")
        return cls(targets=frozenset(items), text=";".join(items))


GpuArchs = CudaArchs | RocmArchs


def parse_archs(family: Family, text: str | None) -> GpuArchs | None:
    """The arch list a build of ``family`` reads, parsed; None for the CPU, or no list.

    >>> parse_archs(Family.CUDA, "8.0;9.0+PTX").text, parse_archs(Family.CPU, None)
    ('8.0;9.0+PTX', None)
    """
    if text is None or family is Family.CPU:
        return None
    return CudaArchs.parse(text) if family is Family.CUDA else RocmArchs.parse(text)


def _unique(items: list[str]) -> None:
    """An arch listed twice is a typo (or a merge gone wrong), never intended."""
    twice = sorted({item for item in items if items.count(item) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} listed more than once")


def arch_tag(arch: str) -> str:
    """One arch's short name, as slim variants, channels and wheel labels carry it.

    >>> arch_tag("9.0"), arch_tag("10.0"), arch_tag("9.0a"), arch_tag("gfx942")
    ('sm90', 'sm100', 'sm90a', 'gfx942')
    """
    if arch.startswith("gfx"):
        return RocmArchs.parse(arch).text
    (name,) = CudaArchs.parse(arch).sass
    return name.replace("_", "")


ARCH_RECORD = "gpu-archs.json"  # in the wheel's .dist-info; wheelmill.images.doctor reads it by this name
_RECORD_KEYS = frozenset({"family", "arch_list", "cell"})


@dataclass(frozen=True, kw_only=True)
class ArchRecord:
    """What a wheel's ``gpu-archs.json`` says: the family of device code it carries, its
    arch list (normalized; None for cpu) and the cell that built it.

    >>> record = ArchRecord.of_build(Family.CUDA, "8.0 9.0+PTX", "cuda130-py311", device_code=True)
    >>> record.to_bytes()
    b'{"arch_list": "8.0;9.0+PTX", "cell": "cuda130-py311", "family": "cuda"}\\n'
    >>> ArchRecord.parse(record.to_bytes()).describe()
    'cuda 8.0;9.0+PTX'
    >>> ArchRecord.of_build(Family.CUDA, "8.0", "cuda130-py311", device_code=False).describe()
    'cpu'
    """

    family: Family
    arch_list: str | None
    cell: str

    @classmethod
    def of_build(cls, family: Family, arch_list: str | None, cell: str, *, device_code: bool) -> ArchRecord:
        """The record of a wheel built in ``cell``. One that carries no device code (C++
        operators built in a CUDA cell) is recorded as cpu: it runs on any GPU, or none,
        and ``wheelmill doctor`` must not fail it for a list it does not use."""
        if family is Family.CPU or not device_code:
            return cls(family=Family.CPU, arch_list=None, cell=cell)
        return cls(family=family, arch_list=_normalized(family, arch_list or ""), cell=cell)

    @classmethod
    def parse(cls, data: bytes) -> ArchRecord:
        """The record in ``data``; ValueError (saying what is wrong) for anything else."""
        try:
            value: Any = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError("not UTF-8") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg}, line {exc.lineno})") from None
        if not isinstance(value, dict) or set(value) != _RECORD_KEYS:
            raise ValueError(f"not an object with exactly the keys {', '.join(sorted(_RECORD_KEYS))}")
        family, arch_list, cell = value["family"], value["arch_list"], value["cell"]
        if family not in {f.value for f in Family}:
            raise ValueError(f"family {family!r} is not cpu, cuda or rocm")
        if not isinstance(cell, str):
            raise ValueError(f"cell {cell!r} is not a string")  # noqa: TRY004 - bad data, caught with bad JSON as ValueError
        if (family == Family.CPU) != (arch_list is None) or not isinstance(arch_list, str | None):
            raise ValueError(
                f"arch_list {arch_list!r} does not fit family {family} (null for cpu, a list for cuda and rocm)"
            )
        text = None if arch_list is None else _normalized(Family(family), arch_list)
        return cls(family=Family(family), arch_list=text, cell=cell)

    def to_bytes(self) -> bytes:
        """Sorted keys, one line: the same record is always the same bytes (reproducible wheels)."""
        data = {"family": self.family.value, "arch_list": self.arch_list, "cell": self.cell}
        return (json.dumps(data, sort_keys=True, indent=None) + "\n").encode()

    def describe(self) -> str:
        """What the index and the logs show: ``cuda 8.0;9.0+PTX``, ``rocm gfx90a``, ``cpu``."""
        return f"{self.family.value} {self.arch_list}" if self.arch_list else self.family.value


def _normalized(family: Family, text: str) -> str:
    return CudaArchs.parse(text).text if family is Family.CUDA else RocmArchs.parse(text).text
