"""The run's CPU seconds per test. Two workers on two cores: a test's wall time says how long
it waited as much as what it cost, and the suite's time is bounded by the CPU its tests use
together. Each worker counts, for every phase of a test (setup, call, teardown), the user and
system seconds of its own process and of every process it started and waited for (a build's
compilers, pip, uv, nox); the controller adds them up and prints the tests that cost the most.
A container's processes are children of the engine's daemon or of conmon, not of the test:
their CPU is not counted, and an engine test's figure is a floor. A process is counted when
it is reaped: one a fixture keeps running for many tests (a server of the worker's) counts
in the test during which it ends, which may be a unit test that started nothing of it.
"""

from __future__ import annotations

import resource
from collections.abc import Generator

import pytest

KEY = "cpu-seconds"
SHOWN = 20


def _cpu() -> float:
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


class CpuTimes:
    """Registered on the workers (counting) and on the controller (adding up and printing)."""

    def __init__(self) -> None:
        self.tests: dict[str, float] = {}
        self.walls: dict[str, float] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from _counted(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from _counted(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from _counted(item, "teardown"))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        counted = [value for name, value in report.user_properties if name == f"{KEY}:{report.when}"]
        seconds = sum(value for value in counted if isinstance(value, float))
        self.tests[report.nodeid] = self.tests.get(report.nodeid, 0.0) + seconds
        self.walls[report.nodeid] = self.walls.get(report.nodeid, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.tests:
            return
        terminalreporter.section("CPU seconds per test")
        total = sum(self.tests.values())
        terminalreporter.write_line(f"{total:.0f} s of CPU in {len(self.tests)} tests (containers' own not counted)")
        for nodeid, seconds in sorted(self.tests.items(), key=lambda pair: -pair[1])[:SHOWN]:
            terminalreporter.write_line(f"{seconds:8.1f} s CPU {self.walls[nodeid]:8.1f} s wall  {nodeid}")


def _counted(item: pytest.Item, phase: str) -> Generator[None, None, None]:
    started = _cpu()
    try:
        return (yield)
    finally:
        # appended before pytest makes the phase's report, which carries it to the controller
        item.user_properties.append((f"{KEY}:{phase}", round(_cpu() - started, 2)))
