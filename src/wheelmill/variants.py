"""The words of the matrix as values: a variant (one accelerator toolchain and everything it
pins), its family, and a cell (variant, python), whose id has a grammar:
``<variant>-py<major><minor>`` (``cuda118-py311``). Overrides, selections, logs and output
paths all use it. Loading them from ``recipes/matrix.toml`` is ``wheelmill.matrix``'s job.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Family(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"
    ROCM = "rocm"


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One accelerator toolchain and everything pinned by it."""

    name: str
    family: Family
    label: str
    torch: str
    torch_on_pypi: bool
    torch_index: str | None
    glibc: str
    pythons: tuple[str, ...]
    toolkit: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    arch_list: str | None = None
    toolkit_wheels: tuple[str, ...] = ()

    @property
    def toolkit_short(self) -> str | None:
        """``11.8`` for toolkit ``11.8.0``: what nvcc/hipcc must report."""
        return ".".join(self.toolkit.split(".")[:2]) if self.toolkit else None

    @property
    def channel(self) -> str:
        """The index channel of this variant: its local label (``cu118``, ``cpu``)."""
        return self.label

    @property
    def torch_requirement(self) -> str:
        """The exact torch this variant builds against.

        With ``torch-on-pypi`` the unlabeled release counts too (PEP 440: ``==2.14.1``
        matches any local label), and the env check then insists on the right CUDA.
        """
        return f"torch=={self.torch}" if self.torch_on_pypi else f"torch=={self.torch}+{self.label}"

    def describe(self) -> str:
        match self.family:
            case Family.CPU:
                return f"CPU, torch {self.torch}+{self.label}, {self.glibc}"
            case Family.CUDA:
                return f"CUDA {self.toolkit}, torch {self.torch}+{self.label}, archs {self.arch_list}, {self.glibc}"
            case Family.ROCM:
                return f"ROCm {self.toolkit}, torch {self.torch}+{self.label}, archs {self.arch_list}, {self.glibc}"


@dataclass(frozen=True, kw_only=True)
class Cell:
    """(variant, python): the unit of a nox session and of a CI job."""

    variant: Variant
    python: str

    @property
    def id(self) -> str:
        return f"{self.variant.name}-py{self.python.replace('.', '')}"

    @property
    def python_tag(self) -> str:
        return f"cp{self.python.replace('.', '')}"
