"""The GPU stage's pure parts: which file of the channel it tests for each recipe, how a
wheel's result is judged against doctor's verdict, what a test run counted, the report's
round trip, and the recipe key's templates."""

from __future__ import annotations

from pathlib import Path

import pytest

from wheelmill.checks.tally import tally
from wheelmill.errors import ConfigError
from wheelmill.gpu.report import CheckRun, GpuReport, WheelResult, load_gpu_report
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes, resolve_all
from wheelmill.machine.net import IndexFile
from wheelmill.planning.gpu_stage import Outcome, Ran, choose, judge, plan_stage, worst
from wheelmill.planning.spec import recipe_spec

ROOT = Path(__file__).resolve().parent.parent.parent
MATRIX = load_matrix(ROOT / "recipes" / "matrix.toml")


def listed(*names: str, yanked: tuple[str, ...] = (), mirrored: tuple[str, ...] = ()) -> list[IndexFile]:
    return [
        IndexFile(
            filename=n,
            url=f"file:///index/cu130/files/{n}",
            sha256="0" * 64,
            yanked=n in yanked,
            mirrored=n in mirrored,
        )
        for n in names
    ]


def test_the_newest_fitting_unyanked_file_of_the_cells_label_is_chosen() -> None:
    files = listed(
        "ops-1.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
        "ops-1.2+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",  # newest, but yanked
        "ops-1.1+cu130-cp312-cp312-manylinux_2_28_x86_64.whl",  # another Python
        "ops-1.1+cu130.sm90-cp311-cp311-manylinux_2_28_x86_64.whl",  # a slim variant's
        "ops-1.1+cu130-cp311-cp311-manylinux_2_28_aarch64.whl",  # another platform
        "ops-1.1.tar.gz",
        yanked=("ops-1.2+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",),
    )
    chosen = choose(files, "3.11", labels={"cu130"})
    assert chosen is not None and chosen.filename == "ops-1.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
    both = listed(
        "ops-1.0+cu130-cp39-abi3-manylinux_2_28_x86_64.whl", "ops-1.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
    )
    best = choose(both, "3.11", labels={"cu130"})
    assert best is not None and "cp311-cp311" in best.filename  # the more specific tag, as pip picks
    assert choose(listed("ops-1.0+cu130-cp312-abi3-linux_x86_64.whl"), "3.11", labels={"cu130"}) is None
    torch = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"  # the closure's copy: not wheelmill's build
    assert choose(listed(torch, mirrored=(torch,)), "3.11", labels={"cu130"}) is None


def test_another_torchs_cell_takes_its_per_torch_wheels_and_the_ones_built_once() -> None:
    variant = MATRIX.variants["cuda130-torch2.12"]
    labels = {variant.wheel_label, variant.serving_label}
    per_torch = listed("ops-1.0+cu130.torch2.12-cp311-cp311-manylinux_2_28_x86_64.whl")
    stable = listed("stable-1.0+cu130-cp39-abi3-manylinux_2_28_x86_64.whl")
    assert choose(per_torch, "3.11", labels=labels) is not None and choose(stable, "3.11", labels=labels) is not None
    assert choose(listed("ops-1.0+cu130.torch2.13-cp311-cp311-linux_x86_64.whl"), "3.11", labels=labels) is None


def test_the_plan_tests_each_recipe_with_a_wheel_and_names_the_rest() -> None:
    cell = MATRIX.cell("cuda130-py311")
    recipes = resolve_all(load_recipes(ROOT / "recipes"), cell)
    files = {"example-cuda-ops": listed("example_cuda_ops-0.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl")}
    plan = plan_stage(cell, "cu130", recipes, files)
    assert [w.recipe for w in plan.wheels] == ["example-cuda-ops"]
    assert "example-cpp-ops" in plan.missing and "flash-attn" in plan.missing
    (wheel,) = plan.wheels
    assert wheel.gpu_smoke is not None and wheel.imports == ("example_cuda_ops",)
    command = wheel.command("/py", "/recipes", "/src", plan.template_values())
    assert command is not None and command[0] == "/py" and command[-1] == "/src/tests"
    named = plan_stage(cell, "cu130", recipes, files, named={"example-cuda-ops": "other.whl"})
    assert named.wheels == () and "example-cuda-ops" in named.missing  # the record's file, or none


@pytest.mark.parametrize(
    ("doctor", "ran", "gpu_code", "outcome"),
    [
        ("ok", Ran(imported=True, check="passed"), True, Outcome.PASSED),
        ("jit", Ran(imported=True, check=None), True, Outcome.PASSED),
        ("ok", Ran(imported=True, check="skipped"), True, Outcome.SKIPPED),
        ("ok", Ran(imported=True, check="failed"), True, Outcome.MISMATCH),
        ("ok", Ran(imported=False, check=None), True, Outcome.MISMATCH),
        ("fails", Ran(imported=True, check="failed"), True, Outcome.FAILED),
        ("fails", Ran(imported=False, check=None), True, Outcome.FAILED),
        ("fails", Ran(imported=True, check=None), True, Outcome.FAILED),
        ("fails", Ran(imported=True, check="passed"), True, Outcome.MISMATCH),
        ("unknown", Ran(imported=True, check="failed"), False, Outcome.FAILED),
        ("ok", Ran(imported=True, check="failed"), False, Outcome.FAILED),  # CPU only: no arch promise
        ("ok", Ran(imported=True, check="not-run"), True, Outcome.NOT_RUN),
        ("fails", Ran(imported=True, check="not-run"), True, Outcome.FAILED),  # on doctor's word
        ("ok", Ran(imported=False, check="not-run"), True, Outcome.MISMATCH),  # it did not even load
        ("ok", Ran(imported=True, check=None), False, Outcome.PASSED),  # no GPU check: nothing left to run
    ],
)
def test_a_wheel_is_judged_by_doctors_verdict_and_what_ran(
    doctor: str, ran: Ran, gpu_code: bool, outcome: Outcome
) -> None:
    assert judge(doctor, ran, gpu_code=gpu_code)[0] is outcome


def test_the_stage_is_its_worst_wheel() -> None:
    assert worst([Outcome.PASSED, Outcome.SKIPPED]) is Outcome.SKIPPED
    assert worst([Outcome.FAILED, Outcome.MISMATCH, Outcome.NOT_RUN]) is Outcome.MISMATCH
    assert worst([]) is Outcome.PASSED


def test_a_test_run_counts_skips_apart_from_passes() -> None:
    pytest_run = tally(
        ["..sss", "SKIPPED [3] tests/test_ops.py:9: no CUDA device", "==== 2 passed, 3 skipped in 1.20s ===="]
    )
    assert pytest_run is not None and (pytest_run.passed, pytest_run.skipped) == (2, 3)
    assert pytest_run.reasons == ("no CUDA device",)
    unit = tally(["test_a ... ok", "Ran 4 tests in 0.010s", "", "FAILED (failures=1, skipped=2)"])
    assert unit is not None and (unit.passed, unit.failed, unit.skipped) == (1, 1, 2)
    assert tally(["prebuilt ['fused_adam']"]) is None


def test_a_report_reads_back_as_written(tmp_path: Path) -> None:
    run = CheckRun(
        name="gpu-smoke", result="skipped", seconds=1.5, detail="1 skipped", tally=tally(["1 skipped in 0.1s"])
    )
    wheel = WheelResult(
        recipe="ops", filename="ops.whl", sha256="0" * 64, doctor="ok", doctor_detail="sm_90 SASS",
        runs=(run,), outcome=Outcome.SKIPPED, why="every test of its GPU check was skipped",
    )  # fmt: skip
    report = GpuReport(
        cell="cuda130-py311", channel="cu130", index="/index", env="fresh", python="3.11", torch="2.14.1+cu130",
        gpus=("GPU 0 (H100, 9.0)",), torch_gpus=("GPU 0 (H100, 9.0)",), notes=(), wheels=(wheel,), missing=("apex",),
        status="skipped", exit_code=0, error=None, seconds=3.0,
    )  # fmt: skip
    assert load_gpu_report(report.write(tmp_path)) == report
    assert report.counts() == "1 skipped"


def test_a_gpu_check_of_a_downloaded_source_may_not_name_its_source(tmp_path: Path) -> None:
    """A GPU machine has the recipes (and the repository's path sources) but no downloaded
    source: {source} in the GPU check of an sdist recipe is refused when planning."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "patches").symlink_to(ROOT / "recipes" / "patches")
    text = (ROOT / "recipes" / "deepspeed.toml").read_text()
    (recipes / "deepspeed.toml").write_text(
        text.replace("{recipes}/gpu-checks/deepspeed_fused_adam.py", "{source}/t.py")
    )
    cell = MATRIX.cell("cuda130-py311")
    (recipe,) = resolve_all(load_recipes(recipes), cell).values()
    with pytest.raises(ConfigError, match=r"checks.gpu-smoke: unknown placeholder \{source\}"):
        recipe_spec(MATRIX, cell, recipe, depends_on=(), needs=(), release=None)


def test_a_gpu_runner_glob_must_name_a_gpu_variant(tmp_path: Path) -> None:
    text = (ROOT / "recipes" / "matrix.toml").read_text()
    assert MATRIX.gpu_runner(MATRIX.cell("cuda130-sm90-torch2.12-py312")) == "linux-gpu-h100"
    assert MATRIX.gpu_runner(MATRIX.cell("cuda130-sm90-torch2.12-aarch64-py312")) == "linux-gpu-gh200"
    assert (
        MATRIX.gpu_runner(MATRIX.cell("cpu-py311")) is None and MATRIX.gpu_runner(MATRIX.cell("cuda126-py311")) is None
    )
    broken = tmp_path / "matrix.toml"
    broken.write_text(text.replace('gpu-runners = { "cuda130*-aarch64"', 'gpu-runners = { "cpu*"', 1))
    with pytest.raises(ConfigError, match=r"ci.gpu-runners: 'cpu\*' matches no CUDA or ROCm variant"):
        load_matrix(broken)
