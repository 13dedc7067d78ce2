"""What the steps of one cell share while it runs: the plan, where files go, the runner,
and what earlier steps found (the Python, the toolkit, the env, the wheels)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from wheelmill.containers.engine import Engine
from wheelmill.containers.images import Ready
from wheelmill.containers.runner import ContainerRunner
from wheelmill.envs import Env, EnvBackend
from wheelmill.matrix import Matrix
from wheelmill.plan import CellPlan, ContainerSetup
from wheelmill.runner import Runner
from wheelmill.settings import Settings
from wheelmill.sources import PackageSources
from wheelmill.toolchain import Toolkit


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where one cell's files live: everything under ``<output>/<cell>/``."""

    output: Path
    cell: str

    @property
    def root(self) -> Path:
        return self.output / self.cell

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def envs(self) -> Path:
        return self.root / "envs"

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def build(self) -> Path:
        return self.root / "build"

    @property
    def dist(self) -> Path:
        """The deliverables: repaired wheels that passed every check."""
        return self.root / "dist"

    @property
    def rejected(self) -> Path:
        """Wheels that failed a check, kept for inspection."""
        return self.root / "rejected"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    @property
    def requirements(self) -> Path:
        return self.root / "build-env.in"

    @property
    def lock(self) -> Path:
        return self.root / "build-env.lock"

    @property
    def cache(self) -> Path:
        """Shared by every cell: verified downloads, keyed by sha256."""
        return self.output / ".cache"


@dataclass(frozen=True, kw_only=True)
class TorchInfo:
    """What the torch in an env says about itself."""

    version: str  # torch.__version__, e.g. 2.14.1+cu130
    dist_version: str  # the installed distribution's version, e.g. 2.14.1
    cuda: str | None
    hip: str | None
    cxx11_abi: bool
    lib_dir: Path
    site_packages: Path


@dataclass(kw_only=True)
class CellRun:
    """The mutable state of one cell's execution; steps read and fill it in order."""

    plan: CellPlan
    matrix: Matrix
    settings: Settings
    layout: Layout
    runner: Runner
    backend: EnvBackend
    on_line: Callable[[str], None]
    python: Path | None = None
    toolkit: Toolkit | None = None
    sources: PackageSources | None = None
    torch_pins: dict[str, str] = field(default_factory=dict)
    build_env: Env | None = None
    torch: TorchInfo | None = None
    source_dirs: dict[str, Path] = field(default_factory=dict)
    built: dict[str, Path] = field(default_factory=dict)
    stamped: dict[str, Path] = field(default_factory=dict)
    repaired: dict[str, Path] = field(default_factory=dict)
    final: dict[str, Path] = field(default_factory=dict)
    max_jobs: dict[str, int] = field(default_factory=dict)
    engine: Engine | None = None
    containers: ContainerSetup | None = None
    image: Ready | None = None
    container: ContainerRunner | None = None
    lock_origin: str = ""

    def need_python(self) -> Path:
        assert self.python is not None, "pre-checks found the Python"
        return self.python

    def need_env(self) -> tuple[Env, TorchInfo]:
        assert self.build_env is not None, "prepare-env ran"
        assert self.torch is not None, "env-checks ran"
        return self.build_env, self.torch

    def need_sources(self) -> PackageSources:
        assert self.sources is not None, "pre-checks chose the package sources"
        return self.sources
