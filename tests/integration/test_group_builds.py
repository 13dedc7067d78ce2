"""One build for a group, for real: the stable example and the per-torch C++ example in two
cells of one ABI group (cuda130-sm90 on torch 2.14.1 and on torch 2.12.0, Python 3.10:
both corners of the group, so both install-test), built in one run into one output root and
index. The stable example is compiled once, in the cell of the oldest torch, and the same file
is published into both channels, its floor checked against each channel's torch; the per-torch
example is compiled in each cell, under a label of its own. A consumer resolves, from each
channel's URL alone, the channel's torch, that torch's build of the per-torch example and the
one stable build. (That a run builds the oldest torch's cell first, whichever the command
lists first, is the plan's: tests/unit/test_docs.py; what a group build costs is
benchmarks/groups.py's, whose smoke is the benchmarks session's.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.channels import tree_channel
from tests.integration.test_cells import ROOT, report
from tests.integration.test_index import Served, isolated_env, uv
from wheelmill.index.channels import built_by_key
from wheelmill.index.roots import problems
from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine.envs import UvBackend
from wheelmill.machine.package_sources import machine_sources
from wheelmill.machine.process import HostRunner, StepLog
from wheelmill.machine.toolchain import Found, find_python
from wheelmill.planning.locks import inputs, requirements_text, target
from wheelmill.settings import Settings

pytestmark = pytest.mark.integration
CELLS = {
    "cuda130-sm90-py310": ("cu130-sm90", "2.14.1"),
    "cuda130-sm90-torch2.12-py310": ("cu130-sm90-torch2.12", "2.12.0"),
}
STABLE, PER_TORCH = "example-stable-ops", "example-cpp-ops"


def _build(output: Path, index: Path) -> subprocess.CompletedProcess[str]:
    """Both examples in both cells, the newer torch's listed first."""
    cells = [arg for cell in CELLS for arg in ("--cell", cell)]
    command = [sys.executable, "-m", "wheelmill", "build", "--recipe", STABLE, "--recipe", PER_TORCH, *cells]
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output), "WHEELMILL_INDEX_ROOT": str(index)}
    env["WHEELMILL_ENGINE"] = "none"
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400, check=False)


def _steps(data: dict[str, Any], recipe: str) -> dict[str, str]:
    return {step["step"]: step["status"] for step in data["steps"] if step.get("recipe") == recipe}


def _check(data: dict[str, Any], recipe: str, kind: str, name: str) -> dict[str, str]:
    (step,) = [s for s in data["steps"] if s.get("recipe") == recipe and s["step"] == kind]
    (check,) = [c for c in step["checks"] if c["name"] == name]
    return dict(check)


def test_the_stable_example_is_built_once_and_taken_by_the_other_torchs_channel(tmp_path: Path) -> None:
    output, index = tmp_path / "wheels", tmp_path / "index"
    result = _build(output, index)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr
    said = result.stdout
    assert "taken from their group build in another channel of their ABI group: example-stable-ops" in said
    newer, oldest = (report(output, cell) for cell in CELLS)
    assert _steps(oldest, STABLE)["build"] == "ok", "built in the cell of the oldest torch"
    taken = _steps(newer, STABLE)
    assert {taken[kind] for kind in ("build", "stamp", "post-build-checks", "repair")} == {"from-group"}, taken
    assert taken["post-repair-checks"] == taken["install-test"] == taken["publish"] == "ok", taken
    for data, torch in ((oldest, "2.12.0"), (newer, "2.14.1")):
        group = _check(data, STABLE, "post-repair-checks", "abi-group")
        assert group["verdict"] == "pass" and "stable shims of torch >= 2.10.0" in group["detail"], group
        assert group["detail"].endswith(f"torch {torch}"), group
    one, other = ({r["name"]: r["wheel"] for r in report(output, cell)["recipes"]}[STABLE] for cell in CELLS)
    assert (one["name"], one["sha256"]) == (other["name"], other["sha256"]), "the same file in both"
    assert "+cu130.sm90-cp310-abi3-" in one["name"]

    cpp = {}
    for cell in CELLS:
        data = report(output, cell)
        assert _steps(data, PER_TORCH)["build"] == "ok", "built per torch: compiled in each cell"
        cpp[cell] = {r["name"]: r["wheel"] for r in data["recipes"]}[PER_TORCH]["name"]
    assert (
        "+cu130.sm90-" in cpp["cuda130-sm90-py310"] and "+cu130.sm90.torch2.12-" in cpp["cuda130-sm90-torch2.12-py310"]
    )
    keys = []
    for channel, _torch in CELLS.values():
        listed = tree_channel(index, channel)
        assert problems(listed) == []
        keys.append({key for key, (_project, entry) in built_by_key(listed).items() if entry.filename == one["name"]})
    assert keys[0] == keys[1] and len(keys[0]) == 1, "listed in both channels under its one build key"
    _each_channel_resolves_its_torch(index, tmp_path, cpp, one["name"])


def _each_channel_resolves_its_torch(index_root: Path, tmp_path: Path, cpp: dict[str, str], stable: str) -> None:
    """uv, on Python 3.10, from each channel's URL alone: the channel's torch, its build of the
    per-torch example, and the one stable build."""
    server = Served(index_root, tmp_path / "access.log")
    try:
        for cell, (channel, torch) in CELLS.items():
            done = uv(
                "pip", "compile", "-", "--python-version", "3.10", "--index-url", server.simple(channel),
                "--no-header", "--no-annotate", env=isolated_env(), input_text=f"{PER_TORCH}\n{STABLE}\n",
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            pins = dict(line.split("==") for line in done.stdout.split() if "==" in line)
            assert pins["torch"] == torch, (channel, pins)
            assert f"{PER_TORCH.replace('-', '_')}-{pins[PER_TORCH]}-" in cpp[cell], (channel, pins)
            assert stable.startswith(f"{STABLE.replace('-', '_')}-{pins[STABLE]}-"), (channel, pins)
    finally:
        server.close()


def test_a_lock_resolved_again_over_an_earlier_one_resolves_from_its_inputs_alone(tmp_path: Path) -> None:
    """A cell without a committed lock, built again in the same output root, resolves its lock
    over the one the earlier build left: uv takes an output file's pins as preferences, and
    with that file (torch for Python 3.10, hashes of every index's files) it found the same
    inputs unsolvable. The lock step asks it to ignore them."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    cell = matrix.cell("cuda130-py310")
    backend, sources = UvBackend(HostRunner()), machine_sources(Settings.from_environ({})).best_match()
    requirements = tmp_path / "build-env.in"
    requirements.write_text(requirements_text(inputs(matrix, {}, cell).requirements), encoding="utf-8")
    lock = tmp_path / "build-env.lock"
    python = find_python("3.10", HostRunner())
    assert isinstance(python, Found), python
    with StepLog(tmp_path / "lock.log") as log:
        for _ in range(2):
            pins = backend.lock(
                requirements, lock, target=target(cell), sources=sources, log=log, interpreter=python.path
            )
            assert pins["torch"] == "2.14.1", pins
