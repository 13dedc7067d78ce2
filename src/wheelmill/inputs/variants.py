"""The words of the matrix as values: a variant (one accelerator toolchain and everything it
pins), its family, and a cell (variant, python), whose id has a grammar:
``<variant>-py<major><minor>`` (``cuda118-py311``). Overrides, selections, logs and output
paths all use it. Loading them from ``recipes/matrix.toml`` is ``wheelmill.inputs.matrix``'s job.

A slim variant (``cuda130-sm90``) is its parent built for one arch of the parent's list and
published apart: its own channel (``cu130-sm90``) and wheel label (``+cu130.sm90``), so
choosing it is explicit and its wheels never collide with the parent's full-arch ones;
everything else, torch and its label included, is the parent's.

A variant of another torch (``cuda130-torch2.12``) is its parent built against one of the
parent's ``other-torch`` releases: the same toolkit, archs and recipes; its own lock (the
torch differs), channel (``cu130-torch2.12``) and wheel label (``+cu130.torch2.12``). A
channel per torch, because an extension built per torch pins that torch exactly: in one
channel with both, an installer takes the highest version and replaces the machine's torch
with the other one; the label besides, because two different wheels never share a name,
wherever they end up side by side (a download directory, a cache, a mirror).

A variant of another platform (``cpu-aarch64``, ``cuda130-sm90-aarch64``) is its twin built
for that machine: the same channel and wheel label (a wheel's platform tag keeps the two
apart, and an installer on either machine takes its own), its own lock, builder image and
build keys, and where the matrix says so its own arch list and torch. A variant's plain name
means x86_64.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The machines a cell can build for, as Linux names them (``uname -m``, wheel platform tags):
# x86_64 is every variant's own; aarch64 is the other (Grace Hopper and Grace Blackwell).
X86_64 = "x86_64"
AARCH64 = "aarch64"
PLATFORMS = (X86_64, AARCH64)


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
    slim: tuple[str, ...] = ()  # the archs of its slim variants, as declared
    slim_of: str | None = None  # a slim variant: its parent's name
    slim_tag: str | None = None  # a slim variant: its one arch, short (sm90, gfx942)
    other_torch: tuple[str, ...] = ()  # the other torch releases it builds for, as declared
    torch_of: str | None = None  # a variant of another torch: the variant it derives from
    torch_tag: str | None = None  # a variant of another torch: its torch, short (torch2.12)
    platform: str = X86_64  # the machine its wheels are code for
    platforms: tuple[str, ...] = (X86_64,)  # the platforms it builds for, as declared
    platform_of: str | None = None  # a variant of another platform: its x86_64 twin

    @property
    def base_name(self) -> str:
        """The variant as declared, whose recipes, overrides and builder image this one
        shares: the parent of a slim variant or of a variant of another torch, else itself."""
        return self.slim_of or self.torch_of or self.platform_of or self.name

    @property
    def lock_name(self) -> str:
        """The variant whose build env this one shares: a slim variant its parent's (the
        archs are no input of the env), a variant of another torch or platform one of its own."""
        return "-".join(tag for tag in (self.base_name, self.torch_tag, self.platform_tag) if tag)

    @property
    def platform_tag(self) -> str | None:
        """The platform in the names of a variant of another platform (``aarch64``); None for
        x86_64, whose names carry none."""
        return None if self.platform == X86_64 else self.platform

    @property
    def toolkit_short(self) -> str | None:
        """``11.8`` for toolkit ``11.8.0``: what nvcc/hipcc must report."""
        return ".".join(self.toolkit.split(".")[:2]) if self.toolkit else None

    @property
    def channel(self) -> str:
        """The index channel of this variant: its local label (``cu118``, ``cpu``), then a
        slim variant's arch and another torch's tag (``cu130-sm90``, ``cu130-torch2.12``)."""
        return "-".join(self._tags)

    @property
    def wheel_label(self) -> str:
        """The local version label its wheels carry: the variant's (``cu130``), then a slim
        variant's arch and another torch's tag as more PEP 440 local segments
        (``cu130.sm90``, ``cu130.torch2.12``), so no two variants' wheels share a file name.
        torch keeps ``label``: it is the same."""
        return ".".join(self._tags)

    @property
    def group_label(self) -> str:
        """The label of a wheel built once for every torch of the variant (stable ABI): its
        toolkit and arch set alone (``cu130``, ``cu130.sm90``), the same in every channel it
        is published to."""
        return ".".join(tag for tag in (self.label, self.slim_tag) if tag)

    @property
    def _tags(self) -> tuple[str, ...]:
        return tuple(tag for tag in (self.label, self.slim_tag, self.torch_tag) if tag)

    @property
    def torch_requirement(self) -> str:
        """The exact torch this variant builds against.

        With ``torch-on-pypi`` the unlabeled release counts too (PEP 440: ``==2.14.1``
        matches any local label), and the env check then insists on the right CUDA.
        """
        return f"torch=={self.torch}" if self.torch_on_pypi else f"torch=={self.torch}+{self.label}"

    def describe(self) -> str:
        """The variant in a line; ``glibc`` is its torch build's (what locks resolve for), not a
        promise of the wheels built here, which their builder base's glibc bounds."""
        torch = f"torch {self.torch}+{self.label} (a {self.glibc} build)"
        machine = f", {self.platform}" if self.platform_tag else ""
        if self.family is Family.CPU:
            return f"CPU, {torch}{machine}"
        kind = "CUDA" if self.family is Family.CUDA else "ROCm"
        return f"{kind} {self.toolkit}, {torch}, archs {self.arch_list}{self._derived()}{machine}"

    def _derived(self) -> str:
        """What a derived variant is derived from, and its channel ("" for a declared one)."""
        if self.slim_of:
            return f" (slim of {self.slim_of}: channel {self.channel})"
        if self.torch_of:
            return f" (another torch of {self.torch_of}: channel {self.channel})"
        return ""


@dataclass(frozen=True, kw_only=True)
class Cell:
    """(variant, python): the unit of a nox session and of a CI job."""

    variant: Variant
    python: str

    @property
    def id(self) -> str:
        return f"{self.variant.name}-py{self.python.replace('.', '')}"

    @property
    def base_id(self) -> str:
        """The id recipe globs go by: a slim cell, or one of another torch, takes its parent
        cell's recipes and overrides (``cuda130-sm90-py311``, ``cuda130-torch2.12-py311`` ->
        ``cuda130-py311``)."""
        return f"{self.variant.base_name}-py{self.python.replace('.', '')}"

    @property
    def recipe_ids(self) -> tuple[str, ...]:
        """The ids recipe and override globs match: the base id, and for a cell of another
        platform that id with the platform too (``cpu-aarch64-py311``), so a glob such as
        ``*-aarch64-*`` can say what only that platform's builds need."""
        if not self.variant.platform_tag:
            return (self.base_id,)
        return (self.base_id, f"{self.variant.base_name}-{self.variant.platform_tag}-py{self.python.replace('.', '')}")

    @property
    def lock_id(self) -> str:
        """The id its build env's lock goes by: a slim cell's is its parent's
        (``cuda130-sm90-py311`` -> ``cuda130-py311``), a cell of another torch has its own
        (``cuda130-sm90-torch2.12-py311`` -> ``cuda130-torch2.12-py311``)."""
        return f"{self.variant.lock_name}-py{self.python.replace('.', '')}"

    @property
    def python_tag(self) -> str:
        return f"cp{self.python.replace('.', '')}"
