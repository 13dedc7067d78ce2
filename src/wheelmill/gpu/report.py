"""The GPU stage's report: ``<output>/<cell>/gpu-report.json`` beside the cell's build
report, and its summary table. Per wheel: the GPU, doctor's verdict, each check's result
and time, and the outcome; for the run: the GPUs, the env's torch and the status.

The release records every report (``wheelmill release record-gpu``), and promotion asks for
a passed one per GPU cell and runner (``wheelmill.releases.promotion.gpu_gate``); statuses and outcomes are
``wheelmill.checks.gpu.GpuOutcome``'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from wheelmill.checks.gpu import GpuOutcome
from wheelmill.checks.tally import Tally
from wheelmill.errors import UsageError, redact_data
from wheelmill.files import write_atomic
from wheelmill.releases.records import GpuRecord

GPU_REPORT = "gpu-report.json"
# 2: the runner, and each wheel's outcome from one set (import-only among them); 3: provenance
SCHEMA = 3


@dataclass(frozen=True, kw_only=True)
class CheckRun:
    """One thing run for a wheel: its import probe, or its GPU check."""

    name: str  # import | gpu-smoke
    result: GpuOutcome  # passed | failed | skipped | not-run
    seconds: float
    detail: str
    tally: Tally | None = None

    def as_dict(self) -> dict[str, Any]:
        counted = self.tally
        counts = (
            None
            if counted is None
            else {"passed": counted.passed, "failed": counted.failed, "skipped": counted.skipped}
        )
        return {
            "name": self.name,
            "result": self.result.value,
            "seconds": round(self.seconds, 2),
            "detail": self.detail,
            "counts": counts,
        }

    def shown(self) -> str:
        return f"{self.result.value} {self.seconds:.1f}s" + (f" ({self.tally.describe()})" if self.tally else "")


@dataclass(frozen=True, kw_only=True)
class WheelResult:
    recipe: str
    filename: str
    sha256: str | None
    doctor: str  # doctor's status: ok | jit | fails | unknown | no-gpu
    doctor_detail: str
    runs: tuple[CheckRun, ...]
    outcome: GpuOutcome
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "filename": self.filename,
            "sha256": self.sha256,
            "doctor": {"status": self.doctor, "detail": self.doctor_detail},
            "runs": [run.as_dict() for run in self.runs],
            "outcome": self.outcome.value,
            "why": self.why,
        }

    def side_by_side(self) -> str:
        """doctor's prediction and what the kernels did, for the error line."""
        failed = [run for run in self.runs if run.result is GpuOutcome.FAILED]
        not_run = [run for run in self.runs if run.result is GpuOutcome.NOT_RUN]
        said = "; ".join(f"{run.name}: {run.detail}" for run in failed)
        said = said or (f"not run ({not_run[0].detail})" if not_run else self.why)
        return f"{self.recipe} ({self.filename}): doctor: {self.doctor} ({self.doctor_detail}); kernels: {said}"


@dataclass(frozen=True, kw_only=True)
class GpuReport:
    cell: str
    channel: str
    index: str  # the index root or URL the wheels came from
    env: str  # a fresh env from the channel, or the given interpreter
    python: str
    runner: str | None  # the CI runner label (a GPU kind) it ran on, as --runner said
    torch: str | None  # the env's torch, as it says (2.14.1+cu130)
    gpus: tuple[str, ...]  # as doctor names them: GPU 0 (NVIDIA H100 80GB HBM3, 9.0)
    torch_gpus: tuple[str, ...]  # what the env's torch sees
    notes: tuple[str, ...]
    wheels: tuple[WheelResult, ...]
    missing: tuple[str, ...]  # recipes of the cell with no wheel in the channel
    status: GpuOutcome  # the worst outcome, or no-gpu, or stopped
    exit_code: int
    error: str | None
    seconds: float
    # What was held to its provenance before installing: {"verified": n, "files", "keys", "failed"},
    # or "not verified: no trusted key"; None where the stage stopped before (no GPU).
    provenance: dict[str, Any] | str | None = None

    @property
    def passed(self) -> bool:
        return self.status.passed

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "cell": self.cell,
            "channel": self.channel,
            "index": self.index,
            "env": self.env,
            "python": self.python,
            "runner": self.runner,
            "torch": self.torch,
            "gpus": list(self.gpus),
            "torch_gpus": list(self.torch_gpus),
            "notes": list(self.notes),
            "wheels": [wheel.as_dict() for wheel in self.wheels],
            "missing": list(self.missing),
            "status": self.status.value,
            "exit_code": self.exit_code,
            "error": self.error,
            "seconds": round(self.seconds, 1),
            "provenance": self.provenance,
        }

    def write(self, directory: Path) -> Path:
        path = directory / GPU_REPORT
        write_atomic(path, (json.dumps(redact_data(self.as_dict()), indent=2) + "\n").encode())
        return path

    def record(self) -> GpuRecord:
        """What a release records of this stage, and its runner signs."""
        return GpuRecord(
            cell=self.cell,
            status=self.status,
            runner=self.runner,
            gpus=self.gpus,
            torch=self.torch,
            tested={w.sha256: w.outcome for w in self.wheels if w.sha256},
            note=self.error or self.counts(),
        )

    def tested_files(self) -> dict[str, str]:
        """Each tested wheel's sha256, and its file name."""
        return {w.sha256: w.filename for w in self.wheels if w.sha256}

    def counts(self) -> str:
        """``2 passed, 1 skipped`` over the wheels."""
        found = [(o, sum(1 for w in self.wheels if w.outcome is o)) for o in GpuOutcome]
        return ", ".join(f"{n} {o.value}" for o, n in found if n) or "no wheels"


def load_gpu_report(path: Path) -> GpuReport:
    """A report the stage wrote; a ``UsageError`` naming the file for anything else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        wheels = tuple(_wheel(w) for w in data["wheels"])
        return GpuReport(
            cell=data["cell"],
            channel=data["channel"],
            index=data["index"],
            env=data["env"],
            python=data["python"],
            runner=data.get("runner"),
            torch=data["torch"],
            gpus=tuple(data["gpus"]),
            torch_gpus=tuple(data["torch_gpus"]),
            notes=tuple(data["notes"]),
            wheels=wheels,
            missing=tuple(data["missing"]),
            status=GpuOutcome(data["status"]),
            exit_code=int(data["exit_code"]),
            error=data["error"],
            seconds=float(data["seconds"]),
            provenance=data.get("provenance"),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"{path}: not a GPU stage report ({exc})", fix="give the gpu-report.json that `wheelmill test-gpu` wrote"
        ) from None


def _wheel(data: dict[str, Any]) -> WheelResult:
    runs = tuple(
        CheckRun(
            name=r["name"],
            result=GpuOutcome(r["result"]),
            seconds=float(r["seconds"]),
            detail=r["detail"],
            tally=Tally(**r["counts"]) if r.get("counts") else None,
        )
        for r in data["runs"]
    )
    return WheelResult(
        recipe=data["recipe"],
        filename=data["filename"],
        sha256=data["sha256"],
        doctor=data["doctor"]["status"],
        doctor_detail=data["doctor"]["detail"],
        runs=runs,
        outcome=GpuOutcome(data["outcome"]),
        why=data["why"],
    )


_MARK = {
    GpuOutcome.PASSED: "[green]passed[/]",
    GpuOutcome.IMPORT_ONLY: "[yellow]import only[/]",
    GpuOutcome.SKIPPED: "[yellow]skipped[/]",
    GpuOutcome.NOT_RUN: "[yellow]not run[/]",
    GpuOutcome.FAILED: "[red]failed[/]",
    GpuOutcome.MISMATCH: "[red bold]mismatch[/]",
}


def table(report: GpuReport) -> Table:
    """A row a wheel: its GPU, doctor's verdict, each check's result and time, the outcome."""
    gpus = ", ".join(report.gpus) or "none"
    shown = Table(title=f"GPU stage of {report.cell} on {gpus}", title_justify="left")
    for column in ("recipe", "wheel", "doctor", "import", "GPU check", "outcome"):
        shown.add_column(column, overflow="fold")
    for wheel in report.wheels:
        runs = {run.name: run for run in wheel.runs}
        shown.add_row(
            wheel.recipe,
            escape(wheel.filename),
            escape(wheel.doctor),
            escape(runs["import"].shown()) if "import" in runs else "-",
            escape(runs["gpu-smoke"].shown()) if "gpu-smoke" in runs else "none in the recipe",
            f"{_MARK[wheel.outcome]}: {escape(wheel.why)}",
        )
    return shown
