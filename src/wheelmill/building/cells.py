"""A run of several cells: the cells a command selects, in their order, each next one
starting beside the one before it as that one starts its first build, two at most at once.

While the cell before it runs, a cell's commands yield the cores to it
(``process.yielding``), and each of its builds waits for that cell's build of the same
recipe (``Builds``): what does not depend on the Python (device code, most C++) is then a
compiler cache hit, not the same code compiled twice at once. A cell's steps from its first
build on run on a thread (``FinishingCell``) while the next cell starts; that cell's lines
are held until the one before it has said its summary. Ctrl-C stops both, each step it
stopped recorded interrupted, and the run ends with a row a cell, the cells it kept from
starting among them. A run of one cell is the pipeline's ``execute``, nothing beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from functools import partial

from rich.console import Console

from wheelmill.building.pipeline import CellRun, execute, first_build, in_this_context
from wheelmill.building.report import CellReport
from wheelmill.building.ui import UI, held_console
from wheelmill.errors import Interrupted, WheelmillError
from wheelmill.machine.engine import Engine
from wheelmill.machine.process import stop_running, yielding
from wheelmill.planning.spec import CellPlan, Step, StepKind
from wheelmill.settings import Settings


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
        self.over = threading.Event()  # the cell ended, its wheels published

    def ended(self, step: Step) -> None:
        if step.kind is StepKind.BUILD and step.recipe in self._ended:
            self.count += 1
            self._ended[step.recipe].set()

    def end(self) -> None:
        for built in self._ended.values():
            built.set()
        self.over.set()

    def awaited(self, step: Step, plan: CellPlan) -> threading.Event | None:
        """What ``step`` of the next cell (``plan``) waits for: this cell's build of its
        recipe, still running; None where they share nothing (another variant)."""
        if step.kind is not StepKind.BUILD or step.recipe is None or plan.cell.variant != self.cell.variant:
            return None
        built = self._ended.get(step.recipe)
        return built if built is not None and not built.is_set() else None

    def builds_for_group(self, step: Step, plan: CellPlan) -> threading.Event | None:
        """What the next cell's build keys wait for: this cell's end, where it builds (or
        serves) a recipe the next cell would be served, so the next finds it published."""
        if step.kind is not StepKind.BUILD_KEYS or self.over.is_set():
            return None
        shared = any(r.group_build and self.cell.id in r.group_build.cells for r in plan.recipes)
        return self.over if shared else None


@dataclass(frozen=True, kw_only=True)
class SideBySide:
    """A cell's neighbours in the run: its own builds, which the next cell waits for, and
    those of the cell before it (None: none runs), which it waits for."""

    builds: Builds
    before: Builds | None

    def builds_before(self) -> int:
        return self.before.count if self.before is not None else 0

    def wait_before(self, cell: CellRun, step: Step, rest: Sequence[Step], /) -> None:
        """Before ``step``: the cell before this one's build of its recipe, to its end; then
        ``rest`` (this step on) is recorded interrupted where Ctrl-C ended that cell."""
        if self.before is None:
            return
        grouped, built = self.before.builds_for_group(step, cell.plan), self.before.awaited(step, cell.plan)
        awaited = grouped or built
        if awaited is None:
            return
        before = self.before.cell.id
        cell.ui.waiting(
            step,
            f"{before}'s end: it builds what this cell takes, one build for every torch and Python"
            if grouped
            else f"{before}'s build of {step.recipe}, whose compiles it takes from the cache",
        )
        try:
            awaited.wait()
        except KeyboardInterrupt:  # Ctrl-C while this thread, the main one, waited
            cell.interrupted(step, rest)
        if cell.stopping.is_set():  # Ctrl-C ended that cell while this one waited on a thread
            cell.interrupted(step, rest)

    def step_ended(self, step: Step, /) -> None:
        self.builds.ended(step)

    def cell_ended(self) -> None:
        self.builds.end()


@dataclass(frozen=True, kw_only=True)
class FinishingCell:
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

    def wait(self, *, interrupted: bool) -> WheelmillError | None:
        """Stopped (Ctrl-C: how it ended), else waited for: its own failure is in its report."""
        if interrupted:
            return self.stop()
        with suppress(WheelmillError):
            self.future.result()
        return None


class RunOfCells:
    """The run of the cells ``plans`` name, in their order: each cell's report from its
    start (Ctrl-C leaves it recorded), a row a cell at the end, and the exit status of the
    first failed cell (0 where none failed)."""

    def __init__(
        self,
        plans: Sequence[CellPlan],
        *,
        settings: Settings,
        engine: Engine | None,
        console: Console,
        say_error: Callable[[str], None],
        verbose: bool = False,
    ) -> None:
        self.plans, self.settings, self.engine, self.console = plans, settings, engine, console
        self.say_error, self.verbose = say_error, verbose
        self.stopping = threading.Event()
        self.reports: list[CellReport] = []
        self.finishing: list[FinishingCell] = []  # the cells still finishing, the earlier first

    def run(self) -> int:
        if len(self.plans) == 1:  # nothing beside it: its own summary says it all
            (plan,) = self.plans
            report = execute(
                plan,
                settings=self.settings,
                ui=UI(self.console, verbose=self.verbose),
                engine=self.engine,
                started=self.reports.append,
                stopping=self.stopping,
            )
            self._say_failed(report)
            if report.exit_code == 0:
                UI(self.console).next_steps([report])
            return report.exit_code
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="wheelmill-finishing") as pool:
            try:
                for number, plan in enumerate(self.plans, start=1):
                    self._start(plan, pool=pool if number < len(self.plans) else None)
            except (WheelmillError, KeyboardInterrupt) as exc:  # Ctrl-C, or a cell that could not start
                interrupted = isinstance(exc, (Interrupted, KeyboardInterrupt))
                stopped = [cell.wait(interrupted=interrupted) for cell in self.finishing]
                not_started = [p.cell.id for p in self.plans[len(self.reports) :]]
                UI(self.console).run_summary(self.reports, time.monotonic() - started, not_started=not_started)
                said = next((error for error in stopped if isinstance(error, Interrupted)), None)
                if isinstance(exc, KeyboardInterrupt) and said is not None:  # the step it stopped says where
                    raise said from None
                raise
        UI(self.console).run_summary(self.reports, time.monotonic() - started)
        code = next((report.exit_code for report in self.reports if report.exit_code), 0)
        if code == 0:
            UI(self.console).next_steps(self.reports)
        return code

    def _start(self, plan: CellPlan, *, pool: ThreadPoolExecutor | None) -> None:
        """``plan``'s cell, beside the one before it; ``pool``: where its steps from its first
        build on go while the next cell starts (None for the last). The next cell starts
        beside one at most: any other is waited for first."""
        before = self.finishing[-1] if self.finishing else None
        ui = UI(self.console, verbose=self.verbose)
        if before is not None:  # said now: its own lines wait for that cell's summary
            beside = f"{plan.cell.id} starts beside {before.builds.cell.id}"
            self.console.print(f"[dim]{beside}; its lines follow that cell's summary[/]")
            ui = UI(_held_until_finished(before, self.console), verbose=self.verbose)
        outcome = start_cell(
            plan,
            settings=self.settings,
            ui=ui,
            engine=self.engine,
            started=self.reports.append,
            stopping=self.stopping,
            pool=pool,
            before=before,
        )
        self.finishing += [outcome] if isinstance(outcome, FinishingCell) else []
        while len(self.finishing) > 1 or (self.finishing and not isinstance(outcome, FinishingCell)):
            self._say_failed(self.finishing[0].future.result())
            self.finishing.pop(0)  # only now: Ctrl-C while it finishes stops it too
        if isinstance(outcome, CellReport):
            self._say_failed(outcome)

    def _say_failed(self, report: CellReport) -> None:
        failed = report.failed
        if failed is not None and failed.error:
            self.say_error(f"{failed.step.id}: {failed.error}")


def start_cell(
    plan: CellPlan,
    *,
    settings: Settings,
    ui: UI,
    engine: Engine | None,
    started: Callable[[CellReport], None],
    stopping: threading.Event,
    pool: ThreadPoolExecutor | None,
    before: FinishingCell | None,
) -> CellReport | FinishingCell:
    """The cell's report, once its plan ran; with ``pool`` (a cell after it), its steps from
    its first build on go there, and it is a ``FinishingCell``. ``before``: the run's cell
    before this one, still running: this one's commands yield the cores to it while it
    runs, and its builds wait for that cell's of the same recipe."""
    builds = Builds(plan)
    neighbours = SideBySide(builds=builds, before=before.builds if before else None)
    cell = CellRun(plan, settings=settings, ui=ui, engine=engine, stopping=stopping, neighbours=neighbours)
    with yielding(lambda: not before.future.done()) if before else nullcontext():
        cell.open(started)
        try:
            first = first_build(plan.steps)
            handed = cell.run_steps(until=first if pool is not None and first >= 0 else None)
        except BaseException:
            cell.close()
            raise
        if handed is None or pool is None:
            cell.close()
            return cell.report
        future = pool.submit(in_this_context(partial(_finish, cell, handed)))
    return FinishingCell(stopping=stopping, future=future, builds=builds)


def _finish(cell: CellRun, start: int) -> CellReport:
    """On the finishing thread: the cell's steps from ``start`` on, then its end."""
    try:
        cell.run_steps(start)
    finally:
        cell.close()
    return cell.report


def _held_until_finished(before: FinishingCell, console: Console) -> Console:
    """The next cell's console: what it writes is held until the cell before it has ended."""
    held_out, held = held_console(console)
    before.future.add_done_callback(lambda _done: held.release())
    return held_out
