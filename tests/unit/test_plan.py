"""The plan is pure: the same inputs give the same steps, nothing is touched, and the
printed plan of a cell is fixed (golden)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from wheelmill.matrix import load_matrix
from wheelmill.plan import CELL_STEPS, RECIPE_STEPS, Options, StepKind, plan
from wheelmill.recipes import load_recipes
from wheelmill.settings import Settings

GOLDEN = Path(__file__).parent.parent / "golden"


@pytest.mark.parametrize(("cell", "engine"), [("cuda118-py311", "none"), ("cpu-py311", "none"), ("cuda130-py311", "podman")])
def test_printed_plan_matches_golden(cli: CliRunner, repo_root: Path, monkeypatch: pytest.MonkeyPatch, cell: str, engine: str) -> None:
    for name in ("WHEELMILL_TORCH_INDEX", "WHEELMILL_BASE"):
        monkeypatch.delenv(name, raising=False)
    result = cli("--recipes", str(repo_root / "recipes"), "plan", "--cell", cell, "--engine", engine)
    assert result.code == 0, result.err
    golden = GOLDEN / (f"plan-{cell}.txt" if engine == "none" else f"plan-{cell}-{engine}.txt")
    if os.environ.get("WHEELMILL_UPDATE_GOLDEN"):
        golden.write_text(result.out)
    assert result.out == golden.read_text(), f"plan changed; if intended, rerun with WHEELMILL_UPDATE_GOLDEN=1 and review {golden}"


def test_plan_runs_nothing_and_writes_nothing(cli: CliRunner, repo_root: Path, tmp_path: Path) -> None:
    result = cli("--recipes", str(repo_root / "recipes"), "plan", "--cell", "cuda*-py311")
    assert result.code == 0
    assert result.out.count("plan for ") == 6
    assert not (tmp_path / "wheels").exists()


def test_plan_is_a_pure_function(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    settings = Settings.from_environ({})
    cells = matrix.select(["cuda130-py311"])
    assert plan(matrix, recipes, cells, [], settings) == plan(matrix, recipes, cells, [], settings)


def test_steps_come_in_design_order_and_dependencies_first(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    (cell_plan,) = plan(matrix, recipes, matrix.select(["cuda130-py311"]), ["example-cuda-ops"], Settings.from_environ({}))
    assert [r.name for r in cell_plan.recipes] == ["example-cpp-ops", "example-cuda-ops"]
    kinds = [s.kind for s in cell_plan.steps]
    tail = [StepKind.CLOSURE, StepKind.MIRROR, StepKind.CHANNEL_CHECKS]
    assert kinds == [*CELL_STEPS, *RECIPE_STEPS, StepKind.PUBLISH, *RECIPE_STEPS, StepKind.PUBLISH, *tail]
    assert kinds.index(StepKind.PRE_CHECKS) < kinds.index(StepKind.PREPARE_ENV) < kinds.index(StepKind.BUILD)


def test_torch_index_setting_replaces_the_template(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    cells = matrix.select(["cuda118-py311"])
    mirrored = plan(matrix, recipes, cells, [], Settings.from_environ({"WHEELMILL_TORCH_INDEX": "https://mirror.example/whl/{label}"}))
    assert mirrored[0].torch_index == "https://mirror.example/whl/cu118"
    assert plan(matrix, recipes, cells, [], Settings.from_environ({"WHEELMILL_TORCH_INDEX": ""}))[0].torch_index is None


def test_no_publish_leaves_the_publish_steps_out(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    (cell_plan,) = plan(matrix, recipes, matrix.select(["cpu-py311"]), [], Settings.from_environ({}), Options(publish=False))
    assert not {StepKind.PUBLISH, StepKind.CLOSURE, StepKind.MIRROR} & {s.kind for s in cell_plan.steps}


def test_no_mirror_publishes_the_built_wheels_only(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    (cell_plan,) = plan(matrix, recipes, matrix.select(["cpu-py311"]), [], Settings.from_environ({}), Options(mirror=False))
    kinds = {s.kind for s in cell_plan.steps}
    assert StepKind.PUBLISH in kinds
    assert StepKind.CHANNEL_CHECKS in kinds
    assert not {StepKind.CLOSURE, StepKind.MIRROR} & kinds


def test_a_plan_with_an_unpinned_registry_base_says_so_and_runs(cli: CliRunner, repo_root: Path) -> None:
    result = cli("--recipes", str(repo_root / "recipes"), "plan", "--cell", "rocm62-py311", "--engine", "podman")
    assert result.code == 0, result.err
    assert "(not pinned by digest: the build stops here until it is)" in result.out
