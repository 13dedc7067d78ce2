"""Debian's redis-server on a loopback port of its own, for the compiler cache's shared tier:
its working directory a temporary one, killed afterwards; nothing persisted, unless it is
given a file to load at the start and save at the end (the run's compiler cache)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port

STARTUP = 60.0  # seconds: a kept cache of gigabytes is loaded before the server answers


@dataclass(frozen=True, kw_only=True)
class Redis:
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def command(self, *words: str, timeout: float = 5) -> str:
        """One command in Redis's inline form, its reply's first line (``:3`` for DBSIZE)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as connection:
            connection.sendall((" ".join(words) + "\r\n").encode())
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = connection.recv(4096)
                if not chunk:
                    break
                reply += chunk
        return reply.decode().split("\r\n")[0]

    def size(self) -> int:
        """How many keys it holds (DBSIZE)."""
        return int(self.command("DBSIZE").lstrip(":"))


def redis_binary() -> str | None:
    return shutil.which("redis-server", path="/usr/bin:/usr/sbin:/usr/local/bin")


@contextmanager
def running_redis() -> Iterator[Redis]:
    """A redis-server of its own until the block ends. Skips the test where none is installed."""
    binary = redis_binary()
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/setup --system installs it)")
    with serving_redis(binary) as server:
        yield server


@contextmanager
def serving_redis(binary: str, *, kept: Path | None = None, limit: str = "2gb") -> Iterator[Redis]:
    """``binary`` serving on a loopback port of its own until the block ends. With ``kept``
    (a file): what it holds is loaded first, and saved there at the end; at most ``limit``
    of it, the least recently used keys evicted beyond that, so the file stays bounded."""
    work = Path(tempfile.mkdtemp(prefix="wheelmill-redis-"))
    server = Redis(port=free_port())
    argv = [binary, "--bind", "127.0.0.1", "--port", str(server.port), "--save", "", "--appendonly", "no"]
    argv += ["--logfile", str(work / "redis.log")]
    if kept is None:
        argv += ["--dir", str(work)]
    else:
        kept.parent.mkdir(parents=True, exist_ok=True)
        argv += ["--dir", str(kept.parent), "--dbfilename", kept.name]
        argv += ["--maxmemory", limit, "--maxmemory-policy", "allkeys-lru"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
    try:
        _wait_for(server, process, work / "redis.log")
        yield server
        if kept is not None:  # written to a file of its own, then renamed over the old one
            server.command("SAVE", timeout=600)
    finally:
        process.kill()
        process.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


def _wait_for(server: Redis, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited {process.returncode}: {_tail(log)}")
        try:
            if server.command("PING") == "+PONG":
                return
        except OSError:
            pass
        time.sleep(0.05)  # not yet listening, or still loading a kept cache
    raise RuntimeError(f"redis-server did not answer in {STARTUP:.0f}s: {_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError:
        return "no log"
