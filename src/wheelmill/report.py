"""The report of a cell: ``<cell>/report.json``, rewritten atomically after every step so a
crash or Ctrl-C still leaves a valid report of what happened up to then."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from wheelmill.checks import CheckResult
from wheelmill.net import sha256_of
from wheelmill.plan import CellPlan, Step

REPORT_VERSION = 1


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"


@dataclass(kw_only=True)
class StepRecord:
    step: Step
    status: Status
    seconds: float = 0.0
    attempts: int = 0
    log: str | None = None
    error: str | None = None
    exit_code: int | None = None
    checks: list[CheckResult] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": str(self.step.kind),
            "recipe": self.step.recipe,
            "status": self.status.value,
            "seconds": round(self.seconds, 2),
            "attempts": self.attempts,
            "log": self.log,
            "error": self.error,
            "exit_code": self.exit_code,
            "checks": [c.as_dict() for c in self.checks],
        }


@dataclass(frozen=True, kw_only=True)
class WheelRecord:
    name: str
    size: int
    sha256: str
    path: str

    @classmethod
    def of(cls, path: Path) -> WheelRecord:
        return cls(name=path.name, size=path.stat().st_size, sha256=sha256_of(path), path=str(path))


@dataclass(kw_only=True)
class CellReport:
    plan: CellPlan
    path: Path
    started: float = field(default_factory=time.time)
    finished: float | None = None
    steps: list[StepRecord] = field(default_factory=list)
    wheels: dict[str, WheelRecord] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> StepRecord | None:
        return next((s for s in self.steps if s.status in (Status.FAILED, Status.INTERRUPTED)), None)

    @property
    def status(self) -> Status:
        if any(s.status is Status.INTERRUPTED for s in self.steps):
            return Status.INTERRUPTED
        return Status.FAILED if self.failed else Status.OK

    @property
    def exit_code(self) -> int:
        failed = self.failed
        return 0 if failed is None else failed.exit_code or 1

    def recipe_status(self, recipe: str) -> Status:
        mine = [s for s in self.steps if s.step.recipe == recipe]
        for status in (Status.INTERRUPTED, Status.FAILED, Status.SKIPPED):
            if any(s.status is status for s in mine):
                return status
        return Status.OK if mine and len(mine) == sum(1 for s in self.plan.steps if s.recipe == recipe) else Status.SKIPPED

    def as_dict(self) -> dict[str, Any]:
        cell = self.plan.cell
        return {
            "report_version": REPORT_VERSION,
            "cell": cell.id,
            "variant": cell.variant.name,
            "python": cell.python,
            "engine": self.plan.engine,
            "channel": self.plan.channel,
            "release": _release(self.plan),
            "status": self.status.value,
            "exit_code": self.exit_code,
            "started": _iso(self.started),
            "finished": _iso(self.finished) if self.finished else None,
            "seconds": round((self.finished or time.time()) - self.started, 2),
            "facts": self.facts,
            "recipes": [
                {
                    "name": r.name,
                    "status": self.recipe_status(r.name).value,
                    "version_rule": r.version_rule.value,
                    "wheel": vars(self.wheels[r.name]) if r.name in self.wheels else None,
                }
                for r in self.plan.recipes
            ],
            "steps": [s.as_dict() for s in self.steps],
        }

    def write(self) -> None:
        """Write report.json atomically: a reader never sees half a report."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".report.", suffix=".json", dir=self.path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.as_dict(), f, indent=2)
            f.write("\n")
        Path(tmp).replace(self.path)


def _release(cell_plan: CellPlan) -> dict[str, Any] | None:
    release = cell_plan.release
    if release is None:
        return None
    return {"version": release.version, "track": release.track.value, "tag": release.tag, "commit": release.commit}


def _iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))
