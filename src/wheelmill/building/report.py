"""The report of a cell: the record of every step (status, time, attempts, verdicts, and
the value it made), written to ``<cell>/report.json`` atomically after every step, so a
crash or Ctrl-C still leaves a valid report of what happened up to then.

``wheelmill.output.report`` reads it back. The report reads what it says from those
records: the wheels are the install tests' values, the facts (the Python, the toolkit, the
torch, the image) what the values that carry facts say of themselves.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from wheelmill.checks import CheckResult
from wheelmill.errors import redact_data
from wheelmill.files import write_atomic
from wheelmill.machine.emulation import execution
from wheelmill.output.report import BuiltCell, RecipeRecord, ReleaseRecord, Status, WheelRecord
from wheelmill.planning.spec import CellPlan, Step

T = TypeVar("T")


@runtime_checkable
class Facts(Protocol):
    """A step's value that says something about where and how the cell was built."""

    def facts(self) -> Mapping[str, Any]: ...


@dataclass(kw_only=True)
class StepRecord:
    step: Step
    status: Status
    seconds: float = 0.0
    attempts: int = 0
    log: str | None = None
    error: str | None = None
    exit_code: int | None = None
    checks: Sequence[CheckResult] = ()
    made: tuple[object, ...] = ()  # the values the step made, for later steps and the report

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


class Done:
    """What earlier steps of the cell made, by type: a read-only view of the records. A
    step's view holds only the products its registry entry declares (``only``)."""

    def __init__(
        self, records: Sequence[StepRecord], *, declared: frozenset[type] | None = None, step: str = ""
    ) -> None:
        self._records = records
        self._declared = declared
        self._step = step

    def only(self, declared: Iterable[type], *, step: str) -> Done:
        """The view of a step that declares ``declared``: any other lookup is a bug."""
        return Done(self._records, declared=frozenset(declared), step=step)

    def get(self, kind: type[T], recipe: str | None = None) -> T:
        """The latest ``kind`` made by a cell step (``recipe`` None) or by ``recipe``'s steps."""
        found = self.find(kind, recipe)
        if found is None:
            # The plan orders steps so that this cannot happen; if it does, it is a bug.
            raise LookupError(f"no earlier step{f' of {recipe}' if recipe else ''} made a {kind.__name__}")
        return found

    def find(self, kind: type[T], recipe: str | None = None) -> T | None:
        if self._declared is not None and kind not in self._declared:
            raise LookupError(f"{self._step} looks up a {kind.__name__}, which its registry entry does not declare")
        for record in reversed(self._records):
            for value in reversed(record.made) if record.step.recipe == recipe else ():
                if isinstance(value, kind):
                    return value
        return None


@dataclass(kw_only=True)
class CellReport:
    plan: CellPlan
    path: Path
    rootless: bool = False  # the engine runs as this user, not root (rootless podman or docker)
    started: float = field(default_factory=time.time)
    finished: float | None = None
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def done(self) -> Done:
        return Done(self.steps)

    @property
    def wheels(self) -> dict[str, WheelRecord]:
        return {
            r.step.recipe: value
            for r in self.steps
            for value in r.made
            if r.step.recipe and isinstance(value, WheelRecord)
        }

    @property
    def facts(self) -> dict[str, Any]:
        """Where the cell was built, from what the steps found, later steps winning."""
        machine, platform = os.uname().machine, self.plan.cell.variant.platform
        facts: dict[str, Any] = {
            "engine": self.plan.engine,
            **({"rootless": self.rootless} if self.plan.engine != "none" else {}),
            "machine": machine,
            "platform": {"target": platform, "execution": str(execution(platform, machine))},
        }
        for made in (value for record in self.steps for value in record.made if isinstance(value, Facts)):
            for key, value in made.facts().items():
                merged = facts.get(key)
                facts[key] = {**merged, **value} if isinstance(merged, dict) and isinstance(value, dict) else value
        return facts

    @property
    def seconds(self) -> float:
        """How long the cell ran (so far, while it runs)."""
        return (self.finished or time.time()) - self.started

    @property
    def compiler_cache(self) -> dict[str, dict[str, Any]]:
        """The compiler cache's statistics of each recipe built with it."""
        return {recipe: stats for recipe, stats in (self.facts.get("compiler_cache") or {}).items() if stats}

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
        settled = (
            Status.INTERRUPTED,
            Status.FAILED,
            Status.SKIPPED,
            Status.PUBLISHED,
            Status.REUSED,
            Status.FROM_GROUP,
        )
        for status in settled:
            if any(s.status is status for s in mine):
                return status
        return (
            Status.OK if mine and len(mine) == sum(1 for s in self.plan.steps if s.recipe == recipe) else Status.SKIPPED
        )

    def recipes_with(self, status: Status) -> list[str]:
        """The plan's recipes that ended with ``status``, in build order."""
        return [r.name for r in self.plan.recipes if self.recipe_status(r.name) is status]

    def as_built(self) -> BuiltCell:
        """What report.json says, as its readers get it back."""
        cell, wheels = self.plan.cell, self.wheels
        return BuiltCell(
            cell=cell.id,
            variant=cell.variant.name,
            python=cell.python,
            engine=self.plan.engine,
            channel=self.plan.channel,
            release=None if self.plan.release is None else ReleaseRecord.of(self.plan.release),
            status=self.status,
            exit_code=self.exit_code,
            started=_iso(self.started),
            finished=_iso(self.finished) if self.finished else None,
            seconds=round(self.seconds, 2),
            facts=self.facts,
            recipes=tuple(
                RecipeRecord(
                    name=r.name,
                    status=self.recipe_status(r.name),
                    version_rule=r.version.rule,
                    wheel=wheels.get(r.name),
                )
                for r in self.plan.recipes
            ),
            steps=tuple(s.as_dict() for s in self.steps),
        )

    def write(self) -> None:
        """Write report.json atomically: a reader never sees half a report."""
        write_atomic(self.path, (json.dumps(redact_data(self.as_built().as_dict()), indent=2) + "\n").encode())


def _iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))
