"""Executing a cell's plan: one step at a time, each with its own log, timing, attempt
count and verdicts, the report rewritten after each.

A failed cell step stops the cell; a failed recipe step stops that recipe and the recipes
that depend on it, while independent recipes go on. Network steps retry transient
failures; nothing else is retried. Ctrl-C stops the running command's whole process
tree, marks the step interrupted and leaves a valid report.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import assert_never

from wheelmill import envs
from wheelmill.checks import CheckResult
from wheelmill.containers.engine import Engine
from wheelmill.context import CellRun, Layout
from wheelmill.errors import BusyError, EnvError, FetchError, Interrupted, WheelmillError
from wheelmill.matrix import Matrix
from wheelmill.net import sha256_of
from wheelmill.plan import NETWORK_STEPS, CellPlan, ContainerSetup, Step, StepKind
from wheelmill.report import CellReport, Status, StepRecord, WheelRecord
from wheelmill.retry import RetryPolicy, TransientError, with_retries
from wheelmill.runner import HostRunner, StepLog
from wheelmill.settings import Settings
from wheelmill.steps import build, cell, container, install, publish, source, verify
from wheelmill.ui import UI

NO_RETRY = RetryPolicy(attempts=1)


def execute(
    plan: CellPlan, *, matrix: Matrix, settings: Settings, ui: UI, engine: Engine | None = None, containers: ContainerSetup | None = None
) -> CellReport:
    layout = Layout(output=settings.output.resolve(), cell=plan.cell.id)
    layout.root.mkdir(parents=True, exist_ok=True)
    with _cell_lock(layout.root / ".lock"):
        runner = HostRunner()
        run = CellRun(
            plan=plan,
            matrix=matrix,
            settings=settings,
            layout=layout,
            runner=runner,
            backend=envs.backend(settings.env_backend, runner),
            on_line=ui.line,
            engine=engine,
            containers=containers,
        )
        report = CellReport(plan=plan, path=layout.report)
        _clear_logs(layout)
        ui.cell_started(plan.cell.id, plan.cell.variant.describe())
        try:
            _run_steps(run, report, ui)
        finally:  # interrupted too: no container stays, and the report says how far it got
            if run.container is not None:
                run.container.stop()
            report.finished = time.time()
            report.facts.update(_facts(run))
            report.write()
            ui.summary(report)
    return report


def _run_steps(run: CellRun, report: CellReport, ui: UI) -> None:
    steps = run.plan.steps
    for index, step in enumerate(steps, start=1):
        reason = _blocked(step, run, report)
        if reason:
            report.steps.append(StepRecord(step=step, status=Status.SKIPPED, error=reason))
            ui.skipped(step, reason)
            continue
        record = run_step(run, step, index, len(steps), ui)
        report.steps.append(record)
        if record.status is Status.OK and step.kind is StepKind.INSTALL_TEST and step.recipe:
            report.wheels[step.recipe] = WheelRecord.of(run.final[step.recipe])
        report.write()
        if record.status is Status.INTERRUPTED:
            for rest in steps[index:]:
                report.steps.append(StepRecord(step=rest, status=Status.SKIPPED, error="interrupted"))
            raise Interrupted(f"{run.plan.cell.id}: interrupted during {step.id}", fix="run the session again; finished wheels are kept in dist/")


def _blocked(step: Step, run: CellRun, report: CellReport) -> str | None:
    """Why a step cannot run: a cell step failed, or its recipe (or a dependency) failed."""
    for done in report.steps:
        if done.status is Status.OK:
            continue
        if done.step.recipe is None:
            return f"cell step {done.step.kind} did not succeed"
        if step.recipe and (done.step.recipe == step.recipe or done.step.recipe in _ancestors(run, step.recipe)):
            return f"{done.step.id} did not succeed"
    return None


def _ancestors(run: CellRun, recipe: str) -> set[str]:
    found: set[str] = set()
    stack = list(run.plan.recipe(recipe).depends_on)
    while stack:
        name = stack.pop()
        if name not in found:
            found.add(name)
            stack.extend(run.plan.recipe(name).depends_on)
    return found


def run_step(run: CellRun, step: Step, index: int, total: int, ui: UI) -> StepRecord:
    log = StepLog(run.layout.logs / f"{index:02d}-{step.id.replace('/', '-')}.log")
    record = StepRecord(step=step, status=Status.OK, log=str(log.path))
    policy = run.settings.retry if step.kind in NETWORK_STEPS else NO_RETRY
    ui.step_started(step, index, total)
    started = time.monotonic()

    def on_retry(attempt: int, error: Exception, pause: float) -> None:
        log.note(f"attempt {attempt} failed: {error}; retrying in {pause:.1f}s")
        ui.retrying(attempt, error, pause)

    def attempt(number: int) -> list[CheckResult]:
        record.attempts = number
        log.note(f"{step.id} attempt {number}: {step.detail}")
        return _dispatch(run, step, log)

    try:
        record.checks, record.attempts = with_retries(attempt, policy=policy, on_retry=on_retry)
    except TransientError as exc:
        _fail(record, _exhausted(step, exc, record.attempts))
    except WheelmillError as exc:
        _fail(record, exc)
    except KeyboardInterrupt:
        record.status, record.error, record.exit_code = Status.INTERRUPTED, "interrupted", Interrupted.exit_code
    finally:
        record.seconds = time.monotonic() - started
        log.note(f"{step.id}: {record.status} after {record.seconds:.1f}s, {record.attempts} attempt(s)")
        log.close()
        ui.step_finished(record)
    return record


def _fail(record: StepRecord, error: WheelmillError) -> None:
    record.status, record.error, record.exit_code = Status.FAILED, error.one_line(), error.exit_code


def _exhausted(step: Step, error: TransientError, attempts: int) -> WheelmillError:
    kind = FetchError if step.kind is StepKind.FETCH else EnvError
    return kind(f"{step.id}: gave up after {attempts} attempts: {error}", fix="check the network and the index; WHEELMILL_RETRIES sets the attempts")


def _dispatch(run: CellRun, step: Step, log: StepLog) -> list[CheckResult]:
    if step.recipe is None:
        return _dispatch_cell(run, step, log)
    recipe = run.plan.recipe(step.recipe)
    match step.kind:
        case StepKind.PRE_CHECKS | StepKind.PREPARE_IMAGE | StepKind.PREPARE_CONTAINER | StepKind.TOOLCHAIN_CHECKS | StepKind.PREPARE_ENV | StepKind.ENV_CHECKS:
            raise AssertionError(f"{step.kind} is a cell step")
        case StepKind.FETCH:
            return source.fetch(run, recipe, log)
        case StepKind.BUILD:
            return build.build(run, recipe, log)
        case StepKind.STAMP:
            return build.stamp(run, recipe, log)
        case StepKind.POST_BUILD_CHECKS:
            return verify.post_build_checks(run, recipe, log)
        case StepKind.REPAIR:
            return verify.repair(run, recipe, log)
        case StepKind.POST_REPAIR_CHECKS:
            return verify.post_repair_checks(run, recipe, log)
        case StepKind.INSTALL_TEST:
            return install.install_test(run, recipe, log)
        case StepKind.PUBLISH:
            return publish.publish_step(run, recipe, log)
        case _:
            assert_never(step.kind)


def _dispatch_cell(run: CellRun, step: Step, log: StepLog) -> list[CheckResult]:
    match step.kind:
        case StepKind.PREPARE_IMAGE:
            return container.prepare_image(run, log)
        case StepKind.PREPARE_CONTAINER:
            return container.prepare_container(run, log)
        case StepKind.PRE_CHECKS:
            return cell.pre_checks(run, log)
        case StepKind.TOOLCHAIN_CHECKS:
            return cell.toolchain_checks(run, log)
        case StepKind.PREPARE_ENV:
            return cell.prepare_env(run, log)
        case StepKind.ENV_CHECKS:
            return cell.env_checks(run, log)
        case _:
            raise AssertionError(f"{step.kind} is a recipe step")


def _facts(run: CellRun) -> dict[str, object]:
    """What the report records about where the cell was built."""
    facts: dict[str, object] = {"engine": run.plan.engine, "machine": os.uname().machine}
    if run.image is not None and run.plan.image is not None:
        facts["image"] = {"tag": run.image.tag, "id": run.image.image_id, "built": run.image.built, "base": run.plan.image.base.reference}
    if run.lock_origin:
        facts["lock_origin"] = run.lock_origin
    if run.python:
        facts["python"] = str(run.python)
    if run.toolkit:
        facts["toolkit"] = {"root": str(run.toolkit.root), "version": run.toolkit.version}
    if run.sources:
        facts["package_sources"] = run.sources.describe()
        facts["package_source_args"] = run.sources.uv_args()
    if run.torch:
        facts["torch"] = {"version": run.torch.version, "cuda": run.torch.cuda, "hip": run.torch.hip, "cxx11_abi": run.torch.cxx11_abi}
    if run.layout.lock.is_file() and run.build_env:
        facts["lock_sha256"] = sha256_of(run.layout.lock)
    if run.max_jobs:
        facts["max_jobs"] = run.max_jobs
    return facts


def _clear_logs(layout: Layout) -> None:
    if layout.logs.is_dir():
        for old in layout.logs.glob("*.log"):
            old.unlink()


@contextmanager
def _cell_lock(path: Path) -> Iterator[None]:
    """One build per cell output directory at a time."""
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise BusyError(
                f"{path.parent.name}: another build of this cell is running ({holder})", fix="wait for it, or use another WHEELMILL_OUTPUT"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
