"""The error boundary, from the command line: the wheel reader, the probes, the device-code
scanners and the container runner, each fed bad input in a real build of a sandbox cell
(tests/sandbox.py), end as one recorded step result: one error line, the step's exit code,
no traceback on the terminal, and the traceback in the step's log. What wheelmill does not
expect at all is an internal error, exit 70, its traceback in a log."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.elves import EM_AARCH64, EM_CUDA, make_elf
from tests.sandbox import TAG, Sandbox, assert_recorded, build, dist_info, repair_as_auditwheel_tags, script
from wheelmill.building.steps import BY_KIND
from wheelmill.errors import CheckError, EnvError, InternalError, InvalidWheel, PrecheckError
from wheelmill.planning.spec import StepKind


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    return Sandbox(tmp_path / "repo")


@pytest.mark.parametrize(
    ("case", "payload", "says"),
    [
        ("not-a-zip", {"GARBAGE": b"these bytes are no zip file"}, "unreadable wheel"),
        ("no-dist-info", {"thing/__init__.py": b""}, "expected one .dist-info directory"),
        (
            "version-not-a-version",
            {"thing/__init__.py": b"", **dist_info("thing", "1.0", metadata_version="one point oh")},
            "is not a version",
        ),
    ],
)
def test_the_wheel_reader_fed_a_broken_wheel(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, case: str, payload: dict[str, bytes], says: str
) -> None:
    sandbox.recipe("thing", payload, wheel=f"thing-1.0-{TAG}.whl")
    result = build(cli, monkeypatch, sandbox, "cpu")
    assert_recorded(result, sandbox, "cpu", step="thing/stamp", code=InvalidWheel.exit_code, says=says)


@pytest.mark.parametrize(
    ("version_py", "says"),
    [
        ("__version__ = (\n", "cannot be read as Python"),
        ("__version__ = 'banana'\ncuda = None\n", "not a version"),
    ],
)
def test_the_torch_probe_fed_a_damaged_torch(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version_py: str, says: str
) -> None:
    sandbox = Sandbox(tmp_path / "repo", version_py={"cpu": version_py})
    sandbox.recipe("thing", {"thing/__init__.py": b"", **dist_info("thing", "1.0")}, wheel=f"thing-1.0-{TAG}.whl")
    result = build(cli, monkeypatch, sandbox, "cpu")
    assert_recorded(result, sandbox, "cpu", step="env-checks", code=EnvError.exit_code, says=says)


@pytest.mark.parametrize(
    ("variant", "section", "says"),
    [
        # The real cuobjdump (pip's, a wheelmill dependency) refuses the fatbinary.
        (
            "cuda130",
            {".nv_fatbin": b"\x50\xed\x55\xba" + b"not a fatbinary" * 4},
            "cuobjdump --list-elf cannot read it",
        ),
        # A clang offload bundle cut short after its magic.
        ("rocm62", {".hip_fatbin": b"__CLANG_OFFLOAD_BUNDLE__\x05"}, "is not a readable offload bundle"),
    ],
)
def test_the_device_code_scanner_fed_damaged_device_code(
    cli: CliRunner,
    monkeypatch: pytest.MonkeyPatch,
    sandbox: Sandbox,
    tmp_path: Path,
    variant: str,
    section: dict[str, bytes],
    says: str,
) -> None:
    library = make_elf(tmp_path / "_C.so", section).read_bytes()
    sandbox.recipe("thing", {"thing/_C.so": library, **dist_info("thing", "1.0")}, wheel=f"thing-1.0-{TAG}.whl")
    result = build(cli, monkeypatch, sandbox, variant)
    assert_recorded(result, sandbox, variant, step="thing/post-build-checks", code=CheckError.exit_code, says=says)
    assert list((sandbox.output / sandbox.cell(variant) / "rejected").glob("thing-*.whl")), "the failed wheel is kept"


def test_a_library_of_another_machine_planted_in_a_wheel_is_refused_with_one_line(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, tmp_path: Path
) -> None:
    """An AArch64 library in an x86_64 wheel (a prebuilt one a build picked up) would never
    load: the post-build checks name it, the wheel is kept in rejected/, nothing published."""
    native = make_elf(tmp_path / "x86" / "_C.so", {".text": b"\xc3"}).read_bytes()
    planted = make_elf(tmp_path / "arm" / "_kernels.so", {".text": b"\xc0\x03\x5f\xd6"}, machine=EM_AARCH64)
    cubin = make_elf(
        tmp_path / "gpu" / "k.cubin", {".text": b"\0" * 8}, machine=EM_CUDA
    ).read_bytes()  # GPU code: allowed
    files = {"thing/_C.so": native, "thing/_kernels.so": planted.read_bytes(), "thing/k.cubin": cubin}
    files |= dist_info("thing", "1.0")
    sandbox.recipe("thing", files, wheel=f"thing-1.0-{TAG}.whl")
    result = build(cli, monkeypatch, sandbox, "cpu")
    says = "elf-machine: 1 ELF file(s) are not x86_64 code: thing/_kernels.so (AARCH64)"
    assert_recorded(result, sandbox, "cpu", step="thing/post-build-checks", code=CheckError.exit_code, says=says)
    assert list((sandbox.output / sandbox.cell("cpu") / "rejected").glob("thing-*.whl")), "the failed wheel is kept"


def test_a_wheel_tagged_newer_than_its_baseline_fails_the_post_repair_checks_with_one_line(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, tmp_path: Path
) -> None:
    """A library that needs GLIBC_2.34 in a cell built on glibc 2.31 (a prebuilt one the build
    picked up), tagged manylinux_2_34 by its repair: the promise of what it was built on is
    broken, so the post-repair checks fail, naming the tag, the baseline and the file; nothing
    is published."""
    monkeypatch.setattr("wheelmill.building.steps.checks_after.host_glibc", lambda: "2.31")
    library = make_elf(tmp_path / "_C.so", {".text": b"\xc3"}, version_needs={"libc.so.6": ["GLIBC_2.34"]})

    repair_as_auditwheel_tags(monkeypatch, "manylinux_2_34")  # by the newest glibc its libraries need
    files = {"thing/_C.so": library.read_bytes(), **dist_info("thing", "1.0")}
    sandbox.recipe("thing", files, wheel=f"thing-1.0-{TAG}.whl")
    result = build(cli, monkeypatch, sandbox, "cpu")
    says = (
        "thing: glibc-baseline: manylinux_2_34_x86_64 is newer than manylinux_2_31, the baseline of this machine "
        "(glibc 2.31, no container): _C.so needs GLIBC_2.34 from libc.so.6 (wheel kept in "
    )
    assert_recorded(result, sandbox, "cpu", step="thing/post-repair-checks", code=CheckError.exit_code, says=says)
    assert "; fix: glibc-baseline: build that file on this machine (glibc 2.31, no container)" in result.err
    assert result.err.count("glibc-baseline") == 2, "the one failure, its what and its fix"
    assert list((sandbox.output / sandbox.cell("cpu") / "rejected").glob("thing-*manylinux_2_34_x86_64.whl"))
    assert not (sandbox.output / "index" / "cpu").exists(), "nothing published"


def test_the_container_runner_fed_a_container_that_is_not_running(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    # An engine that answers every question, but whose container has no process: the
    # stand-in reports a pid above any pid_max.
    calls = sandbox.root / "podman.calls"
    script(
        sandbox.bin / "podman",
        f'echo "$*" >> {calls}\ncase "$1" in\n  info) echo linux ;;\n  image) echo sha256:0123456789abcdef ;;\n'
        "  run) echo 0123456789ab ;;\n  inspect) echo 2147483646 ;;\n  ps|rm) ;;\n  *) exit 125 ;;\nesac\n",
    )
    sandbox.recipe("thing", {"thing/__init__.py": b"", **dist_info("thing", "1.0")}, wheel=f"thing-1.0-{TAG}.whl")
    result = build(cli, monkeypatch, sandbox, "cpu", engine="podman")
    assert_recorded(
        result,
        sandbox,
        "cpu",
        step="prepare-container",
        code=PrecheckError.exit_code,
        says="started but is not running",
    )
    started = [line for line in calls.read_text().splitlines() if line.startswith("run ")]
    removed = [line for line in calls.read_text().splitlines() if line.startswith("rm ")]
    assert (
        len(started) == 1
        and removed
        and removed[-1].split()[-1] == started[0].split()[started[0].split().index("--name") + 1]
    )


def test_an_unexpected_exception_in_a_step_is_an_internal_error(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    def broken(*_args: object) -> None:
        raise ZeroDivisionError("nobody expects this")

    monkeypatch.setitem(BY_KIND, StepKind.FETCH, dataclasses.replace(BY_KIND[StepKind.FETCH], run=broken))  # type: ignore[arg-type]
    sandbox.recipe("thing", {"thing/__init__.py": b"", **dist_info("thing", "1.0")}, wheel=f"thing-1.0-{TAG}.whl")
    result = build(cli, monkeypatch, sandbox, "cpu")
    log = assert_recorded(
        result,
        sandbox,
        "cpu",
        step="thing/fetch",
        code=InternalError.exit_code,
        says="internal error: ZeroDivisionError: nobody expects this",
    )
    assert "in broken" in log


def test_an_unexpected_exception_outside_a_step_is_an_internal_error(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, repo_root: Path
) -> None:
    def broken(*_args: object) -> int:
        raise KeyError("no such thing")

    monkeypatch.setattr("wheelmill.cli.build.cmd_validate", broken)
    result = cli("--recipes", str(repo_root / "recipes"), "validate")
    (line,) = result.err.strip().splitlines()
    assert result.code == InternalError.exit_code
    assert line.startswith(
        "wheelmill: error: internal error: KeyError: 'no such thing'; "
        "fix: this is a bug in wheelmill; its traceback is in "
    )
    crash = Path(line.rsplit(" ", 1)[-1])
    assert "in broken" in crash.read_text()
    crash.unlink()
