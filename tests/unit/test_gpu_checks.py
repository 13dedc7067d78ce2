"""The shipped GPU checks (recipes/gpu-checks/*.py), which only a GPU machine runs for real:
each compiles, each recipe's GPU check names one that exists, and every recipe whose wheel
carries GPU code in a GPU cell has one (else the GPU stage can only say "import-only").

A recipe's wheel carries GPU code in a cell where the recipe, resolved for that cell, asks
for device code (``[checks] device-code = true``: the post-build check that the wheel holds
code for the cell's GPU archs). tests/integration/test_gpu_checks.py runs every script on
the CPU against stand-in packages.
"""

from __future__ import annotations

import py_compile
import re
from pathlib import Path

import pytest

from tests.gpu_stand_ins import STAND_INS
from wheelmill.gpu.stage import GPU_VARIABLES
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import ResolvedRecipe, load_recipes, resolve
from wheelmill.inputs.variants import Family
from wheelmill.machine.process import PASSTHROUGH

ROOT = Path(__file__).resolve().parent.parent.parent
CHECKS = ROOT / "recipes" / "gpu-checks"
SCRIPT = re.compile(r"\{recipes\}/gpu-checks/([^/\s]+)$")
DEVICE_LINE = 'DEVICE = os.environ.get("WHEELMILL_GPU_CHECK_DEVICE", "cuda")'
HARD_WIRED = re.compile(r"""device=["']cuda|\.cuda\(\)|\.to\(["']cuda""")


def gpu_cells(recipes_dir: Path = ROOT / "recipes") -> list[tuple[str, ResolvedRecipe]]:
    """(cell id, recipe) for every recipe in every CUDA or ROCm cell it applies to."""
    matrix = load_matrix(recipes_dir / "matrix.toml")
    recipes = load_recipes(recipes_dir)
    return [
        (cell.id, resolve(recipe, cell))
        for cell in matrix.cells
        if cell.variant.family is not Family.CPU
        for recipe in recipes.values()
        if recipe.applies_to(cell)
    ]


def without_gpu_check(recipes_dir: Path) -> list[str]:
    """The recipes with GPU code in a GPU cell and no GPU check there."""
    return sorted({r.name for _cell, r in gpu_cells(recipes_dir) if r.device_code and r.gpu_smoke is None})


def scripts_named(recipes_dir: Path) -> set[tuple[str, str]]:
    """(recipe, script) for every script under {recipes}/gpu-checks/ a recipe's GPU check names."""
    return {
        (resolved.name, match.group(1))
        for _cell, resolved in gpu_cells(recipes_dir)
        for part in resolved.gpu_smoke or ()
        if (match := SCRIPT.search(part))
    }


def absent_scripts(recipes_dir: Path) -> list[tuple[str, str]]:
    return sorted(pair for pair in scripts_named(recipes_dir) if not (recipes_dir / "gpu-checks" / pair[1]).is_file())


@pytest.mark.parametrize("script", sorted(path.name for path in CHECKS.glob("*.py")))
def test_every_gpu_check_compiles(script: str, tmp_path: Path) -> None:
    py_compile.compile(str(CHECKS / script), cfile=str(tmp_path / "check.pyc"), doraise=True)


def test_every_recipe_with_gpu_code_in_a_gpu_cell_has_a_gpu_check_that_exists() -> None:
    with_code = {resolved.name for _cell, resolved in gpu_cells() if resolved.device_code}
    assert with_code >= {"apex", "fbgemm-gpu", "torch", "torchaudio", "torchsort", "torchvision", "xformers"}
    assert without_gpu_check(ROOT / "recipes") == []
    assert absent_scripts(ROOT / "recipes") == []
    used = {script for _name, script in scripts_named(ROOT / "recipes")}
    assert used == {path.name for path in CHECKS.glob("*.py")}, "each script is some recipe's check"


def test_a_missing_or_misnamed_gpu_check_is_found(recipes_copy: Path) -> None:
    torchsort = recipes_copy / "torchsort.toml"
    text = torchsort.read_text()
    line = 'gpu-smoke = ["{python}", "{recipes}/gpu-checks/torchsort_soft_rank.py"]\n'
    assert line in text
    torchsort.write_text(text.replace(line, ""))
    assert without_gpu_check(recipes_copy) == ["torchsort"]
    torchsort.write_text(text.replace("torchsort_soft_rank.py", "torchsort_soft_ranks.py"))
    assert absent_scripts(recipes_copy) == [("torchsort", "torchsort_soft_ranks.py")]


def test_a_recipe_without_gpu_code_has_no_gpu_check_to_pretend() -> None:
    """example-cpp-ops builds CPU kernels in every cell, CUDA ones included: no GPU check."""
    cpp = [resolved for _cell, resolved in gpu_cells() if resolved.name == "example-cpp-ops"]
    assert cpp and all(not resolved.device_code and resolved.gpu_smoke is None for resolved in cpp)


@pytest.mark.parametrize("script", sorted(path.name for path in CHECKS.glob("*.py")))
def test_a_check_takes_its_device_from_one_variable_that_the_gpu_stage_never_passes(script: str) -> None:
    """Where no GPU is, the tests run a check on the CPU; on a GPU machine the stage hands a
    check only the GPU's variables, so the check cannot be turned to the CPU there by accident."""
    text = (CHECKS / script).read_text()
    assert text.count(DEVICE_LINE) == 1, script
    assert not HARD_WIRED.search(text), f"{script} names a device of its own: use DEVICE"
    assert "WHEELMILL_GPU_CHECK_DEVICE" not in (*GPU_VARIABLES, *PASSTHROUGH)


def test_every_gpu_check_has_stand_ins_to_run_against() -> None:
    assert set(STAND_INS) == {path.name for path in CHECKS.glob("*.py")}


def test_the_recipes_page_names_each_recipes_gpu_check() -> None:
    text = (ROOT / "docs" / "recipes.md").read_text()
    table = text[text.index("<!-- gpu-checks:start") : text.index("<!-- gpu-checks:end")]
    rows = dict(re.findall(r"^\| ([a-z-]+) \| ([^|]+) \|", table, flags=re.MULTILINE))
    checks = {resolved.name: resolved.gpu_smoke for _cell, resolved in gpu_cells() if resolved.gpu_smoke}
    assert set(rows) - {"recipe"} == set(checks)
    for name, script in scripts_named(ROOT / "recipes"):
        assert rows[name] == f"`{script}`", name
    for name, command in checks.items():
        if not any(SCRIPT.search(part) for part in command):
            assert "{source}/tests" in command and rows[name] == "its tests (`{source}/tests`)", name
