"""The ABI a library keeps to, read from the symbols it leaves undefined (real names, as a
compiler mangles them), and the check that holds a wheel's abi3 tag and a recipe's
``abi = "stable"`` to it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from packaging.tags import parse_tag

from tests.elves import make_elf, summary
from tests.wheels import make_wheel
from wheelmill.checks import Verdict
from wheelmill.checks.abi import judge_abi, judge_cuda_runtime
from wheelmill.errors import CheckError
from wheelmill.inputs.recipes import AbiPromise
from wheelmill.wheel.abi import PythonUse, TorchUse, WheelAbi, classify, read_abi
from wheelmill.wheel.elf import ElfSummary

# What example-cpp-ops' _C.so (the per-torch example) leaves to libtorch and libc10.
UNSTABLE = (
    "_ZNK2at10TensorBase21__dispatch_contiguousEN3c1012MemoryFormatE",
    "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
)
# A stable-ABI library: the C shims of torch 2.9 and one that torch 2.10 added.
STABLE = ("aoti_torch_get_data_ptr", "aoti_torch_empty_strided", "torch_library_impl")
LIMITED = ("PyModule_Create2", "_Py_NoneStruct")  # in the limited API since 3.2


def library(name: str, *symbols: str, needed: tuple[str, ...] = ()) -> ElfSummary:
    return summary(Path("/unpacked") / name, undefined=symbols, needed=needed)


def test_a_library_of_libtorchs_cpp_api_is_for_one_torch() -> None:
    abi = classify(library("ops/_C.so", *LIMITED, *UNSTABLE, "memcpy"), "ops/_C.so")
    assert abi.torch is TorchUse.UNSTABLE and abi.torch_minimum is None
    assert abi.unstable[0] == "at::TensorBase::__dispatch_contiguous(c10::MemoryFormat) const"
    assert any(s.startswith("c10::detail::torchCheckFail(") for s in abi.unstable)
    assert (abi.python, abi.python_minimum) == (PythonUse.LIMITED, "3.2")


def test_a_library_of_the_stable_shims_runs_from_the_torch_of_its_newest_shim() -> None:
    abi = classify(library("ops/_C.abi3.so", *LIMITED, *STABLE), "ops/_C.abi3.so")
    assert (abi.torch, abi.torch_minimum, abi.unstable) == (TorchUse.STABLE, "2.10.0", ())
    older = classify(library("ops/_C.abi3.so", *STABLE[:2]), "ops/_C.abi3.so")
    assert (older.torch, older.torch_minimum) == (TorchUse.STABLE, "2.9.0")
    assert older.python is PythonUse.NONE, "a helper library uses no CPython symbol"


def test_cpython_symbols_outside_the_limited_api_or_newer_than_3_9() -> None:
    full = classify(library("a.so", *LIMITED, "PyFrame_GetBack"), "a.so")
    assert (full.python, full.outside_limited) == (PythonUse.FULL, ("PyFrame_GetBack",))
    newer = classify(library("b.so", *LIMITED, "PyModule_AddType"), "b.so")
    assert (newer.python, newer.python_minimum) == (PythonUse.LIMITED, "3.10")


def test_a_wheel_is_as_wide_as_its_widest_library() -> None:
    stable = classify(library("a.so", *LIMITED, *STABLE), "a.so")
    helper = classify(library("libhelper.so", "memcpy"), "libhelper.so")
    assert WheelAbi(libraries=(stable, helper)).describe() == "python limited>=3.2; torch stable>=2.10.0"
    mixed = WheelAbi(libraries=(stable, classify(library("b.so", "PyFrame_GetBack", *UNSTABLE), "b.so")))
    assert mixed.describe() == "python full; torch unstable"
    assert WheelAbi(libraries=()).describe() == "no native code"


def test_abi_stable_declared_and_a_cpp_symbol_used_fails_naming_library_symbol_and_fix() -> None:
    abi = WheelAbi(libraries=(classify(library("ops/_C.so", *LIMITED, *UNSTABLE), "ops/_C.so"),))
    tags = frozenset(parse_tag("cp311-cp311-manylinux_2_28_x86_64"))
    result = judge_abi(abi, tags, AbiPromise.STABLE, recipe_file="recipes/ops.toml")
    assert result.verdict is Verdict.FAIL
    assert result.detail == (
        'ops/_C.so: declared abi = "stable" but uses libtorch\'s C++ API: '
        "at::TensorBase::__dispatch_contiguous, c10::detail::torchCheckFail"
    )
    assert "torch/csrc/stable" in (result.fix or "") and 'remove abi = "stable" from recipes/ops.toml' in (
        result.fix or ""
    )
    undeclared = judge_abi(abi, tags, None, recipe_file="recipes/ops.toml")
    assert (undeclared.verdict, undeclared.detail) == (Verdict.PASS, "python limited>=3.2; torch unstable")


def test_an_abi3_tag_holds_every_library_to_the_limited_api_of_its_python() -> None:
    tags = frozenset(parse_tag("cp39-abi3-manylinux_2_28_x86_64"))
    fine = WheelAbi(libraries=(classify(library("a.abi3.so", *LIMITED, *STABLE), "a.abi3.so"),))
    assert judge_abi(fine, tags, AbiPromise.STABLE, recipe_file="r.toml").verdict is Verdict.PASS
    newer = WheelAbi(libraries=(classify(library("a.abi3.so", *LIMITED, "PyModule_AddType"), "a.abi3.so"),))
    result = judge_abi(newer, tags, None, recipe_file="r.toml")
    assert result.verdict is Verdict.FAIL
    assert result.detail == "a.abi3.so: tagged abi3 for Python 3.9 but needs the limited API of Python 3.10"
    full = WheelAbi(libraries=(classify(library("a.abi3.so", "PyFrame_GetBack"), "a.abi3.so"),))
    assert "uses PyFrame_GetBack, outside CPython's limited API" in judge_abi(full, tags, None, recipe_file="r").detail


def test_a_library_linked_against_another_cuda_major_than_its_torchs_fails() -> None:
    """PyPI's torch 2.10 ships CUDA 12 runtimes, 2.11 on CUDA 13: a library linked against
    libcudart.so.13 does not load beside the first."""
    root = Path("/unpacked")
    cuda13 = [library("ops/_C.abi3.so", needed=("libc10.so", "libcudart.so.13", "libcufft.so.12"))]
    failed = judge_cuda_runtime(cuda13, root, "12.8")
    assert failed.verdict is Verdict.FAIL
    assert failed.detail == "ops/_C.abi3.so links libcudart.so.13 (CUDA 13) but its torch ships CUDA 12 runtimes"
    assert failed.fix == "build it with a CUDA 12 toolkit, the major of the torch it is for"
    passed = judge_cuda_runtime(cuda13, root, "13.0")
    assert (passed.verdict, passed.detail) == (Verdict.PASS, "CUDA 13, as its torch's (13.0)"), "cuFFT's 12 is its own"
    assert judge_cuda_runtime([library("a.so", needed=("libc10.so",))], root, "13.0").verdict is Verdict.SKIP
    assert judge_cuda_runtime(cuda13, root, None).verdict is Verdict.SKIP


def test_a_wheels_abi_is_read_in_memory_and_a_broken_library_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the index lists for a published wheel: read from the wheel without unpacking it
    anywhere (a publisher killed meanwhile leaves no temporary directory behind)."""
    library = make_elf(tmp_path / "lib.so", {".text": b"\x90"}).read_bytes()
    wheel = make_wheel(tmp_path / "w", "ops", "1.0", files={"ops/_C.so": library, "ops/data.so": b"not ELF"})
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    abi = read_abi(wheel)
    assert [lib.name for lib in abi.libraries] == ["ops/_C.so"] and abi.describe() == "python none; torch none"
    assert list(temporary.iterdir()) == []
    broken = make_wheel(tmp_path / "b", "ops", "1.0", files={"ops/_C.so": b"\x7fELF broken"})
    with pytest.raises(CheckError, match=r"ops/_C\.so starts like an ELF file but cannot be read as one"):
        read_abi(broken)
