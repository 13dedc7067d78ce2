"""GPU arch lists as values: ``TORCH_CUDA_ARCH_LIST`` and ``PYTORCH_ROCM_ARCH``.

An arch list says which device code a wheel must carry: SASS (cubin) for every listed CUDA
arch, and PTX for those marked ``+PTX`` (PyTorch's own notation), or one code object per
ROCm gfx target.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
