"""Same inputs, same bytes: a recipe built from two copies of the project at different paths,
into different output roots, gives byte-identical wheels. Paths compiled into a library
(debug info, __FILE__) are mapped to fixed names by the build's prefix maps; the build sees
its cell at a fixed path (in a container, or on this machine in a mount namespace), which
nvcc's module ids need too (they start with a hash of the source's path, and end in a
seed), and which the compiler cache hashes: a third output root takes every compile from
the second's cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_cells import ROOT, report
from tests.integration.test_containers import containers_of
from wheelmill.building.compiler_cache import SOCKET_PATH_MAX
from wheelmill.machine.engine import detect
from wheelmill.machine.process import make_view

# Each clone must compile for its bytes to prove anything: no tier shared with the run.
pytestmark = [pytest.mark.integration, pytest.mark.own_compiler_cache]


def _copy_of_the_project(where: Path) -> Path:
    for part in ("recipes", "extensions", "locks", "containers"):
        shutil.copytree(ROOT / part, where / part)
    return where


def _build(project: Path, output: Path, cell: str, recipe: str, engine: str, *, cache: Path | None = None) -> Path:
    """The recipe and what it depends on built into ``output``: the cell's dist/, by name."""
    env = {
        **os.environ,
        "WHEELMILL_OUTPUT": str(output),
        "WHEELMILL_ENGINE": engine,
        # The bytes are compared, not run: no install test (the cells' tests run them).
        "WHEELMILL_INSTALL_TESTS": "none",
        **({"SCCACHE_DIR": str(cache)} if cache else {}),
    }
    command = [sys.executable, "-m", "wheelmill", "build", "--cell", cell, "--recipe", recipe, "--no-publish"]
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert list((output / cell / "dist").glob(f"{recipe.replace('-', '_')}-*.whl")), "the recipe's wheel"
    tested = [c for s in report(output, cell)["steps"] if s["step"] == "install-test" for c in s["checks"]]
    assert tested and {(c["name"], c["verdict"]) for c in tested} == {("install-test", "skip")}, tested
    return output / cell / "dist"


def _wheels(dist: Path) -> dict[str, bytes]:
    return {wheel.name: wheel.read_bytes() for wheel in sorted(dist.glob("*.whl"))}


def _keep_only(directory: Path, keep: Path) -> None:
    """Remove everything under ``directory`` but ``keep`` and the directories that lead to it."""
    for entry in directory.iterdir():
        if keep.is_relative_to(entry):
            if entry != keep:
                _keep_only(entry, keep)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _packages_cached_as_ci_restores_them(first: Path, second: Path) -> None:
    """The package cache a container build keeps under its output root (uv's downloads and
    unpacked wheels, GBs for a CUDA cell), linked into the second root before its build, as
    a CI cache restores it: what is compiled, and so the bytes, does not come from it."""
    packages = first / ".cache" / "uv"
    if packages.is_dir():
        (second / ".cache").mkdir(parents=True)
        subprocess.run(["cp", "-al", str(packages), str(second / ".cache" / "uv")], check=True)


def _assert_same_bytes_from_two_places(
    tmp_path: Path,
    cell: str,
    recipe: str,
    engine: str = "none",
    *,
    then: Callable[[Path], None] | None = None,
    deep: bool = False,
    shared: bool = False,
) -> None:
    first = _build(_copy_of_the_project(tmp_path / "a"), tmp_path / "out-a", cell, recipe, engine)
    if then is not None:
        then(tmp_path / "out-a")  # checks of the first build, before it is cleared away
    # deep: an output root whose cell directory is too long for a socket path (107 bytes).
    other = (
        tmp_path / "elsewhere" / ("an-output-root-deeper-than-a-unix-socket-path-may-be" if deep else "") / "other-root"
    )
    _packages_cached_as_ci_restores_them(tmp_path / "out-a", other)
    # Only the wheel is compared: the first build's envs and caches (GBs for a CUDA cell) go
    # before the second build checks its free disk.
    _keep_only(tmp_path / "out-a", first)
    second = _build(_copy_of_the_project(tmp_path / "elsewhere" / "deeper" / "b"), other, cell, recipe, engine)
    if deep:
        assert len(str(other / cell / "sccache.sock")) > SOCKET_PATH_MAX
        data = json.loads((other / cell / "report.json").read_text())
        assert data["facts"]["compiler_cache"][recipe] is not None, "the deep root kept its compiler cache"
    built = _wheels(first)
    assert built.keys() == _wheels(second).keys()
    assert built == _wheels(second), f"{first} and {second} differ"
    if shared:  # the second root's compiler cache, from a third: every compile a hit, the same bytes
        third = _build(
            _copy_of_the_project(tmp_path / "c"),
            tmp_path / "out-c",
            cell,
            recipe,
            engine,
            cache=other / ".cache" / "sccache",
        )
        for name, stats in report(tmp_path / "out-c", cell)["facts"]["compiler_cache"].items():
            assert stats["misses"] == 0 and stats["hits"] > 0, (name, stats)
        stats = report(tmp_path / "out-c", cell)["facts"]["compiler_cache"][recipe]
        if cell.startswith("cuda"):  # nvcc's host and device steps, not the C++ files alone
            assert {"C/C++", "CUDA"} <= stats["hits_by_language"].keys(), stats
        assert _wheels(third) == _wheels(second)


@pytest.mark.cuda
def test_the_examples_are_byte_identical_from_two_clones_and_output_roots_on_this_machine(tmp_path: Path) -> None:
    """Engine none, every wheel of the build compared: example-cuda-ops, device code for one
    arch, and example-cpp-ops, its dependency, built before it as the CPU cell builds it (a
    test of its own would compile the same C++ again). The cell seen at the view's fixed
    path gives nvcc's module ids the same source paths from any output root, and the
    compiler cache the same command lines: a third build, into another root, takes every
    compile from the second's cache. That needs the view (a mount namespace): without one,
    engine none's CUDA builds name their cell's path, so the C++ example alone is compared,
    in the CPU cell, and the third build's check is a skip, never silence."""
    viewed = _viewed()
    if viewed:
        _assert_same_bytes_from_two_places(tmp_path, "cuda130-sm90-py311", "example-cuda-ops", shared=True)
        return
    _assert_same_bytes_from_two_places(tmp_path, "cpu-py311", "example-cpp-ops")
    pytest.skip("no mount namespace here: the third build's cache hits are not checked")


def _viewed() -> bool:
    """Whether this machine gives engine none its view of the cell (a mount namespace)."""
    with tempfile.TemporaryDirectory() as cell:
        return not isinstance(make_view(Path(cell), None, netless=False), str)


@pytest.mark.cuda
@pytest.mark.engine
def test_example_cuda_ops_is_byte_identical_from_two_clones_and_output_roots(tmp_path: Path) -> None:
    """Device code too: built in the container with the nvcc of pip's nvidia-* wheels, which
    are under the same fixed path in every cell like its sources and env, and nvcc's module
    ids are seeded, not ended in its process id (which differs with every ``docker exec``);
    one arch, the slim cell: the causes are per file, not per arch. The container is gone
    after the build. The second output root is deeper than a socket's path may be: in the
    container the cache is still reached (nvcc through it names its intermediate files, and
    a symbol with them, otherwise than without it)."""
    if shutil.which("podman") is None and shutil.which("docker") is None:
        pytest.skip("no container engine")
    engine = detect("auto")  # the engine the build takes
    assert engine is not None
    cell = "cuda130-sm90-py311"

    def built_with_pips_nvcc_and_left_no_container(output: Path) -> None:
        data = report(output, cell)
        toolkit = next(c for s in data["steps"] for c in s["checks"] if c["name"] == "env-toolkit")
        assert toolkit["verdict"] == "pass" and "site-packages/nvidia/cu13" in toolkit["detail"], toolkit
        device = next(
            c
            for s in data["steps"]
            if s["recipe"] == "example-cuda-ops"
            for c in s["checks"]
            if c["name"] == "device-code"
        )
        assert device["verdict"] == "pass", device
        assert containers_of(engine.binary, cell) == []

    _assert_same_bytes_from_two_places(
        tmp_path, cell, "example-cuda-ops", engine="auto", then=built_with_pips_nvcc_and_left_no_container, deep=True
    )
