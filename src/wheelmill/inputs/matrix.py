"""The matrix: variants, Pythons and the supported cells, loaded from ``recipes/matrix.toml``.

A cell id has a grammar, ``<variant>-py<major><minor>`` (``cuda118-py311``); overrides,
selections, logs and output paths all use it. A variant's ``slim`` archs each derive a slim
variant, ``<variant>-<arch>`` (``cuda130-sm90``), and its ``other-torch`` releases a variant
of each torch, ``<variant>-torch<major>.<minor>`` (``cuda130-torch2.12``, and for each slim
one ``cuda130-sm90-torch2.12``), placed right after what they derive from, whose cells
(``cuda130-sm90-py311``, ``cuda130-torch2.12-py311``) are cells like any other. The cells
of the variant's own ``torch`` keep the plain names. A variant's ``platforms`` beyond x86_64
derive a twin of it and of each variant derived from it, ``<name>-aarch64``
(``cpu-aarch64-py311``, ``cuda130-sm90-aarch64-py311``), placed after them, with what the
variant's ``[variants.<name>.aarch64]`` table says differs on that machine.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wheelmill.config import load_toml, parse_size, validate
from wheelmill.errors import ConfigError, SelectionError, did_you_mean
from wheelmill.inputs import SCHEMAS
from wheelmill.inputs.archs import CudaArchs, RocmArchs, arch_tag
from wheelmill.inputs.manylinux import policies
from wheelmill.inputs.variants import AARCH64, PLATFORMS, X86_64, Cell, Family, Variant

SCHEMA = "matrix.schema.json"
_CELL_ID = re.compile(
    r"^(?P<variant>[a-z0-9]+(?:-[a-z0-9]+)?(?:-torch[0-9]+\.[0-9]+)?(?:-aarch64)?)-py(?P<major>3)(?P<minor>[0-9]{1,2})$"
)


@dataclass(frozen=True, kw_only=True)
class Matrix:
    path: Path
    pythons: tuple[str, ...]
    variants: Mapping[str, Variant]
    torch_index: str
    build_requires: tuple[str, ...]
    test_requires: tuple[str, ...]
    repair_exclude: Mapping[str, tuple[str, ...]]
    forbid: tuple[str, ...]
    max_wheel_size: int
    min_free_disk: Mapping[str, int]
    memory_per_job: Mapping[str, int]
    canary: tuple[str, ...] = ()
    # variant glob -> the CI runner labels of GPU machines, one per GPU kind that must pass its stage
    gpu_runners: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    runners: Mapping[str, str] = field(default_factory=dict)  # platform -> CI runner label building it natively

    @property
    def cells(self) -> tuple[Cell, ...]:
        return tuple(Cell(variant=v, python=p) for v in self.variants.values() for p in v.pythons)

    def gpu_runners_of(self, cell: Cell) -> tuple[str, ...]:
        """The CI runner labels of the GPU machines that run the cell's GPU stage, a label per
        GPU kind (the first glob that matches its variant); none where no GPU runner covers it
        (or it has no GPU code)."""
        if cell.variant.family is Family.CPU:
            return ()
        return next(
            (labels for glob, labels in self.gpu_runners.items() if fnmatch.fnmatchcase(cell.variant.name, glob)), ()
        )

    def excludes_for(self, variant: Variant) -> tuple[str, ...]:
        return self.repair_exclude.get("all", ()) + self.repair_exclude.get(variant.family.value, ())

    def cell(self, cell_id: str) -> Cell:
        """The cell with this id, or a ``SelectionError`` that lists what is valid."""
        match = _CELL_ID.match(cell_id)
        if not match:
            known = [c.id for c in self.cells]
            raise SelectionError(
                f"'{cell_id}' is not a cell id{did_you_mean(cell_id, known)}",
                fix="write <variant>-py<XY>, e.g. cuda118-py311, cuda130-sm90-py311 for a slim variant, "
                "cuda130-torch2.12-py311 for another torch, cpu-aarch64-py311 for aarch64 "
                "(`wheelmill matrix` lists them)",
            )
        variant = self.variant(match.group("variant"))
        python = f"{match.group('major')}.{match.group('minor')}"
        if python not in self.pythons:
            raise SelectionError(
                f"unknown Python {python} in cell '{cell_id}'",
                fix=f"use one of: {', '.join(self.pythons)}",
            )
        if python not in variant.pythons:
            raise SelectionError(
                f"variant {variant.name} does not support Python {python} (cell '{cell_id}')",
                fix=f"use one of its Pythons: {', '.join(variant.pythons)}, or add it in {self.path}",
            )
        return Cell(variant=variant, python=python)

    def variant(self, name: str) -> Variant:
        try:
            return self.variants[name]
        except KeyError:
            raise self._unknown_variant(name) from None

    def _unknown_variant(self, name: str) -> SelectionError:
        twin, _, platform = name.rpartition("-")
        if platform in PLATFORMS and twin in self.variants:
            return SelectionError(
                f"variant {twin} is not built for {platform}, so there is no variant '{name}'",
                fix=f'add "{platform}" to variants.{self.variants[twin].base_name}.platforms in {self.path} '
                f"(where the toolkit and torch exist for it)",
            )
        stem, _, torch = name.rpartition("-torch")
        if stem in self.variants and re.fullmatch(r"[0-9]+\.[0-9]+", torch):
            return self._unknown_torch(self.variants[stem], torch, name)
        parent, _, tag = name.partition("-")
        if tag and parent in self.variants and self.variants[parent].family is not Family.CPU:
            slims = [
                v.name for v in self.variants.values() if v.slim_of == parent and not (v.torch_of or v.platform_tag)
            ]
            others = f"use one of its slim variants ({', '.join(slims)}), or " if slims else ""
            return SelectionError(
                f"variant {parent} has no slim variant '{name}'{did_you_mean(name, slims)}",
                fix=f"{others}add the arch to variants.{parent}.slim in {self.path}, "
                f"or build {parent} (its whole arch list)",
            )
        return SelectionError(
            f"unknown variant '{name}'{did_you_mean(name, self.variants)}",
            fix=f"use one of: {', '.join(self.variants)}",
        )

    def _unknown_torch(self, variant: Variant, torch: str, name: str) -> SelectionError:
        built = ", ".join((variant.torch, *variant.other_torch))
        return SelectionError(
            f"variant {variant.name} builds no torch {torch} (it builds {built}), so there is no variant '{name}'",
            fix=f"add the torch release to variants.{variant.base_name}.other-torch in {self.path}",
        )

    def select(self, patterns: Iterable[str]) -> tuple[Cell, ...]:
        """Cells whose id matches any glob; a pattern that matches nothing is an error."""
        chosen: dict[str, Cell] = {}
        for pattern in patterns:
            hits = [c for c in self.cells if fnmatch.fnmatchcase(c.id, pattern)]
            if not hits:
                if not any(ch in pattern for ch in "*?["):
                    self.cell(pattern)  # raises the precise error for a plain id
                raise SelectionError(f"no cell matches '{pattern}'", fix="`wheelmill matrix` lists the cells")
            chosen.update((c.id, c) for c in hits)
        return tuple(chosen.values())


def github_matrix(cells: Iterable[Cell], runners: Mapping[str, str]) -> dict[str, list[dict[str, str]]]:
    """GitHub Actions' ``{"include": [...]}``: one entry per cell, with the runner label of
    its platform (an aarch64 cell builds natively on an arm runner); a slim cell's says whose."""
    return {"include": [_entry(c, runners) for c in cells]}


def _entry(cell: Cell, runners: Mapping[str, str]) -> dict[str, str]:
    v = cell.variant
    entry = {
        "cell": cell.id,
        "variant": v.name,
        "python": cell.python,
        "family": v.family.value,
        "label": v.label,
        "channel": v.channel,
        "platform": v.platform,
        "runner": runners[v.platform],
    }
    entry |= {"slim-of": v.slim_of} if v.slim_of else {}
    return entry | ({"torch": v.torch, "torch-of": v.torch_of} if v.torch_of else {})


# The matrix as two tables: each variant's toolchain, and the Pythons it builds for.
TOOLCHAIN_COLUMNS = (
    "variant",  # its name says its platform where it is not x86_64 (cpu-aarch64)
    "toolkit",
    "torch",
    "arch list",
    "glibc, registry base",
    "glibc, bootstrapped",
)
PYTHON_COLUMNS = ("variant", "channel")  # then a column per Python


def toolchain_row(
    v: Variant, *, baselines: tuple[str | None, str | None], code: Callable[[str], str] = str
) -> list[str]:
    """A variant as a row under ``TOOLCHAIN_COLUMNS``. ``baselines``: its promise on its
    registry base and on its bootstrapped one (the manylinux tag its wheels are held to there,
    as containers/pins.toml makes it; None where it never builds on one); ``code`` marks up
    the arch list (Markdown's backticks)."""
    return [
        v.name,
        v.toolkit or "-",
        f"{v.torch}+{v.label}",
        code(v.arch_list) if v.arch_list else "-",
        *(baseline or "-" for baseline in baselines),
    ]


def python_row(v: Variant, pythons: Sequence[str]) -> list[str]:
    """A variant as a row under ``PYTHON_COLUMNS``, then ``yes`` or ``-`` under each Python."""
    return [v.name, v.channel, *("yes" if p in v.pythons else "-" for p in pythons)]


def matrix_markdown(matrix: Matrix, baselines: Mapping[str, tuple[str | None, str | None]]) -> str:
    """The variants as two Markdown tables (the copy in docs/matrix.md): their toolchains, with
    each one's ``baselines`` (by name), then the Pythons each builds for and its channel."""
    toolchains = [toolchain_row(v, baselines=baselines[v.name], code=_arch_code) for v in matrix.variants.values()]
    pythons = [python_row(v, matrix.pythons) for v in matrix.variants.values()]
    return "\n\n".join(
        (_markdown(TOOLCHAIN_COLUMNS, toolchains), _markdown((*PYTHON_COLUMNS, *matrix.pythons), pythons))
    )


def _arch_code(arch_list: str) -> str:
    """An arch list as Markdown code that a narrow column wraps between archs, never in one."""
    return "`" + "; ".join(arch_list.split(";")) + "`"


def _markdown(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def load_matrix(path: Path) -> Matrix:
    data = load_toml(path)
    validate(data, schema_path=SCHEMAS / SCHEMA, file=path)
    pythons = tuple(data["pythons"])
    variants: dict[str, Variant] = {}
    for name, raw in data["variants"].items():
        variant = _variant(name, raw, file=path, pythons=pythons)
        family = [v for each in (variant, *slim_variants(variant)) for v in (each, *torch_variants(each))]
        for platform in variant.platforms[1:]:
            family += platform_variants(family, platform, raw.get(platform, {}), where=f"{path}: variants.{name}")
        variants |= {v.name: v for v in family}
    checks = data["checks"]
    ci = data.get("ci", {})
    return Matrix(
        path=path,
        pythons=pythons,
        variants=variants,
        torch_index=data["torch"]["index"],
        build_requires=tuple(data["build-env"]["requires"]),
        test_requires=tuple(data["test-env"]["requires"]),
        repair_exclude={k: tuple(v) for k, v in data["repair"]["exclude"].items()},
        forbid=tuple(data["repair"].get("forbid", ())),
        max_wheel_size=parse_size(checks.get("max-wheel-size", "300MiB")),
        min_free_disk={k: parse_size(v) for k, v in checks.get("min-free-disk", {}).items()},
        memory_per_job={k: parse_size(v) for k, v in checks.get("memory-per-job", {}).items()},
        canary=_canary(ci.get("canary", ()), variants, file=path),
        gpu_runners=_gpu_runners(ci.get("gpu-runners", {}), variants, file=path),
        runners=_runners(ci.get("runners", {})),
    )


# GitHub's hosted runners of each platform: what ci.runners replaces.
DEFAULT_RUNNERS = {X86_64: "ubuntu-24.04", AARCH64: "ubuntu-24.04-arm"}


def _runners(runners: Mapping[str, str]) -> dict[str, str]:
    """The CI runner label of each platform: GitHub's hosted ones, unless ci.runners names
    others (a self-hosted arm pool, say)."""
    return DEFAULT_RUNNERS | dict(runners)


def _gpu_runners(
    given: Mapping[str, str | list[str]], variants: Mapping[str, Variant], *, file: Path
) -> dict[str, tuple[str, ...]]:
    """Each glob must name a variant with GPU code: a glob that matches none is a typo. A
    variant takes the first glob that matches it, and a runner is machines of one platform:
    a glob that is first for variants of two platforms would test aarch64 wheels on x86_64.
    A glob names one runner label, or several: a GPU kind each, every one of which must pass."""
    runners = {
        glob: (labels,) if isinstance(labels, str) else tuple(dict.fromkeys(labels)) for glob, labels in given.items()
    }
    gpu = [name for name, v in variants.items() if v.family is not Family.CPU]
    for glob in runners:
        if not fnmatch.filter(gpu, glob):
            raise ConfigError(
                f"{file}: ci.gpu-runners: '{glob}' matches no CUDA or ROCm variant",
                fix=f'use a glob on variant names, e.g. "cuda130*" (GPU variants: {", ".join(sorted(gpu)[:6])}, ...)',
            )
    served: dict[str, set[str]] = {}
    for name in gpu:
        first = next((glob for glob in runners if fnmatch.fnmatchcase(name, glob)), None)
        if first is not None:
            served.setdefault(first, set()).add(variants[name].platform)
    for glob, platforms in served.items():
        if len(platforms) > 1:
            raise ConfigError(
                f"{file}: ci.gpu-runners: '{glob}' sends {' and '.join(sorted(platforms))} cells to one runner "
                f"({', '.join(runners[glob])})",
                fix=f'put a glob of the aarch64 variants first: "{glob.rstrip("*")}*-aarch64" = "<arm GPU runner>"',
            )
    return runners


def _canary(ids: Sequence[str], variants: Mapping[str, Variant], *, file: Path) -> tuple[str, ...]:
    known = [Cell(variant=v, python=p).id for v in variants.values() for p in v.pythons]
    for cell_id in ids:
        if cell_id not in known:
            raise ConfigError(
                f"{file}: ci.canary: '{cell_id}' is not a supported cell",
                fix=f"use cell ids of this matrix{did_you_mean(cell_id, known)}",
            )
    return tuple(ids)


def _variant(name: str, raw: Mapping[str, Any], *, file: Path, pythons: tuple[str, ...]) -> Variant:
    variant = Variant(
        name=name,
        family=Family(raw["family"]),
        label=raw["label"],
        torch=raw["torch"],
        torch_on_pypi=raw.get("torch-on-pypi", False),
        torch_index=raw.get("torch-index"),
        glibc=raw["glibc"],
        pythons=tuple(raw["pythons"]),
        toolkit=raw.get("toolkit"),
        cudnn=raw.get("cudnn"),
        nccl=raw.get("nccl"),
        arch_list=raw.get("arch-list"),
        toolkit_wheels=tuple(raw.get("toolkit-wheels", ())),
        slim=tuple(raw.get("slim", ())),
        other_torch=tuple(raw.get("other-torch", ())),
        platforms=tuple(raw.get("platforms", (X86_64,))),
    )
    _check_variant(variant, file=file, pythons=pythons)
    return variant


def platform_variants(
    family: Sequence[Variant], platform: str, differs: Mapping[str, Any], *, where: str
) -> list[Variant]:
    """A twin for ``platform`` of each variant of a declared one's ``family`` (it, its slim
    variants and those of other torch releases), with what ``differs`` on that machine: its
    own arch list (a slim arch it lacks has no twin) and its own torch, and whether PyPI's
    torch is the variant's build there. Channel and wheel label stay the twin's: the wheels'
    platform tags keep the two apart."""
    declared = family[0]
    arch_list = differs.get("arch-list", declared.arch_list)
    twins = []
    for v in family:
        if v.slim_tag and not _lists(arch_list, v.arch_list):
            continue
        twin = replace(
            v,
            name=f"{v.name}-{platform}",
            platform=platform,
            platform_of=v.base_name if v is declared else None,
            arch_list=v.arch_list if v.slim_tag else arch_list,
            torch=v.torch if v.torch_tag else differs.get("torch", v.torch),
            torch_on_pypi=differs.get("torch-on-pypi", v.torch_on_pypi),
            glibc=differs.get("glibc", v.glibc),
        )
        _check_platform(twin, where=f"{where}.{platform}")
        twins.append(twin)
    return twins


def _lists(arch_list: str | None, arch: str | None) -> bool:
    """Whether ``arch`` (one arch, a slim variant's) is in ``arch_list``."""
    return arch is not None and arch_list is not None and arch in arch_list.replace("+PTX", "").split(";")


def _check_platform(v: Variant, *, where: str) -> None:
    """A twin's own glibc and arch list, checked as its variant's are."""
    _check_glibc(v, where=where)
    if v.arch_list and not v.slim_tag:
        _check_arch_list(v, where=where)


def _check_glibc(v: Variant, *, where: str) -> None:
    known = policies(v.platform)
    if v.glibc not in known:
        raise ConfigError(
            f"{where}.glibc: '{v.glibc}' is no manylinux policy of {v.platform} "
            f"(auditwheel knows {min(known, key=_glibc)} to {max(known, key=_glibc)})",
            fix="give the oldest glibc the variant's wheels must run on, as a PEP 600 tag prefix, e.g. manylinux_2_28",
        )


def _check_arch_list(v: Variant, *, where: str) -> None:
    assert v.arch_list is not None
    try:
        CudaArchs.parse(v.arch_list) if v.family is Family.CUDA else RocmArchs.parse(v.arch_list)
    except ValueError as exc:
        raise ConfigError(f"{where}.arch-list: {exc}", fix="list archs separated by ';'") from None


def torch_tag(torch: str) -> str:
    """The short name of a torch release in variant names, channels and labels: its major
    and minor (one build per minor release; patch releases keep the C++ ABI).

    >>> torch_tag("2.12.0"), torch_tag("2.9.1")
    ('torch2.12', 'torch2.9')
    """
    major, minor = torch.split(".")[:2]
    return f"torch{major}.{minor}"


def torch_variants(parent: Variant) -> tuple[Variant, ...]:
    """A variant of its own for each of the parent's other torch releases: the parent built
    against that torch, in its own lock and channel (name, channel and wheel label carry the
    torch); toolkit, archs and recipes are the parent's."""
    return tuple(
        replace(
            parent,
            name=f"{parent.name}-{torch_tag(torch)}",
            torch=torch,
            other_torch=(),
            torch_of=parent.name,
            torch_tag=torch_tag(torch),
        )
        for torch in parent.other_torch
    )


def slim_variants(parent: Variant) -> tuple[Variant, ...]:
    """A variant of its own for each slim arch: the parent with that one arch, published
    apart (its name, channel and wheel label carry the arch); the rest is the parent's."""
    tags = {arch: arch_tag(arch) for arch in parent.slim}
    return tuple(
        replace(parent, name=f"{parent.name}-{tag}", arch_list=arch, slim=(), slim_of=parent.name, slim_tag=tag)
        for arch, tag in tags.items()
    )


def _check_variant(v: Variant, *, file: Path, pythons: tuple[str, ...]) -> None:
    where = f"{file}: variants.{v.name}"
    for python in v.pythons:
        if python not in pythons:
            raise ConfigError(
                f"{where}.pythons: {python} is not in the top-level pythons",
                fix=f"add it there or use one of: {', '.join(pythons)}",
            )
    if not v.name.startswith(v.family.value):
        raise ConfigError(
            f"{where}.family: '{v.family}' does not match the variant name",
            fix=f"name {v.family} variants {v.family}...",
        )
    if v.platforms[0] != X86_64:
        raise ConfigError(
            f"{where}.platforms: {', '.join(v.platforms)} does not start with {X86_64}",
            fix=f'list {X86_64} first: every variant builds for it, e.g. platforms = ["{X86_64}", "{AARCH64}"]',
        )
    if v.family is Family.ROCM and AARCH64 in v.platforms:
        raise ConfigError(
            f"{where}.platforms: ROCm has no {AARCH64} toolkit or torch", fix=f'remove "{AARCH64}" from its platforms'
        )
    _check_glibc(v, where=where)
    _check_other_torch(v, where=f"{where}.other-torch")
    if v.family is Family.CPU:
        if v.toolkit or v.arch_list:
            raise ConfigError(f"{where}: a cpu variant has no toolkit or arch-list", fix="remove toolkit and arch-list")
        if v.slim:
            raise ConfigError(
                f"{where}.slim: a cpu variant has no GPU arch to build alone",
                fix="remove slim (slim variants are for cuda and rocm variants)",
            )
        if v.label != "cpu":
            raise ConfigError(f"{where}.label: a cpu variant's label is 'cpu'", fix='set label = "cpu"')
        return
    if not v.toolkit or not v.arch_list:
        raise ConfigError(
            f"{where}: a {v.family} variant needs toolkit and arch-list", fix="add both (see the other variants)"
        )
    _check_accelerator(v, where=where)


def _check_other_torch(v: Variant, *, where: str) -> None:
    """Each other torch is a minor release of its own: a variant of another torch is named
    by its major and minor, so two patch releases of one minor would share a channel."""
    seen = {torch_tag(v.torch): v.torch}
    for torch in v.other_torch:
        tag = torch_tag(torch)
        if tag in seen:
            raise ConfigError(
                f"{where}: {torch} is the same minor release as {seen[tag]}",
                fix="list one release per torch minor (the variant's torch is its default)",
            )
        seen[tag] = torch


def _check_accelerator(v: Variant, *, where: str) -> None:
    assert v.toolkit is not None
    assert v.arch_list is not None
    major, minor = _toolkit_release(v, where=where)
    expected_label = f"cu{major}{minor}" if v.family is Family.CUDA else f"rocm{major}.{minor}"
    expected_name = f"cuda{major}{minor}" if v.family is Family.CUDA else f"rocm{major}{minor}"
    if v.label != expected_label:
        raise ConfigError(
            f"{where}.label: '{v.label}' does not match toolkit {v.toolkit}", fix=f'set label = "{expected_label}"'
        )
    if v.name != expected_name:
        raise ConfigError(
            f"{where}.toolkit: {v.toolkit} does not match the variant name",
            fix=f"name it {expected_name} or fix the toolkit version",
        )
    _check_arch_list(v, where=where)
    _check_slim(v, where=f"{where}.slim")
    for wheel in v.toolkit_wheels:
        _, _, version = wheel.partition("==")
        if version.split(".")[:2] != [major, minor]:
            raise ConfigError(
                f"{where}.toolkit-wheels: '{wheel}' is not of toolkit {major}.{minor}",
                fix=f"pin the {major}.{minor} release of each toolkit wheel (==X.Y.Z)",
            )


# The releases torch has been built with: CUDA 11.0 on (minors 0 to 9), ROCm 5.0 on. A
# version outside (a typo such as 1.18.0 for 11.8.0) would still make a label and a name.
_RELEASES = {Family.CUDA: ("CUDA", 11, 99, 9), Family.ROCM: ("ROCm", 5, 99, 9)}
_EXAMPLE = {Family.CUDA: "11.8.0", Family.ROCM: "6.4.0"}


def _toolkit_release(v: Variant, *, where: str) -> tuple[str, str]:
    """The toolkit's major and minor, where it is a release of its family."""
    assert v.toolkit is not None
    kind, oldest, newest, minors = _RELEASES[v.family]
    parts = v.toolkit.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ConfigError(
            f"{where}.toolkit: '{v.toolkit}' is not a {kind} version", fix="give it as X.Y.Z, e.g. 12.8.1"
        )
    major, minor = int(parts[0]), int(parts[1])
    if not (oldest <= major <= newest and minor <= minors):
        raise ConfigError(
            f"{where}.toolkit: {v.toolkit} is no {kind} release (majors {oldest} on, minors 0 to {minors})",
            fix=f"give the {kind} toolkit's version as its release notes do, e.g. {_EXAMPLE[v.family]}",
        )
    return parts[0], parts[1]


def _check_slim(v: Variant, *, where: str) -> None:
    """Each slim arch is one arch of the variant's own list (of its family), listed once: a
    slim variant narrows its parent, it never adds an arch nobody tested the list with."""
    assert v.arch_list is not None
    rocm = v.family is Family.ROCM
    kind, text = ("ROCm", RocmArchs.parse(v.arch_list).text) if rocm else ("CUDA", CudaArchs.parse(v.arch_list).text)
    listed = [item.removesuffix("+PTX") for item in text.split(";")]
    for index, arch in enumerate(v.slim):
        if arch.startswith("gfx") is not rocm:
            raise ConfigError(
                f"{where}: '{arch}' is no {kind} arch, and {v.name} builds for {kind}",
                fix=f'list archs of its arch-list, e.g. slim = ["{listed[-1]}"]',
            )
        if arch in v.slim[:index]:
            raise ConfigError(f"{where}: {arch} listed more than once", fix="list each arch once")
        if arch not in listed:
            raise ConfigError(
                f"{where}: {arch} is not in its arch-list ({v.arch_list}){did_you_mean(arch, listed)}",
                fix=f"slim one of: {', '.join(listed)} (or add {arch} to variants.{v.name}.arch-list first)",
            )


def _glibc(policy: str) -> tuple[int, ...]:
    return tuple(int(part) for part in policy.split("_")[1:])
