"""What a person sees: live progress while steps run, and a summary at the end.

On a terminal a spinner shows the running step, its elapsed time and its phase in words
(``phase_of``: bootstrapping the base, compiling CPython into the builder image, resolving
the env, compiling file 12 of 70), or where no line says one, the last line of its output
that says something; elsewhere (CI) each step prints a start and an end line and long steps
print a heartbeat with the same. Full output is always in the step's log file, never lost to
the screen.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.status import Status as Spinner
from rich.table import Table

from wheelmill.building.report import CellReport, StepRecord
from wheelmill.checks import Verdict
from wheelmill.config import format_duration, format_size
from wheelmill.inputs.variants import Family
from wheelmill.machine.process import TRACEBACK_MARK
from wheelmill.output.report import Status
from wheelmill.planning.spec import Step, StepKind
from wheelmill.terminal import make_console

HEARTBEAT = 60.0
# What a line of a step's output says the step is doing, in words: (pattern, phase). The
# first that matches wins; {0}, {1} are the pattern's groups.
PHASES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), phase)
    for pattern, phase in (
        (r"^I: (?:Retrieving|Validating|downloading)", "bootstrapping the base: fetching Debian's packages"),
        (r"^I: (?:Extracting|extracting|Unpacking|unpacking)", "bootstrapping the base: unpacking packages"),
        (r"^I: (?:Installing|installing|Configuring|configuring)", "bootstrapping the base: installing packages"),
        (r"^(?:STEP|Step) (\d+)/(\d+) ?:", "building the image: step {0} of {1}"),
        (r"^#\d+ \[[^\]]*?(\d+)/(\d+)\]", "building the image: step {0} of {1}"),
        (
            r"^checking (?:for|whether|if|how) ",
            "configuring CPython to compile it into the builder image (once a base)",
        ),
        (
            r"(?:^|[\s/])(?:Python|Modules|Objects|Parser)/\S+\.c\b",
            "compiling CPython into the builder image (once a base)",
        ),
        (r"^(?:Get:\d+|Unpacking |Setting up |Selecting previously)", "installing the image's Debian packages"),
        (r"^Resolved (\d+) packages?", "resolving the env: {0} packages"),
        (r"^(?:Prepared|Installed) (\d+) packages?", "installing the env: {0} packages"),
        (r"^\[(\d+)/(\d+)\] ", "compiling: {0} of {1}"),
        (r"^building '([^']+)' extension", "compiling the extension {0}"),
        (r"\bnvcc\b.* -c \S*?([^/\s]+\.cu)\b", "compiling {0} (nvcc)"),
        (r"\b(?:gcc|g\+\+|c\+\+|clang\+*)\b.* -c \S*?([^/\s]+\.(?:c|cc|cpp|cxx))\b", "compiling {0}"),
        (r"^(?:INFO:auditwheel|auditwheel)", "repairing the wheel (auditwheel)"),
        (r"^collected (\d+) items?", "running {0} tests"),
        (r"^Successfully built ", "wheel built"),
    )
)
MEANINGFUL = re.compile(r"[A-Za-z]{3}")  # a line with a word in it, not a caret's underline


def phase_of(line: str) -> str | None:
    """What a line of a step's output says the step is doing, in words; None where it says nothing of it.

    >>> phase_of("STEP 3/7: RUN apt-get update"), phase_of("[12/70] /usr/bin/nvcc -c a.cu"), phase_of("  | ^~~~")
    ('building the image: step 3 of 7', 'compiling: 12 of 70', None)
    >>> phase_of("gcc -pthread -c ./Modules/_ssl.c -o Modules/_ssl.o")
    'compiling CPython into the builder image (once a base)'
    >>> phase_of("Resolved 42 packages in 1.2s"), phase_of("I: Retrieving libc6 2.36-9")
    ('resolving the env: 42 packages', "bootstrapping the base: fetching Debian's packages")
    """
    text = line.strip()
    for pattern, phase in PHASES:
        found = pattern.search(text)
        if found:
            return phase.format(*found.groups())
    return None


_MARK = {
    Status.OK: "[green]ok[/]",
    Status.FAILED: "[red]FAILED[/]",
    Status.SKIPPED: "[dim]skipped[/]",
    Status.INTERRUPTED: "[yellow]interrupted[/]",
    Status.PUBLISHED: "[cyan]published[/]",
    Status.REUSED: "[cyan]reused[/]",
    Status.FROM_GROUP: "[cyan]from group[/]",
}
_NOT_STARTED = "[dim]not started[/]"  # a cell after one that Ctrl-C stopped, or that could not start
_VERDICT = {
    Verdict.PASS: "[green]pass[/]",
    Verdict.FAIL: "[red]FAIL[/]",
    Verdict.WARN: "[yellow]warn[/]",
    Verdict.SKIP: "[dim]skip[/]",
}


class HeldOutput:
    """A stream that keeps what a cell writes while the run's cell before it ends on a thread
    (its last steps' lines and its summary come first), then writes it, and writes through."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream, self._holding, self._lock = stream, True, threading.Lock()
        self._kept: list[str] = []

    def write(self, text: str) -> int:
        with self._lock:
            if self._holding:
                self._kept.append(text)
            else:
                self._stream.write(text)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if not self._holding:
                self._stream.flush()

    def release(self) -> None:
        with self._lock:
            self._holding = False
            self._stream.write("".join(self._kept))
            self._kept.clear()
            self._stream.flush()

    def isatty(self) -> bool:  # a spinner once it writes through, not into what it keeps
        return not self._holding and self._stream.isatty()


def held_console(console: Console) -> tuple[Console, HeldOutput]:
    """A console for the run's next cell, as wide as ``console``, whose output is held until
    ``release``."""
    held = HeldOutput(console.file)
    return Console(file=held, width=console.width, highlight=False, soft_wrap=False), held  # type: ignore[arg-type]


SLOW_SHARE = 0.1  # a step that took at least this share of its cell's time, and SLOW_SECONDS, is slow
SLOW_SECONDS = 10.0


class UI:
    def __init__(self, console: Console | None = None, *, verbose: bool = False) -> None:
        self.console = console or make_console()
        self.verbose = verbose  # the summary's whole tables (every step, every wheel's sha256)
        self._spinner: Spinner | None = None
        self._step: Step | None = None
        self._label = ""
        self._started = 0.0
        self._last_line = ""
        self._phase: str | None = None
        self._last_draw = 0.0
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._published: set[str | None] = set()  # recipes (None: the cell) said published

    @property
    def live(self) -> bool:
        """A spinner a step, not a line: on a terminal, but in CI."""
        return self.console.is_terminal and not os.environ.get("CI")

    def cell_started(self, cell: str, detail: str) -> None:
        self.console.print(f"[bold]wheelmill[/] build [bold]{cell}[/]: {escape(detail)}")

    def step_started(self, step: Step, index: int, total: int) -> None:
        self._step, self._started, self._last_line, self._phase = step, time.monotonic(), "", None
        self._label = step_label(step, index, total)
        if self.live:
            self._spinner = self.console.status(escape(self._label))
            self._spinner.start()
        else:
            self.console.print(f"> {escape(self._label)}: {escape(step.detail)}")
            self._stop.clear()
            self._beat = threading.Thread(target=self._heartbeat, daemon=True)
            self._beat.start()

    def line(self, text: str) -> None:
        self._phase = phase_of(text) or self._phase
        if MEANINGFUL.search(text):
            self._last_line = text.strip()
        now = time.monotonic()
        if self._spinner and now - self._last_draw > 0.1:
            self._last_draw = now
            elapsed = format_duration(now - self._started)
            self._spinner.update(f"{escape(self._label)} {elapsed}  [dim]{escape(self.doing()[:120])}[/]")

    def doing(self) -> str:
        """What the running step is doing: its phase in words, else its last line that says something."""
        return self._phase or self._last_line

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            elapsed = format_duration(time.monotonic() - self._started)
            self.console.print(f"  ... {escape(self._label)} running {elapsed}: {escape(self.doing()[:120])}")

    def retrying(self, attempt: int, error: Exception, pause: float) -> None:
        self.console.print(f"  [yellow]attempt {attempt} failed[/]: {escape(str(error))}; retrying in {pause:.1f}s")

    def step_beside(self, step: Step, index: int, total: int) -> None:
        """A step started on a thread beside the next ones: said now, its verdict (``verdict``) when it ends."""
        self.console.print(
            f"> {escape(step_label(step, index, total))}: {escape(step.detail)} [dim](beside the next steps)[/]"
        )

    def waiting(self, step: Step, what: str) -> None:
        """A step that waits for something before it starts (the run's cell before this one)."""
        self.console.print(f"[dim]{escape(step.id)} waits for {escape(what)}[/]")

    def step_finished(self, record: StepRecord) -> None:
        if self._spinner:
            self._spinner.stop()
            self._spinner = None
        self._stop.set()
        self.verdict(record, self._label)

    def verdict(self, record: StepRecord, label: str) -> None:
        tries = f", {record.attempts} attempts" if record.attempts > 1 else ""
        self.console.print(f"{_MARK[record.status]} {escape(label)} {format_duration(record.seconds)}{tries}")
        if record.error:
            self.console.print(f"  [red]{escape(record.error)}[/]")
        if record.status is Status.FAILED and record.log:
            self._tail(Path(record.log))

    def _tail(self, log: Path, lines: int = 25) -> None:
        try:
            text = log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return
        output = [line for line in text if not line.startswith(("# env ", TRACEBACK_MARK))][-lines:]
        if os.environ.get("GITHUB_ACTIONS"):
            print(f"::group::last lines of {log}", file=self.console.file, flush=True)
        self.console.print(f"  [dim]last lines of {escape(str(log))}:[/]")
        for line in output:
            self.console.print(f"  [dim]| {escape(line)}[/]")
        if os.environ.get("GITHUB_ACTIONS"):
            print("::endgroup::", file=self.console.file, flush=True)

    def skipped(self, step: Step, reason: str, *, status: Status = Status.SKIPPED) -> None:
        if status is Status.SKIPPED:
            self.console.print(f"[dim]skipped {escape(step.id)}: {escape(reason)}[/]")
        elif step.recipe not in self._published:  # once for its steps, not once a step
            self._published.add(step.recipe)
            self.console.print(f"{_MARK[status]} {escape(step.recipe or '(cell)')}: {escape(reason)}")

    def summary(self, report: CellReport) -> None:
        """What failed, warned, was slow or was built, and what was not built and why: a few
        lines (a run with nothing to build, three); with ``verbose`` the steps' and wheels'
        tables too."""
        failed = report.failed
        if failed is not None:  # the line that matters, before the table
            self.console.print(
                f"{_MARK[failed.status]} {escape(failed.step.id)}: {escape(failed.error or failed.status)}"
            )
        if self.verbose:
            self.console.print(self._steps_table(report))
            self._skipped(report)
        else:
            self._slow(report)
        built = self._built(report)
        if report.wheels and (self.verbose or built):
            self.console.print(self._wheels_table(report) if self.verbose else built)
        self._not_built(report)
        caches = report.compiler_cache
        if caches:
            self.console.print(_cache_table(caches) if self.verbose else _cache_line(caches))
        for record, check in ((r, c) for r in report.steps for c in r.checks if c.verdict is Verdict.WARN):
            fix = f"; fix: {check.fix}" if check.fix else ""
            self.console.print(
                f"[yellow]warn[/] {escape(record.step.id)}: {escape(check.name)}: {escape(check.detail + fix)}"
            )
        self._untested(report)
        self._unsigned(report)
        status = _MARK[report.status]
        more = "" if self.verbose else " (-v: every step)"
        self.console.print(
            f"{report.plan.cell.id}: {status} in {format_duration(report.seconds)} ({escape(_where(report))}); "
            f"report {escape(str(report.path))}{more}"
        )

    def _skipped(self, report: CellReport) -> None:
        skipped = [r for r in report.steps if r.status is Status.SKIPPED]
        if skipped:
            why = Counter(r.error or "not run" for r in skipped).most_common(1)[0][0]
            self.console.print(
                f"[dim]{len(skipped)} steps skipped (not in the table), from {escape(skipped[0].step.id)} on: "
                f"{escape(why)}[/]"
            )

    def _slow(self, report: CellReport) -> None:
        """The steps that took most of the cell's time, slowest first (three at most)."""
        total = max(report.seconds, 1e-9)
        slow = sorted(
            (r for r in report.steps if r.seconds >= SLOW_SECONDS and r.seconds / total >= SLOW_SHARE),
            key=lambda r: -r.seconds,
        )[:3]
        if slow:
            said = ", ".join(f"{escape(r.step.id)} {format_duration(r.seconds)}" for r in slow)
            self.console.print(f"slowest: {said}")

    def _built(self, report: CellReport) -> str:
        """A line a wheel built here: its recipe, file, size and sha256's start (one published,
        reused or taken from its group says so below, by name)."""
        lines = [
            f"wheel {escape(recipe)}: {escape(wheel.name)} ({format_size(wheel.size)}, sha256 {wheel.sha256[:12]})"
            for recipe, wheel in report.wheels.items()
            if report.recipe_status(recipe) is Status.OK
        ]
        return "\n".join(lines)

    def _not_built(self, report: CellReport) -> None:
        published = report.recipes_with(Status.PUBLISHED)
        if published:
            names = ", ".join(published)
            again = "--rebuild builds them again, --rebuild RECIPE one of them"
            self.console.print(
                f"not built again, published in channel {report.plan.channel} for their build keys: {names} ({again})"
            )
        reused = report.recipes_with(Status.REUSED)
        if reused:
            self.console.print(
                f"not built again, fetched from the served index (sha256 checked) for their build keys: "
                f"{', '.join(reused)} ({report.plan.choices.served_index})"
            )
        grouped = report.recipes_with(Status.FROM_GROUP)
        if grouped:
            self.console.print(
                f"not built here, taken from their group build in another channel of their ABI group: "
                f"{', '.join(grouped)} (checked, tested in a corner or where this torch's channel lacked it, "
                f"and published in {report.plan.channel})"
            )

    def _unsigned(self, report: CellReport) -> None:
        """Wheels delivered without signed provenance: said once, with the line that signs here
        (a pass would promise what ``wheelmill verify`` refuses)."""
        unsigned = [c for r in report.steps for c in r.checks if c.name == "provenance" and c.verdict is Verdict.SKIP]
        if unsigned:
            self.console.print(f"[dim]unsigned[/] {len(unsigned)} wheel(s): {escape(unsigned[0].detail)}")

    def _untested(self, report: CellReport) -> None:
        """Smoke commands that skipped tests: counted apart from passes, with where they run."""
        skipped = [(r, c) for r in report.steps for c in r.checks if c.name == "smoke" and c.verdict is Verdict.SKIP]
        for record, check in skipped:
            self.console.print(f"[dim]skip[/] {escape(record.step.id)}: smoke: {escape(check.detail)}")
        if skipped and report.plan.cell.variant.family is not Family.CPU:
            self.console.print(
                f"{len(skipped)} smoke command(s) skipped tests, not counted as passed; on a GPU machine "
                f"`wheelmill test-gpu --cell {report.plan.cell.id}` runs the recipes' GPU checks"
            )

    def run_summary(self, reports: Sequence[CellReport], seconds: float, *, not_started: Sequence[str] = ()) -> None:
        """After a run of several cells: a row a cell (each one's own summary is above), those
        an interruption kept from starting included, and a line that counts them."""
        table = Table(title="cells", title_justify="left")
        for column in ("cell", "status", "time", "built", "published", "from group", "compiler cache", "failed step"):
            table.add_column(column, overflow="fold")
        for report in reports:
            table.add_row(*_cell_row(report))
        for cell in not_started:
            table.add_row(cell, _NOT_STARTED, *("-" for _ in range(6)))
        self.console.print(table)
        counts = Counter(report.status for report in reports)
        said = [f"{counts[status]} {mark}" for status, mark in _MARK.items() if counts[status]]
        said += [f"{len(not_started)} {_NOT_STARTED}"] if not_started else []
        self.console.print(f"{len(reports) + len(not_started)} cells in {format_duration(seconds)}: {', '.join(said)}")

    def next_steps(self, reports: Sequence[CellReport]) -> None:
        """After a run that ended ok: the command a user runs next, where its wheels went."""
        channels = sorted({r.plan.channel for r in reports if any(s.kind is StepKind.PUBLISH for s in r.plan.steps)})
        if channels:
            configs = "; ".join(f"wheelmill index config --channel {channel}" for channel in channels)
            self.console.print(
                f"next: `wheelmill index serve` serves the index over HTTP, and `{configs}` prints the pip and uv "
                "settings that install from it",
                soft_wrap=True,
            )
            return
        folders = ", ".join(escape(str(r.path.parent / "dist")) for r in reports)
        self.console.print(
            f"next: the wheels are in {folders} (not published: `wheelmill publish` adds them)", soft_wrap=True
        )

    def _steps_table(self, report: CellReport) -> Table:
        table = Table(title=f"{report.plan.cell.id} ({_where(report)})", title_justify="left")
        for column in ("recipe", "step", "status", "time", "tries", "checks"):
            table.add_column(column, overflow="fold")
        for record in (r for r in report.steps if r.status is not Status.SKIPPED):
            checks = ", ".join(f"{c.name} {_VERDICT[c.verdict]}" for c in record.checks)
            table.add_row(
                record.step.recipe or "(cell)",
                str(record.step.kind),
                _MARK[record.status],
                format_duration(record.seconds),
                str(record.attempts),
                checks or escape(record.error or ""),
            )
        return table

    def _wheels_table(self, report: CellReport) -> Table:
        table = Table(title="wheels", title_justify="left")
        for column in ("recipe", "wheel", "size", "sha256"):
            table.add_column(column, overflow="fold")
        for recipe, wheel in report.wheels.items():
            table.add_row(recipe, wheel.name, format_size(wheel.size), wheel.sha256)
        return table


def _cell_row(report: CellReport) -> tuple[str, ...]:
    cache = _cache_summary(list(report.compiler_cache.values()))
    failed = report.failed
    return (
        report.plan.cell.id,
        _MARK[report.status],
        format_duration(report.seconds),
        f"{len(report.recipes_with(Status.OK))} of {len(report.plan.recipes)}",
        ", ".join(report.recipes_with(Status.PUBLISHED) + report.recipes_with(Status.REUSED)) or "-",
        ", ".join(report.recipes_with(Status.FROM_GROUP)) or "-",
        cache,
        escape(failed.step.id) if failed else "-",
    )


def _cache_summary(stats: Sequence[Mapping[str, Any]]) -> str:
    """The cell's builds' compiler cache in a few words: ``12 hits (disk 3, s3 9), 0 misses, read-only``.

    >>> _cache_summary([{"hits": 2, "misses": 1, "hits_by_tier": {"disk": 2, "s3": 0}},
    ...                 {"hits": 3, "misses": 0, "hits_by_tier": {"disk": 1, "s3": 2}, "read_only": True}])
    '5 hits (disk 3, s3 2), 1 misses, read-only'
    >>> _cache_summary([])
    '-'
    """
    if not stats:
        return "-"
    tiers: Counter[str] = Counter()
    for one in stats:
        tiers.update(one.get("hits_by_tier") or {})
    by_tier = f" ({_tier_list(tiers)})" if tiers else ""
    read_only = ", read-only" if any(one.get("read_only") for one in stats) else ""
    return f"{sum(s['hits'] for s in stats)} hits{by_tier}, {sum(s['misses'] for s in stats)} misses{read_only}"


def _cache_line(caches: Mapping[str, Mapping[str, Any]]) -> str:
    """The builds' compiler cache in a line: ``compiler cache: 12 hits (disk 3, s3 9), 0 misses``."""
    return f"compiler cache: {_cache_summary(list(caches.values()))}"


def _tier_list(tiers: Mapping[str, int]) -> str:
    return ", ".join(f"{tier} {n}" for tier, n in tiers.items())


def _cache_table(caches: Mapping[str, Mapping[str, Any]]) -> Table:
    """Each build's compiler cache hits and misses (the build's counters, zeroed before it),
    and which tier served its hits (where the server ran a chain of them)."""
    table = Table(title="compiler cache", title_justify="left")
    for column in ("recipe", "hits", "misses", "by tier", "cache"):
        table.add_column(column, overflow="fold")
    for recipe, stats in caches.items():
        said = [_tier_list(stats.get("hits_by_tier") or {}), "read-only" if stats.get("read_only") else ""]
        tiers = ", ".join(filter(None, said)) or "-"
        location = escape(str(stats.get("location", "")))
        table.add_row(recipe, str(stats["hits"]), str(stats["misses"]), tiers, location)
    return table


def step_label(step: Step, index: int, total: int) -> str:
    return f"[{index}/{total}] {step.id}"


def _where(report: CellReport) -> str:
    """``podman``, or ``podman, aarch64 emulated``: what ran the cell's code."""
    platform = report.facts["platform"]
    emulated = f", {platform['target']} emulated" if platform["execution"] == "emulated" else ""
    return f"{report.plan.engine}{emulated}"
