"""Every shipped GPU check (recipes/gpu-checks/*.py) run for real where no GPU is: in a venv
with a real CPU torch (2.13.0+cpu), its device set to the CPU, and stand-in packages on its
path (tests/gpu_stand_ins.py). Each passes against right stand-ins, printing its one line,
and fails against wrong ones, naming what it compared: a check that could not fail would
pass a broken wheel on a GPU machine as well."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpu_stand_ins import STAND_INS, named_failure, write_stand_ins
from wheelmill.checks.tally import tally
from wheelmill.machine.package_sources import machine_sources
from wheelmill.machine.process import base_environment
from wheelmill.machine.tools import uv_bin
from wheelmill.settings import Settings

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
CHECKS = ROOT / "recipes" / "gpu-checks"
TORCH = "torch==2.13.0+cpu"  # the cpu variant's torch, from this machine's package sources as the cell tests take it


@pytest.fixture(scope="module")
def cpu_torch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An interpreter with a real CPU torch and nothing else of the checks' packages."""
    env = tmp_path_factory.mktemp("gpu-checks") / "env"
    sources = machine_sources(Settings.from_environ()).best_match()  # pip reads every index alike
    uv = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}  # UV_CACHE_DIR: the run's one cache (conftest)
    subprocess.run([uv_bin(), "venv", "--quiet", "--python", sys.executable, str(env)], check=True, env=uv)
    install = [uv_bin(), "pip", "install", "--quiet", "--python", str(env / "bin" / "python"), *sources.uv_args()]
    subprocess.run([*install, TORCH], check=True, env=uv)
    yield env / "bin" / "python"
    shutil.rmtree(env, ignore_errors=True)


def run_check(python: Path, check: str, stand_ins: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The check as the GPU stage runs it (an explicit environment, from an empty directory),
    on the CPU, the stand-ins first on its path."""
    env = base_environment([python.parent], {"PYTHONPATH": str(stand_ins), "WHEELMILL_GPU_CHECK_DEVICE": "cpu"})
    cwd.mkdir()
    return subprocess.run(
        [str(python), str(CHECKS / check)], env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize("check", sorted(path.name for path in CHECKS.glob("*.py")))
def test_a_gpu_check_passes_right_stand_ins_and_fails_wrong_ones(check: str, cpu_torch: Path, tmp_path: Path) -> None:
    assert check in STAND_INS, f"tests/gpu_stand_ins.py has no stand-ins for {check}"
    right = run_check(cpu_torch, check, write_stand_ins(tmp_path / "right", check, error=0.0), tmp_path / "a")
    assert right.returncode == 0, right.stdout + right.stderr[-3000:]
    (line,) = right.stdout.splitlines()
    assert " on cpu (a stand-in for a GPU)" in line, line
    assert tally([line]) is None, "the GPU stage reads no test counts into it: it passes on its exit status"

    wrong = run_check(cpu_torch, check, write_stand_ins(tmp_path / "wrong", check, error=0.5), tmp_path / "b")
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr[-3000:]
    assert f"AssertionError: {named_failure(check)}" in wrong.stderr, wrong.stderr[-3000:]
    assert wrong.stdout == ""
