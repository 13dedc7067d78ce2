"""The channel-checks step, on real channels: it passes on what was just published, and
fails, naming the wheel, when the channel lists or serves other bytes than were tested or
a page is broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.channels import pages_dir, stored_file
from tests.wheels import make_wheel
from wheelmill.building.context import RunContext, StepContext
from wheelmill.building.pipeline import host
from wheelmill.building.plan import plan_cell
from wheelmill.building.report import CellReport, StepRecord
from wheelmill.building.steps.channel import channel_checks
from wheelmill.errors import ChannelError
from wheelmill.index.roots import Index, publish
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.machine.process import StepLog
from wheelmill.output.layout import CellLayout
from wheelmill.output.report import Status, WheelRecord
from wheelmill.planning.spec import Step, StepKind
from wheelmill.settings import Settings

ROOT = Path(__file__).resolve().parent.parent.parent


def checks_after_publishing(tmp_path: Path, damage: str | None = None) -> list[str]:
    """Publish a tested wheel of example-cpp-ops into the cpu channel, damage the channel,
    run the step; the verdicts, or the step's error."""
    settings = Settings.from_environ({"WHEELMILL_OUTPUT": str(tmp_path / "wheels")})
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    plan = plan_cell(matrix, load_recipes(ROOT / "recipes"), matrix.cell("cpu-py311"), ["example-cpp-ops"], settings)
    tested = make_wheel(
        tmp_path / "dist", "example-cpp-ops", "0.1.0+cpu", files={"example_cpp_ops/__init__.py": b"x = 1\n"}
    )
    channel = Index.of(settings).channel("cpu")
    done = publish(channel, tested)
    if damage == "other bytes":
        stored_file(channel, tested.name).write_bytes(b"not what was tested")
    elif damage == "broken page":
        (pages_dir(channel) / "example-cpp-ops" / "index.html").write_text("<html>")
    report = CellReport(plan=plan, path=tmp_path / "report.json")
    for kind, made in ((StepKind.INSTALL_TEST, WheelRecord.of(tested)), (StepKind.PUBLISH, done)):
        report.steps.append(
            StepRecord(step=Step(kind=kind, recipe="example-cpp-ops", detail=""), status=Status.OK, made=(made,))
        )
    run = RunContext(
        plan=plan,
        settings=settings,
        layout=CellLayout(output=settings.output, cell="cpu-py311"),
        engine=None,
        on_line=lambda _line: None,
    )
    with StepLog(tmp_path / "channel-checks.log") as log:
        ctx = StepContext(
            run=run,
            where=host(settings, settings.env_backend),
            done=report.done,
            log=log,
            hold=lambda manager: manager.__enter__(),
        )
        try:
            return [f"{c.name} {c.verdict}" for c in channel_checks(ctx).checks]
        except ChannelError as error:
            return [error.one_line()]


def test_a_freshly_published_channel_passes(tmp_path: Path) -> None:
    assert checks_after_publishing(tmp_path) == ["channel pass", "example-cpp-ops pass"]


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("other bytes", "example-cpp-ops: example_cpp_ops-0.1.0+cpu-cp311-cp311-linux_x86_64.whl: listed sha256"),
        ("broken page", "index.html and index.json list different files"),
    ],
)
def test_a_damaged_channel_fails_naming_what(tmp_path: Path, damage: str, says: str) -> None:
    (line,) = checks_after_publishing(tmp_path, damage)
    assert line.startswith("cpu-py311: channel cpu: ") and says in line, line
