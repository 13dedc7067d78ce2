"""One build for a group: a stable, abi3 recipe's plan names the cells and channels it
is for, the cells of its oldest torch that build it (a run builds them first, whichever cell
it lists first) and the corners of each torch that install-test it; its build key says no
cell's torch or Python but the torch it is built against and its building cells' committed
locks, so every cell of its ABI group finds the one build; the build-keys step finds it
in a sibling channel, and the pipeline runs none of its build there but its checks after
repair, its install test where the plan has one or the cell's own channel lacks it, and its
publishing; a cell of a newer torch that finds it nowhere builds it only to test it; and a
group build whose libraries need a newer torch than a cell's is refused there."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from packaging.tags import parse_tag

from tests.channels import stored_file, tree_channel
from tests.elves import summary
from tests.unit.test_buildkey import HOST, _run_keys_step, _step, cell_plan, project  # noqa: F401 - a fixture
from tests.wheels import make_wheel
from wheelmill.building.pipeline import blocked
from wheelmill.building.plan import Options, plan
from wheelmill.building.products import Repaired, ShippedAbi
from wheelmill.building.report import CellReport, StepRecord
from wheelmill.checks import Verdict
from wheelmill.checks.abi import judge_abi_group
from wheelmill.conda.package import CondaTarget, conda_meta
from wheelmill.index.channels import conda_channel_root
from wheelmill.index.roots import publish
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.inputs.variants import Cell
from wheelmill.output.report import Status, WheelRecord
from wheelmill.planning.buildkey import build_keys
from wheelmill.planning.groups import building_order, corners
from wheelmill.planning.spec import CellPlan, StepKind
from wheelmill.settings import Settings
from wheelmill.wheel.abi import WheelAbi, classify
from wheelmill.wheel.wheelfile import read_wheel

STABLE = "example-stable-ops"


ROOT = Path(__file__).resolve().parents[2]
# A library of the stable shims: one that torch 2.13 added (grid_sampler_3d), one of 2.10,
# and CPython's limited API.
SHIMS_OF_2_13 = ("aoti_torch_cpu_grid_sampler_3d", "torch_library_impl", "PyModule_Create2")


def _plans(repo: Path, *cells: str, names: tuple[str, ...] = (STABLE, "example-cpp-ops")) -> tuple[CellPlan, ...]:
    matrix = load_matrix(repo / "recipes" / "matrix.toml")
    chosen = [matrix.cell(c) for c in cells]
    return plan(
        matrix, load_recipes(repo / "recipes"), chosen, list(names), Settings(), Options(locks_dir=repo / "locks")
    )


def _cuda130_group() -> list[Cell]:
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    return [
        c
        for c in matrix.cells
        if c.variant.base_name == "cuda130" and c.variant.slim_tag is None and not c.variant.platform_tag
    ]


def test_the_corners_are_each_torchs_oldest_and_newest_python() -> None:
    group = _cuda130_group()
    assert {c.id for c in group} >= {"cuda130-py310", "cuda130-torch2.12-py313"}
    assert corners(group) == ("cuda130-torch2.12-py310", "cuda130-torch2.12-py313", "cuda130-py310", "cuda130-py313")
    # A torch between the oldest and the newest has corners of its own: no torch takes it untested.
    middle = [
        Cell(variant=replace(c.variant, name="cuda130-torch2.13", torch="2.13.0"), python=c.python)
        for c in group
        if c.variant.torch == "2.12.0" and c.python != "3.10"
    ]
    assert corners([*group, *middle]) == (
        "cuda130-torch2.12-py310",
        "cuda130-torch2.12-py313",
        "cuda130-torch2.13-py311",
        "cuda130-torch2.13-py313",
        "cuda130-py310",
        "cuda130-py313",
    )


def test_the_group_builds_in_a_cell_of_its_oldest_torch_whichever_cell_the_run_lists_first(project: Path) -> None:  # noqa: F811
    listed = ("cuda130-py311", "cuda130-torch2.12-py312")
    for cells in (listed, listed[::-1]):
        plans = _plans(project, *cells)
        assert [p.cell.id for p in plans] == ["cuda130-torch2.12-py312", "cuda130-py311"], "the builder runs first"
        groups = [p.recipe(STABLE).group_build for p in plans]
        assert {(s.first, s.torch) for s in groups if s} == {("cuda130-torch2.12-py312", "2.12.0")}
    said = {p.cell.id: p.recipe(STABLE).group_build.describe(p.cell.id) for p in _plans(project, *listed)}  # type: ignore[union-attr]
    assert "where none has it, built here;" in said["cuda130-torch2.12-py312"]
    assert "where none has it, built by cuda130-torch2.12-py312 earlier in this run;" in said["cuda130-py311"]


def test_a_run_keeps_its_order_but_a_groups_oldest_torch_goes_first_in_the_places_of_its_cells() -> None:
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    given = ["cuda130-py311", "cpu-py311", "cuda130-sm90-py311", "cuda130-py312", "cuda130-torch2.12-py310"]
    ordered = [c.id for c in building_order(matrix, [matrix.cell(c) for c in given])]
    assert ordered == ["cuda130-torch2.12-py310", "cpu-py311", "cuda130-sm90-py311", "cuda130-py311", "cuda130-py312"]
    alone = [c.id for c in building_order(matrix, [matrix.cell(c) for c in given[:4]])]
    assert alone == given[:4], "no cell of the oldest torch: the order as given"


def test_a_stable_recipe_is_planned_once_for_the_group_and_a_per_torch_one_per_cell(project: Path) -> None:  # noqa: F811
    first, second = _plans(project, "cuda130-torch2.12-py312", "cuda130-py311")
    stable, other = first.recipe(STABLE), first.recipe("example-cpp-ops")
    assert stable.group_build is not None and other.group_build is None
    assert stable.group_build.first == "cuda130-torch2.12-py312" == second.recipe(STABLE).group_build.first  # type: ignore[union-attr]
    assert stable.group_build.channels == ("cu130-torch2.12", "cu130"), "its own channel first, then the group's"
    assert len(stable.group_build.cells) == 8 and "cuda130-sm90-py311" not in stable.group_build.cells, (
        "a slim arch is apart"
    )
    assert stable.group_build.builders == tuple(f"cuda130-torch2.12-py{p}" for p in ("310", "311", "312", "313"))
    assert stable.group_build.builds_in(first.cell.id) and not stable.group_build.builds_in(second.cell.id)
    assert stable.label == "cu130" and stable.version.label == "cu130", "no torch in the label of the one build"
    assert other.label == "cu130.torch2.12", "built per torch, it carries its torch"
    (alone,) = _plans(project, "cuda130-py311")
    said = alone.recipe(STABLE).group_build.describe(alone.cell.id)  # type: ignore[union-attr]
    assert "built here only to be checked and tested, and not published (no cell of torch 2.12.0 in this run" in said


def test_every_cell_of_the_group_computes_the_same_key_for_the_stable_recipe(project: Path) -> None:  # noqa: F811
    plans = _plans(
        project, "cuda130-torch2.12-py310", "cuda130-py311", "cuda130-py313", "cuda130-sm90-py311", "cpu-py311"
    )
    builders = [{"host": {**HOST["host"], "python": [f"/usr/bin/python{p.cell.python}", p.cell.python]}} for p in plans]
    keys = [build_keys(p, b) for p, b in zip(plans, builders, strict=True)]
    stable = [k[STABLE].digest for k in keys]
    assert len(set(stable[:3])) == 1, "another torch or Python: the same one build"
    assert len(set(stable[2:])) == 3, "another arch set or toolkit: a build of its own"
    assert len({k["example-cpp-ops"].digest for k in keys}) == len(plans), "built per torch and Python"
    changed = replace(plans[0], recipes=tuple(replace(r, max_wheel_size=1) for r in plans[0].recipes))
    assert build_keys(changed, builders[0])[STABLE].digest != stable[0], "its recipe is still in its key"
    assert keys[1][STABLE].inputs["lock"]["torch"] == "2.12.0", "a cell of torch 2.14.1 keys the torch it is built on"


def test_the_torch_the_one_build_is_made_against_is_in_its_key(project: Path) -> None:  # noqa: F811
    """One key names one file: a build against another torch (the matrix's oldest changed)
    is another key, whichever cell a run lists first."""
    (cell,) = _plans(project, "cuda130-py311")
    group = cell.recipe(STABLE).group_build
    assert group is not None
    other = replace(
        cell,
        recipes=tuple(
            replace(r, group_build=replace(group, torch="2.11.0")) if r.group_build else r for r in cell.recipes
        ),
    )
    assert build_keys(other, HOST)[STABLE].digest != build_keys(cell, HOST)[STABLE].digest
    reversed_run = _plans(project, "cuda130-torch2.12-py311", "cuda130-py311")[1]
    assert build_keys(reversed_run, HOST)[STABLE].digest == build_keys(cell, HOST)[STABLE].digest


def test_the_group_builds_key_changes_when_a_committed_lock_of_its_building_cells_does(project: Path) -> None:  # noqa: F811
    """Re-locking the env the one build is made in builds it again; the lock of a cell that
    only takes it (its own torch) is no input of that build."""
    (cell,) = _plans(project, "cuda130-py311")
    before = build_keys(cell, HOST)
    builder = project / "locks" / "cuda130-torch2.12-py310.txt"
    assert not builder.exists()
    builder.write_text("torch==2.12.0 --hash=sha256:" + "0" * 64 + "\n")
    locked = build_keys(cell, HOST)
    assert locked[STABLE].digest != before[STABLE].digest, "a building cell's committed lock is part of its key"
    assert locked["example-cpp-ops"].digest == before["example-cpp-ops"].digest, "another cell's lock: not its"
    builder.write_text(builder.read_text() + "# re-locked\n")
    again = build_keys(cell, HOST)
    assert again[STABLE].digest != locked[STABLE].digest, "re-locked: built again"
    own = project / "locks" / "cuda130-py311.txt"
    own.write_text(own.read_text() + "# re-locked\n")
    relocked = build_keys(cell, HOST)
    assert relocked["example-cpp-ops"].digest != again["example-cpp-ops"].digest, "its own lock: a per-torch build's"
    assert relocked[STABLE].digest == again[STABLE].digest, "the lock of a cell that only takes it: not the one build's"


def _walk(plan: CellPlan, report: CellReport) -> list[StepKind]:
    """Each of the stable recipe's steps, run (recorded ok) or blocked: the kinds that ran."""
    ran = []
    for step in (s for s in plan.steps if s.recipe == STABLE):
        stop = blocked(step, plan, report)
        if stop is None:
            ran.append(step.kind)
            made = (ShippedAbi(text="python limited>=3.10"),) if step.kind is StepKind.POST_REPAIR_CHECKS else ()
            report.steps.append(StepRecord(step=step, status=Status.OK, made=made))
        else:
            assert stop.status is Status.FROM_GROUP and "from the group build: " in stop.reason, stop
            report.steps.append(StepRecord(step=step, status=stop.status, error=stop.reason, made=stop.made))
    return ran


def _keys_done(plan: CellPlan, tmp_path: Path) -> CellReport:
    report = CellReport(plan=plan, path=tmp_path / f"{plan.cell.id}.json")
    report.steps += [
        StepRecord(step=plan.steps[0], status=Status.OK),
        StepRecord(step=plan.steps[1], status=Status.OK, made=(_run_keys_step(plan, tmp_path),)),
    ]
    return report


def test_a_sibling_channels_build_is_taken_and_only_its_own_steps_run(project: Path, tmp_path: Path) -> None:  # noqa: F811
    """cuda130-py311 (torch 2.14.1, no corner): taken from its torch's own channel, it is
    checked and published; found only in a sibling's, no cell of its torch has tested it, so it is
    install-tested here too."""
    (cell,) = _plans(project, "cuda130-py311", names=(STABLE,))
    keys = _run_keys_step(cell, tmp_path)
    wheel = make_wheel(
        tmp_path / "dist", STABLE, "0.1.0+cu130", tag="cp310-abi3-linux_x86_64", requires=["torch>=2.10"]
    )
    index = tmp_path / "wheels" / "index"
    publish(tree_channel(index, "cu130-torch2.12"), wheel, build_key=keys.keys[STABLE].digest)
    keys = _run_keys_step(cell, tmp_path)
    assert keys.from_group[STABLE].channel == "cu130-torch2.12" and keys.from_group[STABLE].tested
    assert _walk(cell, _keys_done(cell, tmp_path)) == [
        StepKind.FETCH,
        StepKind.POST_REPAIR_CHECKS,
        StepKind.INSTALL_TEST,
        StepKind.PUBLISH,
    ], "no cell of torch 2.14.1 tested it: tested here"
    publish(tree_channel(index, "cu130"), wheel, build_key=keys.keys[STABLE].digest)
    keys = _run_keys_step(cell, tmp_path)
    taken = keys.from_group[STABLE]
    assert taken.channel == "cu130" and taken.wheel.name == wheel.name and keys.published == {}
    assert not taken.tested and keys.unpublished == {}
    published = stored_file(tree_channel(index, "cu130"), wheel.name)
    assert taken.wheel.is_relative_to(tmp_path / "wheels" / cell.cell.id), "in the cell's tree: a container sees it"
    assert taken.wheel.stat().st_ino == published.stat().st_ino, "linked: the published bytes"
    report = _keys_done(cell, tmp_path)
    assert blocked(_step(cell, StepKind.PREPARE_ENV), cell, report) is None, "its torch's env checks it"
    assert _walk(cell, report) == [StepKind.POST_REPAIR_CHECKS, StepKind.PUBLISH], "its channel lists it: not tested"
    assert report.done.get(Repaired, STABLE).wheel == taken.wheel
    record = report.done.get(WheelRecord, STABLE)
    assert (
        record.abi == "python limited>=3.10" and Path(record.path).parent == tmp_path / "wheels" / cell.cell.id / "dist"
    )
    assert report.recipe_status(STABLE) is Status.FROM_GROUP


def test_a_corner_cell_fetches_and_install_tests_what_it_takes(project: Path, tmp_path: Path) -> None:  # noqa: F811
    _first, corner = _plans(project, "cuda130-torch2.12-py311", "cuda130-py313", names=(STABLE,))
    keys = _run_keys_step(corner, tmp_path)
    wheel = make_wheel(tmp_path / "dist", STABLE, "0.1.0+cu130", tag="cp310-abi3-linux_x86_64")
    publish(tree_channel(tmp_path / "wheels" / "index", "cu130"), wheel, build_key=keys.keys[STABLE].digest)
    keys = _run_keys_step(corner, tmp_path)
    assert keys.from_group[STABLE].channel == "cu130", "its own channel: another Python of its torch published it"
    assert keys.from_group[STABLE].delivered is None, "its install test delivers it"
    report = CellReport(plan=corner, path=tmp_path / "report.json")
    report.steps += [StepRecord(step=corner.steps[1], status=Status.OK, made=(keys,))]
    for kind in (StepKind.FETCH, StepKind.INSTALL_TEST, StepKind.PUBLISH):
        assert blocked(_step(corner, kind, STABLE), corner, report) is None, kind


def test_a_cell_of_a_newer_torch_builds_what_no_channel_has_only_to_test_it(project: Path, tmp_path: Path) -> None:  # noqa: F811
    """No cell of the oldest torch in the run and no channel with the one build: a cell of a
    newer torch builds it, checks it and install-tests it, and publishes none of it (its
    shims may be newer than the oldest torch's); a cell of the oldest torch builds and
    publishes it."""
    (newer,) = _plans(project, "cuda130-py311", names=(STABLE,))
    keys = _run_keys_step(newer, tmp_path)
    assert keys.from_group == {} == keys.published and set(keys.unpublished) == {STABLE}
    assert keys.facts()["unpublished"] == keys.unpublished, "report.json says so: a --no-publish run has no publish"
    report = _keys_done(newer, tmp_path)
    for kind in (StepKind.FETCH, StepKind.BUILD, StepKind.POST_REPAIR_CHECKS, StepKind.INSTALL_TEST):
        assert blocked(_step(newer, kind, STABLE), newer, report) is None, kind
    stop = blocked(_step(newer, StepKind.PUBLISH, STABLE), newer, report)
    assert stop is not None and stop.status is Status.SKIPPED, stop
    assert stop.reason.startswith("built here against torch 2.14.1 to be checked and tested, not published"), stop
    assert "made against torch 2.12.0, the oldest of its group, by a cell of that torch (cuda130-torch2.12-py310" in (
        stop.reason
    )
    assert report.exit_code == 0, "not published is no failure"
    (rebuilt,) = _plans(project, "cuda130-py311", names=(STABLE,))
    rebuilt = replace(rebuilt, rebuild=frozenset({STABLE}))
    assert "(--rebuild)" in _run_keys_step(rebuilt, tmp_path).unpublished[STABLE], "--rebuild there: not published"
    (oldest,) = _plans(project, "cuda130-torch2.12-py311", names=(STABLE,))
    assert _run_keys_step(oldest, tmp_path).unpublished == {}, "a cell of the oldest torch builds it to publish"


def _abi(*symbols: str) -> WheelAbi:
    name = "example_stable_ops/_C.abi3.so"
    return WheelAbi(libraries=(classify(summary(Path("/x") / name, undefined=symbols), name),) if symbols else ())


@pytest.mark.parametrize(
    ("tag", "requires", "symbols", "python", "torch", "said"),
    [
        ("cp310-abi3-linux_x86_64", ["torch>=2.10"], (), "3.12", "2.12.0", None),
        ("py3-none-linux_x86_64", ["torch>=2.10"], (), "3.9", "2.14.1", None),
        ("cp310-abi3-linux_x86_64", ["torch>=2.13"], SHIMS_OF_2_13, "3.11", "2.14.1", None),
        ("cp311-cp311-linux_x86_64", [], (), "3.11", "2.14.1", "built once for every Python, but tagged cp311-cp311"),
        ("cp312-abi3-linux_x86_64", [], (), "3.11", "2.14.1", "tagged abi3 from Python 3.12: no wheel for this cell's"),
        (
            "cp310-abi3-linux_x86_64",
            ["torch>=2.13"],
            (),
            "3.11",
            "2.12.0",
            "requires torch>=2.13, which this cell's torch 2.12.0 does not satisfy",
        ),
        (
            "cp310-abi3-linux_x86_64",
            ["torch>=2.10"],
            SHIMS_OF_2_13,
            "3.11",
            "2.12.0",
            "its libraries call a stable shim of torch 2.13.0, which this cell's torch 2.12.0 lacks",
        ),
        ("py3-none-linux_x86_64", [], (), "3.11", "2.12.0", "says no oldest torch it runs on"),
        ("py3-none-linux_x86_64", ["torch"], (), "3.11", "2.12.0", "its Requires-Dist torch has no lower bound"),
        (
            "cp310-abi3-linux_x86_64",
            ["torch>=2.10"],
            ("_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",),
            "3.11",
            "2.12.0",
            "its libraries use libtorch's C++ API",
        ),
    ],
)
def test_a_group_builds_wheel_must_fit_the_cell_it_is_published_to(
    tag: str, requires: list[str], symbols: tuple[str, ...], python: str, torch: str, said: str | None
) -> None:
    verdict = judge_abi_group(frozenset(parse_tag(tag)), requires, _abi(*symbols), python=python, torch=torch)
    if said is None:
        assert verdict.verdict is Verdict.PASS, verdict
        assert "torch >=" in verdict.detail or "requires torch>=" in verdict.detail, "a pass names its floor"
    else:
        assert verdict.verdict is Verdict.FAIL and said in verdict.detail and verdict.fix, verdict
        assert "\n" not in verdict.detail + verdict.fix, "one line"


def test_a_wheel_whose_shims_need_a_newer_torch_says_the_floor_and_the_fix() -> None:
    """A library that calls a shim torch 2.13 added, taken by a cell of torch 2.12: refused
    there, naming the floor and what to do; in a cell of torch 2.14 it fits."""
    tags = frozenset(parse_tag("cp310-abi3-manylinux_2_28_x86_64"))
    refused = judge_abi_group(tags, ["torch>=2.10"], _abi(*SHIMS_OF_2_13), python="3.12", torch="2.12.0")
    assert refused.verdict is Verdict.FAIL
    assert "torch 2.13.0" in refused.detail and "2.12.0" in refused.detail
    assert refused.fix is not None and "the oldest torch it runs on, no newer than 2.12.0" in refused.fix
    fits = judge_abi_group(tags, ["torch>=2.13"], _abi(*SHIMS_OF_2_13), python="3.12", torch="2.14.1")
    assert fits.verdict is Verdict.PASS
    assert fits.detail == (
        "Python >= 3.10, stable shims of torch >= 2.13.0, requires torch>=2.13: fits Python 3.12, torch 2.14.1"
    )


def test_in_its_own_channel_a_stable_build_is_published_for_the_cell_whose_conda_package_is_there(
    project: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The channel lists the one build for every Python of it once one cell put it there; a
    cell of another Python takes it (its checks, corner test and conda package), the cell
    that published it (its conda package there) finds it published."""
    (cell,) = _plans(project, "cuda130-py313", names=(STABLE,))
    keys = _run_keys_step(cell, tmp_path)
    wheel = make_wheel(tmp_path / "dist", STABLE, "0.1.0+cu130", tag="cp310-abi3-linux_x86_64")
    publish(tree_channel(tmp_path / "wheels" / "index", "cu130"), wheel, build_key=keys.keys[STABLE].digest)
    keys = _run_keys_step(cell, tmp_path)
    assert keys.published == {} and keys.from_group[STABLE].channel == "cu130", "another Python's cell published it"
    meta = conda_meta(read_wheel(wheel), CondaTarget.of(cell.cell.variant, cell.cell.python))
    package = conda_channel_root(tmp_path / "wheels" / "index", "cu130") / meta.subdir / meta.filename
    package.parent.mkdir(parents=True)
    package.write_bytes(b"")
    keys = _run_keys_step(cell, tmp_path)
    assert set(keys.published) == {STABLE} and keys.from_group == {}, "this cell published it: nothing to do"


@pytest.mark.parametrize(
    ("requires", "verdict"),
    [
        (["torch>=2.13"], Verdict.PASS),
        (["torch>=2.13.0,<3"], Verdict.PASS),
        (["torch>=2.10"], Verdict.FAIL),  # admits 2.10 to 2.12, which lack a shim it calls
        ([], Verdict.FAIL),  # admits any torch
    ],
)
def test_a_wheels_requires_dist_admits_no_torch_older_than_its_libraries_need(
    requires: list[str], verdict: Verdict
) -> None:
    """Where its libraries say the oldest torch they load on, its metadata must too: an
    installer reads the metadata, never the libraries."""
    tags = frozenset(parse_tag("cp310-abi3-manylinux_2_28_x86_64"))
    judged = judge_abi_group(tags, requires, _abi(*SHIMS_OF_2_13), python="3.12", torch="2.14.1")
    assert judged.verdict is verdict, judged
    if verdict is Verdict.FAIL:
        assert "its libraries need torch 2.13.0 or newer" in judged.detail
        assert judged.fix == "require torch>=2.13.0 (Requires-Dist), the oldest torch its libraries run on"
