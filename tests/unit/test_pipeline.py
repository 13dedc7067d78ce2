"""A recipe's install test runs beside the next recipe's build: the pipeline, driven from the
command line in the sandbox, with every recipe step standing in (recording what it was given)
and the cell's steps real. Recipe ``b`` depends on ``a``."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.conftest import CliResult, CliRunner
from tests.sandbox import OTHER_PYTHON, PYTHON, Sandbox
from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import Repaired
from wheelmill.building.steps import BY_KIND
from wheelmill.building.steps.build import wheel_of
from wheelmill.building.ui import UI
from wheelmill.errors import BuildError, ConfigError, InstallTestError, Interrupted, UsageError
from wheelmill.machine.process import base_environment
from wheelmill.output.report import WheelRecord
from wheelmill.planning.spec import RecipeSpec, Step, StepKind

KINDS = (
    StepKind.FETCH,
    StepKind.BUILD,
    StepKind.STAMP,
    StepKind.POST_BUILD_CHECKS,
    StepKind.REPAIR,
    StepKind.POST_REPAIR_CHECKS,
    StepKind.INSTALL_TEST,
)
WAIT = 30.0  # seconds a stand-in waits for the other thread before it says it never came


class Recipes:
    """Stand-ins for every recipe step. ``a``'s install test runs ``test_a``, given the
    moment ``b``'s build has started; ``b``'s build runs ``build_b``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.b_building = threading.Event()
        self.taken: Path | None = None  # the wheel of a that b's build was given
        self.test_a: Callable[[StepContext], None] = lambda _ctx: None
        self.build_b: Callable[[StepContext], None] = lambda _ctx: None

    def run(self, kind: StepKind) -> Callable[[StepContext, RecipeSpec], Outcome]:
        def step(ctx: StepContext, spec: RecipeSpec) -> Outcome:
            if kind is StepKind.REPAIR:
                return Outcome(made=(Repaired(wheel=self._wheel("repaired", spec.name)),))
            if kind is StepKind.BUILD and spec.name == "b":
                self.taken = wheel_of(ctx.done, "a")
                self.b_building.set()
                self.build_b(ctx)
            if kind is StepKind.INSTALL_TEST:
                if spec.name == "a":
                    self.test_a(ctx)
                return Outcome(made=(WheelRecord.of(self._wheel("dist", spec.name)),))
            return Outcome()

        return step

    def _wheel(self, where: str, name: str) -> Path:
        path = self.tmp / where / f"{name}-1.0-py3-none-any.whl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode())
        return path


@pytest.fixture
def recipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recipes:
    stand_ins = Recipes(tmp_path / "made")
    for kind in KINDS:
        monkeypatch.setitem(BY_KIND, kind, dataclasses.replace(BY_KIND[kind], run=stand_ins.run(kind)))  # type: ignore[arg-type]
    return stand_ins


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return two_recipes(tmp_path)


def two_recipes(tmp_path: Path, *, pythons: tuple[str, ...] = (PYTHON,)) -> Sandbox:
    """The sandbox with recipes a and b, b depending on a."""
    box = Sandbox(tmp_path / "repo", pythons=pythons)
    for name in ("a", "b"):
        box.recipe(name, {}, wheel=f"{name}-1.0-py3-none-any.whl")
    recipe_b = box.recipes / "b.toml"
    recipe_b.write_text(recipe_b.read_text().replace('cells = ["*"]\n', 'cells = ["*"]\ndepends-on = ["a"]\n'))
    return box


def on_b(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, command: str = "build", *, publish: bool = False
) -> CliResult:
    """``command`` (build or plan) for recipe b in the sandbox's CPU cell, engine none, in the
    sandbox's environment; not published unless ``publish``."""
    for key, value in sandbox.environ().items():
        monkeypatch.setenv(key, value)
    unpublished = () if publish else ("--no-publish",)
    args = ("--recipes", str(sandbox.recipes), command, "--cell", sandbox.cell("cpu"), "--recipe", "b")
    return cli(*args, *unpublished, "--engine", "none")


def build(cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox) -> tuple[CliResult, list[dict[str, Any]]]:
    result = on_b(cli, monkeypatch, sandbox)
    report = json.loads((sandbox.output / sandbox.cell("cpu") / "report.json").read_text())
    return result, [step for step in report["steps"] if step["recipe"]]


def test_the_next_build_runs_beside_an_install_test_on_the_repaired_wheel(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    def test_a(ctx: StepContext) -> None:
        assert recipes.b_building.wait(WAIT), "b's build did not start while a's install test ran"

    recipes.test_a = test_a
    result, steps = build(cli, monkeypatch, sandbox)
    assert result.code == 0, result.out + result.err
    assert recipes.taken == recipes.tmp / "repaired" / "a-1.0-py3-none-any.whl"
    # The report keeps the plan's order, and says each step's own time.
    assert [(s["recipe"], s["step"]) for s in steps] == [(name, kind.value) for name in ("a", "b") for kind in KINDS]
    assert all(s["status"] == "ok" for s in steps)
    assert "a/install-test" in result.out and "(beside the next steps)" in result.out


def test_a_failed_install_test_stops_what_depends_on_it_before_its_test(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    def test_a(ctx: StepContext) -> None:
        recipes.b_building.wait(WAIT)
        raise InstallTestError("a: import a: ModuleNotFoundError", fix="read the log")

    recipes.test_a = test_a
    result, steps = build(cli, monkeypatch, sandbox)
    assert result.code == InstallTestError.exit_code, result.out + result.err
    status = {(s["recipe"], s["step"]): (s["status"], s["error"]) for s in steps}
    assert status["a", "install-test"] == ("failed", "a: import a: ModuleNotFoundError; fix: read the log")
    assert status["b", "build"][0] == "ok"  # built beside it; nothing of b is tested or delivered
    assert status["b", "install-test"] == ("skipped", "a/install-test did not succeed")
    assert len(re.findall(r"FAILED \[\d+/\d+\] a/install-test", result.out)) == 1, result.out  # its verdict, said once
    assert not (sandbox.output / sandbox.cell("cpu") / "dist").exists() or not list(
        (sandbox.output / sandbox.cell("cpu") / "dist").glob("b-*")
    )


def test_ctrl_c_stops_the_install_test_beside_the_interrupted_step(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    def test_a(ctx: StepContext) -> None:  # a real command, which Ctrl-C must stop
        ctx.where.runner.run(["sleep", str(int(WAIT * 2))], env=base_environment([]), log=ctx.log)

    def build_b(_ctx: StepContext) -> None:
        time.sleep(0.5)  # a's command has started
        raise KeyboardInterrupt

    recipes.test_a, recipes.build_b = test_a, build_b
    started = time.monotonic()
    result, steps = build(cli, monkeypatch, sandbox)
    assert time.monotonic() - started < WAIT
    assert result.code == Interrupted.exit_code, result.out + result.err
    status = {(s["recipe"], s["step"]): s["status"] for s in steps}
    assert status["a", "install-test"] == "interrupted"
    assert status["b", "build"] == "interrupted"
    assert status["b", "install-test"] == "skipped"
    assert "failed" not in result.out  # a stopped test is said interrupted, not failed


def test_with_install_tests_after_each_step_waits_for_the_one_before(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    seen: list[bool] = []

    def record_a(_ctx: StepContext) -> None:
        seen.append(recipes.b_building.is_set())

    recipes.test_a = record_a
    monkeypatch.setenv("WHEELMILL_INSTALL_TESTS", "after")
    result, steps = build(cli, monkeypatch, sandbox)
    assert result.code == 0, result.out + result.err
    assert seen == [False], "a's test ran before b's build started"
    assert "(beside the next steps)" not in result.out
    assert [(s["recipe"], s["step"]) for s in steps] == [(name, kind.value) for name in ("a", "b") for kind in KINDS]


def test_an_unknown_install_tests_mode_is_one_line_naming_the_variable(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    monkeypatch.setenv("WHEELMILL_INSTALL_TESTS", "sometimes")
    result = on_b(cli, monkeypatch, sandbox)
    assert result.code == ConfigError.exit_code
    expected = (
        "environment: WHEELMILL_INSTALL_TESTS='sometimes' is not one of beside, after, none; "
        "fix: set WHEELMILL_INSTALL_TESTS to one of them or unset it"
    )
    assert result.err.strip().splitlines() == [f"wheelmill: error: {expected}"]


def test_no_install_tests_never_publishes_a_build_refuses_before_anything_runs(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox
) -> None:
    monkeypatch.setenv("WHEELMILL_INSTALL_TESTS", "none")
    result = on_b(cli, monkeypatch, sandbox, publish=True)
    assert result.code == UsageError.exit_code == 2
    expected = (
        "WHEELMILL_INSTALL_TESTS=none delivers wheels that no install test has run: they are never published; "
        "fix: build with --no-publish, or unset WHEELMILL_INSTALL_TESTS"
    )
    assert result.err.strip().splitlines() == [f"wheelmill: error: {expected}"]
    assert not (sandbox.output / sandbox.cell("cpu")).exists(), "nothing ran"
    planned = on_b(cli, monkeypatch, sandbox, "plan")
    assert planned.code == 0, planned.err
    assert "install tests none (wheels untested, not published)" in " ".join(planned.out.split()), planned.out


def test_a_run_of_several_cells_ends_with_a_row_a_cell_and_a_count(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    cells = [sandbox.cell("cpu"), sandbox.cell("cuda130")]

    def build_b(ctx: StepContext) -> None:
        if ctx.run.plan.cell.id == cells[0]:
            raise BuildError("b: nvcc exited 1", fix="read the log")

    recipes.build_b = build_b
    for key, value in sandbox.environ().items():
        monkeypatch.setenv(key, value)
    result = cli(
        "--recipes",
        str(sandbox.recipes),
        "build",
        "--cell",
        cells[0],
        "--cell",
        cells[1],
        "--recipe",
        "b",
        "--no-publish",
        "--engine",
        "none",
        "-v",
    )
    assert result.code == BuildError.exit_code, result.out + result.err
    # The failed cell's summary says its failure first, then (-v) its steps, the skipped ones as one count.
    summary = result.out[result.out.index("FAILED b/build: b: nvcc exited 1") :]
    assert summary.index(f"{cells[0]} (none)") > 0, "the failure, then the steps table"
    assert re.search(r"\n\d+ steps skipped \(not in the table\), from b/stamp on: b/build did not succeed", summary)
    table = summary[: summary.index("steps skipped")]
    assert "│ skipped" not in table
    # The first cell's failure does not stop the next; the run's table comes after both.
    *_, title, _top, head, _rule, failed, ok, _bottom, counted = result.out.splitlines()
    columns = ["cell", "status", "time", "built", "published", "from group", "compiler cache", "failed step"]
    assert title.strip() == "cells" and [c.strip() for c in head.split("┃")[1:-1]] == columns, head
    assert [c.strip() for c in ok.split("│")[1:3]] == [cells[1], "ok"] and [c.strip() for c in ok.split("│")[4:]] == [
        "2 of 2",
        "-",
        "-",
        "-",
        "-",
        "",
    ], ok
    assert [c.strip() for c in failed.split("│")[1:3]] == [cells[0], "FAILED"], failed
    assert [c.strip() for c in failed.split("│")[4:]] == ["1 of 2", "-", "-", "-", "b/build", ""], failed
    assert re.fullmatch(r"2 cells in \d+\.\ds: 1 ok, 1 FAILED", counted), counted
    (error,) = result.err.splitlines()  # the failed cell's line, said once
    assert error == "wheelmill: error: b/build: b: nvcc exited 1; fix: read the log"


@pytest.fixture
def interruptible() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process, as in a terminal: a test run started
    in the background (`cmd &` in a script) inherits SIGINT ignored, and Python then leaves
    it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("interruptible")
def test_ctrl_c_in_a_run_of_several_cells_ends_with_the_runs_rows_and_the_cells_not_started(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    """Ctrl-C while the first cell builds b, on its thread, and the second builds beside it:
    both end interrupted, the third never starts."""
    cells = [sandbox.cell("cpu"), sandbox.cell("cuda130"), sandbox.cell("rocm62")]
    second_building = threading.Event()

    def build(ctx: StepContext, spec: RecipeSpec) -> None:  # real commands, which Ctrl-C must stop
        cell = ctx.run.plan.cell.id
        if cell == cells[1]:
            second_building.set()
        elif cell == cells[0] and spec.name == "b":
            assert second_building.wait(WAIT)  # the second cell builds on its thread, the main one waits
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C, as a terminal sends it
        else:
            return
        ctx.where.runner.run(["sleep", str(int(WAIT * 2))], env=base_environment([]), log=ctx.log)

    before(monkeypatch, StepKind.BUILD, build)
    for key, value in sandbox.environ().items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    selected = [arg for cell in cells for arg in ("--cell", cell)]
    result = cli(
        "--recipes", str(sandbox.recipes), "build", *selected, "--recipe", "b", "--no-publish", "--engine", "none"
    )
    assert time.monotonic() - started < WAIT, "Ctrl-C stopped the command it ran"
    assert result.code == Interrupted.exit_code, result.out + result.err
    *_, first, second, not_started, _bottom, counted = result.out.splitlines()
    assert [c.strip() for c in first.split("│")[1:3]] == [cells[0], "interrupted"], first
    assert [c.strip() for c in second.split("│")[1:3]] == [cells[1], "interrupted"], second
    assert [c.strip() for c in not_started.split("│")[1:-1]] == [cells[2], "not started", *["-"] * 6], not_started
    assert re.fullmatch(r"3 cells in \d+\.\ds: 2 interrupted, 1 not started", counted), counted
    (error,) = result.err.splitlines()  # the step Ctrl-C stopped, once
    assert error.startswith(f"wheelmill: error: {cells[0]}: interrupted during b/build; fix: ")
    assert "FAILED" not in result.out
    assert not (sandbox.output / cells[2]).exists()


def two_cells(cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox) -> tuple[CliResult, list[str]]:
    cells = [sandbox.cell("cpu"), sandbox.cell("cuda130")]
    for key, value in sandbox.environ().items():
        monkeypatch.setenv(key, value)
    result = cli(
        "--recipes",
        str(sandbox.recipes),
        "build",
        "--cell",
        cells[0],
        "--cell",
        cells[1],
        "--recipe",
        "b",
        "--no-publish",
        "--engine",
        "none",
    )
    return result, cells


def before(
    monkeypatch: pytest.MonkeyPatch,
    kind: StepKind,
    hook: Callable[[StepContext, RecipeSpec], None],
    *,
    after: Callable[[StepContext, RecipeSpec], None] = lambda _ctx, _spec: None,
) -> None:
    """``hook`` runs before the stand-in of every step of this kind (and ``after``, after it)."""
    definition = BY_KIND[kind]

    def run(ctx: StepContext, spec: RecipeSpec) -> Outcome:
        hook(ctx, spec)
        done = definition.run(ctx, spec)  # type: ignore[call-arg]
        after(ctx, spec)
        return done

    monkeypatch.setitem(BY_KIND, kind, dataclasses.replace(definition, run=run))  # type: ignore[arg-type]


def test_a_cells_steps_from_its_first_build_on_run_beside_the_next_cell(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    """A CPU and a CUDA cell: the CUDA cell starts once the CPU cell builds, and builds
    without waiting for it (another variant shares no compiles); while the CPU cell runs,
    the CUDA cell's commands yield the cores to it; the terminal still reads in order."""
    next_building, seen = threading.Event(), []

    def build(ctx: StepContext, spec: RecipeSpec) -> None:
        if ctx.run.plan.cell.id.startswith("cuda130"):
            next_building.set()
        elif spec.name == "a":
            seen.append(next_building.wait(WAIT))

    before(monkeypatch, StepKind.BUILD, build)
    result, cells = two_cells(cli, monkeypatch, sandbox)
    assert result.code == 0, result.out + result.err
    assert seen == [True], "the next cell did not build while the first one built"
    assert " waits for " not in result.out
    # What the next cell said meanwhile comes after the first one's lines and summary.
    out = result.out
    last = len(KINDS) * 2 + 5  # the cell's five steps (build-keys too), then the recipes' (none after them)
    assert (
        out.index(f"ok [{last}/{last}] b/install-test")
        < out.index(f"{cells[0]}: ok in ")
        < out.index(f"wheelmill build {cells[1]}")
    )
    assert out.index(f"{cells[1]} starts beside {cells[0]}; its lines follow that cell's summary") < out.index(
        f"{cells[0]}: ok in "
    )
    for name in cells:
        report = json.loads((sandbox.output / name / "report.json").read_text())
        assert [(s["recipe"], s["step"], s["status"]) for s in report["steps"] if s["recipe"]] == [
            (r, k.value, "ok") for r in ("a", "b") for k in KINDS
        ]
    assert re.fullmatch(r"2 cells in \d+\.\ds: 2 ok", out.splitlines()[-2])
    dists = ", ".join(str(sandbox.output / cell / "dist") for cell in cells)  # both built unpublished
    assert out.splitlines()[-1] == f"next: the wheels are in {dists} (not published: `wheelmill publish` adds them)"
    # The next cell's env was made while the first cell built: at a lower priority.
    (made,) = [text for name, text in sandbox.logs("cuda130").items() if name.endswith("-prepare-env.log")]
    assert re.search(r"^\$ sh -c .*wheelmill-yield ", made, re.MULTILINE), made[:2000]
    assert not any("wheelmill-yield" in text for text in sandbox.logs("cpu").values()), "the first cell yields to none"


class Around:
    """Every build's start and end, in the order they happened, as (what, cell, recipe),
    and the builds each cell's saw the cell before it had ended (``builds_before``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, on_start: Callable[[str], object]) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.before: dict[str, list[int]] = {}

        def start(ctx: StepContext, spec: RecipeSpec) -> None:
            cell = ctx.run.plan.cell.id
            self.events.append(("start", cell, spec.name))
            self.before.setdefault(cell, []).append(ctx.run.builds_before())
            on_start(cell)

        def end(ctx: StepContext, spec: RecipeSpec) -> None:
            self.events.append(("end", ctx.run.plan.cell.id, spec.name))

        before(monkeypatch, StepKind.BUILD, start, after=end)


def test_the_next_cell_of_a_variant_builds_a_recipe_once_the_cell_before_it_has(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, recipes: Recipes
) -> None:
    """Two Pythons of one variant: the second cell reaches its build of a while the first
    still builds a, waits, and says so; each of its builds starts after the first cell's of
    that recipe ended, and counts it (its compiler cache's server restarts on it)."""
    box = two_recipes(tmp_path, pythons=(PYTHON, OTHER_PYTHON))
    cells = [box.cell("cpu"), box.cell("cpu", OTHER_PYTHON)]
    waiting, says = threading.Event(), UI.waiting

    def wait_said(ui: UI, step: Step, what: str) -> None:
        waiting.set()
        says(ui, step, what)

    monkeypatch.setattr(UI, "waiting", wait_said)
    # The first cell builds a until the second says it waits for that build.
    builds = Around(monkeypatch, on_start=lambda cell: cell == cells[0] and waiting.wait(WAIT))
    for key, value in box.environ().items():
        monkeypatch.setenv(key, value)
    result = cli(
        "--recipes",
        str(box.recipes),
        "build",
        "--cell",
        cells[0],
        "--cell",
        cells[1],
        "--recipe",
        "b",
        "--no-publish",
        "--engine",
        "none",
    )
    assert result.code == 0, result.out + result.err
    assert f"a/build waits for {cells[0]}'s build of a, whose compiles it takes from the cache" in result.out, (
        result.out
    )
    for recipe in ("a", "b"):
        assert builds.events.index(("end", cells[0], recipe)) < builds.events.index(("start", cells[1], recipe)), (
            builds.events
        )
    assert builds.before == {cells[0]: [0, 0], cells[1]: [1, 2]}, "the second cell's builds see the first's ended"


def test_ctrl_c_in_the_next_cell_stops_the_steps_of_the_cell_still_ending(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    sleeping = threading.Event()

    def test_b(ctx: StepContext, spec: RecipeSpec) -> None:  # a real command, which Ctrl-C must stop
        if spec.name == "b" and ctx.run.plan.cell.id.startswith("cpu"):
            sleeping.set()
            ctx.where.runner.run(["sleep", str(int(WAIT * 2))], env=base_environment([]), log=ctx.log)

    def build_a(ctx: StepContext, spec: RecipeSpec) -> None:
        if spec.name == "a" and ctx.run.plan.cell.id.startswith("cuda130"):
            assert sleeping.wait(WAIT)
            time.sleep(0.5)  # its command has started
            raise KeyboardInterrupt

    before(monkeypatch, StepKind.INSTALL_TEST, test_b)
    before(monkeypatch, StepKind.BUILD, build_a)
    started = time.monotonic()
    result, cells = two_cells(cli, monkeypatch, sandbox)
    assert time.monotonic() - started < WAIT
    assert result.code == Interrupted.exit_code, result.out + result.err
    first = json.loads((sandbox.output / cells[0] / "report.json").read_text())
    assert {(s["recipe"], s["step"]): s["status"] for s in first["steps"]}["b", "install-test"] == "interrupted"
    assert re.fullmatch(r"2 cells in \d+\.\ds: 2 interrupted", result.out.splitlines()[-1]), result.out
    (error,) = result.err.splitlines()  # the run's one line: the cell that Ctrl-C reached
    assert error.startswith(f"wheelmill: error: {cells[1]}: interrupted during a/build; fix: ")
    assert "FAILED" not in result.out


def test_a_run_of_one_cell_ends_with_its_own_summary(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    result, _steps = build(cli, monkeypatch, sandbox)
    assert result.code == 0, result.out + result.err
    *_, summary, then = result.out.splitlines()
    assert summary.startswith(f"{sandbox.cell('cpu')}: ok in ") and " cells in " not in result.out
    assert then.startswith("next: ") and sandbox.cell("cpu") in then, then  # the command to run next


def test_the_summary_says_what_was_built_in_a_few_lines_and_the_steps_table_is_behind_v(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, recipes: Recipes
) -> None:
    """By default a cell ends with what failed, warned, was slow or was built, never the
    table of every step; ``-v`` shows it."""
    shown = on_b(cli, monkeypatch, sandbox)
    assert shown.code == 0, shown.out + shown.err
    summary = shown.out[shown.out.index("wheel a: ") :].splitlines()
    assert "┃ recipe" not in shown.out and "│ a  " not in shown.out, "no steps table by default"
    assert summary[0].startswith("wheel a: a-1.0-") and ", sha256 " in summary[0]
    assert summary[1].startswith("wheel b: b-1.0-")
    assert any(line.startswith(f"{sandbox.cell('cpu')}: ok in ") and "(-v: every step)" in line for line in summary)
    assert len(summary) <= 6, summary  # the wheels, the compiler cache, the cell's line, what to run next
    verbose = cli("--recipes", str(sandbox.recipes), "build", "--cell", sandbox.cell("cpu"), "--recipe", "b",
                  "--no-publish", "--engine", "none", "-v")  # fmt: skip
    assert verbose.code == 0 and "┃ recipe" in verbose.out and "│ a  " in verbose.out
    assert "(-v: every step)" not in verbose.out


def test_the_progress_line_names_the_phase_not_a_compilers_underline() -> None:
    """What the spinner and CI's heartbeat say a long step is doing: its phase in words, kept
    over lines that say nothing of it; a line with words where none names a phase."""
    ui = UI(Console(file=io.StringIO()))
    for line in ("STEP 3/9: RUN apt-get update -qq", "gcc -c ./Modules/_ssl.c -o Modules/_ssl.o", "  | ^~~~~~~~"):
        ui.line(line)
    assert ui.doing() == "compiling CPython into the builder image (once a base)"
    other = UI(Console(file=io.StringIO()))
    for line in ("warning: unused variable 'x'", "  |     ^~~~"):
        other.line(line)
    assert other.doing() == "warning: unused variable 'x'"
    other.line("[7/70] nvcc -c kernels.cu")
    assert other.doing() == "compiling: 7 of 70"
