"""The GPU stage's pure parts: which file of the channel it tests for each recipe, how a
wheel's result is judged against doctor's verdict (``wheelmill.checks.gpu``'s table, a row a
case), what a test run counted, the report's round trip, and the recipe key's templates."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.wheels import make_wheel
from wheelmill.checks.gpu import (
    GpuOutcome,
    Ran,
    judge_check,
    judge_wheel,
    no_kernel_image,
    not_the_channels_file,
    worst,
)
from wheelmill.checks.tally import Tally, tally
from wheelmill.errors import ConfigError
from wheelmill.gpu.report import CheckRun, GpuReport, WheelResult, load_gpu_report
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes, resolve_all
from wheelmill.machine.net import IndexFile
from wheelmill.planning.gpu_stage import file_for_cell, plan_stage
from wheelmill.planning.spec import recipe_spec

ROOT = Path(__file__).resolve().parent.parent.parent
MATRIX = load_matrix(ROOT / "recipes" / "matrix.toml")


def listed(*names: str, yanked: tuple[str, ...] = (), mirrored: tuple[str, ...] = ()) -> list[IndexFile]:
    return [
        IndexFile(
            filename=n,
            url=f"file:///index/blobs/sha256/{'0' * 64}/{n}",  # where a tree channel's page links it
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
    chosen = file_for_cell(files, "3.11", labels={"cu130"})
    assert chosen is not None and chosen.filename == "ops-1.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
    both = listed(
        "ops-1.0+cu130-cp39-abi3-manylinux_2_28_x86_64.whl", "ops-1.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
    )
    best = file_for_cell(both, "3.11", labels={"cu130"})
    assert best is not None and "cp311-cp311" in best.filename  # the more specific tag, as pip picks
    assert file_for_cell(listed("ops-1.0+cu130-cp312-abi3-linux_x86_64.whl"), "3.11", labels={"cu130"}) is None
    torch = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"  # the closure's copy: not wheelmill's build
    assert file_for_cell(listed(torch, mirrored=(torch,)), "3.11", labels={"cu130"}) is None


def test_another_torchs_cell_takes_its_per_torch_wheels_and_the_ones_built_once() -> None:
    variant = MATRIX.variants["cuda130-torch2.12"]
    labels = {variant.wheel_label, variant.group_label}
    per_torch = listed("ops-1.0+cu130.torch2.12-cp311-cp311-manylinux_2_28_x86_64.whl")
    stable = listed("stable-1.0+cu130-cp39-abi3-manylinux_2_28_x86_64.whl")
    assert (
        file_for_cell(per_torch, "3.11", labels=labels) is not None
        and file_for_cell(stable, "3.11", labels=labels) is not None
    )
    assert file_for_cell(listed("ops-1.0+cu130.torch2.13-cp311-cp311-linux_x86_64.whl"), "3.11", labels=labels) is None


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


def ran(
    *,
    installed: str | None = None,
    record: str | None = "cuda",
    sees_gpu: bool = True,
    imported: bool = True,
    check: GpuOutcome | None = GpuOutcome.PASSED,
    no_kernel_image: bool = False,
) -> Ran:
    """What ran for a wheel: by default, a CUDA wheel that imported and whose check passed."""
    return Ran(
        installed=installed,
        record=record,
        record_problem="unknown (its gpu-archs.json is unreadable: not JSON)",
        sees_gpu=sees_gpu,
        imported=imported,
        check=check,
        no_kernel_image=no_kernel_image,
    )


P, F, S, N = GpuOutcome.PASSED, GpuOutcome.FAILED, GpuOutcome.SKIPPED, GpuOutcome.NOT_RUN


# A row of the table in wheelmill.checks.gpu each: doctor's status, what ran, the outcome.
@pytest.mark.parametrize(
    ("doctor", "what", "outcome", "why"),
    [
        ("ok", ran(installed="the env imports ops from /usr/lib/python3/dist-packages"), F, "the env imports"),
        ("unknown", ran(record=None), F, "doctor cannot judge it: unknown (its gpu-archs.json is unreadable"),
        ("fails", ran(sees_gpu=False, check=N), F, "on this GPU (its GPU check did not run"),
        ("ok", ran(sees_gpu=False, check=N), N, "torch sees no GPU"),
        ("ok", ran(record="cpu", sees_gpu=False, check=None), N, "torch sees no GPU"),
        ("ok", ran(check=F, no_kernel_image=True), GpuOutcome.MISMATCH, "found no kernel image"),
        ("jit", ran(imported=False, check=None, no_kernel_image=True), GpuOutcome.MISMATCH, "no kernel image"),
        ("ok", ran(check=F), F, "its GPU check failed"),  # a wrong number is the kernel's fault, not doctor's
        ("ok", ran(imported=False, check=None), F, "its import failed"),
        ("fails", ran(check=F, no_kernel_image=True), F, "as doctor predicted"),
        ("fails", ran(imported=False, check=None, no_kernel_image=True), F, "as doctor predicted"),
        ("fails", ran(check=F), F, "the error is not the kernel image's"),
        ("fails", ran(check=P), GpuOutcome.MISMATCH, "its GPU check passed"),
        ("fails", ran(check=None), F, "doctor predicts it fails"),
        ("ok", ran(check=P), P, "its GPU check passed"),
        ("ok", ran(record="cpu", check=P), P, "its GPU check passed"),
        ("ok", ran(check=S), S, "proved nothing"),
        ("jit", ran(check=None), GpuOutcome.IMPORT_ONLY, "no GPU check"),
        ("ok", ran(record="cpu", check=None), P, "no GPU code; imported"),
        ("ok", ran(record="cpu", check=F), F, "its GPU check failed"),
    ],
)
def test_a_wheel_is_judged_by_doctors_verdict_and_what_ran(
    doctor: str, what: Ran, outcome: GpuOutcome, why: str
) -> None:
    assert judge_wheel(doctor, what)[0] is outcome
    assert why in judge_wheel(doctor, what)[1]


@pytest.mark.parametrize(
    ("counted", "exit_ok", "outcome"),
    [
        (Tally(passed=9), True, P),
        (Tally(passed=4, skipped=1), True, S),  # a partial skip proved less: a skip, as in the install test
        (Tally(), True, S),  # unittest's "Ran 0 tests ... OK"
        (tally(["2 passed, 1 xfailed in 0.3s"]), True, S),  # an expected failure is not a pass
        (Tally(passed=3, failed=1), True, F),
        (None, True, P),  # a script: its exit status says
        (None, False, F),
        (Tally(passed=9), False, F),
    ],
)
def test_a_gpu_checks_result_passes_only_where_every_test_ran_and_passed(
    counted: Tally | None, exit_ok: bool, outcome: GpuOutcome
) -> None:
    assert judge_check(counted, exit_ok=exit_ok) is outcome


def test_only_a_missing_kernel_image_contradicts_doctor() -> None:
    assert no_kernel_image(["torch.AcceleratorError: CUDA error: no kernel image is available for execution"])
    assert no_kernel_image(["RuntimeError: HIP error: invalid device function"])
    assert no_kernel_image(["hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"])
    assert not no_kernel_image(["AssertionError: Tensor-likes are not close!"])
    assert not no_kernel_image(["ImportError: libcudart.so.13: cannot open shared object file"])


def test_the_stage_is_its_worst_wheel() -> None:
    assert worst([GpuOutcome.PASSED, GpuOutcome.SKIPPED]) is GpuOutcome.SKIPPED
    assert worst([GpuOutcome.PASSED, GpuOutcome.IMPORT_ONLY]) is GpuOutcome.IMPORT_ONLY
    assert worst([GpuOutcome.IMPORT_ONLY, GpuOutcome.SKIPPED]) is GpuOutcome.SKIPPED
    assert worst([GpuOutcome.FAILED, GpuOutcome.MISMATCH, GpuOutcome.NOT_RUN]) is GpuOutcome.MISMATCH
    assert worst([]) is GpuOutcome.PASSED
    assert [o for o in GpuOutcome if o.passed] == [GpuOutcome.PASSED], "one outcome passes, and no other"


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
    run = CheckRun(name="gpu-smoke", result=S, seconds=1.5, detail="1 skipped", tally=tally(["1 skipped in 0.1s"]))
    wheel = WheelResult(
        recipe="ops", filename="ops.whl", sha256="0" * 64, doctor="ok", doctor_detail="sm_90 SASS",
        runs=(run,), outcome=S, why="its GPU check proved nothing",
    )  # fmt: skip
    report = GpuReport(
        cell="cuda130-py311", channel="cu130", index="/index", env="fresh", python="3.11", runner="linux-gpu-h100",
        torch="2.14.1+cu130", gpus=("GPU 0 (H100, 9.0)",), torch_gpus=("GPU 0 (H100, 9.0)",), notes=(),
        wheels=(wheel,), missing=("apex",), status=S, exit_code=25, error="proved nothing", seconds=3.0,
    )  # fmt: skip
    assert load_gpu_report(report.write(tmp_path)) == report
    assert report.counts() == "1 skipped" and not report.passed


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
    assert MATRIX.gpu_runners_of(MATRIX.cell("cuda130-sm90-torch2.12-py312")) == ("linux-gpu-h100",)
    assert MATRIX.gpu_runners_of(MATRIX.cell("cuda130-sm90-torch2.12-aarch64-py312")) == ("linux-gpu-gh200",)
    assert MATRIX.gpu_runners_of(MATRIX.cell("cpu-py311")) == MATRIX.gpu_runners_of(MATRIX.cell("cuda126-py311")) == ()
    broken = tmp_path / "matrix.toml"
    broken.write_text(text.replace('gpu-runners = { "cuda130*-aarch64"', 'gpu-runners = { "cpu*"', 1))
    with pytest.raises(ConfigError, match=r"ci.gpu-runners: 'cpu\*' matches no CUDA or ROCm variant"):
        load_matrix(broken)


def test_a_gpu_runner_glob_may_name_a_runner_per_gpu_kind(tmp_path: Path) -> None:
    text = (ROOT / "recipes" / "matrix.toml").read_text()
    kinds = tmp_path / "matrix.toml"
    kinds.write_text(
        text.replace('"cuda130*" = "linux-gpu-h100"', '"cuda130*" = ["linux-gpu-h100", "linux-gpu-b200"]', 1)
    )
    matrix = load_matrix(kinds)
    assert matrix.gpu_runners_of(matrix.cell("cuda130-py311")) == ("linux-gpu-h100", "linux-gpu-b200")
    kinds.write_text(text.replace('"cuda130*" = "linux-gpu-h100"', '"cuda130*" = []', 1))
    with pytest.raises(ConfigError, match=r"ci.gpu-runners"):
        load_matrix(kinds)


def test_a_wheel_is_tested_only_where_the_env_imports_the_channels_file(tmp_path: Path) -> None:
    """The env must find the project in the wheels' own directory, every file of the wheel's
    RECORD there with its hash: else the stage would test some other copy and record this one."""
    wheel = make_wheel(tmp_path / "w", "ops", "1.0+cu130", files={"ops/__init__.py": b"KERNELS = 1\n"})
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    assert not_the_channels_file("ops", wheel, str(site), site) is None
    elsewhere = not_the_channels_file("ops", wheel, "/usr/lib/python3/dist-packages", site)
    assert elsewhere is not None and elsewhere.startswith("the env imports ops from /usr/lib/python3/dist-packages")
    assert not_the_channels_file("ops", wheel, None, site) == (
        f"ops is not among the env's distributions after installing {wheel.name}"
    )
    (site / "ops" / "__init__.py").write_bytes(b"KERNELS = 0  # an older build's\n")
    assert not_the_channels_file("ops", wheel, str(site), site) == (
        f"ops/__init__.py in the env is not the one {wheel.name} records"
    )


def test_a_runner_the_matrix_does_not_map_the_cell_to_is_refused_first(cli: CliRunner) -> None:
    """`--runner` names the GPU kind a release records the report under: a label the matrix
    does not give the cell is a usage error, before any channel is read."""
    done = cli("--recipes", str(ROOT / "recipes"), "test-gpu", "--cell", "cuda130-py311", "--runner", "linux-gpu-b200")
    assert done.code == 2 and done.err.count("\n") == 1, done.err
    assert (
        "--runner linux-gpu-b200: not a GPU runner of cuda130-py311 (ci.gpu-runners names: linux-gpu-h100)" in done.err
    )
