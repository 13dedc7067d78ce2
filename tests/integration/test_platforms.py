"""An aarch64 cell built for real on this x86_64 machine: podman runs its arm64 builder
image under qemu-user emulation (registered by scripts/setup --system), with torch from
PyPI for aarch64. One recipe, so that CI proves the path in minutes; the base is the suite
containers/pins.toml ships for the cell (bookworm, whose CPython 3.11 is a package: nothing
compiled at image build), and its wheel keeps the glibc promise docs/matrix.md makes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.channels import stored_file, tree_channel
from tests.matrix_table import BOOTSTRAP, REGISTRY, table_rows
from wheelmill.errors import PrecheckError
from wheelmill.inputs.manylinux import glibc_of
from wheelmill.machine.emulation import emulation_problem, host_machine
from wheelmill.machine.engine import detect
from wheelmill.machine.pins import load_pins
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


def test_an_aarch64_cell_builds_and_is_install_tested_under_emulation(podman: str, tmp_path: Path) -> None:
    """The repository as it ships (its pins, its matrix), the base policy left to its default."""
    suite = load_pins(ROOT / "containers" / "pins.toml").suite_for("cpu", "aarch64")
    promised = table_rows()["cpu-aarch64"]
    assert promised[REGISTRY] == "-", "no registry base for aarch64: the bootstrapped base's promise is the one"
    output = tmp_path / "wheels"
    env = {key: value for key, value in os.environ.items() if key != "WHEELMILL_BASE"}
    env["WHEELMILL_OUTPUT"] = str(output)
    command = [sys.executable, "-m", "wheelmill", "--recipes", str(ROOT / "recipes"), "build", "--engine", "podman"]
    result = subprocess.run(
        [*command, "--cell", CELL, "--recipe", "example-cpp-ops"],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert re.search(rf"\n{CELL}: ok in \S+ \(podman, aarch64 emulated\); report ", result.stdout)
    data: dict[str, Any] = json.loads((output / CELL / "report.json").read_text())
    assert data["facts"]["platform"] == {"target": "aarch64", "execution": "emulated"}
    assert ":builder-arm64-py311-" in data["facts"]["image"]["tag"]
    assert data["facts"]["image"]["base"].endswith(f":{suite}-minbase-arm64"), data["facts"]["image"]
    checks = {(s["step"], c["name"]): c for s in data["steps"] for c in s["checks"]}
    assert not [c for c in checks.values() if c["verdict"] in ("warn", "fail")], "no warning, no failure"
    assert "run under qemu-user emulation" in checks[("pre-checks", "platform")]["detail"]
    assert checks[("compiler-cache", "compiler-cache")]["verdict"] == "skip"
    assert checks[("post-build-checks", "elf-machine")]["verdict"] == "pass"
    tested = {c["name"]: c["verdict"] for (step, _), c in checks.items() if step == "install-test"}
    wanted = {"import example_cpp_ops": "pass", "torch.ops example_ops::rms_norm@CPU": "pass", "smoke": "pass"}
    assert wanted.items() <= tested.items(), tested
    (wheel,) = (output / CELL / "dist").glob("*.whl")
    _assert_the_promise_is_kept(checks[("post-repair-checks", "glibc-baseline")], wheel, promised[BOOTSTRAP], suite)
    unpacked = tmp_path / "unpacked"
    shutil.unpack_archive(wheel, unpacked, format="zip")
    libraries = [p for p in unpacked.rglob("*.so*") if is_elf(p)]
    assert libraries and {summarize(p).machine for p in libraries} == {"EM_AARCH64"}
    # the channel it shares with cpu-py311, and conda's subdir of aarch64
    assert stored_file(tree_channel(output / "index", "cpu"), wheel.name).read_bytes() == wheel.read_bytes()
    assert list((output / "index" / "conda" / "cpu" / "linux-aarch64").glob("example-cpp-ops-*.conda"))
    # given the channel alone, resolving for aarch64 takes this wheel and PyPI's aarch64 torch,
    # mirrored into the channel as the cell's closure: uv (markers evaluated for aarch64), and
    # pip told aarch64's manylinux tags (pip reads markers as this machine's, so no deps)
    index = (output / "index" / "cpu" / "simple").as_uri()
    uv = [uv_bin(), "pip", "compile", "--no-config", "--quiet", "--no-header", "--python-version", "3.11"]
    compiled = subprocess.run(
        [*uv, "--python-platform", f"aarch64-{promised[BOOTSTRAP]}", "--index-url", index, "-"],
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
    newest = glibc_of(promised[BOOTSTRAP])[1]  # a machine of the promised glibc
    pip += [arg for minor in range(17, newest + 1) for arg in ("--platform", f"manylinux_2_{minor}_aarch64")]
    pip += ["--target", str(tmp_path / "target"), "--index-url", index, "example-cpp-ops", "torch==2.10.0"]
    isolated = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run(pip, env=isolated, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    files = {i["metadata"]["name"]: unquote(i["download_info"]["url"].rsplit("/", 1)[-1]) for i in _installs(report)}
    assert files["example-cpp-ops"] == wheel.name
    assert files["torch"] == "torch-2.10.0-cp311-cp311-manylinux_2_28_aarch64.whl"


def _assert_the_promise_is_kept(verdict: dict[str, Any], wheel: Path, promised: str, suite: str) -> None:
    """The glibc-baseline check held the wheel to what docs/matrix.md's table promises for the
    cell, and passed: the wheel's tag is within it."""
    platforms = read_wheel(wheel).platforms
    print(f"\n{CELL}: {wheel.name}, promised {promised} (Debian {suite}): {verdict['detail']}")
    assert all(p.startswith("manylinux_") and p.endswith("_aarch64") for p in platforms), platforms
    assert all(glibc_of(p) <= glibc_of(promised) for p in platforms), (platforms, promised)
    assert verdict["verdict"] == "pass", verdict
    assert verdict["detail"] == (
        f"{min(platforms, key=glibc_of)} is within {promised}, the baseline of the bootstrapped Debian {suite} base "
        "for aarch64"
    ), verdict


def _installs(report: Path) -> list[dict[str, Any]]:
    installs: list[dict[str, Any]] = json.loads(report.read_text())["install"]
    return installs
