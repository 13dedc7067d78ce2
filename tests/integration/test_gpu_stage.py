"""The GPU stage on a machine without a GPU: its planning, its report and its failure paths,
for real (a channel under an index root, uv making the env, real torch where it says so),
with a stand-in ``nvidia-smi`` that lists one H100. It must not pretend to run kernels:
with the real torch, which sees no GPU, no GPU check runs and the stage says so.

The fresh-env test uses a stand-in torch too (published into the channel, so the env is
made from the channel alone), one that reports the stand-in GPU, so that the checks run
and their outcomes (passed, skipped, failed as doctor predicted, doctor contradicted) are
judged end to end; the real torch's tests use a wheel whose kernels cannot load (a real
library with an undefined symbol) against doctor's verdict.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.wheels import make_wheel
from wheelmill.errors import EnvError, GpuCheckError, GpuUnproven, GpuVerdictMismatch, NoGpuError, PrecheckError
from wheelmill.gpu.report import load_gpu_report
from wheelmill.index.storage import TreeStorage
from wheelmill.inputs.versions import Track, VersionRule
from wheelmill.machine.net import sha256_of
from wheelmill.machine.package_sources import machine_sources
from wheelmill.machine.tools import uv_bin
from wheelmill.provenance.signing import new_signing_key
from wheelmill.releases.gpu_attestation import envelope_beside, opened
from wheelmill.releases.records import Manifest, ReleasedFile, record
from wheelmill.settings import Settings

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
CELL = "cuda130-py311"
TAG = "cp311-cp311-manylinux_2_28_x86_64"
NVIDIA_SMI = "#!/bin/sh\necho '0, NVIDIA H100 80GB HBM3, 9.0'\n"
# A library that cannot load, as kernels built wrong cannot: it needs a symbol nothing defines.
BROKEN = r"""
#include <Python.h>
extern int wm_kernel_image_for_sm_90(void);
static PyObject *run(PyObject *self, PyObject *args) { return PyLong_FromLong(wm_kernel_image_for_sm_90()); }
static PyMethodDef methods[] = {{"run", run, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};
PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
"""
STAND_IN_TORCH = '''"""A stand-in for torch in a test: its version, and the GPUs CUDA_VISIBLE_DEVICES names."""
import os
__version__ = "2.14.1+cu130"
class version:
    cuda = "13.0"
    hip = None
class cuda:
    @staticmethod
    def _ids():
        return [i for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if i]
    @staticmethod
    def is_available():
        return bool(cuda._ids())
    @staticmethod
    def device_count():
        return len(cuda._ids())
    @staticmethod
    def get_device_capability(i):
        return (9, 0)
    @staticmethod
    def get_device_name(i):
        return "stand-in H100"
    @staticmethod
    def get_arch_list():
        return ["sm_90"]
'''
PASSES = """import unittest, torch, {module}
class T(unittest.TestCase):
    def test_kernel(self):
        self.assertTrue(torch.cuda.is_available())
"""
SKIPS = """import unittest
class T(unittest.TestCase):
    @unittest.skip("needs two GPUs")
    def test_pair(self):
        pass
"""
NO_IMAGE = 'raise RuntimeError("CUDA error: no kernel image is available for execution on the device")\n'
WRONG = 'raise AssertionError("Tensor-likes are not close! Mismatched elements: 3 / 4096")\n'
NO_TESTS = "import unittest\n"


def archs(arch_list: str, cell: str = CELL) -> bytes:
    return json.dumps({"arch_list": arch_list, "cell": cell, "family": "cuda"}).encode()


def recipe(name: str, module: str, *, check: str | None) -> str:
    smoke = f'\ngpu-smoke = ["{{python}}", "{{recipes}}/gpu-checks/{check}"]' if check else ""
    head = f'name = "{name}"\ncells = ["cuda130*-py311"]\n[source]\npath = "src"\n'
    return head + f'[checks]\nimports = ["{module}"]{smoke}\n'


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A recipes directory: the matrix (its test env empty: the checks here need no pytest)
    and the test's recipes, their GPU checks beside them."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    matrix = (ROOT / "recipes" / "matrix.toml").read_text()
    (recipes / "matrix.toml").write_text(matrix.replace('requires = ["pytest>=8"]', "requires = []", 1))
    (recipes / "src").mkdir()
    (recipes / "gpu-checks").mkdir()
    return recipes


def wheelmill(
    project: Path, *args: str, path: Path | None = None, gpus: str | None = None, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **(extra or {}),
        "WHEELMILL_INDEX_ROOT": str(project.parent / "index"),
        "WHEELMILL_OUTPUT": str(project.parent / "out"),
        "PATH": f"{path}:{os.environ['PATH']}" if path else os.environ["PATH"],
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    argv = [sys.executable, "-m", "wheelmill", "--recipes", str(project), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)


def stand_in_nvidia_smi(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "nvidia-smi").write_text(NVIDIA_SMI)
    (where / "nvidia-smi").chmod(0o755)
    return where


def publish(project: Path, *wheels: Path) -> None:
    done = wheelmill(project, "publish", "--channel", "cu130", *map(str, wheels))
    assert done.returncode == 0, done.stderr


def report(project: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((project.parent / "out" / CELL / "gpu-report.json").read_text())
    return data


def outcomes(data: dict[str, Any]) -> dict[str, str]:
    return {w["recipe"]: w["outcome"] for w in data["wheels"]}


def broken_wheel(tmp_path: Path, name: str, arch_list: str) -> Path:
    """A wheel whose kernels library cannot load: compiled for real, one symbol undefined."""
    module = name.replace("-", "_")
    build = tmp_path / "build" / module
    build.mkdir(parents=True)
    (build / "kernels.c").write_text(BROKEN)
    library = build / "_kernels.so"
    include = sysconfig.get_paths()["include"]
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{include}", "-o", library, build / "kernels.c"], check=True)
    files = {f"{module}/__init__.py": b"from ._kernels import run\n", f"{module}/_kernels.so": library.read_bytes()}
    return make_wheel(tmp_path / "wheels", name, "1.0+cu130", tag=TAG, files=files, gpu_archs=archs(arch_list))


def test_fresh_env_from_the_channel_alone_judges_each_wheel_against_doctor(project: Path, tmp_path: Path) -> None:
    """The env is made from the channel alone (its torch a stand-in that reports the stand-in
    GPU); each check's outcome is judged against doctor: one passes, one skips every test and
    one runs none (skipped, never passed), one fails as doctor predicted (sm_80 only on a 9.0
    GPU), one with a wrong number where doctor said it runs (failed: not doctor's error), one
    with no kernel image where doctor said it runs (a mismatch: the worst, exit 24); a wheel
    with GPU code and no check only imported, a CPU-only one passed on its import, and one
    whose arch record cannot be read failed; the report says all."""
    checks = project / "gpu-checks"
    (checks / "test_good.py").write_text(PASSES.format(module="wm_good"))
    (checks / "test_skips.py").write_text(SKIPS)
    (checks / "test_none.py").write_text(NO_TESTS)
    (checks / "no_image.py").write_text(NO_IMAGE)
    (checks / "wrong.py").write_text(WRONG)
    unit = ["-m", "unittest", "discover", "-v", "-s", "{recipes}/gpu-checks", "-p"]
    for name, check in (("wm-good", "test_good.py"), ("wm-skips", "test_skips.py"), ("wm-none", "test_none.py")):
        command = ", ".join(f'"{part}"' for part in ["{python}", *unit, check])
        (project / f"{name}.toml").write_text(
            recipe(name, name.replace("-", "_"), check=None) + f"gpu-smoke = [{command}]\n"
        )
    (project / "wm-sm80.toml").write_text(recipe("wm-sm80", "wm_sm80", check="no_image.py"))
    (project / "wm-lies.toml").write_text(recipe("wm-lies", "wm_lies", check="no_image.py"))
    (project / "wm-wrong.toml").write_text(recipe("wm-wrong", "wm_wrong", check="wrong.py"))
    for name in ("wm-nocheck", "wm-cpu", "wm-norecord"):
        (project / f"{name}.toml").write_text(recipe(name, name.replace("-", "_"), check=None))
    wheels = tmp_path / "wheels"
    torch = make_wheel(
        wheels, "torch", "2.14.1+cu130", tag="py3-none-any", files={"torch/__init__.py": STAND_IN_TORCH.encode()}
    )
    made = [
        make_wheel(
            wheels,
            name,
            "1.0+cu130",
            tag=TAG,
            requires=["torch==2.14.1+cu130"],
            files={f"{name.replace('-', '_')}/__init__.py": b""},
            gpu_archs=archs(arch),
        )
        for name, arch in (
            ("wm-good", "9.0"),
            ("wm-skips", "8.0;9.0"),
            ("wm-none", "9.0"),
            ("wm-sm80", "8.0"),
            ("wm-lies", "9.0"),
            ("wm-wrong", "9.0"),
            ("wm-nocheck", "9.0"),
        )
    ]
    cpu_only = json.dumps({"arch_list": None, "cell": CELL, "family": "cpu"}).encode()
    # (publishing refuses an unreadable record; a wheel with none is as far as a channel goes)
    for name, arch_record in (("wm-cpu", cpu_only), ("wm-norecord", None)):
        files = {f"{name.replace('-', '_')}/__init__.py": b""}
        made.append(make_wheel(wheels, name, "1.0+cu130", tag=TAG, files=files, gpu_archs=arch_record))
    older = make_wheel(
        wheels / "old", "wm-good", "0.9+cu130", tag=TAG, files={"wm_good/__init__.py": b""}, gpu_archs=archs("9.0")
    )
    publish(project, torch, older, *made)

    done = wheelmill(project, "test-gpu", "--cell", CELL, path=stand_in_nvidia_smi(tmp_path / "bin"), gpus="0")

    assert done.returncode == GpuVerdictMismatch.exit_code, done.stdout[-3000:] + done.stderr
    (line,) = done.stderr.splitlines()
    assert "doctor's verdict and the kernels disagree on wm-lies" in line, line
    assert "doctor: ok (sm_90 SASS on GPU 0 (NVIDIA H100 80GB HBM3, 9.0))" in line
    assert "kernels: gpu-smoke: RuntimeError: CUDA error: no kernel image is available" in line
    data = report(project)
    assert outcomes(data) == {
        "wm-good": "passed",
        "wm-skips": "skipped",
        "wm-none": "skipped",
        "wm-sm80": "failed",
        "wm-lies": "mismatch",
        "wm-wrong": "failed",
        "wm-nocheck": "import-only",
        "wm-cpu": "passed",
        "wm-norecord": "failed",
    }
    by_recipe = {w["recipe"]: w for w in data["wheels"]}
    assert by_recipe["wm-good"]["filename"].startswith("wm_good-1.0+cu130-")  # the newest, not 0.9
    assert by_recipe["wm-skips"]["runs"][1]["counts"] == {"passed": 0, "failed": 0, "skipped": 1}
    assert by_recipe["wm-none"]["runs"][1]["detail"] == "no tests ran"
    assert by_recipe["wm-sm80"]["doctor"]["status"] == "fails"
    assert by_recipe["wm-sm80"]["why"] == "no kernel image for this GPU, as doctor predicted"
    assert by_recipe["wm-wrong"]["why"] == "its GPU check failed"
    assert by_recipe["wm-norecord"]["why"].startswith("doctor cannot judge it: unknown (not built by wheelmill")
    assert data["gpus"] == ["GPU 0 (NVIDIA H100 80GB HBM3, 9.0)"] and data["torch"] == "2.14.1+cu130"
    assert data["env"].startswith("fresh") and data["status"] == "mismatch" and data["exit_code"] == 24
    assert "2 passed, 1 import-only, 2 skipped, 3 failed, 1 mismatch" in done.stdout
    assert not (project.parent / "out" / CELL / "gpu-stage").exists()  # the env is gone, the report stays

    signed = project.parent / "out" / CELL / "gpu-report.json.intoto.jsonl"
    assert "gpu-report.json: unsigned (no signing key set)" in done.stdout and not signed.exists()
    for name in ("wm-skips", "wm-sm80", "wm-lies", "wm-wrong", "wm-cpu", "wm-norecord"):
        (project / f"{name}.toml").unlink()
    _proving_nothing_is_its_own_exit_and_the_runners_key_signs_it(project, tmp_path)


def _proving_nothing_is_its_own_exit_and_the_runners_key_signs_it(project: Path, tmp_path: Path) -> None:
    """What proved nothing, alone beside a pass: not a pass either, its own exit (25), one
    line. The runner's key set: the report's record signed beside it, and nothing else."""
    signed = project.parent / "out" / CELL / "gpu-report.json.intoto.jsonl"
    runner = new_signing_key("ed25519")
    (tmp_path / "runner.pem").write_bytes(runner.private_pem())
    done = wheelmill(
        project,
        "test-gpu",
        "--cell",
        CELL,
        path=stand_in_nvidia_smi(tmp_path / "bin"),
        gpus="0",
        extra={"WHEELMILL_SIGNING_KEY_FILE": str(tmp_path / "runner.pem")},
    )
    assert done.returncode == GpuUnproven.exit_code, done.stdout[-3000:] + done.stderr
    (line,) = done.stderr.splitlines()
    assert "proved nothing of 2 wheel(s)" in line and "wm-nocheck" in line and "import-only" in line, line
    assert report(project)["status"] == "skipped"
    assert f"signed by key {runner.key_id}: {signed}" in " ".join(done.stdout.split()), done.stdout[-2000:]
    written = project.parent / "out" / CELL / "gpu-report.json"
    record = opened(envelope_beside(written) or {}, [runner.trusted()], source=str(written))
    assert record.signed_by == runner.key_id and record.facts() == load_gpu_report(written).record().facts()
    assert record.status.value == "skipped" and len(record.tested) == 3
    # Run again with no key: the earlier statement does not stay beside the new report.
    done = wheelmill(project, "test-gpu", "--cell", CELL, path=stand_in_nvidia_smi(tmp_path / "bin"), gpus="0")
    assert done.returncode == GpuUnproven.exit_code and not signed.exists()


@pytest.fixture(scope="module")
def real_torch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An interpreter with the cell's real torch (2.14.1, CUDA 13.0), as a GPU machine has one."""
    env = tmp_path_factory.mktemp("torch-env") / "env"
    sources = machine_sources(Settings.from_environ()).best_match()  # pip reads every index alike
    uv = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([uv_bin(), "venv", "--quiet", "--python", "3.11", str(env)], check=True, env=uv)
    install = [uv_bin(), "pip", "install", "--quiet", "--python", str(env / "bin" / "python"), *sources.uv_args()]
    subprocess.run([*install, "torch==2.14.1"], check=True, env=uv)
    yield env / "bin" / "python"
    shutil.rmtree(env, ignore_errors=True)


def test_over_real_torch_a_wheel_that_cannot_load_is_judged_and_no_kernel_is_pretended(
    project: Path, tmp_path: Path, real_torch: Path
) -> None:
    """Over an interpreter with the real torch, which sees no GPU here: a library that cannot
    load is a mismatch where doctor said it runs and a failure where it predicted one, side
    by side with the loader's own error; the check of the wheel that loads is not run (torch
    sees no GPU), and the report says so."""
    (project / "gpu-checks" / "test_good.py").write_text(PASSES.format(module="wm_good"))
    (project / "wm-good.toml").write_text(recipe("wm-good", "wm_good", check="test_good.py"))
    (project / "wm-broken.toml").write_text(recipe("wm-broken", "wm_broken", check=None))
    (project / "wm-old-arch.toml").write_text(recipe("wm-old-arch", "wm_old_arch", check=None))
    good = make_wheel(
        tmp_path / "wheels", "wm-good", "1.0+cu130", tag=TAG, files={"wm_good/__init__.py": b""}, gpu_archs=archs("9.0")
    )
    publish(project, good, broken_wheel(tmp_path, "wm-broken", "9.0"), broken_wheel(tmp_path, "wm-old-arch", "8.0"))

    done = wheelmill(
        project, "test-gpu", "--cell", CELL, "--python", str(real_torch), path=stand_in_nvidia_smi(tmp_path / "bin")
    )

    # An import that fails is the wheel's failure, not doctor's: only a missing kernel image is.
    assert done.returncode == GpuCheckError.exit_code, done.stdout[-3000:] + done.stderr
    (line,) = done.stderr.splitlines()
    assert "wm-broken" in line and "undefined symbol: wm_kernel_image_for_sm_90" in line, line
    data = report(project)
    assert outcomes(data) == {"wm-good": "not-run", "wm-broken": "failed", "wm-old-arch": "failed"}
    good_runs = next(w for w in data["wheels"] if w["recipe"] == "wm-good")["runs"]
    assert [(r["name"], r["result"]) for r in good_runs] == [("import", "passed"), ("gpu-smoke", "not-run")]
    assert data["torch"].startswith("2.14.1") and data["torch_gpus"] == [] and data["env"].startswith("over ")

    # The wheel that loads, alone: nothing failed, nothing ran on a GPU: no GPU, exit 22.
    for name in ("wm-broken", "wm-old-arch"):
        (project / f"{name}.toml").unlink()
    done = wheelmill(
        project, "test-gpu", "--cell", CELL, "--python", str(real_torch), path=stand_in_nvidia_smi(tmp_path / "bin")
    )
    assert done.returncode == NoGpuError.exit_code, done.stdout[-3000:] + done.stderr
    assert "but torch 2.14.1+cu130 sees no GPU: no kernel ran" in done.stderr
    assert report(project)["status"] == "not-run"

    # The interpreter holds an older build of the project under test (as a runtime image
    # does), one that cannot import: the channel's file is installed before it and tested.
    old = make_wheel(
        tmp_path / "old", "wm-good", "0.9+cu130", tag=TAG, gpu_archs=archs("9.0"),
        files={"wm_good/__init__.py": b"raise ImportError('the old build of the interpreter was imported')\n"},
    )  # fmt: skip
    uv = [uv_bin(), "pip", "install", "--quiet", "--no-deps", "--python", str(real_torch), str(old)]
    subprocess.run(uv, check=True, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})
    try:
        done = wheelmill(
            project, "test-gpu", "--cell", CELL, "--python", str(real_torch), path=stand_in_nvidia_smi(tmp_path / "bin")
        )
    finally:
        uninstall = [uv_bin(), "pip", "uninstall", "--quiet", "--python", str(real_torch), "wm-good"]
        subprocess.run(uninstall, check=True, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})
    assert done.returncode == NoGpuError.exit_code, done.stdout[-3000:] + done.stderr
    (tested,) = report(project)["wheels"]
    assert tested["filename"] == good.name and tested["runs"][0]["result"] == "passed", tested

    # The cell of another torch over the same interpreter: not its torch, exit 5, one line.
    other = "cuda130-torch2.12-py311"
    files = {"wm_good/__init__.py": b""}
    wheel = make_wheel(
        tmp_path / "w212", "wm-good", "1.0+cu130.torch2.12", tag=TAG, files=files, gpu_archs=archs("9.0", other)
    )
    assert wheelmill(project, "publish", "--channel", "cu130-torch2.12", str(wheel)).returncode == 0
    done = wheelmill(
        project, "test-gpu", "--cell", other, "--python", str(real_torch), path=stand_in_nvidia_smi(tmp_path / "bin")
    )
    assert done.returncode == PrecheckError.exit_code, done.stdout[-3000:] + done.stderr
    assert "the env's torch is 2.14.1+cu130, not the cell's 2.12.0" in done.stderr


def test_no_gpu_visible_is_its_own_exit_and_a_report(project: Path, tmp_path: Path) -> None:
    """No nvidia-smi (or rocminfo): the stage stops before making anything, exit 22, and its
    report says why; a CPU cell is not one it runs for."""
    (project / "wm-good.toml").write_text(recipe("wm-good", "wm_good", check=None))
    publish(project, make_wheel(tmp_path / "wheels", "wm-good", "1.0+cu130", tag=TAG, gpu_archs=archs("9.0")))
    empty = tmp_path / "no-tools"
    empty.mkdir()
    done = wheelmill(project, "test-gpu", "--cell", CELL, path=empty)
    assert done.returncode == NoGpuError.exit_code, done.stderr
    assert "no GPU visible (nvidia-smi not found; rocminfo not found)" in done.stderr
    assert report(project)["status"] == "no-gpu" and report(project)["wheels"] == []
    assert wheelmill(project, "test-gpu", "--cell", "cpu-py311").returncode == 4
    # A GPU, and an interpreter without torch: the env cannot be the cell's, exit 8, one line.
    bare = wheelmill(
        project, "test-gpu", "--cell", CELL, "--python", sys.executable, path=stand_in_nvidia_smi(tmp_path / "bin")
    )
    assert bare.returncode == EnvError.exit_code, bare.stderr
    assert "import torch: ModuleNotFoundError: No module named 'torch'" in bare.stderr
    stopped = report(project)  # written whatever stopped the stage
    assert stopped["status"] == "stopped" and stopped["exit_code"] == EnvError.exit_code
    assert "No module named 'torch'" in stopped["error"]


def test_a_release_is_tested_on_the_files_its_record_names(project: Path, tmp_path: Path) -> None:
    """--release: the record's file of each recipe, not the channel's newest."""
    (project / "wm-good.toml").write_text(recipe("wm-good", "wm_good", check=None))
    first = make_wheel(tmp_path / "a", "wm-good", "1.0+cu130", tag=TAG, gpu_archs=archs("9.0"))
    publish(project, first, make_wheel(tmp_path / "b", "wm-good", "1.1+cu130", tag=TAG, gpu_archs=archs("9.0")))
    released = ReleasedFile(
        channel="cu130",
        cell=CELL,
        recipe="wm-good",
        filename=first.name,
        sha256=sha256_of(first),
        rule=VersionRule.REPO,
    )
    manifest = Manifest(version="1.0", track=Track.RELEASE, commit="0" * 40, tag="v1.0", files=(released,))
    record(TreeStorage(project.parent / "index"), manifest)
    empty = tmp_path / "no-tools"
    empty.mkdir()
    done = wheelmill(project, "test-gpu", "--cell", CELL, "--release", "1.0", path=empty)
    assert done.returncode == NoGpuError.exit_code, done.stderr
    assert f"wm-good: {first.name}; no GPU check in its recipe" in done.stdout
    done = wheelmill(project, "test-gpu", "--cell", CELL, path=empty)
    assert "wm-good: wm_good-1.1+cu130-" in done.stdout  # without it, the channel's newest
    missing = wheelmill(project, "test-gpu", "--cell", CELL, "--release", "2.0", path=empty)
    assert missing.returncode == 2 and "the release track has no release 2.0 (there: 1.0)" in missing.stderr, (
        missing.stderr
    )
