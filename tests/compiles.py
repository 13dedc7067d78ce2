"""The run's compiler cache. A dozen integration tests build the same recipes in the same
cells (example-cpp-ops and example-cuda-ops in cpu-py311 and the cuda130-sm90 cells,
torchsort), each into an output root of its own, so each compiled the same sources from an
empty cache. They compile through a shared tier of the run's own instead, as a fleet's
runners do: Debian's redis-server on loopback, started by the run's controller before the
workers (which inherit its address in ``RUN_CACHE``) and killed at the end, given to the
integration tests as ``WHEELMILL_COMPILER_CACHE_TIERS=disk,redis``. What one test compiled,
the next that compiles the same translation unit with the same flags takes from Redis; a
test's build still runs every step, and its wheel is the same bytes.

The tests whose compiles must happen, or that count or time them, keep the tiers their
own settings give them, marked ``own_compiler_cache``: the reproducibility tests (each clone
must compile for its bytes to prove anything), the compiler cache's own tests, and the
benchmarks (whose figures are their own compiles). The engine tests keep theirs
too: their builds run in containers, whose network the tier would have to reach.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

from tests.redis import redis_binary, serving_redis

RUN_CACHE = "WHEELMILL_TESTS_COMPILER_CACHE"  # redis://127.0.0.1:port, set by the controller


def run_cache() -> str | None:
    """The run's shared tier (``redis://127.0.0.1:port``), or None where none was started."""
    return os.environ.get(RUN_CACHE) or None


class RunCache:
    """The controller's: the run's Redis for the whole run, gone at its end."""

    def __init__(self) -> None:
        self.stack = ExitStack()

    def start(self) -> None:
        binary = redis_binary()
        if binary is None:  # no shared tier: each test compiles into its own cache, as before
            return
        server = self.stack.enter_context(serving_redis(binary))
        os.environ[RUN_CACHE] = server.url
        self.stack.callback(os.environ.pop, RUN_CACHE, None)

    def pytest_unconfigure(self) -> None:
        self.stack.close()
