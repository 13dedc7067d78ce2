"""Executing a cell's plan: one step at a time, each with its own log, timing, attempt
count and verdicts, the report rewritten after each.

The pipeline knows no step by name: the registry says how each runs, whether it retries
and what a failed command in it means. A failed cell step stops the cell; a failed recipe
step stops that recipe and the recipes that depend on it, while independent recipes go
on. Network steps retry transient failures; nothing else is retried. Ctrl-C stops the
running command's whole process tree, marks the step interrupted and leaves a valid
report.

A recipe's install test runs on a thread beside the next steps (``Beside``); in a run of
several cells, a cell's steps from its first build on run on a thread while the next cell
starts (``Ending``): that one waits for the cell before it to have built a recipe before it
builds it (``Builds``), and yields the cores to it while it runs. Ctrl-C reaches the main
thread only: it stops the others' commands, and their steps end interrupted too.

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
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NoReturn, TypeVar

from wheelmill.build.context import Hold, Outcome, RunContext, StepContext, Where
from wheelmill.build.products import BuildKeys
from wheelmill.build.report import CellReport, StepRecord
from wheelmill.build.steps import BY_KIND, CellStep, RecipeStep, StepDefinition
from wheelmill.build.ui import UI, step_label
from wheelmill.conda.channel import configured_channels
from wheelmill.errors import BusyError, CommandFailed, InternalError, Interrupted, UsageError, WheelmillError
from wheelmill.files import file_lock
from wheelmill.machine import envs
from wheelmill.machine.engine import Engine
from wheelmill.machine.process import HostRunner, StepLog, netless_prefix, stop_running, yielding
from wheelmill.output.layout import CellLayout
from wheelmill.output.report import Status
from wheelmill.planning.spec import CellPlan, Step, StepKind
from wheelmill.retry import RetryPolicy, TransientError, with_retries
from wheelmill.settings import EnvBackendName, InstallTests, Settings

NO_RETRY = RetryPolicy(attempts=1)
T = TypeVar("T")


class Builds:
    """A cell's builds as the run's next cell sees them: each recipe's ended once its step
    is recorded (built, failed, skipped or published), and every one once the cell ended,
    however. The next cell of the same variant builds a recipe only after this one has: its
    compiles that do not depend on the Python (device code, most C++) are then cache hits,
    not the same code compiled twice at once."""

    def __init__(self, plan: CellPlan) -> None:
        self.cell = plan.cell
        self._ended = {
            step.recipe: threading.Event() for step in plan.steps if step.kind is StepKind.BUILD and step.recipe
        }
        self.count = 0  # the builds ended: a compiler cache server started before the last one does not see it

    def ended(self, step: Step) -> None:
        if step.kind is StepKind.BUILD and step.recipe in self._ended:
            self.count += 1
            self._ended[step.recipe].set()

    def end(self) -> None:
        for built in self._ended.values():
            built.set()

    def awaited(self, step: Step, plan: CellPlan) -> threading.Event | None:
        """What ``step`` of the next cell (``plan``) waits for: this cell's build of its
        recipe, still running; None where they share nothing (another variant)."""
        if step.kind is not StepKind.BUILD or step.recipe is None or plan.cell.variant != self.cell.variant:
            return None
        built = self._ended.get(step.recipe)
        return built if built is not None and not built.is_set() else None


@dataclass(frozen=True, kw_only=True)
class Ending:
    """A cell whose steps from its first build on (building, checking, repairing, testing
    and publishing each recipe's wheel, the cell's closure) run on a thread while the run's
    next cell starts; then what they held ends, the report is written and said, and the
    lock goes."""

    stopping: threading.Event  # the run's: set, its running step ends interrupted
    future: Future[CellReport]  # its report, once it ended
    builds: Builds  # which of its recipes it has built: the next cell waits for them

    def stop(self) -> WheelmillError | None:
        """Ctrl-C: its running command is stopped, its step and the rest recorded
        interrupted; how it ended (its Interrupted), for the caller to say once."""
        self.stopping.set()
        stop_running()
        try:
            self.future.result()
        except WheelmillError as error:
            return error
        return None


def execute(
    plan: CellPlan,
    *,
    settings: Settings,
    ui: UI,
    engine: Engine | None = None,
    started: Callable[[CellReport], None] = lambda _report: None,
    stopping: threading.Event | None = None,
    ending: ThreadPoolExecutor | None = None,
    after: Ending | None = None,
) -> CellReport | Ending:
    """The cell's report, once its plan ran; ``started`` is given it first, so a caller that
    Ctrl-C stops (the error raised here) still has it. With ``ending`` (a run with a cell
    after this one), the steps from the first build on run there: see ``Ending``.
    ``stopping``: the run's, set when Ctrl-C stops the steps of its threads. ``after``: the
    run's cell before this one, still running: this one's commands yield the cores to it
    while it runs, and its builds wait for that cell's of the same recipe."""
    with yielding(lambda: not after.future.done()) if after else nullcontext():
        return _execute(
            plan,
            settings=settings,
            ui=ui,
            engine=engine,
            started=started,
            stopping=stopping,
            ending=ending,
            after=after.builds if after else None,
        )


def _execute(
    plan: CellPlan,
    *,
    settings: Settings,
    ui: UI,
    engine: Engine | None,
    started: Callable[[CellReport], None],
    stopping: threading.Event | None,
    ending: ThreadPoolExecutor | None,
    after: Builds | None,
) -> CellReport | Ending:
    layout = CellLayout(output=settings.output.resolve(), cell=plan.cell.id)
    stopping = stopping or threading.Event()
    builds = Builds(plan)

    def busy(holder: str) -> BusyError:
        return BusyError(
            f"{plan.cell.id}: another build of this cell is running ({holder})",
            fix="wait for it, or use another WHEELMILL_OUTPUT",
        )

    locked, held = ExitStack(), ExitStack()  # the cell's lock; what steps hand over (the container)
    locked.enter_context(file_lock(layout.root / ".lock", busy=busy))
    locked.callback(builds.end)  # however the cell ends, the next one waits for none of its builds
    report = CellReport(plan=plan, path=layout.report)
    order = Order(builds=builds, after=after)
    try:
        run = RunContext(
            plan=plan, settings=settings, layout=layout, engine=engine, on_line=ui.line, builds_before=_counted(after)
        )
        started(report)
        _clear_logs(layout)
        ui.cell_started(plan.cell.id, plan.cell.variant.describe())
        rest = _run_steps(
            run, report, ui, held.enter_context, order=order, stopping=stopping, hand_over=ending is not None
        )
    except BaseException:
        _end(report, ui, held, locked)
        raise
    if rest is None or ending is None:
        _end(report, ui, held, locked)
        return report
    future = ending.submit(
        _here(partial(_run_rest, run, report, ui, held, locked, rest=rest, order=order, stopping=stopping))
    )
    return Ending(stopping=stopping, future=future, builds=builds)


def _counted(builds: Builds | None) -> Callable[[], int]:
    return (lambda: builds.count) if builds is not None else (lambda: 0)


def _run_rest(
    run: RunContext,
    report: CellReport,
    ui: UI,
    held: ExitStack,
    locked: ExitStack,
    *,
    rest: Rest,
    order: Order,
    stopping: threading.Event,
) -> CellReport:
    """On the ending thread: the cell's steps from ``rest`` on, then its end."""
    try:
        _run_steps(run, report, ui, held.enter_context, order=order, stopping=stopping, rest=rest)
    finally:
        _end(report, ui, held, locked)
    return report


def _end(report: CellReport, ui: UI, held: ExitStack, locked: ExitStack) -> None:
    """What the steps held ends first (the container); then the report is written and said,
    interrupted too (it says how far it got); then the lock goes, and with it the next
    cell's wait for its builds."""
    try:
        held.close()
    finally:
        try:
            report.finished = time.time()
            report.write()
            ui.summary(report)
        finally:
            locked.close()


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
        return configured_channels(settings.conda_channels, settings.index)
    except UsageError:
        return []


@dataclass(frozen=True, kw_only=True)
class Order:
    """Where a cell stands in its run: its own builds, which the next cell waits for, and
    those of the cell before it (None: none runs), which it waits for."""

    builds: Builds
    after: Builds | None


@dataclass(frozen=True, kw_only=True)
class Rest:
    """Where a cell's steps go on: the index of the next one, and where commands run."""

    index: int
    where: Where


def _run_steps(
    run: RunContext,
    report: CellReport,
    ui: UI,
    hold: Hold,
    *,
    order: Order,
    stopping: threading.Event,
    hand_over: bool = False,
    rest: Rest | None = None,
) -> Rest | None:
    """Run the plan's steps (from ``rest`` on); ``hand_over``: stop before the first build
    and return where the rest starts (None where nothing is left)."""
    steps = run.plan.steps
    where = rest.where if rest else host(run.settings, run.plan.choices.env_backend)
    first = first_build(steps)
    handing = first if hand_over and first >= 0 else None  # a cell that builds nothing keeps its steps
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wheelmill-beside") as pool:
        beside: Beside | None = None
        try:
            start = rest.index if rest else 0
            for index, step in enumerate(steps[start:], start=start + 1):
                if stopping.is_set():  # Ctrl-C in the run's next cell, while this one ends on a thread
                    _interrupted(run.plan, step, steps[index - 1 :], report)
                if beside and (waits_for(step, beside.step) or _goes_beside(step, run.plan) or index - 1 == handing):
                    _await(beside, report, ui)
                    beside = None
                if index - 1 == handing:
                    return Rest(index=index - 1, where=where)
                stop = blocked(step, run.plan, report)
                if stop:
                    report.steps.append(StepRecord(step=step, status=stop.status, error=stop.reason, made=stop.made))
                    order.builds.ended(step)
                    ui.skipped(step, stop.reason, published=stop.status is Status.PUBLISHED)
                    continue
                if order.after is not None:
                    _wait_for(
                        order.after,
                        step,
                        plan=run.plan,
                        ui=ui,
                        rest=steps[index - 1 :],
                        report=report,
                        stopping=stopping,
                    )
                position = (index, len(steps))
                if _goes_beside(step, run.plan) and index < len(steps) and not waits_for(steps[index], step):
                    beside = _start_beside(
                        pool,
                        run,
                        step,
                        steps[index],
                        stopping=stopping,
                        where=where,
                        report=report,
                        position=position,
                        ui=ui,
                        hold=hold,
                    )
                    continue
                record = run_step(
                    run, step, where=where, report=report, position=position, ui=ui, hold=hold, stopping=stopping
                )
                report.steps.append(record)
                order.builds.ended(step)
                where = next((made for made in record.made if isinstance(made, Where)), where)
                report.write()
                if record.status is Status.INTERRUPTED:
                    _interrupted(run.plan, step, steps[index:], report)
        except BaseException:  # Ctrl-C, or a bug: the step beside is stopped, and recorded in its place
            if beside:
                _await(beside, report, ui, stop=True)
            raise
        if beside:
            _await(beside, report, ui)
    return None


def _here(work: Callable[[], T]) -> Callable[[], T]:
    """``work``, for another thread, in a copy of this thread's context: the cell's
    commands there yield the cores as they do here (``process.yielding``)."""
    return partial(contextvars.copy_context().run, work)


def first_build(steps: Sequence[Step]) -> int:
    """The index of the plan's first build step (-1 where it has none)."""
    return next((i for i, step in enumerate(steps) if step.kind is StepKind.BUILD), -1)


def _wait_for(
    after: Builds,
    step: Step,
    *,
    plan: CellPlan,
    ui: UI,
    rest: Sequence[Step],
    report: CellReport,
    stopping: threading.Event,
) -> None:
    """Before ``step``: the cell before this one's build of its recipe, to its end; then
    ``rest`` (this step on) is recorded interrupted where Ctrl-C ended that cell."""
    built = after.awaited(step, plan)
    if built is None:
        return
    ui.waiting(step, f"{after.cell.id}'s build of {step.recipe}, whose compiles it takes from the cache")
    try:
        built.wait()
    except KeyboardInterrupt:  # Ctrl-C while this thread, the main one, waited
        _interrupted(plan, step, rest, report)
    if stopping.is_set():  # Ctrl-C ended that cell while this one waited on a thread
        _interrupted(plan, step, rest, report)


def _interrupted(plan: CellPlan, step: Step, rest: Sequence[Step], report: CellReport) -> NoReturn:
    report.steps += [StepRecord(step=later, status=Status.SKIPPED, error="interrupted") for later in rest]
    raise Interrupted(
        f"{plan.cell.id}: interrupted during {step.id}", fix="run the session again; finished wheels are kept in dist/"
    )


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


def _start_beside(
    pool: ThreadPoolExecutor,
    run: RunContext,
    step: Step,
    after: Step,
    *,
    stopping: threading.Event,
    position: tuple[int, int],
    ui: UI,
    **context: Any,
) -> Beside:
    ui.step_beside(step, *position)
    quiet = replace(run, on_line=lambda _line: None)  # the terminal's progress line is the main step's
    label = step_label(step, *position)
    future = pool.submit(
        _here(partial(_run_beside, quiet, step, label=label, stopping=stopping, position=position, ui=ui, **context))
    )
    return Beside(step=step, after=after, label=label, stopping=stopping, future=future)


def _run_beside(
    run: RunContext, step: Step, *, label: str, stopping: threading.Event, ui: UI, **context: Any
) -> tuple[StepRecord, bool]:
    """``step``'s record, and whether its verdict was said: as soon as it ends (a failed
    test is seen while the next build runs), unless it failed because Ctrl-C stopped it."""
    record = run_step(run, step, ui=ui, beside=True, **context)
    if stopping.is_set() and record.status is Status.FAILED:
        return record, False
    ui.verdict(record, label)
    return record, True


def _await(beside: Beside, report: CellReport, ui: UI, *, stop: bool = False) -> None:
    """Wait for the step beside, and record it; ``stop``: its commands are stopped first
    (Ctrl-C), so that it ends as interrupted."""
    if stop:
        beside.stopping.set()
        stop_running()
    record, said = beside.future.result()
    if not said:
        _interrupt(record)
        ui.verdict(record, beside.label)
    # In the plan's order, where a reader of the report looks for it.
    recorded = [done.step for done in report.steps]
    report.steps.insert(recorded.index(beside.after) if beside.after in recorded else len(recorded), record)
    report.write()


@dataclass(frozen=True, kw_only=True)
class Blocked:
    """Why a step does not run: the status of its record, the reason, and what the record
    holds in its place (a published recipe's wheel, for what depends on it)."""

    status: Status
    reason: str
    made: tuple[object, ...] = ()


def blocked(step: Step, plan: CellPlan, report: CellReport) -> Blocked | None:
    """Why a step does not run: it need not (its recipe is published for its build key, or
    every recipe is and the step only serves builds), or it cannot (a cell step failed, or
    its recipe, or one it needs, failed). A published step is no failure: what depends on
    it goes on."""
    published = _published(step, report.done.find(BuildKeys))
    if published is not None:
        return published
    needs = {step.recipe, *plan.recipe(step.recipe).needs} if step.recipe else set()
    for done in report.steps:
        if done.status in (Status.OK, Status.PUBLISHED):
            continue
        if done.step.recipe is None:
            return Blocked(status=Status.SKIPPED, reason=f"cell step {done.step.kind} did not succeed")
        if done.step.recipe in needs:
            return Blocked(status=Status.SKIPPED, reason=f"{done.step.id} did not succeed")
    return None


def _published(step: Step, keys: BuildKeys | None) -> Blocked | None:
    if keys is None:
        return None
    if step.recipe is not None:
        found = keys.published.get(step.recipe)
        return Blocked(status=Status.PUBLISHED, reason=found.describe(), made=found.made()) if found else None
    definition = BY_KIND[step.kind]
    if isinstance(definition, CellStep) and definition.for_builds and keys.nothing_to_build:
        return Blocked(
            status=Status.PUBLISHED,
            reason=f"nothing to build: every recipe is published in channel {keys.channel} for its build key",
        )
    return None


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
