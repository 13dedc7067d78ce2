"""Ctrl-C in the middle of a compile: start a build, wait until its build log shows the
compiler at work, send SIGINT, and collect the exit status and stderr."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_mid_compile(
    command: Sequence[str], *, cwd: Path, env: Mapping[str, str], build_log: Path, wait: float, stop_within: float
) -> tuple[int, str]:
    """SIGINT to ``command`` once ``build_log`` shows ``c++`` (waiting at most ``wait`` s);
    its exit status and stderr, which must come within ``stop_within`` s. The log's name may
    be a pattern (``*-example-cpp-ops-build.log``: steps are numbered by their position)."""
    # A run started in the background (`cmd &` in a script) inherits SIGINT ignored, and
    # Python then never raises KeyboardInterrupt: the build gets Ctrl-C's default, as a
    # terminal would give it.
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,  # noqa: PLW1509 - no threads here
    )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not _compiling(build_log):
        time.sleep(0.5)
    if proc.poll() is not None:
        raise AssertionError(f"the command ended (exit {proc.returncode}) before its compile could be interrupted")
    if not list(build_log.parent.glob(build_log.name)):
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the build step did not start within {wait:.0f} s")
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=stop_within)
    return proc.returncode, err


def _compiling(build_log: Path) -> bool:
    return any("c++" in log.read_text(errors="replace") for log in build_log.parent.glob(build_log.name))
