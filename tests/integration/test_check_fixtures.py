"""The post-build checks catch real defects in real binaries: each fixture is compiled here,
packed into a wheel, and judged by the same functions the build steps use. Every broken
fixture has a healthy twin that passes, so a check that cannot fail would show."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.channels import tree_channel
from tests.wheels import make_wheel
from wheelmill.checks import CheckResult, Verdict
from wheelmill.checks.contents import judge_bundled
from wheelmill.checks.device import find_cuobjdump, judge_cuda, scan_cuda
from wheelmill.checks.symbols import interpreter_libraries, judge_undefined, unresolved_symbols
from wheelmill.errors import CheckError
from wheelmill.inputs.archs import CudaArchs
from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine.process import HostRunner, capture
from wheelmill.machine.toolchain import Toolkit, find_toolkit
from wheelmill.wheel.elf import ElfSummary, LibraryFinder, system_lib_dirs
from wheelmill.wheel.wheelfile import inspect_wheel

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent


def compile_c(tmp_path: Path, name: str, source: str, *flags: str) -> bytes:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src), *flags], check=True)
    return out.read_bytes()


def symbol_verdict(wheel: Path) -> CheckResult:
    def judge(root: Path, elves: list[ElfSummary]) -> list[CheckResult]:
        finder = LibraryFinder([], system_lib_dirs(capture(["ldconfig", "-p"]).stdout))
        interpreter = interpreter_libraries(Path(sys.executable).resolve(), finder)
        return [judge_undefined(unresolved_symbols(elves, root=root, finder=finder, interpreter=interpreter))]

    (result,) = inspect_wheel(wheel, judge)
    return result


def test_unresolved_symbol_is_caught(tmp_path: Path) -> None:
    broken = compile_c(
        tmp_path,
        "broken",
        "extern int wm_missing_kernel(int);\nint entry(int x) { return wm_missing_kernel(x) + 1; }\n",
    )
    wheel = make_wheel(tmp_path, "broken", "1.0", files={"broken/_C.so": broken})
    result = symbol_verdict(wheel)
    assert result.verdict is Verdict.FAIL
    assert "wm_missing_kernel" in result.detail
    assert "broken/_C.so" in result.detail


def test_symbols_from_libm_libc_and_python_resolve(tmp_path: Path) -> None:
    source = (
        "#include <math.h>\n#include <stdio.h>\nextern void* PyLong_FromLong(long);\n"
        'void* entry(double x) { printf("%f", cos(x)); return PyLong_FromLong(1); }\n'
    )
    healthy = compile_c(tmp_path, "healthy", source, "-lm")
    wheel = make_wheel(tmp_path, "healthy", "1.0", files={"healthy/_C.so": healthy})
    assert symbol_verdict(wheel).verdict is Verdict.PASS


def test_bundled_libcuda_is_caught(tmp_path: Path) -> None:
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    forbidden = [*matrix.forbid, *matrix.excludes_for(matrix.variants["cuda130"])]
    fake_driver = compile_c(
        tmp_path, "driver", "int cuInit(unsigned flags) { return 0; }\n", "-Wl,-soname,libcuda.so.1"
    )
    helper = compile_c(tmp_path, "helper", "int helper(void) { return 0; }\n", "-Wl,-soname,libhelper.so.1")
    bad = make_wheel(tmp_path, "bad", "1.0", files={"bad.libs/libcuda-0a1b2c3d.so.1": fake_driver, "bad/_C.so": helper})
    good = make_wheel(tmp_path, "good", "1.0", files={"good.libs/libhelper-0a1b2c3d.so.1": helper})
    (bad_result,) = inspect_wheel(bad, lambda root, elves: [judge_bundled(elves, forbidden)])
    (good_result,) = inspect_wheel(good, lambda root, elves: [judge_bundled(elves, forbidden)])
    assert bad_result.verdict is Verdict.FAIL
    assert "libcuda-0a1b2c3d.so.1" in bad_result.detail
    assert good_result.verdict is Verdict.PASS


def cuda_toolkit() -> Toolkit:
    toolkit = find_toolkit(load_matrix(ROOT / "recipes" / "matrix.toml").variants["cuda130"], HostRunner())
    if not isinstance(toolkit, Toolkit):
        pytest.skip("no CUDA 13.0 toolkit on this machine")
    return toolkit


KERNEL = (
    "__global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }\n"
    'extern "C" void launch(float* x) { add_one<<<1, 32>>>(x); }\n'
)


def compile_cu(tmp_path: Path, toolkit: Toolkit, name: str, *gencodes: str) -> bytes:
    src = tmp_path / f"{name}.cu"
    src.write_text(KERNEL)
    out = tmp_path / f"{name}.so"
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in gencodes]
    subprocess.run(
        [str(toolkit.compiler), "-shared", "-Xcompiler", "-fPIC", *flags, "-o", str(out), str(src)], check=True
    )
    return out.read_bytes()


@pytest.mark.cuda
def test_arch_mismatch_is_caught(tmp_path: Path) -> None:
    toolkit = cuda_toolkit()
    cuobjdump = find_cuobjdump(toolkit.bin_dir)
    assert cuobjdump is not None, "setup installs nvidia-cuda-cuobjdump"
    requested = CudaArchs.parse("8.0;9.0")
    only_80 = make_wheel(tmp_path, "only80", "1.0", files={"only80/_k.so": compile_cu(tmp_path, toolkit, "k80", "80")})
    both = make_wheel(tmp_path, "both", "1.0", files={"both/_k.so": compile_cu(tmp_path, toolkit, "kboth", "80", "90")})
    (mismatch,) = inspect_wheel(
        only_80, lambda root, elves: [judge_cuda(scan_cuda(elves, root, cuobjdump), requested, required=True)]
    )
    (match,) = inspect_wheel(
        both, lambda root, elves: [judge_cuda(scan_cuda(elves, root, cuobjdump), requested, required=True)]
    )
    assert mismatch.verdict is Verdict.FAIL
    assert "lacks SASS for sm_90" in mismatch.detail
    assert match.verdict is Verdict.PASS, match.detail


def test_gcc_is_present() -> None:
    assert shutil.which("gcc"), "these fixtures need gcc (Debian: apt-get install gcc)"


def test_abi_stable_declared_by_a_library_of_the_cpp_api_is_one_line_and_nothing_published(
    tmp_path: Path, recipes_copy: Path
) -> None:
    """example-cpp-ops, the per-torch example, declared stable: its real build, repaired,
    fails the ABI check on its first libtorch C++ symbol; nothing is delivered or published.
    Its healthy twin is the same build undeclared, which every cell test runs."""
    recipe = recipes_copy / "example-cpp-ops.toml"
    recipe.write_text(recipe.read_text().replace('cells = ["*"]\n', 'cells = ["*"]\nabi = "stable"\n'))
    out = tmp_path / "out"
    env = {**os.environ, "WHEELMILL_OUTPUT": str(out), "WHEELMILL_ENGINE": "none"}
    command = [sys.executable, "-m", "wheelmill", "--recipes", str(recipes_copy), "build", "--cell", "cpu-py311"]
    done = subprocess.run(
        [*command, "--recipe", "example-cpp-ops"], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("wheelmill: error:")]
    assert done.returncode == CheckError.exit_code and len(errors) == 1, done.stdout[-3000:] + done.stderr
    (line,) = errors
    assert "example-cpp-ops: " in line and "example_cpp_ops/_C.cpython-311-x86_64-linux-gnu.so" in line
    assert 'declared abi = "stable" but uses libtorch\'s C++ API: ' in line and "at::" in line
    assert "at::TensorBase::__dispatch_contiguous, at::_ops::" in line, "names without their parameters"
    assert "fix: abi: call torch only through torch/csrc/stable" in line and f"{recipe}" in line
    assert not list((out / "cpu-py311" / "dist").glob("*.whl")), "nothing delivered"
    assert tree_channel(out / "index", "cpu").project("example-cpp-ops") is None, "nothing published"
