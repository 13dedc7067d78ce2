"""What a step gets, in three parts that change at different rates:

- ``RunContext``: fixed for the cell's run: its plan, the settings, where its files go.
- ``Where``: where commands run now: this machine, or the cell's container once the
  ``prepare-container`` step made it. Replaced as one value, never patched.
- ``Done``: what earlier steps made (``wheelmill.building.report``), read by type.

A step returns an ``Outcome``: its check verdicts and the values it made, which the
pipeline records for later steps and the report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from wheelmill.building.report import Done
from wheelmill.checks import CheckResult
from wheelmill.machine.engine import Engine
from wheelmill.machine.envs import EnvBackend
from wheelmill.machine.process import Runner, StepLog
from wheelmill.output.layout import CellLayout
from wheelmill.planning.spec import CellPlan
from wheelmill.settings import Settings

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """Fixed for one cell's run."""

    plan: CellPlan
    settings: Settings
    layout: CellLayout
    engine: Engine | None  # the engine the command line found; None: this machine
    on_line: Callable[[str], None]  # progress: a line of a running command's output
    # How many builds the run's cell before this one, still running beside it, has ended
    # (always 0 where none does): what they compiled is in the cache from then on.
    builds_before: Callable[[], int] = lambda: 0
    started: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))  # RFC 3339


@dataclass(frozen=True, kw_only=True)
class Where:
    """Where the cell's commands run, and the env backend that works there; ``netless``:
    the same place without network, for the steps that need none (None where the
    platform cannot take it away)."""

    runner: Runner
    backend: EnvBackend
    netless: Where | None = None

    def for_network(self, network: bool) -> Where:
        return self.netless if not network and self.netless is not None else self


class Hold(Protocol):
    """Hands a context manager to the pipeline: entered now, exited when the cell ends."""

    def __call__(self, manager: AbstractContextManager[T], /) -> T: ...


@dataclass(frozen=True, kw_only=True)
class StepContext:
    run: RunContext
    where: Where
    done: Done
    log: StepLog
    hold: Hold


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a step returns: every verdict it reached, and the values it made."""

    checks: Sequence[CheckResult] = ()
    made: tuple[object, ...] = ()
