"""Build once, serve many: a stable, abi3 recipe's plan names the cells and channels it
serves and the corners that install-test it; its build key says no torch and no Python, so
every cell of its serving group finds the one build; the build-keys step finds it in a
sibling channel, and the pipeline runs none of its build there but its checks after repair,
its install test where the plan has one, and its publishing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from packaging.tags import parse_tag

from tests.unit.test_buildkey import HOST, _run_keys_step, _step, cell_plan, project  # noqa: F401 - a fixture
from tests.wheels import make_wheel
from wheelmill.building.pipeline import blocked
from wheelmill.building.plan import plan
from wheelmill.building.products import Repaired, ShippedAbi
from wheelmill.building.report import CellReport, StepRecord
from wheelmill.checks import Verdict
from wheelmill.checks.abi import judge_serving
from wheelmill.conda.channel import conda_channel_root
from wheelmill.conda.package import CondaTarget, conda_meta
from wheelmill.index.store import Channel, publish
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.output.report import Status, WheelRecord
from wheelmill.planning.buildkey import build_keys
from wheelmill.planning.serving import corners
from wheelmill.planning.spec import CellPlan, StepKind
from wheelmill.settings import Settings
from wheelmill.wheel.wheelfile import read_wheel

STABLE = "example-stable-ops"


def _plans(repo: Path, *cells: str, names: tuple[str, ...] = (STABLE, "example-cpp-ops")) -> tuple[CellPlan, ...]:
    matrix = load_matrix(repo / "recipes" / "matrix.toml")
    return plan(matrix, load_recipes(repo / "recipes"), [matrix.cell(c) for c in cells], list(names), Settings())


def test_the_corners_are_the_oldest_and_newest_torch_each_with_its_oldest_and_newest_python() -> None:
    matrix = load_matrix(Path(__file__).resolve().parents[2] / "recipes" / "matrix.toml")
    group = [
        c
        for c in matrix.cells
        if c.variant.base_name == "cuda130" and c.variant.slim_tag is None and not c.variant.platform_tag
    ]
    assert {c.id for c in group} >= {"cuda130-py310", "cuda130-torch2.12-py313"}
    assert corners(group) == ("cuda130-torch2.12-py310", "cuda130-torch2.12-py313", "cuda130-py310", "cuda130-py313")


def test_a_stable_recipe_is_planned_once_for_the_group_and_a_per_torch_one_per_cell(project: Path) -> None:  # noqa: F811
    first, second = _plans(project, "cuda130-py311", "cuda130-torch2.12-py312")
    stable, other = second.recipe(STABLE), second.recipe("example-cpp-ops")
    assert stable.serving is not None and other.serving is None
    assert stable.serving.first == "cuda130-py311" == first.recipe(STABLE).serving.first  # type: ignore[union-attr]
    assert stable.serving.channels == ("cu130-torch2.12", "cu130"), "its own channel first, then the group's"
    assert len(stable.serving.cells) == 8 and "cuda130-sm90-py311" not in stable.serving.cells, "a slim arch is apart"
    assert stable.label == "cu130" and stable.version.label == "cu130", "no torch in the label of the one build"
    assert other.label == "cu130.torch2.12", "built per torch, it carries its torch"
    assert "built by cuda130-py311 earlier in this run where none has it" in stable.serving.describe(second.cell.id)


def test_every_cell_of_the_group_computes_the_same_key_for_the_stable_recipe(project: Path) -> None:  # noqa: F811
    plans = _plans(
        project, "cuda130-py311", "cuda130-py313", "cuda130-torch2.12-py310", "cuda130-sm90-py311", "cpu-py311"
    )
    builders = [{"host": {**HOST["host"], "python": [f"/usr/bin/python{p.cell.python}", p.cell.python]}} for p in plans]
    keys = [build_keys(p, b) for p, b in zip(plans, builders, strict=True)]
    stable = [k[STABLE].digest for k in keys]
    assert len(set(stable[:3])) == 1, "another torch or Python: the same one build"
    assert len(set(stable[2:])) == 3, "another arch set or toolkit: a build of its own"
    assert len({k["example-cpp-ops"].digest for k in keys}) == len(plans), "built per torch and Python"
    changed = replace(plans[0], recipes=tuple(replace(r, max_wheel_size=1) for r in plans[0].recipes))
    assert build_keys(changed, builders[0])[STABLE].digest != stable[0], "its recipe is still in its key"


def test_a_sibling_channels_build_is_served_and_only_its_own_steps_run(project: Path, tmp_path: Path) -> None:  # noqa: F811
    _first, second = _plans(project, "cuda130-py310", "cuda130-torch2.12-py311", names=(STABLE,))
    keys = _run_keys_step(second, tmp_path)
    assert keys.served == {}, "nothing built yet: this cell builds it"
    wheel = make_wheel(
        tmp_path / "dist", STABLE, "0.1.0+cu130", tag="cp310-abi3-linux_x86_64", requires=["torch>=2.10"]
    )
    publish(Channel(tmp_path / "wheels" / "index", "cu130"), wheel, build_key=keys.keys[STABLE].digest)
    keys = _run_keys_step(second, tmp_path)
    served = keys.served[STABLE]
    assert served.channel == "cu130" and served.wheel.name == wheel.name and keys.published == {}
    published = tmp_path / "wheels" / "index" / "cu130" / "files" / wheel.name
    assert served.wheel.is_relative_to(tmp_path / "wheels" / second.cell.id), "in the cell's tree: a container sees it"
    assert served.wheel.stat().st_ino == published.stat().st_ino, "linked: the published bytes"
    report = CellReport(plan=second, path=tmp_path / "report.json")
    report.steps += [
        StepRecord(step=second.steps[0], status=Status.OK),
        StepRecord(step=second.steps[1], status=Status.OK, made=(keys,)),
    ]
    assert blocked(_step(second, StepKind.PREPARE_ENV), second, report) is None, "its torch's env checks it"
    ran = []
    for step in (s for s in second.steps if s.recipe == STABLE):
        stop = blocked(step, second, report)
        if stop is None:
            ran.append(step.kind)
            made = (ShippedAbi(text="python limited>=3.10"),) if step.kind is StepKind.POST_REPAIR_CHECKS else ()
            report.steps.append(StepRecord(step=step, status=Status.OK, made=made))
        else:
            assert stop.status is Status.SERVED and "served: " in stop.reason, stop
            report.steps.append(StepRecord(step=step, status=stop.status, error=stop.reason, made=stop.made))
    assert ran == [StepKind.POST_REPAIR_CHECKS, StepKind.PUBLISH], "py311 is no corner: checked and published"
    assert report.done.get(Repaired, STABLE).wheel == served.wheel
    record = report.done.get(WheelRecord, STABLE)
    assert (
        record.abi == "python limited>=3.10"
        and Path(record.path).parent == tmp_path / "wheels" / second.cell.id / "dist"
    )
    assert report.recipe_status(STABLE) is Status.SERVED


def test_a_corner_cell_fetches_and_install_tests_what_it_is_served(project: Path, tmp_path: Path) -> None:  # noqa: F811
    _first, corner = _plans(project, "cuda130-py311", "cuda130-torch2.12-py313", names=(STABLE,))
    keys = _run_keys_step(corner, tmp_path)
    wheel = make_wheel(tmp_path / "dist", STABLE, "0.1.0+cu130", tag="cp310-abi3-linux_x86_64")
    publish(Channel(tmp_path / "wheels" / "index", "cu130"), wheel, build_key=keys.keys[STABLE].digest)
    keys = _run_keys_step(corner, tmp_path)
    assert keys.served[STABLE].delivered is None, "its install test delivers it"
    report = CellReport(plan=corner, path=tmp_path / "report.json")
    report.steps += [StepRecord(step=corner.steps[1], status=Status.OK, made=(keys,))]
    for kind in (StepKind.FETCH, StepKind.INSTALL_TEST, StepKind.PUBLISH):
        assert blocked(_step(corner, kind, STABLE), corner, report) is None, kind


@pytest.mark.parametrize(
    ("tag", "requires", "python", "torch", "said"),
    [
        ("cp310-abi3-linux_x86_64", ["torch>=2.10"], "3.12", "2.12.0", None),
        ("py3-none-linux_x86_64", [], "3.9", "2.14.1", None),
        ("cp311-cp311-linux_x86_64", [], "3.11", "2.14.1", "built once for every Python, but tagged cp311-cp311"),
        ("cp312-abi3-linux_x86_64", [], "3.11", "2.14.1", "tagged abi3 from Python 3.12: no wheel for this cell's"),
        ("cp310-abi3-linux_x86_64", ["torch>=2.13"], "3.11", "2.12.0", "requires torch>=2.13, which this cell's torch"),
    ],
)
def test_a_served_wheel_must_fit_the_cell_it_is_published_to(
    tag: str, requires: list[str], python: str, torch: str, said: str | None
) -> None:
    verdict = judge_serving(frozenset(parse_tag(tag)), requires, python=python, torch=torch)
    if said is None:
        assert verdict.verdict is Verdict.PASS, verdict
    else:
        assert verdict.verdict is Verdict.FAIL and said in verdict.detail and verdict.fix, verdict


def test_in_its_own_channel_a_stable_build_is_published_for_the_cell_whose_conda_package_is_there(
    project: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The channel lists the one build for every Python of it once one cell put it there; a
    cell of another Python is served it (its checks, corner test and conda package), the cell
    that published it (its conda package there) finds it published."""
    (cell,) = _plans(project, "cuda130-py313", names=(STABLE,))
    keys = _run_keys_step(cell, tmp_path)
    wheel = make_wheel(tmp_path / "dist", STABLE, "0.1.0+cu130", tag="cp310-abi3-linux_x86_64")
    publish(Channel(tmp_path / "wheels" / "index", "cu130"), wheel, build_key=keys.keys[STABLE].digest)
    keys = _run_keys_step(cell, tmp_path)
    assert keys.published == {} and keys.served[STABLE].channel == "cu130", "another Python's cell published it"
    meta = conda_meta(read_wheel(wheel), CondaTarget.of(cell.cell.variant, cell.cell.python))
    package = conda_channel_root(tmp_path / "wheels" / "index", "cu130") / meta.subdir / meta.filename
    package.parent.mkdir(parents=True)
    package.write_bytes(b"")
    keys = _run_keys_step(cell, tmp_path)
    assert set(keys.published) == {STABLE} and keys.served == {}, "this cell published it: nothing to do"
