"""``wheelmill doctor`` and the ``wheelmill-doctor`` of the images: the installed wheels'
arch records judged against a declared or a visible GPU (a stand-in nvidia-smi or rocminfo
on PATH), with CUDA's compatibility rules, ROCm's exact targets, and no GPU at all."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import wheels
from tests.conftest import CliRunner
from tests.sandbox import script
from wheelmill.errors import DoctorError, UsageError
from wheelmill.images import doctor
from wheelmill.inputs.archs import ArchRecord
from wheelmill.inputs.variants import Family
from wheelmill.machine.process import HostRunner
from wheelmill.machine.toolchain import Found, find_python

DOCTOR = Path(doctor.__file__)
FIX = "install it from the slim channel for this arch or a build whose arch list includes"


def install(
    site: Path, name: str, version: str, record: ArchRecord | bytes | None = None, *, requires: tuple[str, ...] = ()
) -> None:
    wheels.install(
        site,
        name,
        version,
        requires=requires,
        gpu_archs=record.to_bytes() if isinstance(record, ArchRecord) else record,
    )


def cuda(arch_list: str) -> ArchRecord:
    return ArchRecord(family=Family.CUDA, arch_list=arch_list, cell="cuda130-py311")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty site-packages, and a PATH without nvidia-smi or rocminfo."""
    monkeypatch.delenv(doctor.CAPABILITY_VARIABLE, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "site").mkdir()
    return tmp_path / "site"


def test_a_gpu_the_wheel_lacks_names_the_wheel_the_gpu_the_list_and_the_fix(cli: CliRunner, site: Path) -> None:
    install(site, "example-cuda-ops", "0.1.0+cu130", cuda("7.5;8.0;9.0;10.0"))
    install(site, "example-cpp-ops", "0.1.0+cu130", ArchRecord(family=Family.CPU, arch_list=None, cell="cuda130-py311"))
    result = cli("doctor", "--path", str(site), "--capability", "8.9")
    assert (result.code, result.err) == (0, "")
    assert result.out.splitlines() == [
        "checking against declared 8.9 (--capability)",
        "example-cpp-ops 0.1.0+cu130: ok (no GPU code: runs anywhere)",
        "example-cuda-ops 0.1.0+cu130: ok (sm_80 SASS on declared 8.9 (--capability))",
        "summary: 0 would fail, 2 would run, 0 unknown",
    ]
    install(site, "torchsort", "0.1.10+cu130", cuda("8.0;9.0"))
    result = cli("doctor", "--path", str(site), "--capability", "7.5")
    assert result.code == DoctorError.exit_code == doctor.EXIT_WOULD_FAIL == 21
    line = next(line for line in result.out.splitlines() if line.startswith("torchsort"))
    assert line == (
        "torchsort 0.1.10+cu130: FAILS: declared 7.5 (--capability): the wheel carries cuda 8.0;9.0, which lacks sm_75 "
        f"(SASS for 7.0 to 7.5 or PTX for 7.5 or lower would also run); fix: {FIX} 7.5"
    )
    assert result.out.splitlines()[-1] == "summary: 1 would fail, 2 would run, 0 unknown"
    (error,) = result.err.splitlines()
    assert error == (
        "wheelmill: error: doctor: 1 installed wheel(s) would not run on this machine's GPU: "
        f"torchsort 0.1.10+cu130; fix: {FIX} 7.5"
    )


def test_ptx_is_jit_compiled_on_a_newer_gpu_never_an_older_one(cli: CliRunner, site: Path) -> None:
    install(site, "ext", "1.0+cu130", cuda("8.0;9.0+PTX"))
    newer = cli("doctor", "--path", str(site), "--capability", "12.0")
    assert newer.code == 0, newer.err
    assert (
        "ext 1.0+cu130: ok, will JIT (no SASS for 12.0: the driver JIT-compiles its compute_90 PTX on declared 12.0 "
        "(--capability), a slower first start)" in newer.out
    )
    assert newer.out.splitlines()[-1] == "summary: 0 would fail, 1 would run (1 by JIT), 0 unknown"
    older = cli("doctor", "--path", str(site), "--capability", "7.5")
    assert older.code == 21 and "FAILS" in older.out


@pytest.mark.parametrize(
    ("arch_list", "gpu", "status"),
    [
        ("8.0", "8.6", doctor.OK),  # binary compatible within a major, upwards
        ("8.6", "8.0", doctor.FAILS),  # never downwards
        ("9.0", "10.0", doctor.FAILS),  # nor across a major
        ("9.0a", "9.0", doctor.OK),  # arch-specific: exactly its arch
        ("9.0a", "10.0", doctor.FAILS),
        ("10.0a+PTX", "12.0", doctor.FAILS),  # arch-specific PTX is no portable PTX
        ("10.0f", "10.3", doctor.OK),  # family-specific: its major, same or higher minor
        ("10.3f", "10.0", doctor.FAILS),
        ("10.0f", "12.0", doctor.FAILS),
        ("8.0+PTX", "12.0", doctor.JIT),  # PTX: any capability at least its own
        ("8.0;9.0+PTX", "9.0", doctor.OK),  # SASS where there is some
    ],
)
def test_cuda_compatibility_rules(arch_list: str, gpu: str, status: str) -> None:
    (declared,) = doctor.declared(gpu, "--capability").found
    assert doctor.predict(doctor.parse_record(cuda(arch_list).to_bytes().decode()), declared).status == status


def test_arch_specific_code_runs_only_on_exactly_its_arch(cli: CliRunner, site: Path) -> None:
    install(site, "hopper-kernels", "1.0+cu130", cuda("8.0;9.0a"))
    assert cli("doctor", "--path", str(site), "--capability", "9.0").out.startswith(
        "checking against declared 9.0 (--capability)\n"
        "hopper-kernels 1.0+cu130: ok (sm_90a SASS on declared 9.0 (--capability))"
    )
    blackwell = cli("doctor", "--path", str(site), "--capability", "10.0")
    assert blackwell.code == 21
    assert (
        "hopper-kernels 1.0+cu130: FAILS: declared 10.0 (--capability): "
        "the wheel carries cuda 8.0;9.0a, which lacks sm_100 (PTX for 10.0 or lower" in blackwell.out
    )


def test_rocm_needs_its_exact_gfx_target(cli: CliRunner, site: Path) -> None:
    install(site, "ext", "1.0+rocm6.2", ArchRecord(family=Family.ROCM, arch_list="gfx90a;gfx942", cell="rocm62-py311"))
    ok = cli("doctor", "--path", str(site), "--capability", "gfx90a:sramecc+:xnack-")
    assert ok.code == 0 and "ext 1.0+rocm6.2: ok (gfx90a code object on declared gfx90a (--capability))" in ok.out
    other = cli("doctor", "--path", str(site), "--capability", "gfx908")
    assert other.code == 21
    assert "which lacks gfx908 (a ROCm code object runs only on its exact gfx target); fix:" in other.out
    nvidia = cli("doctor", "--path", str(site), "--capability", "9.0")
    assert (
        nvidia.code == 21
        and "declared 9.0 (--capability) is a CUDA GPU; the wheel carries rocm gfx90a;gfx942" in nvidia.out
    )


def test_no_gpu_visible_is_said_plainly_and_the_wheels_with_gpu_code_are_listed(cli: CliRunner, site: Path) -> None:
    install(site, "example-cuda-ops", "0.1.0+cu130", cuda("8.0"))
    install(site, "example-cpp-ops", "0.1.0+cu130", ArchRecord(family=Family.CPU, arch_list=None, cell="cuda130-py311"))
    install(site, "flash-attn", "2.6.3", requires=("torch",))  # not built by wheelmill
    install(site, "filelock", "3.0")  # no sign of GPU code: counted, not listed
    result = cli("doctor", "--path", str(site))
    assert result.code == 0, result.err
    assert result.err == ""
    assert result.out.splitlines() == [
        (
            "no GPU visible (nvidia-smi not found; rocminfo not found) and none declared: nothing to check against "
            "(declare one: --capability 8.6, or WHEELMILL_GPU_CAPABILITY=gfx90a)"
        ),
        "example-cpp-ops 0.1.0+cu130: no GPU code: runs anywhere",
        "example-cuda-ops 0.1.0+cu130: carries cuda 8.0",
        "flash-attn 2.6.3: unknown (not built by wheelmill or built before arch recording)",
        (
            "summary: no GPU to check against; 1 wheel(s) carry GPU code, 1 unknown; "
            "1 other distribution(s) show no sign of GPU code (--all lists them)"
        ),
    ]
    assert "filelock 3.0: unknown" in cli("doctor", "--path", str(site), "--all").out


def test_a_stand_in_nvidia_smi_on_path_is_every_visible_gpu(cli: CliRunner, site: Path, tmp_path: Path) -> None:
    script(tmp_path / "bin" / "nvidia-smi", 'echo "0, NVIDIA H100, 9.0"\necho "1, NVIDIA H100, 9.0"\n')
    install(site, "ext", "1.0+cu130", cuda("8.0;8.6"))
    install(site, "torch", "2.14.1+cu130")  # PyTorch's own: no arch record, never a failure
    result = cli("doctor", "--path", str(site))
    assert result.code == 21
    assert result.out.splitlines() == [
        "checking against GPUs 0,1 (NVIDIA H100, 9.0)",
        "note: rocminfo not found",
        (
            "ext 1.0+cu130: FAILS: GPUs 0,1 (NVIDIA H100, 9.0): the wheel carries cuda 8.0;8.6, which lacks sm_90 "
            "(PTX for 9.0 or lower would also run); "
            f"fix: {FIX} 9.0"
        ),
        "torch 2.14.1+cu130: unknown (not built by wheelmill or built before arch recording)",
        "summary: 1 would fail, 0 would run, 1 unknown",
    ]


def test_a_declared_capability_wins_over_the_visible_gpu_and_the_option_over_the_variable(
    cli: CliRunner, site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script(tmp_path / "bin" / "nvidia-smi", 'echo "0, NVIDIA H100, 9.0"\n')
    install(site, "ext", "1.0+cu130", cuda("9.0"))
    monkeypatch.setenv(doctor.CAPABILITY_VARIABLE, "8.6")
    assert cli("doctor", "--path", str(site)).out.startswith(
        f"checking against declared 8.6 ({doctor.CAPABILITY_VARIABLE})\next 1.0+cu130: FAILS"
    )
    assert cli("doctor", "--path", str(site), "--capability", "9.0").code == 0


def test_a_failing_nvidia_smi_and_a_rocminfo_agent_list(cli: CliRunner, site: Path, tmp_path: Path) -> None:
    script(
        tmp_path / "bin" / "nvidia-smi",
        'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2\nexit 9\n',
    )
    agents = (
        "*******",
        "Agent 1",
        "*******",
        "  Name:                    AMD EPYC 7763 64-Core Processor",
        "  Device Type:             CPU",
        "*******",
        "Agent 2",
        "*******",
        "  Name:                    gfx90a",
        "  Marketing Name:          AMD Instinct MI210",
        "  Device Type:             GPU",
        "  ISA Info:",
        "    ISA 1",
        "      Name:                    amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-",
    )
    script(tmp_path / "bin" / "rocminfo", "".join(f"echo '{line}'\n" for line in agents))  # PATH has no cat
    install(site, "ext", "1.0+rocm6.2", ArchRecord(family=Family.ROCM, arch_list="gfx90a", cell="rocm62-py311"))
    result = cli("doctor", "--path", str(site))
    assert result.code == 0, result.out
    assert result.out.splitlines()[:3] == [
        "checking against GPU 0 (AMD Instinct MI210, gfx90a)",
        (
            "note: nvidia-smi failed (exit 9): "
            "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."
        ),
        "ext 1.0+rocm6.2: ok (gfx90a code object on GPU 0 (AMD Instinct MI210, gfx90a))",
    ]


def test_an_unreadable_record_is_unknown_and_json_is_for_machines(cli: CliRunner, site: Path) -> None:
    install(site, "broken", "1.0+cu130", b"{not json")
    install(site, "ext", "1.0+cu130", cuda("8.0"))
    result = cli("doctor", "--path", str(site), "--capability", "8.6", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["gpus"] == [
        {"family": "cuda", "arch": "8.6", "name": "", "index": "", "label": "declared 8.6 (--capability)"}
    ]
    broken, ext = data["wheels"]
    assert broken["status"] == "unknown" and broken["detail"].startswith("unknown (its gpu-archs.json is unreadable: ")
    assert ext == {
        "name": "ext",
        "version": "1.0+cu130",
        "status": "ok",
        "detail": "sm_80 SASS on declared 8.6 (--capability)",
        "fix": None,
        "gpu_archs": {"family": "cuda", "arch_list": "8.0", "cell": "cuda130-py311"},
    }
    assert data["exit_code"] == 0


@pytest.mark.parametrize("capability", ["sm_86", "8", "gfx", "9.0a"])
def test_a_capability_that_is_none_is_a_usage_error(cli: CliRunner, site: Path, capability: str) -> None:
    result = cli("doctor", "--path", str(site), "--capability", capability)
    assert result.code == UsageError.exit_code
    (line,) = result.err.splitlines()
    assert line.startswith(
        f"wheelmill: error: doctor: --capability: '{capability}' is no GPU capability; "
        "fix: give a CUDA compute capability"
    )


def test_a_path_that_is_no_directory_is_a_usage_error(cli: CliRunner, site: Path) -> None:
    result = cli("doctor", "--path", str(site / "nowhere"), "--capability", "8.6")
    assert result.code == UsageError.exit_code
    assert result.err.startswith(
        f"wheelmill: error: doctor: --path {site / 'nowhere'}: no such directory; fix: give a site-packages directory"
    )


def test_doctor_reads_what_the_stamp_writes() -> None:
    for record in (
        cuda("7.5;8.0;9.0a;10.0f;12.0+PTX"),
        ArchRecord(family=Family.ROCM, arch_list="gfx90a;gfx942", cell="c"),
        ArchRecord.of_build(Family.CPU, None, "c", device_code=False),
    ):
        assert doctor.parse_record(record.to_bytes().decode()).describe() == record.describe()


def test_a_folder_of_wheel_files_is_read_file_by_file_and_an_empty_one_is_an_error(
    cli: CliRunner, tmp_path: Path, site: Path
) -> None:
    """``--path dist/``: each .whl read in place (two builds of one version for two cells both
    judged), a file that is no wheel named; a folder with neither wheels nor distributions is
    one line and the usage code, not an empty report."""
    dist = tmp_path / "dist"
    for cell, archs in (("cuda130-py311", "8.0;9.0"), ("cuda130-sm90-py311", "9.0")):
        record = ArchRecord(family=Family.CUDA, arch_list=archs, cell=cell).to_bytes()
        wheel = wheels.make_wheel(dist, "example-cuda-ops", "0.1.0+cu130", gpu_archs=record, tag=f"cp311-{cell}")
        assert wheel.is_file()
    (dist / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    result = cli("doctor", "--path", str(dist), "--capability", "8.0")
    assert result.code == doctor.EXIT_WOULD_FAIL, result.err
    assert result.out.splitlines()[1:4] == [
        "broken-1.0-py3-none-any.whl: unknown (not a wheel: File is not a zip file)",
        "example_cuda_ops-0.1.0+cu130-cp311-cuda130-py311.whl: ok (sm_80 SASS on declared 8.0 (--capability))",
        (
            "example_cuda_ops-0.1.0+cu130-cp311-cuda130-sm90-py311.whl: FAILS: declared 8.0 (--capability): the wheel "
            f"carries cuda 9.0, which lacks sm_80 (PTX for 8.0 or lower would also run); fix: {FIX} 8.0"
        ),
    ], result.out
    empty = cli("doctor", "--path", str(site))
    assert (empty.code, empty.out) == (UsageError.exit_code, "")
    assert empty.err == (
        f"wheelmill: error: doctor: --path {site}: no installed distribution and no .whl file in it; "
        "fix: give a site-packages directory or a folder of wheels (dist/)\n"
    )


def test_doctor_is_standard_library_only_runs_on_python_3_9_and_runs_alone(site: Path) -> None:
    source = DOCTOR.read_text()
    tree = ast.parse(source, feature_version=(3, 9))  # the oldest Python of a cell
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= sys.stdlib_module_names | {"__future__"}, imported - sys.stdlib_module_names
    assert "kw_only" not in source and "match " not in source.replace("re.match", "")
    install(site, "ext", "1.0+cu130", cuda("9.0"))
    oldest = find_python("3.9", HostRunner())  # pyenv's, as CI has: run there, not only parsed for it
    assert isinstance(oldest, Found), oldest
    for python in (Path(sys.executable), oldest.path):
        # -I: no PYTHONPATH, no user site, not even the script's directory: wheelmill is not importable.
        alone = subprocess.run(
            [str(python), "-I", str(DOCTOR), "--path", str(site), "--capability", "8.6"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert alone.returncode == doctor.EXIT_WOULD_FAIL, (python, alone.stderr)
        assert "ext 1.0+cu130: FAILS: declared 8.6 (--capability): the wheel carries cuda 9.0" in alone.stdout
        assert alone.stderr.startswith(
            "wheelmill-doctor: error: 1 installed wheel(s) would not run on this machine's GPU: ext 1.0+cu130; fix: "
        )
    assert doctor.main(["--path", str(site), "--capability", "bogus"]) == doctor.EXIT_USAGE == UsageError.exit_code


def test_a_huge_record_is_refused_unread_and_a_bad_value_shown_short(cli: CliRunner, site: Path) -> None:
    """A gpu-archs.json of one 10 MB line, or a long bad arch list, is a finding of one short
    line: doctor neither parses nor prints megabytes."""
    install(site, "huge", "1.0+cu130", b'{"family": "cuda", "cell": "x", "arch_list": "' + b"8.0;" * 2_500_000 + b'"}')
    install(site, "long", "1.0+cu130", b'{"family": "cuda", "cell": "x", "arch_list": "' + b"x" * 5000 + b'"}')
    result = cli("doctor", "--path", str(site), "--capability", "8.6", "--json")
    assert result.code == 0, result.err
    huge, long = json.loads(result.out)["wheels"]
    assert "more than a record has (65536)" in huge["detail"] and huge["status"] == "unknown", huge
    assert "... (5002 characters) is not a CUDA arch" in long["detail"] and len(long["detail"]) < 300, long
    assert len(result.out) < 4000
