"""The compiler cache for real: a cell built twice into one output root compiles nothing the
second time (the cache benchmark's smoke, test_benchmarks.py, builds torchsort so and holds
its reports to that); a cache that cannot be reached is one warning and a build without it,
never a failed build; shared tiers (a real redis-server and S3 server) serve one runner what another
compiled, and a read-only build writes nothing to them. In the container, and for nvcc's
host and device steps: test_containers.py's second run, and the CUDA cell's test in
test_cells.py, which builds example-cuda-ops again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.objectstore import ObjectStore
from tests.redis import running_redis
from wheelmill.building.cache_tiers import Tiers
from wheelmill.building.compiler_cache import (
    CacheStats,
    CompilerCache,
    Server,
    read_stats,
    server_environment,
    zero_stats,
)
from wheelmill.machine.process import HostRunner, StepLog, base_environment
from wheelmill.machine.tools import sccache_bin

pytestmark = [pytest.mark.integration, pytest.mark.own_compiler_cache]  # it counts hits and misses
ROOT = Path(__file__).resolve().parent.parent.parent
CELL, RECIPE = "cpu-py311", "example-cpp-ops"


def build(
    output: Path, *, engine: str = "none", cell: str = CELL, recipe: str = RECIPE, **extra: str
) -> dict[str, Any]:
    """One recipe of a cell, not published (nothing would skip a rebuild), and not install-tested
    (the compiles are what is checked); its report."""
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output), "WHEELMILL_INSTALL_TESTS": "none", **extra}
    command = [
        sys.executable,
        "-m",
        "wheelmill",
        "build",
        "--cell",
        cell,
        "--recipe",
        recipe,
        "--engine",
        engine,
        "--no-publish",
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    report: dict[str, Any] = json.loads((output / cell / "report.json").read_text())
    report["stdout"] = done.stdout
    return report


def cache_checks(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (step["step"], check["verdict"], check["detail"])
        for step in report["steps"]
        for check in step["checks"]
        if check["name"] == "compiler-cache"
    ]


def test_an_unreachable_cache_is_one_warning_and_a_build_without_it(tmp_path: Path) -> None:
    report = build(tmp_path / "out", SCCACHE_REDIS_ENDPOINT="redis://127.0.0.1:1")
    assert report["status"] == "ok"
    checks = cache_checks(report)
    warnings = [c for c in checks if c[1] == "warn"]
    assert len(warnings) == 1 and warnings[0][0] == "compiler-cache", checks
    assert warnings[0][2].startswith("builds compile without it: the server did not answer within 15s")
    assert [c[1] for c in checks if c[0] == "build"] == ["skip"]
    assert report["facts"]["compiler_cache"][RECIPE] is None
    assert report["stdout"].count("warn compiler-cache: compiler-cache:") == 1  # one line under the summary
    assert (tmp_path / "out" / CELL / "logs" / "sccache-server.log").exists()


def test_a_server_finds_what_another_cells_server_cached_once_it_is_restarted(tmp_path: Path) -> None:
    """Two cells' servers on one local disk cache, as a run's cells side by side have them:
    one that has looked once misses what the other cached after that (it reads the cache's
    index once), and finds it once restarted, as a cell's build restarts it."""
    binary = sccache_bin()
    assert binary is not None
    for name in ("x", "y", "z"):
        (tmp_path / f"{name}.c").write_text(f"int {name}(int a) {{ return a * 3 + {len(name)}; }}\n")

    def compiled(server: Server, name: str) -> tuple[int, int]:
        """The hits and misses of one compile through ``server``."""
        cache = CompilerCache(binary=binary, socket=server.socket)
        assert zero_stats(cache, HostRunner()) is None
        env = base_environment([], {"SCCACHE_SERVER_UDS": str(server.socket)})
        done = subprocess.run(
            [str(binary), "gcc", "-c", f"{name}.c", "-o", f"{name}.o"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        stats = read_stats(cache, HostRunner())
        assert stats is not None
        return stats.total_hits, stats.total_misses

    def started(name: str) -> Server:
        env = server_environment({}, cache_dir=tmp_path / "cache", socket_path=tmp_path / f"{name}.sock")
        return servers.enter_context(
            Server(HostRunner(), binary=binary, env=env, log=log, output=tmp_path / f"{name}.log")
        )

    with StepLog(tmp_path / "log") as log, ExitStack() as servers:
        first, second = started("first"), started("second")
        assert compiled(second, "y") == (0, 1)  # its first lookup reads the index
        assert compiled(first, "x") == (0, 1) and compiled(first, "z") == (0, 1)
        assert compiled(second, "x") == (0, 1), "a server that has looked does not see what another cached since"
        assert second.refresh(log, seen=1) is None
        assert compiled(second, "z") == (1, 0), "restarted, it does"


def test_shared_tiers_serve_another_runner_and_a_read_only_build_writes_nothing(
    tmp_path: Path, object_store: ObjectStore
) -> None:
    """Servers started as the compiler-cache step starts them, each with local disk of its
    own (two runners), chain disk,redis,s3: what the first compiles, the second finds in a
    shared tier; a read-only one compiling a new file leaves the key counts of Redis and of
    the bucket as they were. ``pytest -s`` prints the figures."""
    binary = sccache_bin()
    assert binary is not None
    source = tmp_path / "src"
    source.mkdir()
    for name in ("first", "second"):
        (source / f"{name}.cpp").write_text(f"int {name}(int a) {{ return a * {len(name)} + 1; }}\n")
    prefix = f"cache-{uuid.uuid4().hex[:12]}"
    bucket = object_store.client()

    def objects() -> int:
        pages = bucket.get_paginator("list_objects_v2").paginate(Bucket=object_store.bucket, Prefix=f"{prefix}/")
        return sum(len(page.get("Contents", [])) for page in pages)

    with running_redis() as redis, StepLog(tmp_path / "log") as log, ExitStack() as servers:

        def runner(name: str, **choices: Any) -> Callable[[str], CacheStats]:
            tiers = Tiers(redis=redis.url, s3=object_store.url(prefix), toolkit="cpu", **choices)
            env = server_environment(
                object_store.environ(),
                cache_dir=tmp_path / name / "disk",
                socket_path=tmp_path / f"{name}.sock",
                tiers=tiers,
            )
            server = servers.enter_context(
                Server(HostRunner(), binary=binary, env=env, log=log, output=tmp_path / f"{name}.log")
            )
            assert server.failure is None, server.failure
            return lambda file: compiled(binary, server.socket, source, file)

        chain = ("disk", "redis", "s3")
        first = runner("runner-1", chain=chain)("first.cpp")
        assert (first.total_hits, first.total_misses) == (0, 1)
        _until(lambda: redis.size() >= 2 and objects() >= 2)  # the shared tiers are written in the background
        keys = bucket.list_objects_v2(Bucket=object_store.bucket, Prefix=f"{prefix}/")["Contents"]
        assert all(key["Key"].startswith(f"{prefix}/cpu/") for key in keys), "under <prefix>/<toolkit>/"
        assert redis.command("KEYS", "cpu/*").startswith("*"), "under <toolkit>/ in Redis"
        print(f"after the first runner: redis {redis.size()} keys, bucket {objects()} objects")

        second = runner("runner-2", chain=chain)("first.cpp")
        assert (second.total_hits, second.tiers) == (1, {"disk": 0, "redis": 1, "s3": 0}), second
        print(f"second runner, empty local disk: hits by tier {dict(second.tiers or {})}")
        from_bucket = runner("runner-2-s3", chain=("disk", "s3"))("first.cpp")
        assert from_bucket.tiers == {"disk": 0, "s3": 1}, from_bucket
        print(f"a runner of chain disk,s3: hits by tier {dict(from_bucket.tiers or {})}")

        before = (redis.size(), objects())
        reader = runner("runner-3", chain=chain, read_only=True)
        new = reader("second.cpp")
        assert (new.total_hits, new.total_misses) == (0, 1)
        old = reader("first.cpp")
        assert old.total_hits == 1
        # a hit from a shared tier is copied to the runner's local disk, read-only or not
        _until(lambda: any(len(p.name) == 64 for p in (tmp_path / "runner-3" / "disk").rglob("*") if p.is_file()))
        time.sleep(1.0)  # what a background write would take
        after = (redis.size(), objects())
        print(f"read-only runner, a new file: redis keys, bucket objects {before} before, {after} after")
        assert after == before, "a read-only build writes nothing to the shared tiers"
        # sccache 0.16 refuses every write of a chain with a read-only tier (mozilla/sccache#2773):
        # what it compiled is stored nowhere, and it counts no hits by tier.
        assert reader("second.cpp").total_misses == 1 and old.tiers is None and new.write_errors == 1


def compiled(binary: Path, socket: Path, cwd: Path, file: str) -> CacheStats:
    """One compile through the server on ``socket``: its counts (by tier: since it began)."""
    cache = CompilerCache(binary=binary, socket=socket)
    assert zero_stats(cache, HostRunner()) is None
    before = read_stats(cache, HostRunner())
    env = base_environment([], {"SCCACHE_SERVER_UDS": str(socket)})
    done = subprocess.run(
        [str(binary), "g++", "-c", file, "-o", f"{file}.{socket.stem}.o"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    stats = read_stats(cache, HostRunner())
    assert stats is not None
    return stats.since(before)


def _until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time given"
        time.sleep(0.1)
