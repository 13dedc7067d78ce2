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


def interrupt_mid_compile(command: Sequence[str], *, cwd: Path, env: Mapping[str, str], build_log: Path, wait: float, stop_within: float) -> tuple[int, str]:
    """SIGINT to ``command`` once ``build_log`` shows ``c++`` (waiting at most ``wait`` s);
    its exit status and stderr, which must come within ``stop_within`` s."""
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
    while time.monotonic() < deadline and not (build_log.exists() and "c++" in build_log.read_text(errors="replace")):
        time.sleep(0.5)
    if proc.poll() is not None:
        raise AssertionError(f"the command ended (exit {proc.returncode}) before its compile could be interrupted")
    if not build_log.exists():
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the build step did not start within {wait:.0f} s")
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=stop_within)
    return proc.returncode, err
