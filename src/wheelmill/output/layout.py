"""The one layout of a cell's directory, ``<output>/<cell>/``: every reader and writer of a
cell's files finds them here, never by a path built by hand."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The cell's runtime closure, resolved and locked beside its report.
CLOSURE_LOCK_NAME = "pylock.closure.toml"


@dataclass(frozen=True, kw_only=True)
class CellLayout:
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
    def images(self) -> Path:
        """The images built from the cell's channel, as ``wheelmill image build`` recorded them."""
        return self.root / "images.json"

    @property
    def closure_lock(self) -> Path:
        return self.root / CLOSURE_LOCK_NAME

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


def built_cells(output: Path) -> list[CellLayout]:
    """The cells under ``output`` that have a report, by name."""
    return [CellLayout(output=output, cell=report.parent.name) for report in sorted(output.glob("*/report.json"))]
