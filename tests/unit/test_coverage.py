"""Coverage from the matrix and the release records alone: a release with two cells built,
one served from its group's one build, one failed and the rest planned, read as the grid
and as JSON held to its schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import CliRunner
from tests.wheels import make_wheel
from wheelmill.checks.gpu import GpuOutcome
from wheelmill.index.roots import Index
from wheelmill.index.storage import TreeStorage
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.inputs.versions import Action, Release, Track, VersionRule
from wheelmill.machine.net import sha256_of
from wheelmill.output.layout import CellLayout
from wheelmill.releases.coverage import COVERAGE_SCHEMA_PATH, Mark, coverage, release_of
from wheelmill.releases.publish import BuiltWheel, failed_build, publish_release
from wheelmill.releases.records import FailedBuild, GpuRecord, Manifest, record_failure, record_gpu

ROOT = Path(__file__).resolve().parent.parent.parent
HEAD = "c" * 40
H100 = "linux-gpu-h100"


def rc(version: str = "2.4.0rc1") -> Release:
    tag = f"v{version.replace('rc', '-rc')}"
    return Release(version=version, track=Track.TEST, tag=tag, commit=HEAD, action=Action.BUILD)


def _wheel(tmp_path: Path, cell: str, channel: str, recipe: str, version: str, *, group: bool = False) -> BuiltWheel:
    made = make_wheel(tmp_path / "built" / cell, recipe, version, files={f"{recipe.replace('-', '_')}/_C.so": b"x"})
    return BuiltWheel(
        cell=cell,
        channel=channel,
        recipe=recipe,
        rule=VersionRule.REPO,
        path=made,
        sha256=sha256_of(made),
        from_group=group,
    )


@pytest.fixture
def released(tmp_path: Path) -> Index:
    """An rc in a tree index: cpu-py311 and cuda130-py311 built, cuda130-torch2.12-py311
    served its group's one build, cuda130-py312 failed; cuda130-py311 passed its GPU stage."""
    index = Index(tree=tmp_path / "index")
    release = rc()
    built = [
        _wheel(tmp_path, "cpu-py311", "test/cpu", "example-cpp-ops", "2.4.0rc1+cpu"),
        _wheel(tmp_path, "cuda130-py311", "test/cu130", "example-cuda-ops", "2.4.0rc1+cu130"),
    ]
    stable = _wheel(tmp_path, "cuda130-py311", "test/cu130", "example-stable-ops", "2.4.0rc1+cu130")
    served = BuiltWheel(**{**vars(stable), "cell": "cuda130-torch2.12-py311", "channel": "test/cu130-torch2.12"})
    served = BuiltWheel(**{**vars(served), "from_group": True})
    runners = {"cuda130-py311": (H100,), "cuda130-torch2.12-py311": (H100,)}
    publish_release(index, release, [*built, stable, served], gpu_runners=runners, on_file=lambda _p: None)
    tested = {built[1].sha256: GpuOutcome.PASSED, stable.sha256: GpuOutcome.IMPORT_ONLY}
    stage = GpuRecord(cell="cuda130-py311", status=GpuOutcome.PASSED, runner=H100, gpus=("H100",), tested=tested)
    record_gpu(index.storage, Track.TEST, "2.4.0rc1", [stage])
    head = Manifest(version="2.4.0rc1", track=Track.TEST, commit=HEAD, tag="v2.4.0-rc1", files=(), gpu_runners={})
    failed = FailedBuild(
        cell="cuda130-py312", step="build", recipe="torchsort", error="nvcc fatal: unsupported gpu", exit_code=10
    )
    record_failure(index.storage, head, failed, b"...\nnvcc fatal: unsupported gpu\n")
    return index


def test_each_spot_is_marked_from_the_records(released: Index) -> None:
    matrix, recipes = load_matrix(ROOT / "recipes" / "matrix.toml"), load_recipes(ROOT / "recipes")
    found = coverage(matrix, recipes, release_of(released.storage, Track.TEST, None))
    assert found.version == "2.4.0rc1"
    spot = found.spot
    assert spot("example-cpp-ops", "cpu", "3.11").mark is Mark.BUILT
    cuda = spot("example-cuda-ops", "cuda130", "3.11")
    assert cuda.mark is Mark.BUILT and cuda.files[0].gpu == {H100: "passed"}
    served = spot("example-stable-ops", "cuda130-torch2.12", "3.11")
    assert served.mark is Mark.SERVED and served.files[0].gpu == {H100: "not-run"}, "no stage of its own cell"
    assert spot("example-stable-ops", "cuda130", "3.11").files[0].gpu == {H100: "import-only"}
    failed = spot("torchsort", "cuda130", "3.12")
    assert failed.mark is Mark.FAILED and failed.failure is not None and failed.failure.step == "build"
    assert failed.failure.log is not None and released.storage.get(failed.failure.log) is not None
    assert spot("example-cpp-ops", "cuda130", "3.12").mark is Mark.FAILED, "the whole cell failed"
    assert spot("example-cpp-ops", "cpu", "3.12").mark is Mark.PLANNED
    assert spot("flash-attn", "cuda130", "3.11").mark is Mark.OPT_IN
    assert spot("example-cpp-ops", "cuda118", "3.9").mark is Mark.PLANNED
    assert spot("example-cpp-ops", "cpu", "3.9").mark is Mark.ABSENT, "the cpu variant has no 3.9"
    assert spot("example-cuda-ops", "cpu", "3.11").mark is Mark.ABSENT, "a CUDA recipe"
    counts = found.counts()
    assert (counts["built"], counts["served"]) == (3, 1)


def test_the_json_holds_to_its_schema_and_a_broken_one_does_not(released: Index) -> None:
    matrix, recipes = load_matrix(ROOT / "recipes" / "matrix.toml"), load_recipes(ROOT / "recipes")
    data = coverage(matrix, recipes, release_of(released.storage, Track.TEST, "2.4.0rc1")).as_dict()
    schema = json.loads(COVERAGE_SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(data, schema)
    data["spots"][0]["mark"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_the_grid_fits_100_columns_and_names_the_failure(
    released: Index, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(released.tree))
    monkeypatch.setenv("COLUMNS", "100")
    shown = cli("coverage")
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert lines[0].startswith("test/2.4.0rc1 at cccccccccccc: 3 built, 1 served, ")
    stable = lines[next(i for i, line in enumerate(lines) if line.startswith("example-stable-ops")) :]
    assert "S?" in next(line for line in stable if line.startswith("cuda130-torch2.12 "))
    assert any("cuda130-py312: build (torchsort), exit 10: nvcc fatal: unsupported gpu" in line for line in lines)
    one = cli("coverage", "--json", "--recipe", "torchsort")
    assert {s["recipe"] for s in json.loads(one.out)["spots"]} == {"torchsort"}


def test_no_release_and_an_unknown_recipe_are_one_line_each(cli: CliRunner, tmp_path: Path) -> None:
    empty = cli("coverage")
    assert empty.code != 0 and "has no release" in empty.err and "fix:" in empty.err
    assert len(empty.err.strip().splitlines()) == 1
    unknown = cli("coverage", "--recipe", "torchsrot")
    assert unknown.code == 2 and "perhaps you meant 'torchsort'?" in unknown.err


def test_a_failed_cells_report_gives_its_step_error_and_log_end(tmp_path: Path) -> None:
    layout = CellLayout(output=tmp_path, cell="cpu-py311")
    layout.logs.mkdir(parents=True)
    (layout.logs / "build-torchsort.log").write_text("compiling\n" * 10000 + "error: no member named 'x'\n")
    report = {
        "report_version": 1, "cell": "cpu-py311", "variant": "cpu", "python": "3.11", "engine": "none",
        "channel": "test/cpu", "release": {"version": "2.4.0rc1", "track": "test", "tag": "v2.4.0-rc1", "commit": HEAD},
        "status": "failed", "exit_code": 10, "started": "", "finished": None, "seconds": 1.0, "facts": {},
        "recipes": [], "steps": [
            {"step": "lock", "recipe": None, "status": "ok", "log": None, "error": None, "exit_code": None},
            {"step": "build", "recipe": "torchsort", "status": "failed", "error": "compile failed\nmore",
             "log": "/elsewhere/logs/build-torchsort.log", "exit_code": 10},
        ],
    }  # fmt: skip
    layout.report.write_text(json.dumps(report))
    failed, log = failed_build(layout, rc(), run="https://ci.example/run/1")
    assert (failed.step, failed.recipe, failed.error, failed.exit_code) == ("build", "torchsort", "compile failed", 10)
    assert log is not None and log.endswith(b"error: no member named 'x'\n") and len(log) <= 64 * 1024
    assert log.startswith(b"compiling\n"), "cut at a line's start"
    stopped, none = failed_build(CellLayout(output=tmp_path, cell="cpu-py312"), rc(), run=None)
    assert stopped.error.startswith("no report") and none is None


def test_records_of_failures_count_the_newest_and_never_a_log_as_one(tmp_path: Path) -> None:
    storage = TreeStorage(tmp_path)
    head = Manifest(version="2.4.0rc1", track=Track.TEST, commit=HEAD, tag=None, files=(), gpu_runners={})
    for error in ("first", "second"):
        failed = FailedBuild(cell="cpu-py311", step="build", recipe=None, error=error, exit_code=1)
        record_failure(storage, head, failed, b"log")
    (manifest,) = [release_of(storage, Track.TEST, None)]
    assert [f.error for f in manifest.failed] == ["second"]


def test_wants_from_the_access_logs_are_in_the_grid_and_the_json(
    released: Index, cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Installers that asked test/cpu for a Python it has no file for, read from the served
    index's access log (a setting, or --wants): ranked in the JSON and under the grid."""
    from tests.unit.test_wants import PIP, UV, agent, line  # noqa: PLC0415 - their real User-Agents

    log = tmp_path / "access.log"
    asked = [agent(PIP, "3.12.7"), agent(UV, "3.12.1"), agent(PIP, "3.12.7"), agent(PIP, "3.10.4")]
    log.write_text("".join(line("/test/cpu/simple/example-cpp-ops/", ua) + "\n" for ua in asked))
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(released.tree))
    monkeypatch.setenv("WHEELMILL_ACCESS_LOGS", str(log))
    shown = cli("coverage", "--json")
    assert shown.code == 0, shown.err
    data = json.loads(shown.out)
    jsonschema.validate(data, json.loads(COVERAGE_SCHEMA_PATH.read_text()))
    ranked = [(w["project"], w["python"], w["count"]) for w in data["wants"]]
    assert ranked == [("example-cpp-ops", "3.12", 3), ("example-cpp-ops", "3.10", 1)]
    monkeypatch.setenv("COLUMNS", "100")
    grid = cli("coverage", "--wants", str(log)).out.splitlines()
    assert "wanted, most asked first (2; `wheelmill wants` says more):" in grid
    assert "      3  test/cpu/example-cpp-ops  Python 3.12 manylinux_2_36_x86_64: no compatible file" in grid


def test_release_list_counts_each_releases_cells_failures_and_gpu_gate(
    released: Index, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(released.tree))
    listed = cli("release", "list", "--json")
    assert listed.code == 0, listed.err
    (one,) = json.loads(listed.out)
    assert {k: one[k] for k in ("track", "version", "cells", "files", "failed", "gpu_cells", "gpu_passed")} == {
        "track": "test", "version": "2.4.0rc1", "cells": 3, "files": 4, "failed": 1, "gpu_cells": 2, "gpu_passed": 0,
    }, "import-only is no pass of the GPU gate"  # fmt: skip
    manifest = release_of(released.storage, Track.TEST, None)
    tested = {f.sha256: GpuOutcome.PASSED for f in manifest.files if f.cell == "cuda130-py311"}
    stage = GpuRecord(cell="cuda130-py311", status=GpuOutcome.PASSED, runner=H100, gpus=("H100",), tested=tested)
    record_gpu(released.storage, Track.TEST, "2.4.0rc1", [stage])
    (again,) = json.loads(cli("release", "list", "--track", "test", "--json").out)
    assert again["gpu_passed"] == 1
    shown = cli("release", "list")
    assert "test  " in shown.out and "2.4.0rc1" in shown.out and "1 of 2" in shown.out
    assert json.loads(cli("release", "list", "--track", "release", "--json").out) == []
