"""The suite's own compiler cache tier (tests/compiles.py): kept between runs in one bounded
file, loaded by the next run, and said in the run's summary; kept by no run where
WHEELMILL_TESTS_KEEP_COMPILES=0 says so."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.compiles import LIMIT, RunCache, kept_file, run_cache
from tests.redis import Redis, redis_binary

pytestmark = pytest.mark.integration


def _maxmemory(server: Redis) -> int:
    """CONFIG GET's answer, read to the end (the inline reply helper reads its first line)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection:
        connection.sendall(b"CONFIG GET maxmemory\r\nQUIT\r\n")
        reply = b""
        while chunk := connection.recv(4096):
            reply += chunk
    return int(reply.decode().split("\r\n")[4])


def _run(monkeypatch: pytest.MonkeyPatch, cache_home: Path, entries: int) -> tuple[int, str]:
    """A run of the suite's tier: what it found at the start, and its summary after the run
    wrote ``entries`` more."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    cache = RunCache()
    cache.start()
    try:
        assert cache.server is not None and run_cache() == cache.server.url
        bound = 2 * 1024**3 if cache.kept else 0  # a tier kept by no run holds one run's alone
        assert _maxmemory(cache.server) == bound and LIMIT == "2gb"
        for n in range(entries):
            assert cache.server.command("SET", f"key-{cache.at_start + n}", "object") == "+OK"
        return cache.at_start, cache.summary(cache.server.size())
    finally:
        cache.pytest_unconfigure()


def test_the_tier_is_kept_for_the_next_run_and_its_summary_says_what_it_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if redis_binary() is None:
        pytest.skip("redis-server is not installed (scripts/setup --system installs it)")
    monkeypatch.delenv("WHEELMILL_TESTS_KEEP_COMPILES", raising=False)
    found, summary = _run(monkeypatch, tmp_path / "cache", 3)
    kept = tmp_path / "cache" / "wheelmill-tests" / "compiles.rdb"
    assert found == 0 and kept.is_file() and kept_file() == kept
    assert "found 0 entries at the start, the run added 3; kept in " in summary and str(kept) in summary
    found, summary = _run(monkeypatch, tmp_path / "cache", 2)
    assert found == 3 and "found 3 entries at the start, the run added 2" in summary
    assert sorted(p.name for p in kept.parent.iterdir()) == ["compiles.rdb"], "nothing else left there"
    # A new machine's run: an empty tier, and nothing written.
    monkeypatch.setenv("WHEELMILL_TESTS_KEEP_COMPILES", "0")
    found, summary = _run(monkeypatch, tmp_path / "other", 4)
    assert found == 0 and "kept by no run (WHEELMILL_TESTS_KEEP_COMPILES=0)" in summary
    assert not (tmp_path / "other").exists()
