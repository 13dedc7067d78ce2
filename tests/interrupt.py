"""Ctrl-C in the middle of a compile: start a build, wait until its build log shows the
compiler at work, send SIGINT, and collect the exit status and stderr."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def interrupt_mid_compile(command: Sequence[str], *, cwd: Path, env: Mapping[str, str], build_log: Path, wait: float, stop_within: float) -> tuple[int, str]:
    """SIGINT to ``command`` once ``build_log`` shows ``c++`` (waiting at most ``wait`` s);
    its exit status and stderr, which must come within ``stop_within`` s."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not (build_log.exists() and "c++" in build_log.read_text(errors="replace")):
        time.sleep(0.5)
    if not build_log.exists():
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the build step did not start within {wait:.0f} s")
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=stop_within)
    return proc.returncode, err
