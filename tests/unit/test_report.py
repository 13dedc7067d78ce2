"""A cell's report: what the build writes (wheelmill.building.report) is what the one reader
(wheelmill.output.report) gives back, and a file that is not such a report is named so."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.wheels import make_wheel
from wheelmill.building.plan import plan_cell
from wheelmill.building.report import CellReport, StepRecord
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.output.layout import CellLayout, built_cells
from wheelmill.output.report import REPORT_VERSION, ReportError, Status, WheelRecord, found_beside, load_report
from wheelmill.planning.spec import StepKind
from wheelmill.settings import Settings

ROOT = Path(__file__).resolve().parent.parent.parent


def written(tmp_path: Path) -> tuple[CellLayout, CellReport, WheelRecord]:
    """cpu-py311's report after every step of example-cpp-ops ran, its install test
    delivering its wheel."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    plan = plan_cell(matrix, load_recipes(ROOT / "recipes"), matrix.cell("cpu-py311"), ["example-cpp-ops"], Settings())
    layout = CellLayout(output=tmp_path, cell="cpu-py311")
    wheel = WheelRecord.of(make_wheel(layout.dist, "example-cpp-ops", "0.1.0+cpu", tag="py3-none-any"))
    report = CellReport(plan=plan, path=layout.report)
    for step in plan.steps:
        made = (wheel,) if step.kind is StepKind.INSTALL_TEST else ()
        report.steps.append(StepRecord(step=step, status=Status.OK, made=made))
    report.finished = report.started + 12.5  # a finished cell: its time no longer grows while read
    layout.root.mkdir(parents=True, exist_ok=True)
    report.write()
    return layout, report, wheel


def test_what_the_build_writes_reads_back_as_it_was(tmp_path: Path) -> None:
    layout, report, wheel = written(tmp_path)
    built = load_report(layout.report, cell="cpu-py311")
    assert built == report.as_built()
    assert (built.cell, built.channel, built.python, built.status) == ("cpu-py311", "cpu", "3.11", Status.OK)
    assert built.wheels == built.delivered == [wheel]
    assert found_beside(layout, wheel) == layout.dist / wheel.name
    assert [cell.cell for cell in built_cells(tmp_path)] == ["cpu-py311"]


def test_a_wheel_with_other_bytes_than_its_report_lists_is_not_found(tmp_path: Path) -> None:
    layout, _report, wheel = written(tmp_path)
    (layout.dist / wheel.name).write_bytes(b"other bytes")
    assert found_beside(layout, wheel) is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda data: {**data, "report_version": REPORT_VERSION + 1}, "report version 2, where this wheelmill reads 1"),
        (lambda data: {k: v for k, v in data.items() if k != "report_version"}, "report version None"),
        (lambda data: {k: v for k, v in data.items() if k != "channel"}, "KeyError: 'channel'"),
        (lambda data: {**data, "status": "fine"}, "ValueError: 'fine' is not a valid Status"),
        (lambda data: [data], "report version None"),
    ],
)
def test_a_report_of_another_version_or_shape_is_named(
    tmp_path: Path, change: Callable[[dict[str, Any]], object], says: str
) -> None:
    layout, _report, _wheel = written(tmp_path)
    data = json.loads(layout.report.read_text())
    layout.report.write_text(json.dumps(change(data)))
    with pytest.raises(ReportError, match=says.replace("(", r"\(")):
        load_report(layout.report, cell="cpu-py311")


def test_a_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_bytes(b'{"report_version": 1,')
    with pytest.raises(ReportError, match="not JSON"):
        load_report(report, cell="cpu-py311")
    report.write_bytes(b"\xff\xfe")
    with pytest.raises(ReportError, match="not UTF-8"):
        load_report(report, cell="cpu-py311")


def test_a_report_in_another_cells_directory_is_not_that_cells(tmp_path: Path) -> None:
    """A report copied into another cell's directory would mirror and release its wheels as
    that cell's: every reader names the mismatch."""
    layout, _report, _wheel = written(tmp_path)
    other = CellLayout(output=tmp_path, cell="cpu-py312")
    other.root.mkdir(parents=True)
    shutil.copy(layout.report, other.report)
    with pytest.raises(ReportError, match="the report of cell cpu-py311, not of cpu-py312"):
        load_report(other.report, cell=other.cell)


def test_the_facts_say_whether_the_engine_ran_rootless() -> None:
    """docs/images.md: report.json's facts say "rootless" where an engine ran the cell."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    recipes, cell = load_recipes(ROOT / "recipes"), matrix.cell("cpu-py311")
    on_host = plan_cell(matrix, recipes, cell, ["example-cpp-ops"], Settings())
    in_podman = replace(on_host, engine="podman")
    assert CellReport(plan=in_podman, path=Path("r.json"), rootless=True).facts["rootless"] is True
    assert CellReport(plan=in_podman, path=Path("r.json")).facts["rootless"] is False
    assert on_host.engine == "none" and "rootless" not in CellReport(plan=on_host, path=Path("r.json")).facts
