"""Debian's docker-registry on a loopback port of its own, for push and pull tests."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.ports import free_port


@contextmanager
def loopback_registry(directory: Path) -> Iterator[str]:
    """A registry storing under ``directory``, for the block; its ``127.0.0.1:port``.
    Skips the test where docker-registry is not installed."""
    binary = shutil.which("docker-registry", path="/usr/bin:/usr/sbin")
    if binary is None:
        pytest.skip("docker-registry is not installed (scripts/setup --system installs it)")
    address = f"127.0.0.1:{free_port()}"
    config = directory / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {directory / 'store'}\nhttp:\n  addr: {address}\n"
    )
    server = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield address
    finally:
        server.terminate()
        server.wait(timeout=10)
