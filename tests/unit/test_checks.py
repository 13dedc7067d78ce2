"""The verdict functions of the checks, on values: what passes, what fails and what it says.
(The integration tests feed them real compiled binaries.)"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.elves import summary
from wheelmill.checks import Verdict
from wheelmill.checks.contents import judge_bundled, judge_size, unhashed
from wheelmill.checks.device import DeviceCode, bundle_targets, judge_cuda, judge_rocm, parse_listing
from wheelmill.checks.platform import Baseline, judge_baseline, judge_platform
from wheelmill.checks.symbols import SymbolReport, judge_required, judge_undefined
from wheelmill.checks.torchenv import judge_located, judge_torch
from wheelmill.inputs.archs import CudaArchs, RocmArchs
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.variants import Variant
from wheelmill.machine.probes import TorchInfo
from wheelmill.wheel.elf import ElfSummary


def elf(
    name: str,
    *,
    soname: str | None = None,
    needs: tuple[tuple[str, str], ...] = (),
    defined: frozenset[str] = frozenset(),
) -> ElfSummary:
    return summary(Path("/w") / name, soname=soname, defined=defined, version_needs=needs)


@pytest.fixture(scope="module")
def variants(repo_root_module: Path) -> dict[str, Variant]:
    return dict(load_matrix(repo_root_module / "recipes" / "matrix.toml").variants)


@pytest.fixture(scope="module")
def repo_root_module() -> Path:
    return Path(__file__).resolve().parent.parent.parent


def torch_info(version: str, cuda: str | None = None, hip: str | None = None) -> TorchInfo:
    return TorchInfo(
        version=version,
        dist_version=version,
        cuda=cuda,
        hip=hip,
        cxx11_abi=True,
        lib_dir=Path("/t/lib"),
        site_packages=Path("/t"),
    )


class TestDeviceCode:
    def test_exact_arch_list_passes(self) -> None:
        found = {"pkg/_C.so": DeviceCode(sass=frozenset({"sm_80", "sm_90"}), ptx=frozenset({"sm_90"}))}
        assert judge_cuda(found, CudaArchs.parse("8.0;9.0+PTX"), required=True).verdict is Verdict.PASS

    def test_missing_arch_fails_and_names_it(self) -> None:
        found = {"pkg/_C.so": DeviceCode(sass=frozenset({"sm_80"}))}
        result = judge_cuda(found, CudaArchs.parse("8.0;9.0"), required=True)
        assert result.verdict is Verdict.FAIL
        assert "lacks SASS for sm_90" in result.detail

    def test_unrequested_arch_or_ptx_fails(self) -> None:
        found = {"pkg/_C.so": DeviceCode(sass=frozenset({"sm_80", "sm_90"}), ptx=frozenset({"sm_90"}))}
        result = judge_cuda(found, CudaArchs.parse("8.0;9.0"), required=True)
        assert result.verdict is Verdict.FAIL
        assert "unrequested PTX for sm_90" in result.detail

    def test_no_device_code_fails_only_when_required(self) -> None:
        assert judge_cuda({}, CudaArchs.parse("8.0"), required=True).verdict is Verdict.FAIL
        assert judge_cuda({}, CudaArchs.parse("8.0"), required=False).verdict is Verdict.SKIP

    def test_cuobjdump_listing(self) -> None:
        listing = "ELF file    1: a.1.sm_80.cubin\nELF file    2: a.2.sm_90a.cubin\nPTX file    1: a.1.sm_120.ptx\n"
        assert parse_listing(listing) == ({"sm_80", "sm_90a"}, {"sm_120"})

    def test_rocm_offload_bundle_targets(self) -> None:
        ids = [
            b"host-x86_64-unknown-linux-gnu-",
            b"hipv4-amdgcn-amd-amdhsa--gfx90a",
            b"hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-",
        ]
        data = b"\0" * 16 + b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(ids))
        for entry in ids:
            data += struct.pack("<QQQ", 0, 0, len(entry)) + entry
        assert bundle_targets(data) == {"gfx90a", "gfx942"}
        verdict = judge_rocm({"_C.so": frozenset({"gfx90a"})}, RocmArchs.parse("gfx90a;gfx942"), required=True)
        assert verdict.verdict is Verdict.FAIL
        assert "gfx942" in verdict.detail


class TestSymbols:
    def test_unresolved_symbols_fail_with_names(self) -> None:
        report = SymbolReport(unresolved={"pkg/_C.so": ("_Z7missingv", "other")}, missing_libs=())
        result = judge_undefined(report)
        assert result.verdict is Verdict.FAIL
        assert "_Z7missingv" in result.detail

    def test_missing_library_fails(self) -> None:
        result = judge_undefined(SymbolReport(unresolved={}, missing_libs=(("libfoo.so.1", "_C.so"),)))
        assert result.verdict is Verdict.FAIL
        assert "_C.so needs libfoo.so.1" in result.detail

    def test_required_symbols(self) -> None:
        elves = [elf("_C.so", defined=frozenset({"PyInit__C"}))]
        assert judge_required(elves, ["PyInit__C"]).verdict is Verdict.PASS
        assert judge_required(elves, ["register_ops"]).verdict is Verdict.FAIL
        assert judge_required(elves, []).verdict is Verdict.SKIP


class TestContents:
    def test_grafted_names_lose_their_hash(self) -> None:
        assert unhashed("libgomp-a34b3233.so.1") == "libgomp.so.1"

    @pytest.mark.parametrize("name", ["libcuda.so.1", "libcuda-0f1e2d3c.so.1", "libtorch_cpu.so", "libnvidia-ml.so.1"])
    def test_forbidden_libraries_fail(self, name: str) -> None:
        forbidden = ["libcuda.so*", "libnvidia-*.so*", "libtorch_cpu.so"]
        assert judge_bundled([elf(f"pkg.libs/{name}")], forbidden).verdict is Verdict.FAIL

    def test_soname_counts_too(self) -> None:
        assert judge_bundled([elf("pkg.libs/libx.so", soname="libcuda.so.1")], ["libcuda.so*"]).verdict is Verdict.FAIL
        assert judge_bundled([elf("pkg.libs/libgomp-a34b3233.so.1")], ["libcuda.so*"]).verdict is Verdict.PASS

    def test_size_gate(self) -> None:
        assert judge_size(10, 100).verdict is Verdict.PASS
        assert judge_size(101, 100).verdict is Verdict.FAIL


class TestPlatform:
    def test_symbols_within_the_tag_pass(self) -> None:
        elves = [elf("_C.so", needs=(("libc.so.6", "GLIBC_2.17"), ("libstdc++.so.6", "GLIBCXX_3.4.19")))]
        result = judge_platform(elves, frozenset({"manylinux_2_17_x86_64", "manylinux2014_x86_64"}))
        assert result.verdict is Verdict.PASS
        assert "GLIBC_2.17" in result.detail

    def test_a_tag_promising_more_than_the_symbols_allow_fails(self) -> None:
        elves = [elf("_C.so", needs=(("libc.so.6", "GLIBC_2.34"),))]
        result = judge_platform(elves, frozenset({"manylinux_2_28_x86_64"}))
        assert result.verdict is Verdict.FAIL
        assert "GLIBC_2.34" in result.detail

    def test_glibcxx_counts(self) -> None:
        elves = [elf("_C.so", needs=(("libstdc++.so.6", "GLIBCXX_3.4.30"),))]
        assert judge_platform(elves, frozenset({"manylinux_2_28_x86_64"})).verdict is Verdict.FAIL
        assert judge_platform(elves, frozenset({"manylinux_2_35_x86_64"})).verdict is Verdict.PASS

    def test_linux_tag_fails(self) -> None:
        assert judge_platform([], frozenset({"linux_x86_64"})).verdict is Verdict.FAIL

    BULLSEYE = Baseline(
        tag="manylinux_2_31", built_on="the bootstrapped Debian bullseye base", newer="give cpu a newer suite"
    )

    def test_a_wheel_within_its_bases_baseline_passes_and_says_so(self) -> None:
        elves = [elf("_C.so", needs=(("libc.so.6", "GLIBC_2.17"),))]
        result = judge_baseline(frozenset({"manylinux_2_17_x86_64", "manylinux2014_x86_64"}), elves, self.BULLSEYE)
        assert (result.verdict, result.fix) == (Verdict.PASS, None)
        assert (
            result.detail
            == "manylinux_2_17_x86_64 is within manylinux_2_31, the baseline of the bootstrapped Debian bullseye base"
        )
        at_it = judge_baseline(frozenset({"manylinux_2_31_aarch64"}), [], self.BULLSEYE)
        assert at_it.verdict is Verdict.PASS

    def test_a_wheel_tagged_newer_than_its_bases_baseline_fails_naming_what_needs_more(self) -> None:
        elves = [
            elf("_ok.so", needs=(("libc.so.6", "GLIBC_2.17"),)),
            elf("_C.so", needs=(("libc.so.6", "GLIBC_2.32"), ("libc.so.6", "GLIBC_2.34"))),
        ]
        result = judge_baseline(frozenset({"manylinux_2_34_x86_64"}), elves, self.BULLSEYE)
        assert result.verdict is Verdict.FAIL, "a promise the wheel breaks is a failure, never a warning"
        assert result.detail == (
            "manylinux_2_34_x86_64 is newer than manylinux_2_31, the baseline of the bootstrapped Debian bullseye "
            "base: _C.so needs GLIBC_2.34 from libc.so.6"
        )
        assert result.fix == (
            "build that file on the bootstrapped Debian bullseye base (a prebuilt library keeps the glibc it was "
            "built on), or give cpu a newer suite"
        )

    def test_a_libstdcxx_too_new_for_the_baseline_is_named(self) -> None:
        elves = [elf("_C.so", needs=(("libstdc++.so.6", "GLIBCXX_3.4.30"),))]
        result = judge_baseline(frozenset({"manylinux_2_35_x86_64"}), elves, self.BULLSEYE)
        assert result.verdict is Verdict.FAIL and result.detail.endswith(
            "_C.so needs GLIBCXX_3.4.30 from libstdc++.so.6"
        )

    def test_a_tag_newer_than_its_files_need_fails_with_the_tag_to_take(self) -> None:
        elves = [elf("_C.so", needs=(("libc.so.6", "GLIBC_2.17"),))]
        result = judge_baseline(frozenset({"manylinux_2_34_x86_64"}), elves, self.BULLSEYE)
        assert result.verdict is Verdict.FAIL and result.detail.endswith("its files need at most GLIBC_2.17")
        assert result.fix == "leave the tag to auditwheel repair (no --plat): manylinux_2_31 holds them"

    def test_a_baseline_of_no_manylinux_policy_still_names_the_newer_need(self) -> None:
        """This machine's glibc (2.30 here) need not be a policy of auditwheel's."""
        here = Baseline(tag="manylinux_2_30", built_on="this machine (glibc 2.30, no container)", newer="n")
        elves = [elf("_C.so", needs=(("libc.so.6", "GLIBC_2.34"),))]
        result = judge_baseline(frozenset({"manylinux_2_34_x86_64"}), elves, here)
        assert result.verdict is Verdict.FAIL and result.detail.endswith("_C.so needs GLIBC_2.34 from libc.so.6")
        assert judge_baseline(frozenset({"linux_x86_64"}), [], here).verdict is Verdict.FAIL


class TestTorchEnv:
    def test_cpu_torch_in_a_cuda_cell_fails(self, variants: dict[str, Variant]) -> None:
        results = {r.name: r for r in judge_torch(torch_info("2.14.1+cpu"), variants["cuda130"])}
        assert results["torch-variant"].verdict is Verdict.FAIL
        assert "a CPU torch in a CUDA 13.0 cell" in results["torch-variant"].detail

    def test_wrong_cuda_fails(self, variants: dict[str, Variant]) -> None:
        results = {r.name: r for r in judge_torch(torch_info("2.14.1+cu126", cuda="12.6"), variants["cuda130"])}
        assert results["torch-variant"].verdict is Verdict.FAIL

    def test_the_variant_build_passes(self, variants: dict[str, Variant]) -> None:
        results = judge_torch(torch_info("2.14.1+cu130", cuda="13.0"), variants["cuda130"])
        assert all(r.verdict is Verdict.PASS for r in results)

    def test_cuda_torch_in_a_cpu_cell_fails(self, variants: dict[str, Variant]) -> None:
        results = {r.name: r for r in judge_torch(torch_info("2.13.0", cuda="12.8"), variants["cpu"])}
        assert results["torch-variant"].verdict is Verdict.FAIL

    def test_located_label_is_checked_before_installing(self, variants: dict[str, Variant]) -> None:
        assert judge_located("2.13.0+cpu", variants["cuda130"]).verdict is Verdict.FAIL
        assert judge_located("2.14.1+cpu", variants["cuda130"]).verdict is Verdict.FAIL
        assert judge_located("2.14.1", variants["cuda130"]).verdict is Verdict.PASS
        assert judge_located("2.7.1", variants["cuda118"]).verdict is Verdict.FAIL
