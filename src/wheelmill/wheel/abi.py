"""The ABI each built library keeps to, read from the symbols it leaves to others.

Two questions, one walk over each library's undefined dynamic symbols:

- CPython: does it use only the limited API (PEP 384, the ``abi3`` tag)? Every ``Py*``
  symbol it needs must be in the stable ABI's table (abi3info, the data abi3audit reads);
  the newest Python that added one of them is the oldest it can run on.
- torch: does it reach libtorch only through the stable C shims (``aoti_torch_*``,
  ``torch_*``: what ``torch/csrc/stable`` compiles down to), or into its C++ internals
  (``c10::``, ``at::``, ``torch::``)? Stable, it runs on every torch from the release that
  added the newest shim it calls (torch-abi-audit's rules and table); otherwise only on the
  torch it was built against.

Header-only code (``torch::headeronly``, ``torch::stable`` wrappers) is compiled into the
library and leaves no undefined symbol behind, so it never counts against it.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import TypeVar

import abi3info
import pycxxfilt
from elftools.common.exceptions import ELFError
from packaging.version import Version
from torch_abi_audit import torch_abi

from wheelmill.errors import CheckError
from wheelmill.wheel.elf import ElfSummary, summarize_stream
from wheelmill.wheel.wheelfile import elf_members


class TorchUse(StrEnum):
    NONE = "none"  # no libtorch symbol at all
    STABLE = "stable"  # the stable C shims alone
    UNSTABLE = "unstable"  # libtorch's C++ API: one torch


class PythonUse(StrEnum):
    NONE = "none"  # no CPython symbol (a helper library)
    LIMITED = "limited"  # the limited API alone: abi3 can hold it
    FULL = "full"  # symbols outside it: one CPython minor


@dataclass(frozen=True, kw_only=True)
class LibraryAbi:
    """One library's ABI, as its symbols show it."""

    name: str  # its path inside the wheel
    python: PythonUse
    python_minimum: str | None  # limited: the newest Python that added a symbol it uses ("3.9")
    outside_limited: tuple[str, ...]  # full: the CPython symbols outside the limited API
    torch: TorchUse
    torch_minimum: str | None  # stable: the release that added the newest shim it calls ("2.10.0")
    unstable: tuple[str, ...]  # unstable: the libtorch C++ symbols it uses, demangled, sorted


def read_abi(wheel: Path) -> WheelAbi:
    """The ABI of ``wheel``'s libraries, read from the wheel itself, in memory: nothing is
    unpacked, so a process killed while it reads (a publisher) leaves nothing behind. A
    library that cannot be read as ELF is a ``CheckError``."""
    libraries = []
    with zipfile.ZipFile(wheel) as zf:
        for info in elf_members(zf):
            try:
                library = summarize_stream(Path(info.filename), io.BytesIO(zf.read(info)))
            except ELFError as exc:
                raise CheckError(
                    f"{wheel.name}: {info.filename} starts like an ELF file but cannot be read as one ({exc})",
                    fix="rebuild the wheel",
                ) from None
            libraries.append(classify(library, info.filename))
    return WheelAbi(libraries=tuple(libraries))


def abi_of(root: Path, libraries: Sequence[ElfSummary]) -> WheelAbi:
    """The ABI of ``libraries``, unpacked under ``root``."""
    return WheelAbi(libraries=tuple(classify(lib, str(lib.path.relative_to(root))) for lib in libraries))


def classify(library: ElfSummary, name: str) -> LibraryAbi:
    """``library``'s ABI; ``name`` is its path inside the wheel."""
    symbols = sorted(library.undefined)
    python, python_minimum, outside = _python(symbols)
    verdict = torch_abi.classify_symbols([_demangled(s) for s in symbols])
    torch = TorchUse.NONE if not verdict.uses_torch else TorchUse.STABLE if verdict.stable else TorchUse.UNSTABLE
    return LibraryAbi(
        name=name,
        python=python,
        python_minimum=python_minimum,
        outside_limited=outside,
        torch=torch,
        torch_minimum=verdict.min_torch_version if torch is TorchUse.STABLE else None,
        unstable=tuple(sorted(verdict.unstable_symbols)),
    )


def _python(symbols: Sequence[str]) -> tuple[PythonUse, str | None, tuple[str, ...]]:
    used = [s for s in symbols if s.startswith(("Py", "_Py", "PY", "_PY"))]
    if not used:
        return PythonUse.NONE, None, ()
    added = _limited_api()
    outside = tuple(s for s in used if s not in added)
    if outside:
        return PythonUse.FULL, None, outside
    newest = max(added[s] for s in used)
    return PythonUse.LIMITED, f"{newest[0]}.{newest[1]}", ()


@cache
def _limited_api() -> dict[str, tuple[int, int]]:
    """Every symbol of CPython's stable ABI, with the Python that added it."""
    table = {**abi3info.FUNCTIONS, **abi3info.DATAS}
    return {symbol.name: (item.added.major, item.added.minor) for symbol, item in table.items()}


@cache
def _demangled(symbol: str) -> str:
    if not symbol.startswith("_Z"):
        return symbol
    try:
        return pycxxfilt.demangle(symbol) or symbol
    except (ValueError, RuntimeError):  # not a name pycxxfilt can read: judged as written
        return symbol


@dataclass(frozen=True, kw_only=True)
class WheelAbi:
    """A wheel's ABI: the narrowest its libraries allow together."""

    libraries: tuple[LibraryAbi, ...]

    @property
    def python(self) -> PythonUse:
        return _widest((lib.python for lib in self.libraries), PythonUse)

    @property
    def torch(self) -> TorchUse:
        return _widest((lib.torch for lib in self.libraries), TorchUse)

    @property
    def python_minimum(self) -> str | None:
        floors = [lib.python_minimum for lib in self.libraries if lib.python_minimum]
        return max(floors, key=Version) if floors and self.python is PythonUse.LIMITED else None

    @property
    def torch_minimum(self) -> str | None:
        floors = [lib.torch_minimum for lib in self.libraries if lib.torch_minimum]
        return max(floors, key=Version) if floors and self.torch is TorchUse.STABLE else None

    @property
    def listed(self) -> str | None:
        """What the report and the index keep: ``describe()``, or None for a wheel with no
        library (which, like a mirrored one, shows nothing)."""
        return self.describe() if self.libraries else None

    def describe(self) -> str:
        """``python limited>=3.9; torch stable>=2.10.0``, ``python full; torch unstable``,
        ``no native code``: what the index shows beside the file."""
        if not self.libraries:
            return "no native code"
        python = f"python {self.python}" + (f">={self.python_minimum}" if self.python_minimum else "")
        torch = f"torch {self.torch}" + (f">={self.torch_minimum}" if self.torch_minimum else "")
        return f"{python}; {torch}"


_Use = TypeVar("_Use", PythonUse, TorchUse)


def _widest(uses: Iterable[_Use], kind: type[_Use]) -> _Use:
    """The widest use among ``uses`` (declaration order: none, narrow, wide)."""
    order = list(kind)
    return max(uses, key=order.index, default=order[0])
