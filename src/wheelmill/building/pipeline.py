"""Executing a cell's plan: one step at a time, each with its own log, timing, attempt
count and verdicts, the report rewritten after each.

The pipeline knows no step by name: the registry says how each runs, whether it retries
and what a failed command in it means. A failed cell step stops the cell; a failed recipe
step stops that recipe and the recipes that depend on it, while independent recipes go
on. Network steps retry transient failures; nothing else is retried. Ctrl-C stops the
running command's whole process tree, marks the step interrupted and leaves a valid
report.

``execute`` runs a cell alone, its steps in the plan's order. Where the plan says so (its
install-tests choice), a recipe's install test runs on a thread beside the next steps
(``Beside``). In a run of several cells (``wheelmill.building.cells``), a cell runs beside the
cells before and after it: its ``CellRun`` is given ``Neighbours`` to wait for and to tell.
Ctrl-C reaches the main thread only: it stops the others' commands, and their steps end
interrupted too.

This is the error boundary of a build: whatever a step raises ends as a recorded step
result, one line and an exit code; what wheelmill did not expect is recorded as an
internal error, its traceback in the step's log, never on the terminal.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, replace
from functools import partial
from typing import NoReturn, Protocol, TypeVar

from wheelmill.building.context import Hold, Outcome, RunContext, StepContext, Where
from wheelmill.building.products import BuildKeys, PublishedBuild, ShippedAbi
from wheelmill.building.report import CellReport, StepRecord
from wheelmill.building.steps import BY_KIND, CellStep, RecipeStep, StepDefinition
from wheelmill.building.ui import UI, step_label
from wheelmill.errors import BusyError, CommandFailed, InternalError, Interrupted, UsageError, WheelmillError
from wheelmill.files import file_lock
from wheelmill.index.conda_channels import configured_channels
from wheelmill.index.roots import Index
from wheelmill.machine import envs
from wheelmill.machine.engine import Engine
from wheelmill.machine.process import HostRunner, StepLog, netless_prefix, stop_running
from wheelmill.output.layout import CellLayout
from wheelmill.output.report import Status
from wheelmill.planning.spec import CellPlan, Step, StepKind
from wheelmill.retry import RetryPolicy, TransientError, with_retries
from wheelmill.settings import EnvBackendName, InstallTests, Settings

NO_RETRY = RetryPolicy(attempts=1)
T = TypeVar("T")


class Neighbours(Protocol):
    """The cells a cell runs beside, in a run of several (``wheelmill.building.cells``)."""

    def builds_before(self) -> int:
        """How many builds the cell before this one has ended (0 where none runs)."""
        ...

    def wait_before(self, cell: CellRun, step: Step, rest: Sequence[Step], /) -> None:
        """Before ``step`` (``rest`` from it on): what of the cell before it the step waits for."""
        ...

    def step_ended(self, step: Step, /) -> None:
        """``step`` of this cell is recorded, run or not."""
        ...

    def cell_ended(self) -> None:
        """This cell ended, however."""
        ...


class Alone:
    """A cell that runs by itself: no cell before it to wait for, none after it waiting."""

    def builds_before(self) -> int:
        return 0

    def wait_before(self, _cell: CellRun, _step: Step, _rest: Sequence[Step], /) -> None:
        return None

    def step_ended(self, _step: Step, /) -> None:
        return None

    def cell_ended(self) -> None:
        return None


def execute(
    plan: CellPlan,
    *,
    settings: Settings,
    ui: UI,
    engine: Engine | None = None,
    started: Callable[[CellReport], None] = lambda _report: None,
    stopping: threading.Event | None = None,
) -> CellReport:
    """The cell's report, once its plan ran; ``started`` is given it first, so a caller that
    Ctrl-C stops (the error raised here) still has it. ``stopping``: the run's, set when
    Ctrl-C stops the steps of its threads."""
    cell = CellRun(plan, settings=settings, ui=ui, engine=engine, stopping=stopping or threading.Event())
    cell.open(started)
    try:
        cell.run_steps()
    finally:
        cell.close()
    return cell.report


class CellRun:
    """One cell's plan running: what its steps share (the run's context, the report, the
    terminal, what steps hold until the cell ends, the cell's lock) and where its commands
    run, from ``open`` through ``run_steps`` (once, or in two parts on two threads) to
    ``close``."""

    def __init__(
        self,
        plan: CellPlan,
        *,
        settings: Settings,
        ui: UI,
        engine: Engine | None,
        stopping: threading.Event,
        neighbours: Neighbours | None = None,
    ) -> None:
        self.plan, self.ui, self.stopping = plan, ui, stopping
        self.neighbours: Neighbours = neighbours or Alone()
        layout = CellLayout(output=settings.output.resolve(), cell=plan.cell.id)
        self.run = RunContext(
            plan=plan,
            settings=settings,
            layout=layout,
            engine=engine,
            on_line=ui.line,
            builds_before=self.neighbours.builds_before,
        )
        self.report = CellReport(plan=plan, path=layout.report, rootless=engine is not None and engine.rootless)
        self.where: Where | None = None  # None: this machine, until a step says otherwise
        self._locked, self._held = ExitStack(), ExitStack()  # the cell's lock; what steps hand over (the container)

    def open(self, started: Callable[[CellReport], None] = lambda _report: None) -> None:
        """The cell's lock taken (a build of it already running is an error), ``started``
        given the report, the logs of an earlier run cleared, the terminal told."""
        layout = self.run.layout
        self._locked.enter_context(file_lock(layout.root / ".lock", busy=self._busy))
        self._locked.callback(self.neighbours.cell_ended)  # however it ends, none waits for its builds
        try:
            started(self.report)
            _clear_logs(layout)
            self.ui.cell_started(self.plan.cell.id, self.plan.cell.variant.describe())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """What the steps held ends first (the container); then the report is written and
        said, interrupted too (it says how far it got); then the lock goes, and with it the
        next cell's wait for its builds."""
        try:
            self._held.close()
        finally:
            try:
                self.report.finished = time.time()
                self.report.write()
                self.ui.summary(self.report)
            finally:
                self._locked.close()

    def run_steps(self, start: int = 0, *, until: int | None = None) -> int | None:
        """Run the plan's steps from ``start`` on; with ``until``, stop before that one and
        return it (None where every step ran)."""
        steps = self.plan.steps
        self.where = self.where or host(self.run.settings, self.plan.choices.env_backend)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wheelmill-beside") as pool:
            beside: Beside | None = None
            try:
                for index in range(start, len(steps)):
                    step = steps[index]
                    if self.stopping.is_set():  # Ctrl-C in the run's next cell, while this one ends on a thread
                        self.interrupted(step, steps[index:])
                    if beside and (waits_for(step, beside.step) or _goes_beside(step, self.plan) or index == until):
                        self._await(beside)
                        beside = None
                    if index == until:
                        return index
                    if self._skipped(step):
                        continue
                    self.neighbours.wait_before(self, step, steps[index:])
                    position, following = (index + 1, len(steps)), steps[index + 1 : index + 2]
                    if _goes_beside(step, self.plan) and following and not waits_for(following[0], step):
                        beside = self._start_beside(pool, step, following[0], position=position)
                        continue
                    self._run(step, position=position, rest=steps[index + 1 :])
            except BaseException:  # Ctrl-C, or a bug: the step beside is stopped, and recorded in its place
                if beside:
                    self._await(beside, stop=True)
                raise
            if beside:
                self._await(beside)
        return None

    def interrupted(self, step: Step, rest: Sequence[Step]) -> NoReturn:
        """Ctrl-C stopped the cell at ``step``: ``rest`` is recorded as not run."""
        self.report.steps += [StepRecord(step=later, status=Status.SKIPPED, error="interrupted") for later in rest]
        raise Interrupted(
            f"{self.plan.cell.id}: interrupted during {step.id}",
            fix="run the session again; finished wheels are kept in dist/",
        )

    def _busy(self, holder: str) -> BusyError:
        return BusyError(
            f"{self.plan.cell.id}: another build of this cell is running ({holder})",
            fix="wait for it, or use another WHEELMILL_OUTPUT",
        )

    def _skipped(self, step: Step) -> bool:
        """Whether ``step`` does not run (``blocked``): then recorded and said why."""
        stop = blocked(step, self.plan, self.report)
        if stop is None:
            return False
        self.report.steps.append(StepRecord(step=step, status=stop.status, error=stop.reason, made=stop.made))
        self.neighbours.step_ended(step)
        self.ui.skipped(step, stop.reason, status=stop.status)
        return True

    def _run(self, step: Step, *, position: tuple[int, int], rest: Sequence[Step]) -> None:
        assert self.where is not None, "run_steps starts where commands run"
        record = run_step(
            self.run,
            step,
            where=self.where,
            report=self.report,
            position=position,
            ui=self.ui,
            hold=self._held.enter_context,
            stopping=self.stopping,
        )
        self.report.steps.append(record)
        self.neighbours.step_ended(step)
        self.where = next((made for made in record.made if isinstance(made, Where)), self.where)
        self.report.write()
        if record.status is Status.INTERRUPTED:
            self.interrupted(step, rest)

    def _start_beside(self, pool: ThreadPoolExecutor, step: Step, after: Step, *, position: tuple[int, int]) -> Beside:
        assert self.where is not None, "run_steps starts where commands run"
        self.ui.step_beside(step, *position)
        quiet = replace(self.run, on_line=lambda _line: None)  # the terminal's progress line is the main step's
        label = step_label(step, *position)
        work = partial(
            _run_beside,
            quiet,
            step,
            label=label,
            stopping=self.stopping,
            ui=self.ui,
            where=self.where,
            report=self.report,
            position=position,
            hold=self._held.enter_context,
        )
        future = pool.submit(in_this_context(work))
        return Beside(step=step, after=after, label=label, stopping=self.stopping, future=future)

    def _await(self, beside: Beside, *, stop: bool = False) -> None:
        """Wait for the step beside, and record it; ``stop``: its commands are stopped first
        (Ctrl-C), so that it ends as interrupted."""
        if stop:
            beside.stopping.set()
            stop_running()
        record, said = beside.future.result()
        if not said:
            _interrupt(record)
            self.ui.verdict(record, beside.label)
        # In the plan's order, where a reader of the report looks for it.
        recorded = [done.step for done in self.report.steps]
        at = recorded.index(beside.after) if beside.after in recorded else len(recorded)
        self.report.steps.insert(at, record)
        self.report.write()


def host(settings: Settings, env_backend: EnvBackendName) -> Where:
    """Where commands run until a step says otherwise: this machine, and a network
    namespace of it for the steps that need no network, where the platform allows one."""
    runner, prefix = HostRunner(), netless_prefix()
    netless = HostRunner(netless=prefix) if prefix else None
    channels = conda_channels(settings) if env_backend is EnvBackendName.CONDA else ()
    offline = (
        Where(runner=netless, backend=envs.backend(env_backend, netless, offline=True, channels=channels))
        if netless
        else None
    )
    return Where(runner=runner, backend=envs.backend(env_backend, runner, channels=channels), netless=offline)


def conda_channels(settings: Settings) -> list[str]:
    """The conda backend's channels; none where none is found (its pre-check says so)."""
    try:
        return configured_channels(settings.conda_channels, Index.of(settings))
    except UsageError:
        return []


def in_this_context(work: Callable[[], T]) -> Callable[[], T]:
    """``work``, for another thread, in a copy of this thread's context: the cell's
    commands there yield the cores as they do here (``process.yielding``)."""
    return partial(contextvars.copy_context().run, work)


def first_build(steps: Sequence[Step]) -> int:
    """The index of the plan's first build step (-1 where it has none)."""
    return next((i for i, step in enumerate(steps) if step.kind is StepKind.BUILD), -1)


def _goes_beside(step: Step, plan: CellPlan) -> bool:
    definition = BY_KIND[step.kind]
    return (
        isinstance(definition, RecipeStep) and definition.beside and plan.choices.install_tests is InstallTests.BESIDE
    )


@dataclass(frozen=True, kw_only=True)
class Beside:
    """The step running on a thread beside the main one (one at a time): its verdict goes to
    the terminal when it ends, its record into the report when a step needs it."""

    step: Step
    after: Step  # the plan's next step, which its record goes before
    label: str  # what the terminal knows it by
    stopping: threading.Event  # the run's, set before Ctrl-C stops its commands: it ends interrupted
    future: Future[tuple[StepRecord, bool]]


def waits_for(step: Step, pending: Step) -> bool:
    """Whether ``step`` needs the outcome of ``pending``, a recipe's step running beside: the
    cell's steps do, and that recipe's later ones; another recipe's do not (one that needs
    that recipe takes its repaired wheel until its own install test)."""
    return step.recipe is None or step.recipe == pending.recipe


def _run_beside(
    run: RunContext,
    step: Step,
    *,
    label: str,
    stopping: threading.Event,
    ui: UI,
    where: Where,
    report: CellReport,
    position: tuple[int, int],
    hold: Hold,
) -> tuple[StepRecord, bool]:
    """``step``'s record, and whether its verdict was said: as soon as it ends (a failed
    test is seen while the next build runs), unless it failed because Ctrl-C stopped it."""
    record = run_step(
        run, step, where=where, report=report, position=position, ui=ui, hold=hold, beside=True, stopping=stopping
    )
    if stopping.is_set() and record.status is Status.FAILED:
        return record, False
    ui.verdict(record, label)
    return record, True


@dataclass(frozen=True, kw_only=True)
class Blocked:
    """Why a step does not run: the status of its record, the reason, and what the record
    holds in its place (a published recipe's wheel, for what depends on it)."""

    status: Status
    reason: str
    made: tuple[object, ...] = ()


def blocked(step: Step, plan: CellPlan, report: CellReport) -> Blocked | None:
    """Why a step does not run: it need not (its recipe is published for its build key, or
    its group's one build was found in another channel, or every recipe is published and the
    step is only there for builds), or it cannot (a cell step failed, or its recipe, or one it
    needs, failed). A step that is ``published`` or ``from-group`` (given the group build)
    is no failure: what depends on it goes on."""
    keys = report.done.find(BuildKeys)
    found = _skip_published(step, keys) or _skip_from_group(step, plan, report, keys) or _skip_test_build(step, keys)
    if found is not None:
        return found
    needs = {step.recipe, *plan.recipe(step.recipe).needs} if step.recipe else set()
    for done in report.steps:
        if done.status in (Status.OK, Status.PUBLISHED, Status.REUSED, Status.FROM_GROUP):
            continue
        if done.step.recipe is None:
            return Blocked(status=Status.SKIPPED, reason=f"cell step {done.step.kind} did not succeed")
        if done.step.recipe in needs:
            return Blocked(status=Status.SKIPPED, reason=f"{done.step.id} did not succeed")
    return None


def _skip_published(step: Step, keys: BuildKeys | None) -> Blocked | None:
    if keys is None:
        return None
    if step.recipe is not None:
        found = keys.published.get(step.recipe)
        if found is not None and found.tested_here:
            return _skip_reused(step, found)
        return Blocked(status=found.status, reason=found.describe(), made=found.made()) if found else None
    definition = BY_KIND[step.kind]
    if not isinstance(definition, CellStep) or not definition.for_builds or not keys.nothing_to_build:
        return None
    if definition.for_tests and not keys.nothing_to_test:  # a reused wheel's install test needs it
        return None
    return Blocked(
        status=Status.PUBLISHED,
        reason=f"nothing to build: every recipe is published in channel {keys.channel} for its build key"
        + (" (the served index's or the local one's)" if _any_reused(keys) else ""),
    )


def _any_reused(keys: BuildKeys) -> bool:
    return any(found.reused_from for found in keys.published.values())


# What runs of a recipe reused from the served index: the steps after its build, as for a wheel built here.
_REUSED_RUN = frozenset({StepKind.FETCH, StepKind.POST_REPAIR_CHECKS, StepKind.INSTALL_TEST})


def _skip_reused(step: Step, found: PublishedBuild) -> Blocked | None:
    """The steps of a recipe reused from the served index: its build's do not run (repair's
    record holds the fetched wheel); fetch (its tests' source), its checks after repair and
    its install test run, which delivers it; the served index has it published."""
    if step.kind in _REUSED_RUN:
        return None
    made = (found.repaired(),) if step.kind is StepKind.REPAIR else ()
    return Blocked(status=found.status, reason=found.describe(), made=made)


# The steps that make the wheel of a recipe built once for its group: the one build elsewhere made it.
_NOT_SERVED = frozenset({StepKind.BUILD, StepKind.STAMP, StepKind.POST_BUILD_CHECKS, StepKind.REPAIR})


def _skip_from_group(step: Step, plan: CellPlan, report: CellReport, keys: BuildKeys | None) -> Blocked | None:
    """The steps of a recipe given its group's one build: its build's do not run (repair's record holds the wheel);
    fetch and the install test run only where the plan tests it; its checks after repair
    and its publishing run."""
    found = keys.from_group.get(step.recipe) if keys is not None and step.recipe else None
    if found is None:
        return None
    group = plan.recipe(found.recipe).group_build
    if step.kind is StepKind.REPAIR:
        return Blocked(status=Status.FROM_GROUP, reason=found.describe(), made=(found.repaired(),))
    if step.kind in _NOT_SERVED or (step.kind is StepKind.FETCH and not found.tested):
        return Blocked(status=Status.FROM_GROUP, reason=found.describe())
    if step.kind is StepKind.INSTALL_TEST and not found.tested:
        abi = report.done.find(ShippedAbi, found.recipe)
        corners = ", ".join(group.tested) if group else "-"
        reason = (
            f"{found.describe()}; not install-tested here: its channel lists it, published after a test with "
            f"this torch (the corners: {corners})"
        )
        return Blocked(
            status=Status.FROM_GROUP, reason=reason, made=(found.delivered_record(abi.text if abi else None),)
        )
    return None


def _skip_test_build(step: Step, keys: BuildKeys | None) -> Blocked | None:
    """A recipe built once for its group, built in a cell not of the group's oldest torch, is never published."""
    why = keys.unpublished.get(step.recipe) if keys is not None and step.recipe else None
    return Blocked(status=Status.SKIPPED, reason=why) if why and step.kind is StepKind.PUBLISH else None


def run_step(
    run: RunContext,
    step: Step,
    *,
    where: Where,
    report: CellReport,
    position: tuple[int, int],
    ui: UI,
    hold: Hold,
    beside: bool = False,
    stopping: threading.Event | None = None,
) -> StepRecord:
    """``step``'s record, once it ran; ``beside``: on a thread beside the main one, whose
    caller says that it started and how it ended. ``stopping``: once set, a failure is
    Ctrl-C's (on a thread, which it reaches by stopping the commands): interrupted."""
    definition = BY_KIND[step.kind]
    log = StepLog(run.layout.logs / f"{position[0]:02d}-{step.id.replace('/', '-')}.log")
    record = StepRecord(step=step, status=Status.OK, log=str(log.path))
    if not beside:
        ui.step_started(step, *position)
    started = time.monotonic()

    def on_retry(attempt: int, error: Exception, pause: float) -> None:
        log.note(f"attempt {attempt} failed: {error}; retrying in {pause:.1f}s")
        ui.retrying(attempt, error, pause)

    def attempt(number: int) -> Outcome:
        record.attempts = number
        log.note(f"{step.id} attempt {number}: {step.detail}")
        done = report.done.only((*definition.needs, *definition.reads), step=str(definition.kind))
        ctx = StepContext(run=run, where=where.for_network(definition.network), done=done, log=log, hold=hold)
        return _start(definition, ctx, step)

    try:
        outcome, record.attempts = with_retries(
            attempt, policy=run.settings.retry if definition.retries else NO_RETRY, on_retry=on_retry
        )
        record.checks, record.made = outcome.checks, outcome.made
    except KeyboardInterrupt:
        _interrupt(record)
    except Exception as exc:  # noqa: BLE001 - the boundary: every failure becomes this step's record
        if stopping is not None and stopping.is_set():
            _interrupt(record)
        else:
            _fail(record, failure(definition, step, exc, record.attempts, log))
    finally:
        record.seconds = time.monotonic() - started
        log.note(f"{step.id}: {record.status} after {record.seconds:.1f}s, {record.attempts} attempt(s)")
        log.close()
        if not beside:
            ui.step_finished(record)
    return record


def _start(definition: StepDefinition, ctx: StepContext, step: Step) -> Outcome:
    if isinstance(definition, CellStep):
        outcome = definition.run(ctx)
    else:
        assert step.recipe is not None, "the plan gives every recipe step its recipe"
        outcome = definition.run(ctx, ctx.run.plan.recipe(step.recipe))
    undeclared = sorted({type(value).__name__ for value in outcome.made if not isinstance(value, definition.makes)})
    if undeclared:
        raise LookupError(f"{definition.kind} made {', '.join(undeclared)}, which its registry entry does not declare")
    return outcome


def failure(definition: StepDefinition, step: Step, exc: Exception, attempts: int, log: StepLog) -> WheelmillError:
    """What an exception that ended a step means, as one of wheelmill's errors. Its
    traceback goes to the step's log, but for a failed command or network (whose output and
    retries are there already)."""
    match exc:
        case TransientError():
            fix = "check the network and the index; WHEELMILL_RETRIES sets the attempts"
            return definition.error(f"{step.id}: gave up after {attempts} attempts: {exc}", fix=fix)
        case CommandFailed():
            return definition.error(f"{step.id}: {exc.message}", fix=exc.fix)
    log.traceback(exc)
    if isinstance(exc, WheelmillError):
        return exc
    return InternalError(
        f"{step.id}: internal error: {type(exc).__name__}: {exc}",
        fix=f"this is a bug in wheelmill; its traceback is in {log.path}",
    )


def _interrupt(record: StepRecord) -> None:
    record.status, record.error, record.exit_code = Status.INTERRUPTED, "interrupted", Interrupted.exit_code


def _fail(record: StepRecord, error: WheelmillError) -> None:
    record.status, record.error, record.exit_code = Status.FAILED, error.one_line(), error.exit_code


def _clear_logs(layout: CellLayout) -> None:
    if layout.logs.is_dir():
        for old in layout.logs.glob("*.log"):
            old.unlink()
