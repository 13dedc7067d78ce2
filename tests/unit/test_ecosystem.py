"""The recipes teams build (torch, torchvision, torchaudio, flash-attn, apex, deepspeed,
xformers, fbgemm-gpu): validated and planned in a CPU, a CUDA and a ROCm cell, the printed
plans golden; what each package needs to know is in its plan, and a cell that builds torch
builds the rest against it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.wheels import make_wheel
from wheelmill.building.plan import plan
from wheelmill.building.report import Done, StepRecord
from wheelmill.building.steps.build import describe_build, describe_stamp, expected_pins
from wheelmill.building.steps.fetch import git_config, mirrored_url
from wheelmill.errors import ConfigError, SelectionError
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import GitSource, load_recipes, select
from wheelmill.output.report import Status, WheelRecord
from wheelmill.planning.spec import CellPlan, Step, StepKind
from wheelmill.settings import Settings

GOLDEN = Path(__file__).parent.parent / "golden"
ECOSYSTEM = ("torch", "torchvision", "torchaudio", "flash-attn", "apex", "deepspeed", "xformers", "fbgemm-gpu")
# One cell of each family; the CUDA and ROCm cells build against torch 2.9, the CPU cell 2.13.
CELLS = {"cpu-py311": set(ECOSYSTEM) - {"flash-attn"}, "cuda128-py311": set(ECOSYSTEM), "rocm64-py311": set(ECOSYSTEM)}


def _plan(repo_root: Path, cell: str, names: list[str]) -> CellPlan:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    (cell_plan,) = plan(matrix, recipes, matrix.select([cell]), names, Settings.from_environ({}))
    return cell_plan


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_ecosystem_plan_matches_golden(
    cli: CliRunner, repo_root: Path, monkeypatch: pytest.MonkeyPatch, cell: str
) -> None:
    monkeypatch.delenv("WHEELMILL_TORCH_INDEX", raising=False)
    args = [arg for name in sorted(CELLS[cell]) for arg in ("--recipe", name)]
    result = cli("--recipes", str(repo_root / "recipes"), "plan", "--cell", cell, "--engine", "none", *args)
    assert result.code == 0, result.err
    golden = GOLDEN / f"plan-{cell}-ecosystem.txt"
    if os.environ.get("WHEELMILL_UPDATE_GOLDEN"):
        golden.write_text(result.out)
    assert result.out == golden.read_text(), (
        f"plan changed; if intended, rerun with WHEELMILL_UPDATE_GOLDEN=1 and review {golden}"
    )


def test_validate_plans_every_recipe_in_every_cell(cli: CliRunner, repo_root: Path) -> None:
    result = cli("--recipes", str(repo_root / "recipes"), "validate")
    assert result.code == 0, result.err
    assert "12 recipes" in result.out and all(name in result.out for name in ECOSYSTEM)


def test_ecosystem_recipes_are_built_only_when_named(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    assert select(recipes, matrix.cell("cuda130-py311"), []) == (
        "example-cpp-ops",
        "example-stable-ops",
        "torchsort",
        "example-cuda-ops",
    )
    # Named alone, torchvision builds against the variant's torch; torch is not pulled in.
    assert select(recipes, matrix.cell("cpu-py311"), ["torchvision"]) == ("torchvision",)


def test_flash_attn_is_refused_in_the_cpu_cell(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    recipes = load_recipes(repo_root / "recipes")
    with pytest.raises(
        SelectionError, match=r"recipe 'flash-attn' is not built for cell cpu-py311 \(its cells: cuda126-\*"
    ):
        select(recipes, matrix.cell("cpu-py311"), ["flash-attn"])


def test_a_cell_that_builds_torch_builds_the_rest_after_and_against_it(repo_root: Path) -> None:
    cell_plan = _plan(repo_root, "cuda130-py311", ["torchvision", "deepspeed", "torch"])
    assert [r.name for r in cell_plan.recipes] == ["torch", "deepspeed", "torchvision"]
    vision = cell_plan.recipe("torchvision")
    assert vision.depends_on == ("torch",) and vision.needs == ("torch",)
    assert "after installing torch" in describe_build(cell_plan, vision)
    assert "torch==<the torch built in this cell>" in describe_stamp(cell_plan, vision)
    assert cell_plan.recipe("torch").depends_on == ()
    assert not cell_plan.recipe("torch").torch_pin
    # torch ships libtorch*.so itself: excluded from the others' repairs, allowed in its own wheel.
    assert "libtorch.so" not in cell_plan.recipe("torch").forbidden
    assert "libtorch.so" in vision.forbidden


def test_torch_nccl_edition_sets_both_ucc_switches(repo_root: Path) -> None:
    env = _plan(repo_root, "cuda130-py311", ["torch"]).recipe("torch").env
    assert (env["USE_UCC"], env["USE_SYSTEM_UCC"], env["USE_NCCL"], env["USE_CUDA"]) == ("1", "1", "1", "1")
    cpu = _plan(repo_root, "cpu-py311", ["torch"]).recipe("torch").env
    assert "USE_UCC" not in cpu and cpu["USE_CUDA"] == "0" and cpu["PYTORCH_BUILD_VERSION"] == "2.13.0"


@pytest.mark.parametrize(
    ("cell", "rev", "version"),
    [
        ("cpu-py311", "8fb87713a24951e639c494b0f2a8a81b5f8e33a6", "0.28.0"),
        ("cuda130-py311", "1f1a920d685d46dfbe187934b785b7ecb7a182f2", "0.29.1"),
        ("rocm64-py311", "d801a34632023859a0a274803d6abaf0a45d77a5", "0.24.1"),
    ],
)
def test_each_torch_gets_its_own_torchvision_commit(repo_root: Path, cell: str, rev: str, version: str) -> None:
    spec = _plan(repo_root, cell, ["torchvision"]).recipe("torchvision")
    assert spec.source == GitSource(url="https://github.com/pytorch/vision", rev=rev)
    assert spec.env["BUILD_VERSION"] == version


def test_flash_attn_reads_its_own_arch_variable(repo_root: Path) -> None:
    cuda = _plan(repo_root, "cuda130-py311", ["flash-attn"])
    spec = cuda.recipe("flash-attn")
    assert spec.arch_list == "8.0;9.0;10.0;12.0", "sm80 and up only, whatever the variant lists"
    assert spec.template_values()["arch_numbers"] == "80;90;100;120"
    assert "FLASH_ATTN_CUDA_ARCHS=80;90;100;120" in describe_build(cuda, spec)
    assert spec.env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    rocm = _plan(repo_root, "rocm64-py311", ["flash-attn"]).recipe("flash-attn")
    assert (rocm.arch_list, rocm.env["BUILD_TARGET"], rocm.env["GPU_ARCHS"]) == ("gfx90a;gfx942", "rocm", "{arch_list}")


def test_deepspeed_names_its_accelerator_and_cpu_target(repo_root: Path) -> None:
    cpu = _plan(repo_root, "cpu-py311", ["deepspeed"]).recipe("deepspeed")
    assert (cpu.env["DS_ACCELERATOR"], cpu.env["DS_BUILD_CPU_ADAM"], cpu.env["DS_CPU_ARCH"]) == (
        "cpu",
        "1",
        "-march=x86-64-v3",
    )
    assert [p.name for p in cpu.patches] == ["deepspeed-cpu-target.patch"]
    cuda = _plan(repo_root, "cuda130-py311", ["deepspeed"]).recipe("deepspeed")
    assert (cuda.env["DS_ACCELERATOR"], cuda.env["DS_BUILD_FUSED_ADAM"]) == ("cuda", "1")


def test_git_mirrors_are_gits_own_insteadof() -> None:
    mirrors = (("https://github.com/", "file:///srv/git/"), ("https://github.com/pytorch/", "https://git.internal/pt/"))
    assert mirrored_url("https://github.com/pytorch/vision", mirrors) == "https://git.internal/pt/vision", (
        "the longest prefix wins, as in git"
    )
    assert mirrored_url("https://github.com/NVIDIA/apex", mirrors) == "file:///srv/git/NVIDIA/apex"
    assert mirrored_url("https://gitlab.com/x/y", mirrors) == "https://gitlab.com/x/y"
    assert git_config(mirrors[1:]) == ["-c", "url.https://git.internal/pt/.insteadOf=https://github.com/pytorch/"]


def test_git_mirror_setting_is_checked() -> None:
    assert Settings.from_environ({"WHEELMILL_GIT_MIRRORS": "https://github.com/=file:///m/"}).git_mirrors == (
        ("https://github.com/", "file:///m/"),
    )
    with pytest.raises(
        ConfigError, match=re.escape("WHEELMILL_GIT_MIRRORS: 'https://github.com/' is not UPSTREAM=MIRROR")
    ):
        Settings.from_environ({"WHEELMILL_GIT_MIRRORS": "https://github.com/"})


def test_what_comes_after_torch_pins_the_torch_the_cell_built(repo_root: Path, tmp_path: Path) -> None:
    cell_plan = _plan(repo_root, "cpu-py311", ["torch", "torchvision"])
    built = make_wheel(tmp_path, "torch", "2.13.0+cpu.team1")
    done = Done(
        [
            StepRecord(
                step=Step(kind=StepKind.INSTALL_TEST, recipe="torch", detail=""),
                status=Status.OK,
                made=(WheelRecord.of(built),),
            )
        ]
    )
    assert expected_pins(done, cell_plan.recipe("torchvision"), "2.13.0+cpu") == {"torch": "2.13.0+cpu.team1"}
    alone = _plan(repo_root, "cpu-py311", ["torchvision"]).recipe("torchvision")
    assert expected_pins(Done([]), alone, "2.13.0+cpu") == {"torch": "2.13.0+cpu"}, (
        "without torch in the cell: the env's"
    )
