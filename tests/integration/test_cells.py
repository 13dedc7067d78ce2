"""Whole cells, built the way a user builds them: `nox -s build-<cell>`.

These are the slow tests (minutes): real compilers, real torch, real auditwheel, and a clean
env per wheel. Each cell's outputs go to a temporary WHEELMILL_OUTPUT."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.channels import tree_channel
from tests.integration.test_index import Served, isolated_env, pip, uv, venv
from tests.interrupt import interrupt_mid_compile
from wheelmill.checks.torchenv import judge_torch
from wheelmill.index.closure import read as read_closure
from wheelmill.index.pages import Project
from wheelmill.index.roots import problems
from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine.envs import Env
from wheelmill.machine.package_sources import machine_sources
from wheelmill.machine.probes import read_torch
from wheelmill.output.layout import CLOSURE_LOCK_NAME
from wheelmill.settings import Settings
from wheelmill.wheel.wheelfile import read_wheel

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent


def nox(session: str, output: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """A build session on this machine (engine none): the container path is tested apart."""
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "none"}
    command = [sys.executable, "-m", "nox", "--no-color", "-s", session, *(["--", *args] if args else [])]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def report(output: Path, cell: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((output / cell / "report.json").read_text())
    return data


def all_checks(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [check for step in data["steps"] for check in step["checks"]]


STABLE = {"example-stable-ops"}  # the recipes on the stable ABI (abi = "stable")
ABI = r"python (none|full|limited>=3\.\d+); torch (none|unstable|stable>=2\.\d+\.\d+)"


def assert_cell_built(
    output: Path,
    cell: str,
    recipes: set[str],
    label: str,
    torch: str,
    *,
    channel_name: str | None = None,
    unpublished: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """``unpublished``: stable recipes a cell of a newer torch than its group's oldest built
    only to test them (no channel had their one build): their publish step is skipped."""
    data = report(output, cell)
    assert data["status"] == "ok", json.dumps(data["steps"], indent=1)
    assert {r["name"] for r in data["recipes"]} == recipes
    skipped = {(s["recipe"], s["step"]) for s in data["steps"] if s["status"] == "skipped"}
    assert skipped == {(name, "publish") for name in unpublished}, skipped
    assert all(step["status"] in ("ok", "skipped") for step in data["steps"])
    checks = all_checks(data)
    assert not [c for c in checks if c["verdict"] == "fail"]
    assert not [c for c in checks if c["verdict"] == "warn"]
    # each wheel held to the glibc it was built on (this machine's here), and within it
    baselines = [c for c in checks if c["name"] == "glibc-baseline"]
    assert baselines and all(c["verdict"] == "pass" for c in baselines)
    assert all("the baseline of this machine (glibc " in c["detail"] for c in baselines)
    channel = tree_channel(output / "index", channel_name or label)
    assert problems(channel) == []
    published = {
        f.filename: f
        for name in channel.project_names()
        for f in (channel.project(name) or Project(name=name, files=())).files
    }
    for recipe in data["recipes"]:
        wheel = Path(recipe["wheel"]["path"])
        assert (wheel.name in published) is (recipe["name"] not in unpublished), "the publish step put it in the index"
        if recipe["name"] in unpublished:
            continue
        assert published[wheel.name].abi == recipe["wheel"]["abi"], "the report and the index say the same ABI"
        assert wheel.parent == output / cell / "dist"
        info = read_wheel(wheel)
        assert info.version.local == label
        assert all(p.startswith("manylinux_") for p in info.platforms)
        if recipe["name"] in STABLE:  # one wheel for every torch from 2.10 and every CPython from 3.10
            assert "torch>=2.10" in info.requires_dist and {t.abi for t in info.tags} == {"abi3"}
            assert recipe["wheel"]["abi"] == "python limited>=3.2; torch stable>=2.10.0"
        else:  # pinned to this torch, whatever ABI its libraries keep to (xformers' are stable)
            assert f"torch=={torch}" in info.requires_dist
            assert re.fullmatch(ABI, recipe["wheel"]["abi"]), recipe["wheel"]["abi"]
        assert len(recipe["wheel"]["sha256"]) == 64
    return data


def test_nox_lists_a_session_per_cell() -> None:
    result = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT, capture_output=True, text=True, check=True)
    for session in (
        "build-cuda118-py311",
        "build-cuda130-py311",
        "build-cpu-py311",
        "build-rocm62-py311",
        "tests",
        "lint",
    ):
        assert f" {session} -> " in result.stdout or f" {session}\n" in result.stdout
    cells = load_matrix(ROOT / "recipes" / "matrix.toml").cells
    listed = [line for line in result.stdout.splitlines() if line[:2] in ("* ", "- ") and line[2:].startswith("build-")]
    assert len(listed) == len(cells)
    assert " image-" not in result.stdout and len(result.stdout.splitlines()) < len(cells) + 15, "nox -l is short"
    named = [sys.executable, "-m", "nox", "-l", "-s", "image-cpu-py311-runtime", "test-gpu-cuda130-py311"]
    shown = subprocess.run(named, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "* image-cpu-py311-runtime -> " in shown and "* test-gpu-cuda130-py311 -> " in shown


SMOKE = """
import torch, torchsort, example_cpp_ops, example_stable_ops
assert torch.__version__ == "2.13.0+cpu", torch.__version__
x = torch.tensor([[3.0, 1.0, 2.0]])
assert torchsort.soft_rank(x, regularization_strength=0.001).round().tolist() == [[3.0, 1.0, 2.0]]
assert torch.ops.example_ops.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6).shape == (2, 4)
assert example_stable_ops.rms_norm(torch.ones(2, 4), torch.ones(4)).shape == (2, 4)
print("smoke ok")
"""


def test_cpu_cell_builds_end_to_end(tmp_path: Path) -> None:
    """The README's first command, then the channel as a consumer uses it: its only index,
    served over HTTP, gives pip and uv the cell's wheels, torch and every dependency."""
    result = nox("build-cpu-py311", tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    built = {"example-cpp-ops", "example-stable-ops", "torchsort"}
    data = assert_cell_built(tmp_path, "cpu-py311", built, "cpu", "2.13.0+cpu")
    abi = {r["name"]: r["wheel"]["abi"] for r in data["recipes"]}
    assert abi["example-cpp-ops"] == "python limited>=3.2; torch unstable" and abi["torchsort"].endswith("unstable")
    assert "cpu-py311: ok" in result.stdout
    for recipe in built:  # the summary: a line a wheel built, never the table of every step (-v)
        assert re.search(rf"\nwheel {recipe}: \S+\.whl \([0-9.]+ [KM]iB, sha256 [0-9a-f]{{12}}\)\n", result.stdout)
    assert "┃ recipe" not in result.stdout
    assert "next: `wheelmill index serve` serves the index over HTTP, and `wheelmill index config --channel cpu`" in (
        result.stdout
    )
    assert [line for line in result.stderr.splitlines() if not line.startswith("nox > ")] == [], (
        "stderr is for the error line only"
    )
    closure = read_closure(tmp_path / "cpu-py311" / CLOSURE_LOCK_NAME)
    assert closure.built == built
    assert {"torch", "filelock", "sympy"} <= {w.project for w in closure.to_mirror}
    channel = tree_channel(tmp_path / "index", "cpu")
    torch = channel.project("torch")
    assert torch is not None and [(f.version, f.built) for f in torch.files] == [("2.13.0+cpu", False)]
    assert {step["step"] for step in data["steps"]} >= {"closure", "mirror", "channel-checks"}
    served = Served(tmp_path / "index", tmp_path / "access.log")
    try:
        for installer in ("pip", "uv"):
            python = venv(tmp_path / f"consumer-{installer}")
            index = served.simple("cpu")
            if installer == "pip":
                done = pip(python, "install", "--index-url", index, *sorted(built))
            else:
                done = uv(
                    "pip",
                    "install",
                    "--no-config",
                    "--python",
                    str(python),
                    "--index-url",
                    index,
                    *sorted(built),
                )
            assert done.returncode == 0, done.stdout + done.stderr
            smoke = subprocess.run(
                [str(python), "-c", SMOKE], capture_output=True, text=True, check=False, env=isolated_env()
            )
            assert smoke.returncode == 0 and "smoke ok" in smoke.stdout, smoke.stderr[-2000:]
        requests = served.requests()
    finally:
        served.close()
    downloads = [path for path, status, _size in requests if path.endswith(".whl")]
    # The channel's pages, and the files they link to: the blobs its entries name.
    assert all(status == 200 and path.startswith(("/cpu/", "/blobs/sha256/")) for path, status, _ in requests), requests
    listed = {f.filename for project in channel.projects() for f in project.files}
    assert {unquote(path.rsplit("/", 1)[1]) for path in downloads} <= listed, "every file installed is the channel's"
    assert any("torch-2.13.0" in path for path in downloads) and any("filelock" in path for path in downloads)
    _conda_env_runs_the_cell(tmp_path)
    _the_stable_wheel_runs_with_another_torch(tmp_path)


def _the_stable_wheel_runs_with_another_torch(output: Path) -> None:
    """The stable example's one wheel, built against torch 2.13.0+cpu, passes its own tests
    with torch 2.14.1 (a CUDA build, on its CPU kernels): docs/design/abi.md says so."""
    (wheel,) = (output / "cpu-py311" / "dist").glob("example_stable_ops-*-cp310-abi3-*.whl")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv
    env = Env(root=output / "torch-2.14")
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(env.root)], check=True)
    sources = machine_sources(Settings.from_environ({})).best_match().uv_args()
    installed = subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(env.python), *sources, "torch==2.14.1", "pytest", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    tests = ROOT / "extensions" / "stable-ops" / "tests"
    ran = subprocess.run(
        [str(env.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib", str(tests)],
        cwd=output,
        capture_output=True,
        text=True,
        check=False,
        env=isolated_env(),
    )
    assert ran.returncode == 0 and " passed" in ran.stdout, ran.stdout[-2000:] + ran.stderr[-2000:]
    version = subprocess.run(  # what is installed, read without importing torch again (6 s)
        [str(env.python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.startswith("2.14.1"), version.stdout


def _conda_env_runs_the_cell(output: Path) -> None:
    """The conda commands of docs/conda.md: the channel's wheels and this machine's CPython as a
    conda channel, an env made from it alone, and the extensions run in it."""
    published = sorted(p.name for p in (output / "index" / "conda" / "cpu").glob("*/*.conda"))
    assert published == [
        "example-cpp-ops-0.1.0-cpu_py311_0.conda",
        "example-stable-ops-0.1.0-cpu_py311_0.conda",
        "torchsort-0.1.10-cpu_py311_0.conda",
    ], "the publish step made them"
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output)}
    outputs = []
    for args in (
        ["seed", "--cell", "cpu-py311"],
        ["create", str(output / "conda-env"), "example-cpp-ops", "example-stable-ops", "torchsort"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "wheelmill", "conda", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    assert " packages added, 3 already there," in outputs[0], outputs[0]
    created = " ".join(outputs[1].split())  # the console wraps a long line
    assert "example-cpp-ops 0.1.0 cpu_py311_0" in created and "torch 2.13.0 cpu_py311_0" in created
    smoke = subprocess.run(
        [str(output / "conda-env" / "bin" / "python"), "-c", SMOKE],
        capture_output=True,
        text=True,
        check=False,
        env=isolated_env(),
    )
    assert smoke.returncode == 0 and "smoke ok" in smoke.stdout, smoke.stderr[-2000:]


@pytest.mark.cuda
def test_cuda130_cell_builds_end_to_end(tmp_path: Path) -> None:
    if shutil.which("nvcc", path="/usr/local/cuda-13.0/bin:" + os.environ.get("CUDA_HOME", "") + "/bin") is None:
        pytest.skip("no CUDA 13.0 toolkit")
    result = nox("build-cuda130-py311", tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    # The stable example is built once against cuda130's oldest torch (2.12), by a cell of
    # that torch: this cell of 2.14.1, alone, builds and tests it, and publishes none of it.
    data = assert_cell_built(
        tmp_path,
        "cuda130-py311",
        {"example-cpp-ops", "example-cuda-ops", "example-stable-ops", "torchsort"},
        "cu130",
        "2.14.1",
        unpublished=frozenset({"example-stable-ops"}),
    )
    device = {step["recipe"]: c for step in data["steps"] for c in step["checks"] if c["name"] == "device-code"}
    assert device["example-cuda-ops"]["verdict"] == "pass"
    assert device["torchsort"]["verdict"] == "pass"
    assert device["example-stable-ops"]["verdict"] == "pass", "its CUDA kernels, on the stable ABI too"
    cuda_ops = next(r for r in data["recipes"] if r["name"] == "example-cuda-ops")
    assert "example-cpp-ops==0.1.0+cu130" in read_wheel(Path(cuda_ops["wheel"]["path"])).requires_dist
    # A rebuild's compiles (nvcc's host and device steps) all from the compiler cache, with
    # the same bytes: test_reproducible; a published dependency not built again: test_build_keys.


def test_cuda118_stops_in_pre_checks_within_seconds(tmp_path: Path) -> None:
    started = time.monotonic()
    result = nox("build-cuda118-py311", tmp_path, timeout=300)
    elapsed = time.monotonic() - started
    assert result.returncode == 5, (result.stdout + result.stderr)[-3000:]
    assert elapsed < 60, f"pre-checks took {elapsed:.0f}s"
    error = [line for line in result.stderr.splitlines() if line.startswith("wheelmill: error:")]
    assert len(error) == 1
    assert "no CUDA 11.8 toolkit" in error[0]
    assert "torch==2.7.1+cu118" in error[0]
    assert "fix:" in error[0] and "CUDA_HOME" in error[0] and "WHEELMILL_TORCH_INDEX" in error[0]
    data = report(tmp_path, "cuda118-py311")
    statuses = {s["step"]: s["status"] for s in data["steps"] if s["recipe"] is None}
    assert statuses["pre-checks"] == "failed"
    assert statuses["prepare-env"] == "skipped"
    assert not (tmp_path / "cuda118-py311" / "envs").exists()


def test_a_cpu_torch_offered_to_a_cuda_cell_is_refused(tmp_path: Path, recipes_copy: Path) -> None:
    """A variant whose torch pin resolves to a CPU build here stops before installing it."""
    matrix = recipes_copy / "matrix.toml"
    matrix.write_text(
        matrix.read_text().replace('label = "cu130"\ntorch = "2.14.1"', 'label = "cu130"\ntorch = "2.13.0"')
    )
    env = {
        **os.environ,
        "WHEELMILL_OUTPUT": str(tmp_path / "out"),
        "WHEELMILL_TORCH_INDEX": "",
        "WHEELMILL_ENGINE": "none",
    }
    command = [
        sys.executable,
        "-m",
        "wheelmill",
        "--recipes",
        str(recipes_copy),
        "build",
        "--cell",
        "cuda130-py311",
        "--recipe",
        "example-cpp-ops",
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 5, (result.stdout + result.stderr)[-3000:]
    assert "offer torch 2.13.0+cpu, not 2.13.0+cu130" in result.stderr


def test_env_check_catches_a_cpu_torch_installed_in_a_cuda_cell(tmp_path: Path) -> None:
    """The env check asks torch itself: a real CPU torch, judged for the cuda130 variant."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv
    env = Env(root=tmp_path / "env")
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(env.root)], check=True)
    sources = machine_sources(Settings.from_environ({})).uv_args()
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(env.python), *sources, "torch==2.13.0+cpu"], check=True
    )
    info = read_torch(env.root)
    imported = subprocess.run(
        [str(env.python), "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.split() == [info.version, str(info.cuda)], "the files say what the import says"
    variant = load_matrix(ROOT / "recipes" / "matrix.toml").variants["cuda130"]
    verdicts = {r.name: r for r in judge_torch(info, variant)}
    assert verdicts["torch-variant"].verdict == "fail"
    assert "a CPU torch in a CUDA 13.0 cell" in verdicts["torch-variant"].detail


def test_ctrl_c_during_a_build_stops_everything_and_keeps_a_report(tmp_path: Path) -> None:
    """SIGINT mid-compile: exit 130, the compiler's whole process tree gone, a valid report."""
    env = {**os.environ, "WHEELMILL_OUTPUT": str(tmp_path), "WHEELMILL_ENGINE": "none"}
    command = [sys.executable, "-m", "wheelmill", "build", "--cell", "cpu-py311", "--recipe", "example-cpp-ops"]
    build_log = tmp_path / "cpu-py311" / "logs" / "*-example-cpp-ops-build.log"
    returncode, err = interrupt_mid_compile(command, cwd=ROOT, env=env, build_log=build_log, wait=300, stop_within=60)
    assert returncode == 130, err[-2000:]
    assert "interrupted" in err.splitlines()[-1]
    data = report(tmp_path, "cpu-py311")
    assert data["status"] == "interrupted"
    statuses = {f"{s['recipe']}/{s['step']}": s["status"] for s in data["steps"]}
    assert statuses["example-cpp-ops/build"] == "interrupted"
    assert statuses["example-cpp-ops/install-test"] == "skipped"
    leftovers = subprocess.run(
        ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert not leftovers, f"processes left running: {leftovers}"
    assert not list(tmp_path.glob("cpu-py311/dist/*.whl")), "nothing half-built is delivered"
