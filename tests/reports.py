"""Reports as a build of a cell leaves them, for tests of what reads them (images, mirror,
releases): written through the one format, so a reader under test sees a real report."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from wheelmill.inputs.versions import VersionRule
from wheelmill.output.layout import CellLayout
from wheelmill.output.report import BuiltCell, RecipeRecord, ReleaseRecord, Status, WheelRecord


def write_report(
    output: Path,
    cell: str,
    *,
    wheels: Sequence[tuple[str, Path, str]],
    torch: str,
    channel: str = "cpu",
    python: str = "3.11",
    facts: Mapping[str, Any] | None = None,
    status: Status = Status.OK,
    release: ReleaseRecord | None = None,
) -> CellLayout:
    """``<output>/<cell>/report.json`` of a build that delivered ``wheels`` (recipe, wheel
    file, the sha256 the report gives it)."""
    layout = CellLayout(output=output, cell=cell)
    recipes = tuple(
        RecipeRecord(
            name=name,
            status=status,
            version_rule=VersionRule.SOURCE,
            wheel=WheelRecord(name=path.name, size=path.stat().st_size, sha256=sha256, path=str(path)),
        )
        for name, path, sha256 in wheels
    )
    built = BuiltCell(
        cell=cell,
        variant=cell.rsplit("-py", 1)[0],
        python=python,
        engine="none",
        channel=channel,
        release=release,
        status=status,
        exit_code=0 if status is Status.OK else 1,
        started="2026-01-01T00:00:00Z",
        finished="2026-01-01T00:01:00Z",
        seconds=60.0,
        facts={"torch": {"version": torch}, **(facts or {})},
        recipes=recipes,
        steps=(),
    )
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.report.write_text(json.dumps(built.as_dict(), indent=2) + "\n")
    return layout
