"""What the benchmarks share: a command timed into a log, wheelmill run from this checkout,
and a work directory that a failed command keeps.

A benchmark whose command fails stops with exit status 1, naming the command and its exit
status, and the last lines of its log, not a traceback; the work directory (log, output
roots, reports) stays for a look, where a passing benchmark removes it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAIL = 15  # lines of a failed command's log that are shown
KEEP_WORK = "WHEELMILL_BENCHMARK_KEEP_WORK"


class RunFailed(Exception):
    def __init__(self, argv: Sequence[str], returncode: int, log: Path) -> None:
        super().__init__(f"{shlex.join(argv)} exited {returncode}")
        self.argv, self.returncode, self.log = list(argv), returncode, log


def timed(argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> float:
    """Seconds ``argv`` ran, its output appended to ``log`` between the command line and
    its exit status and seconds."""
    with log.open("a") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        started = time.monotonic()
        done = subprocess.run(list(argv), env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
        elapsed = time.monotonic() - started
        out.write(f"# exit status {done.returncode} after {elapsed:.1f} s\n")
    if done.returncode != 0:
        raise RunFailed(argv, done.returncode, log)
    return elapsed


def wheelmill(args: Sequence[str], *, output: Path, log: Path, env: Mapping[str, str] | None = None) -> float:
    """Seconds ``wheelmill ARGS`` ran from this checkout into output root ``output``, whose
    own index (``<output>/index``) is what it publishes to, whatever this shell names."""
    own = {key: value for key, value in os.environ.items() if key != "WHEELMILL_INDEX_ROOT"}
    environment = {**own, "WHEELMILL_OUTPUT": str(output), **(env or {})}
    return timed([sys.executable, "-m", "wheelmill", *args], log=log, env=environment, cwd=ROOT)


def cpu_seconds() -> float:
    """User and system time of this process's finished children, theirs included: a build's
    compilers, and the compiler cache's server, which the cell runs in the foreground."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def broken(what: str) -> int:
    """A benchmark whose result is wrong (the thing measured did not happen as it must): said
    on stderr, exit status 1. A benchmark measures, but a broken result is no figure."""
    print(f"benchmark broken: {what}", file=sys.stderr)
    return 1


def cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0))


def free_port() -> int:
    """A TCP port nothing listens on now, on loopback, for a server the benchmark starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(answers: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Until a server the benchmark started answers; one that never does is a broken
    benchmark (exit status 1), not a figure."""
    deadline = time.monotonic() + seconds
    while not answers():
        if time.monotonic() > deadline:
            raise SystemExit(broken(f"{what} never answered"))
        time.sleep(0.1)


def empty_compiler_cache(output: Path) -> None:
    """Empty the compiler cache a build into output root ``output`` uses (sccache's local
    disk cache, ``<output>/.cache/sccache``), leaving the other caches as they are."""
    shutil.rmtree(output / ".cache" / "sccache", ignore_errors=True)


@contextlib.contextmanager
def workspace(prefix: str) -> Iterator[Path]:
    """A fresh work directory, removed when the benchmark passes, or kept and named where
    ``WHEELMILL_BENCHMARK_KEEP_WORK`` is 1 (for a caller that reads what the benchmark made:
    a test of the same builds). A command that fails ends the benchmark here: exit status 1,
    its log's last lines, and the directory kept."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    except RunFailed as failed:
        lines = failed.log.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL:]
        print(f"benchmark stopped: {failed}", file=sys.stderr)
        print(f"the last lines of {failed.log}:", *(f"  {line}" for line in lines), sep="\n", file=sys.stderr)
        print(f"kept for a look: {root}", file=sys.stderr)
        raise SystemExit(1) from None
    if os.environ.get(KEEP_WORK) == "1":
        print(f"work directory kept: {root}")
        return
    shutil.rmtree(root, ignore_errors=True)
