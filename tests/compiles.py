"""The run's compiler cache. A dozen integration tests build the same recipes in the same
cells (example-cpp-ops and example-cuda-ops in cpu-py311 and the cuda130-sm90 cells,
torchsort), each into an output root of its own, so each compiled the same sources from an
empty cache. They compile through a shared tier of the run's own instead, as a fleet's
runners do: Debian's redis-server on loopback, started by the run's controller before the
workers (which inherit its address in ``RUN_CACHE``) and killed at the end, given to the
integration tests as ``WHEELMILL_COMPILER_CACHE_TIERS=disk,redis``. What one test compiled,
the next that compiles the same translation unit with the same flags takes from Redis; a
test's build still runs every step, and its wheel is the same bytes.

The tier outlives the run, as a CI cache of a compiler cache does: Redis loads it from
``~/.cache/wheelmill-tests/compiles.rdb`` (under ``XDG_CACHE_HOME`` where that is set) at the
start and saves it there at the end, at most 2 GiB of it, the least recently used entries
evicted beyond that. A translation unit compiled by an earlier run with the same compiler,
flags and preprocessed input is a hit; anything else compiles. ``WHEELMILL_TESTS_KEEP_COMPILES=0``
starts from an empty tier and keeps nothing (a new machine's run); the run's summary says
what the tier held at the start and what the run added, so that a run that took its
compiles from an earlier one is not mistaken for one that compiled everything.

The tests whose compiles must happen, or that count or time them, keep the tiers their
own settings give them, marked ``own_compiler_cache``: the reproducibility tests (each clone
must compile for its bytes to prove anything), the compiler cache's own tests, and the
benchmark smokes whose lines count hits and misses (cache, fleet), and the container tests
that count hits or interrupt a compile. The other engine tests compile through the tier too:
a cell's sccache server runs in its online container, which has the host's network, and
reaches the tier on loopback; their builds write to it and push no image
(``WHEELMILL_SHARED_WRITES=compiler-cache``, tests/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.redis import Redis, redis_binary, serving_redis

RUN_CACHE = "WHEELMILL_TESTS_COMPILER_CACHE"  # redis://127.0.0.1:port, set by the controller
KEEP = "WHEELMILL_TESTS_KEEP_COMPILES"  # "0": an empty tier, kept by no run
LIMIT = "2gb"


def kept_file(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where the tier is kept between runs; None where the runs keep none.

    >>> kept_file({"HOME": "/home/u"}), kept_file({"XDG_CACHE_HOME": "/c", "HOME": "/h"})
    (PosixPath('/home/u/.cache/wheelmill-tests/compiles.rdb'), PosixPath('/c/wheelmill-tests/compiles.rdb'))
    >>> kept_file({"HOME": "/h", "WHEELMILL_TESTS_KEEP_COMPILES": "0"}) is None
    True
    """
    if environ.get(KEEP, "1").strip() == "0":
        return None
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")) / ".cache")
    return Path(base).expanduser() / "wheelmill-tests" / "compiles.rdb"


def run_cache() -> str | None:
    """The run's shared tier (``redis://127.0.0.1:port``), or None where none was started."""
    return os.environ.get(RUN_CACHE) or None


class RunCache:
    """The controller's: the run's Redis for the whole run, saved where the next run finds
    it (``kept_file``) and stopped at its end; and the summary of what it held."""

    def __init__(self) -> None:
        self.stack = ExitStack()
        self.server: Redis | None = None
        self.kept: Path | None = None
        self.at_start = 0
        self.compiled = False  # a summary only where a test compiled through the tier

    def start(self) -> None:
        binary = redis_binary()
        if binary is None:  # no shared tier: each test compiles into its own cache, as before
            return
        self.kept = kept_file()
        self.server = self.stack.enter_context(serving_redis(binary, kept=self.kept, limit=LIMIT))
        self.at_start = self.server.size()
        os.environ[RUN_CACHE] = self.server.url
        self.stack.callback(os.environ.pop, RUN_CACHE, None)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        marks = report.keywords
        self.compiled = self.compiled or (
            "integration" in marks and "own_compiler_cache" not in marks and "engine" not in marks
        )

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.server is not None and self.compiled:
            terminalreporter.section("compiler cache")
            terminalreporter.write_line(self.summary(self.server.size()))

    def summary(self, at_end: int) -> str:
        """One line: the entries the tier held at the start and those the run added, and
        where they are kept for the next run."""
        where = (
            f"kept in {self.kept} for the next run (at most {LIMIT}; {KEEP}=0 keeps none)"
            if self.kept
            else f"kept by no run ({KEEP}=0)"
        )
        return (
            f"the integration tests' shared tier: found {self.at_start} entries at the start, "
            f"the run added {max(at_end - self.at_start, 0)}; {where}"
        )

    def pytest_unconfigure(self) -> None:
        self.stack.close()
