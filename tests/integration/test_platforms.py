"""An aarch64 cell built for real on this x86_64 machine: podman runs its arm64 builder
image under qemu-user emulation (registered by scripts/setup --system), with torch from
PyPI for aarch64. One recipe, so that CI proves the path in minutes; the base is Debian
bookworm, whose CPython 3.11 is a package (nothing compiled at image build)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from wheelmill.errors import PrecheckError
from wheelmill.machine.emulation import emulation_problem, host_machine
from wheelmill.machine.engine import detect
from wheelmill.machine.tools import uv_bin
from wheelmill.wheel.elf import is_elf, summarize
from wheelmill.wheel.wheelfile import read_wheel

pytestmark = [pytest.mark.integration, pytest.mark.engine]
ROOT = Path(__file__).resolve().parent.parent.parent
CELL = "cpu-aarch64-py311"


@pytest.fixture(scope="module")
def podman() -> str:
    try:
        engine = detect("podman")
    except PrecheckError as exc:
        pytest.skip(exc.one_line())
    assert engine is not None
    if host_machine() == "x86_64" and (problem := emulation_problem("aarch64")):
        pytest.skip(f"{problem} (scripts/setup --system registers it)")
    return engine.binary


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """recipes/, extensions/ and containers/ copied, the aarch64 cells' base pinned to bookworm."""
    for part in ("recipes", "extensions", "containers"):
        shutil.copytree(ROOT / part, tmp_path / "repo" / part, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pins = tmp_path / "repo" / "containers" / "pins.toml"
    text = pins.read_text()
    if "cpu-aarch64" not in tomllib.loads(text)["bootstrap"]["suites"]:  # parsed: a comment may quote the entry
        text = text.replace("[bootstrap.suites]\n", '[bootstrap.suites]\ncpu-aarch64 = "bookworm"\n')
    assert tomllib.loads(text)["bootstrap"]["suites"]["cpu-aarch64"] == "bookworm"
    pins.write_text(text)
    return tmp_path / "repo"


def test_an_aarch64_cell_builds_and_is_install_tested_under_emulation(podman: str, repo: Path, tmp_path: Path) -> None:
    output = tmp_path / "wheels"
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output)}
    command = [sys.executable, "-m", "wheelmill", "--recipes", str(repo / "recipes"), "build", "--engine", "podman"]
    result = subprocess.run(
        [*command, "--cell", CELL, "--recipe", "example-cpp-ops"],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert f"{CELL} (podman, aarch64 emulated)" in result.stdout
    data: dict[str, Any] = json.loads((output / CELL / "report.json").read_text())
    assert data["facts"]["platform"] == {"target": "aarch64", "execution": "emulated"}
    assert ":builder-arm64-py311-" in data["facts"]["image"]["tag"]
    assert data["facts"]["image"]["base"].endswith(":bookworm-minbase-arm64"), data["facts"]["image"]
    checks = {(s["step"], c["name"]): c for s in data["steps"] for c in s["checks"]}
    assert "run under qemu-user emulation" in checks[("pre-checks", "platform")]["detail"]
    assert checks[("compiler-cache", "compiler-cache")]["verdict"] == "skip"
    assert checks[("post-build-checks", "elf-machine")]["verdict"] == "pass"
    tested = {c["name"]: c["verdict"] for (step, _), c in checks.items() if step == "install-test"}
    wanted = {"import example_cpp_ops": "pass", "torch.ops example_ops::rms_norm@CPU": "pass", "smoke": "pass"}
    assert wanted.items() <= tested.items(), tested
    (wheel,) = (output / CELL / "dist").glob("*.whl")
    assert all(p.startswith("manylinux_") and p.endswith("_aarch64") for p in read_wheel(wheel).platforms)
    unpacked = tmp_path / "unpacked"
    shutil.unpack_archive(wheel, unpacked, format="zip")
    libraries = [p for p in unpacked.rglob("*.so*") if is_elf(p)]
    assert libraries and {summarize(p).machine for p in libraries} == {"EM_AARCH64"}
    # the channel it shares with cpu-py311, and conda's subdir of aarch64
    assert (output / "index" / "cpu" / "files" / wheel.name).is_file()
    assert list((output / "index" / "conda" / "cpu" / "linux-aarch64").glob("example-cpp-ops-*.conda"))
    # given the channel alone, resolving for aarch64 takes this wheel and PyPI's aarch64 torch,
    # mirrored into the channel as the cell's closure: uv (markers evaluated for aarch64), and
    # pip told aarch64's manylinux tags (pip reads markers as this machine's, so no deps)
    index = (output / "index" / "cpu" / "simple").as_uri()
    uv = [uv_bin(), "pip", "compile", "--no-config", "--quiet", "--no-header", "--python-version", "3.11"]
    compiled = subprocess.run(
        [*uv, "--python-platform", "aarch64-manylinux_2_34", "--index-url", index, "-"],
        input="example-cpp-ops\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert "torch==2.10.0\n" in compiled.stdout and "example-cpp-ops==0.1.0+cpu\n" in compiled.stdout
    report = tmp_path / "pip.json"
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--no-deps"]
    pip += ["--report", str(report), "--only-binary=:all:", "--python-version", "3.11"]
    pip += [arg for minor in range(17, 36) for arg in ("--platform", f"manylinux_2_{minor}_aarch64")]
    pip += ["--target", str(tmp_path / "target"), "--index-url", index, "example-cpp-ops", "torch==2.10.0"]
    isolated = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run(pip, env=isolated, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    files = {i["metadata"]["name"]: unquote(i["download_info"]["url"].rsplit("/", 1)[-1]) for i in _installs(report)}
    assert files["example-cpp-ops"] == wheel.name
    assert files["torch"] == "torch-2.10.0-cp311-cp311-manylinux_2_28_aarch64.whl"


def _installs(report: Path) -> list[dict[str, Any]]:
    installs: list[dict[str, Any]] = json.loads(report.read_text())["install"]
    return installs
