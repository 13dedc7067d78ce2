"""The plan is pure: the same inputs give the same steps, nothing is touched, and the
printed plan of a cell is fixed (golden)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from wheelmill.building.plan import CELL_STEPS, RECIPE_STEPS, Options, StepKind, plan
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.settings import Settings

GOLDEN = Path(__file__).parent.parent / "golden"


# The choices settings make, printed in the plan and pinned here: the defaults, and each other value.
OTHER_CHOICES = {
    "WHEELMILL_ENV_BACKEND": "conda",
    "WHEELMILL_COMPILER_CACHE": "off",
    "WHEELMILL_INSTALL_TESTS": "after",
}


@pytest.mark.parametrize(
    ("cell", "engine", "choices", "name"),
    [
        ("cuda118-py311", "none", {}, "plan-cuda118-py311.txt"),
        ("cpu-py311", "none", {}, "plan-cpu-py311.txt"),
        ("cuda130-py311", "podman", {}, "plan-cuda130-py311-podman.txt"),
        ("cuda130-torch2.12-py311", "none", {}, "plan-cuda130-torch2.12-py311.txt"),
        ("cpu-py311", "none", OTHER_CHOICES, "plan-cpu-py311-conda-nocache-after.txt"),
    ],
)
def test_printed_plan_matches_golden(
    cli: CliRunner,
    repo_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    cell: str,
    engine: str,
    choices: dict[str, str],
    name: str,
) -> None:
    for variable in ("WHEELMILL_TORCH_INDEX", "WHEELMILL_BASE", *OTHER_CHOICES):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in choices.items():
        monkeypatch.setenv(variable, value)
    result = cli("--recipes", str(repo_root / "recipes"), "plan", "--cell", cell, "--engine", engine)
    assert result.code == 0, result.err
    golden = GOLDEN / name
    if os.environ.get("WHEELMILL_UPDATE_GOLDEN"):
        golden.write_text(result.out)
    assert result.out == golden.read_text(), (
        f"plan changed; if intended, rerun with WHEELMILL_UPDATE_GOLDEN=1 and review {golden}"
    )


def test_plan_runs_nothing_and_writes_nothing(cli: CliRunner, repo_root: Path, tmp_path: Path) -> None:
    result = cli("--recipes", str(repo_root / "recipes"), "plan", "--cell", "cuda*-py311")
    assert result.code == 0
    # six CUDA variants, cuda130's slim cuda130-sm90, and both again for torch 2.12, and those
    # four again for aarch64: a glob matches the derived cells too
    assert result.out.count("plan for ") == 13
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
    (cell_plan,) = plan(
        matrix, recipes, matrix.select(["cuda130-py311"]), ["example-cuda-ops"], Settings.from_environ({})
    )
    assert [r.name for r in cell_plan.recipes] == ["example-cpp-ops", "example-cuda-ops"]
    kinds = [s.kind for s in cell_plan.steps]
    tail = [StepKind.CLOSURE, StepKind.MIRROR, StepKind.CHANNEL_CHECKS]
    # Every recipe is published after the last one's tests: an install test runs beside the next recipe's build.
    assert kinds == [*CELL_STEPS, *RECIPE_STEPS, *RECIPE_STEPS, StepKind.PUBLISH, StepKind.PUBLISH, *tail]
    assert kinds.index(StepKind.PRE_CHECKS) < kinds.index(StepKind.PREPARE_ENV) < kinds.index(StepKind.BUILD)


def test_a_slim_cell_plans_its_one_arch_into_its_own_channel(cli: CliRunner, repo_root: Path) -> None:
    """cuda130-sm90-py311: the parent's build for 9.0 alone, published apart; torch, its
    index and the build env (lock) are the parent's. Pure planning: nothing is built."""
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    settings = Settings.from_environ({})
    (slim,) = plan(matrix, recipes, matrix.select(["cuda130-sm90-py311"]), [], settings)
    (fat,) = plan(matrix, recipes, matrix.select(["cuda130-py311"]), [], settings)
    assert slim.channel == "cu130-sm90" and fat.channel == "cu130"
    assert [r.name for r in slim.recipes] == [r.name for r in fat.recipes]
    assert {r.name: r.arch_list for r in slim.recipes} == {
        "example-cpp-ops": "9.0",
        "example-stable-ops": "9.0",
        "torchsort": "9.0",
        "example-cuda-ops": "9.0",
    }
    torchsort = slim.recipe("torchsort")
    assert fat.recipe("torchsort").arch_list == "8.0;9.0", "the recipe's own list, which does not widen a slim cell's"
    assert torchsort.build_variables()["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert torchsort.version.expected(torchsort.source) == "0.1.10+cu130.sm90"
    assert fat.recipe("torchsort").version.expected(torchsort.source) == "0.1.10+cu130"
    assert slim.cell.variant.torch_requirement == "torch==2.14.1" and slim.lock.requirements[0] == "torch==2.14.1"
    assert slim.torch_index == fat.torch_index == "https://download.pytorch.org/whl/cu130"
    assert slim.lock == fat.lock and slim.lock.cell == "cuda130-py311", "one env, one lock file"
    printed = cli("--recipes", str(repo_root / "recipes"), "plan", "--cell", "cuda130-sm90-py311", "--engine", "none")
    assert printed.code == 0, printed.err
    assert "TORCH_CUDA_ARCH_LIST=9.0;" in printed.out and "add to channel cu130-sm90 " in printed.out
    assert "version label +cu130.sm90" in printed.out and "locks/cuda130-py311.txt" in printed.out


def test_a_rocm_slim_cell_plans_its_one_target(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    (slim,) = plan(matrix, recipes, matrix.select(["rocm64-gfx942-py311"]), [], Settings.from_environ({}))
    assert slim.channel == "rocm6.4-gfx942" and slim.torch_index == "https://download.pytorch.org/whl/rocm6.4"
    assert {r.build_variables()["PYTORCH_ROCM_ARCH"] for r in slim.recipes} == {"gfx942"}
    assert {r.version.label for r in slim.recipes} == {"rocm6.4.gfx942"}


def test_torch_index_setting_replaces_the_template(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    cells = matrix.select(["cuda118-py311"])
    mirrored = plan(
        matrix,
        recipes,
        cells,
        [],
        Settings.from_environ({"WHEELMILL_TORCH_INDEX": "https://mirror.example/whl/{label}"}),
    )
    assert mirrored[0].torch_index == "https://mirror.example/whl/cu118"
    assert plan(matrix, recipes, cells, [], Settings.from_environ({"WHEELMILL_TORCH_INDEX": ""}))[0].torch_index is None


def test_no_publish_leaves_the_publish_steps_out(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    (cell_plan,) = plan(
        matrix, recipes, matrix.select(["cpu-py311"]), [], Settings.from_environ({}), Options(publish=False)
    )
    assert not {StepKind.PUBLISH, StepKind.CLOSURE, StepKind.MIRROR} & {s.kind for s in cell_plan.steps}


def test_no_mirror_publishes_the_built_wheels_only(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    (cell_plan,) = plan(
        matrix, recipes, matrix.select(["cpu-py311"]), [], Settings.from_environ({}), Options(mirror=False)
    )
    kinds = {s.kind for s in cell_plan.steps}
    assert StepKind.PUBLISH in kinds
    assert StepKind.CHANNEL_CHECKS in kinds
    assert not {StepKind.CLOSURE, StepKind.MIRROR} & kinds


def test_a_plan_with_an_unpinned_registry_base_says_so_and_runs(cli: CliRunner, repo_root: Path) -> None:
    result = cli("--recipes", str(repo_root / "recipes"), "plan", "--cell", "rocm62-py311", "--engine", "podman")
    assert result.code == 0, result.err
    assert "(not pinned by digest: the build stops here until it is)" in result.out


def test_a_run_of_both_torches_plans_the_stable_example_once_golden(cli: CliRunner, repo_root: Path) -> None:
    """cuda130 on its two torches in one run: the per-torch example is planned in each cell
    under its own label, the stable one is built by the cell of the older torch, which the run
    builds first although it is listed second, and served to the other."""
    cells = ("--cell", "cuda130-py311", "--cell", "cuda130-torch2.12-py311")
    recipes = ("--recipe", "example-cpp-ops", "--recipe", "example-stable-ops")
    result = cli("--recipes", str(repo_root / "recipes"), "plan", *cells, *recipes, "--engine", "none")
    assert result.code == 0, result.err
    golden = GOLDEN / "plan-cuda130-both-torches-py311.txt"
    if os.environ.get("WHEELMILL_UPDATE_GOLDEN"):
        golden.write_text(result.out)
    assert result.out == golden.read_text(), f"plan changed; rerun with WHEELMILL_UPDATE_GOLDEN=1 and review {golden}"
    grouped = (
        "group build: example-stable-ops built once for cu130 (torch stable ABI, abi3) against torch 2.12.0, "
        "the oldest of the 8 cells it is for"
    )
    assert result.out.count(grouped) == 2
    assert result.out.index("plan for cuda130-torch2.12-py311") < result.out.index("plan for cuda130-py311")
    assert "where none has it, built by cuda130-torch2.12-py311 earlier in this run;" in " ".join(result.out.split())
    assert "example-cpp-ops/stamp" in result.out and "version +cu130.torch2.12;" in result.out
