"""The GPU stage's verdicts: what one wheel's run on a GPU machine proved, judged against
what ``wheelmill doctor`` predicted from its arch record; what a cell's stage proved; and
what a release's record keeps of it. One set of outcomes for the stage's report, the
release record and the promotion gate, so that what the stage calls a pass is what the gate
lets through and nothing else.

A wheel's outcome (``judge_wheel``), from doctor's status, its arch record and what ran:

    doctor says        the wheel and what ran                                outcome
    -                  not in the env, or not the channel's file              failed
    -                  no readable gpu-archs.json (every build writes one)    failed
    fails              torch sees no GPU                                      failed, on doctor's word
    runs or CPU only   torch sees no GPU                                      not-run
    runs (ok, jit)     import or GPU check fails: no kernel image for it      mismatch: doctor was wrong
    runs (ok, jit)     import or GPU check fails otherwise                    failed
    fails              import or GPU check fails                              failed (as predicted where the
                                                                              error is the kernel image's)
    fails              GPU check passes                                       mismatch: doctor was wrong
    fails              imported, its recipe has no GPU check                  failed, on doctor's word
    runs or CPU only   GPU check: every test ran and passed                   passed
    runs or CPU only   GPU check: a test skipped or xfailed, or none ran      skipped: proved nothing
    runs               imported, its recipe has no GPU check                  import-only: no kernel ran
    CPU only           imported, its recipe has no GPU check                  passed: no GPU code to run

A stage's status is its worst wheel's outcome (``worst``), ``not-run`` where torch sees no
GPU, ``no-gpu`` where none is visible, ``stopped`` where an error ended it first. Only
``passed`` passes: the stage exits 0 on it alone, and promotion asks for it alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from wheelmill.checks.tally import Tally
from wheelmill.errors import InvalidWheel
from wheelmill.wheel.wheelfile import record_hash, recorded_hashes

# doctor's statuses (wheelmill.images.doctor, a layer above this one), as its JSON says them
DOCTOR_RUNS = frozenset({"ok", "jit"})
DOCTOR_FAILS = "fails"
# What a kernel launched where its wheel has no code for the GPU says: CUDA's runtime and
# driver (cudaErrorNoKernelImageForDevice, cudaErrorInvalidDeviceFunction, a PTX newer than
# the driver JITs), HIP's (hipErrorNoBinaryForGpu, hipErrorInvalidDeviceFunction).
_NO_KERNEL_IMAGE = re.compile(
    r"no kernel image is available|invalid device function|no binary for gpu|"
    r"unable to find code object for all current devices|unsupported toolchain|ptx.*unsupported|"
    r"nobinaryforgpu|no_binary_for_gpu",
    re.IGNORECASE,
)


class GpuOutcome(StrEnum):
    """One wheel's result on a GPU machine, a stage's status, or a release record's entry.
    ``WORST_FIRST`` orders those a wheel or a stage can have."""

    PASSED = "passed"  # its GPU check ran every test and each passed (or CPU code only, imported)
    IMPORT_ONLY = "import-only"  # it imported; its recipe has no GPU check, so no kernel of it ran
    SKIPPED = "skipped"  # its GPU check ran, and proved nothing: tests skipped or xfailed, or none ran
    NOT_RUN = "not-run"  # torch saw no GPU: no kernel could run
    FAILED = "failed"  # failed, where doctor predicted it or the error is not the kernel image's
    MISMATCH = "mismatch"  # doctor's verdict and the kernels disagree: the record or doctor is wrong
    NO_GPU = "no-gpu"  # a stage's: no GPU visible, nothing ran
    STOPPED = "stopped"  # a stage's: an error stopped it before it judged the wheels
    NOT_COVERED = "not-covered"  # a release record's: no GPU runner covers the cell

    @property
    def passed(self) -> bool:
        return self is GpuOutcome.PASSED


WORST_FIRST = (
    GpuOutcome.STOPPED,
    GpuOutcome.NO_GPU,
    GpuOutcome.MISMATCH,
    GpuOutcome.FAILED,
    GpuOutcome.NOT_RUN,
    GpuOutcome.SKIPPED,
    GpuOutcome.IMPORT_ONLY,
    GpuOutcome.PASSED,
)


@dataclass(frozen=True, kw_only=True)
class Ran:
    """What ran for a wheel on the GPU machine."""

    installed: str | None  # None: the env imports the channel's file; else why not
    record: str | None  # its arch record's family (cuda | rocm | cpu); None: missing or unreadable
    record_problem: str  # why there is no record, where there is none
    sees_gpu: bool  # the env's torch sees a GPU
    imported: bool  # its modules imported and its operators were found
    check: GpuOutcome | None  # its GPU check: passed | failed | skipped | not-run; None: its recipe has none
    no_kernel_image: bool  # what failed said its wheel has no kernel for this GPU


def judge_wheel(doctor: str, ran: Ran) -> tuple[GpuOutcome, str]:
    """A wheel's outcome from doctor's status and what ran (the table in this module's
    docstring), and a few words on why."""
    if ran.installed is not None:
        return GpuOutcome.FAILED, ran.installed
    if ran.record is None:
        return GpuOutcome.FAILED, f"doctor cannot judge it: {ran.record_problem}"
    gpu_code = ran.record != "cpu"
    if doctor == DOCTOR_FAILS and gpu_code:
        return _predicted_to_fail(ran)
    if not gpu_code or doctor in DOCTOR_RUNS:
        return _predicted_to_run(ran, gpu_code=gpu_code)
    return GpuOutcome.FAILED, f"doctor has no verdict on its {ran.record} code (status {doctor})"


def _predicted_to_fail(ran: Ran) -> tuple[GpuOutcome, str]:
    broke = not ran.imported or ran.check is GpuOutcome.FAILED
    if ran.check is GpuOutcome.PASSED:
        return GpuOutcome.MISMATCH, "doctor said it fails on this GPU, and its GPU check passed"
    if broke and ran.no_kernel_image:
        return GpuOutcome.FAILED, "no kernel image for this GPU, as doctor predicted"
    if broke:
        return GpuOutcome.FAILED, "failed (doctor predicts it fails on this GPU; the error is not the kernel image's)"
    if not ran.sees_gpu:
        return GpuOutcome.FAILED, "doctor predicts it fails on this GPU (its GPU check did not run: torch sees no GPU)"
    return GpuOutcome.FAILED, "doctor predicts it fails on this GPU (no kernel of it ran to say otherwise)"


def _predicted_to_run(ran: Ran, *, gpu_code: bool) -> tuple[GpuOutcome, str]:
    broke = not ran.imported or ran.check is GpuOutcome.FAILED
    if broke and gpu_code and ran.no_kernel_image:
        return GpuOutcome.MISMATCH, "doctor said it runs on this GPU, and its kernels found no kernel image for it"
    if broke:
        what = "its import" if not ran.imported else "its GPU check"
        return GpuOutcome.FAILED, f"{what} failed"
    if not ran.sees_gpu:
        return GpuOutcome.NOT_RUN, "torch sees no GPU: no kernel ran"
    if ran.check is GpuOutcome.SKIPPED:
        return GpuOutcome.SKIPPED, "its GPU check proved nothing: tests skipped, or none ran"
    if ran.check is None and gpu_code:
        return GpuOutcome.IMPORT_ONLY, "imported; its recipe has no GPU check, so no kernel of it ran"
    if ran.check is None:
        return GpuOutcome.PASSED, "no GPU code; imported"
    return GpuOutcome.PASSED, "its GPU check passed"


def judge_check(tally: Tally | None, *, exit_ok: bool) -> GpuOutcome:
    """A GPU check's result from its exit status and the tests it counted (where it is a
    test run): passed only where every test it ran passed and none was skipped or xfailed.

    >>> judge_check(Tally(passed=9), exit_ok=True), judge_check(Tally(passed=4, skipped=1), exit_ok=True)
    (<GpuOutcome.PASSED: 'passed'>, <GpuOutcome.SKIPPED: 'skipped'>)
    >>> judge_check(Tally(), exit_ok=True), judge_check(None, exit_ok=True), judge_check(None, exit_ok=False)
    (<GpuOutcome.SKIPPED: 'skipped'>, <GpuOutcome.PASSED: 'passed'>, <GpuOutcome.FAILED: 'failed'>)
    """
    if not exit_ok or (tally is not None and tally.failed):
        return GpuOutcome.FAILED
    if tally is not None and not tally.complete:
        return GpuOutcome.SKIPPED
    return GpuOutcome.PASSED


def no_kernel_image(lines: Sequence[str]) -> bool:
    """Whether a failed run's output says the wheel carries no kernel for this GPU.

    >>> no_kernel_image(["RuntimeError: CUDA error: no kernel image is available for execution on the device"])
    True
    >>> no_kernel_image(["AssertionError: Tensor-likes are not close!"])
    False
    """
    return any(_NO_KERNEL_IMAGE.search(line) for line in lines)


def worst(outcomes: Iterable[GpuOutcome]) -> GpuOutcome:
    """The worst of ``outcomes``: a stage's status from its wheels'; ``passed`` for none."""
    found = set(outcomes)
    return next((o for o in WORST_FIRST if o in found), GpuOutcome.PASSED)


def not_the_channels_file(project: str, file: Path, located: str | None, site: Path) -> str | None:
    """Why an env does not import ``file``, the channel's wheel of ``project``, from ``site``
    where the stage installed it (None where it does): the env finds the project elsewhere
    (an interpreter's own copy), or a file of the wheel's RECORD is missing there or differs."""
    if located is None:
        return f"{project} is not among the env's distributions after installing {file.name}"
    if Path(located).resolve() != site.resolve():
        return f"the env imports {project} from {located}, not the channel's {file.name} in {site}"
    try:
        recorded = recorded_hashes(file)
    except InvalidWheel as exc:
        return exc.message
    for member, expected in sorted(recorded.items()):
        if member.split("/", 1)[0].endswith(".data"):
            continue  # scripts and headers, installed elsewhere
        installed = site / member
        if not installed.is_file() or record_hash(installed.read_bytes()) != expected:
            return f"{member} in the env is not the one {file.name} records"
    return None
