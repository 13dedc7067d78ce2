"""Nothing built twice across the fleet: two runners on one machine, side by side in one run.

Runner A and runner B are two output roots at two paths, each with its own local compiler
cache; they share what a fleet shares: a Redis server as the compiler cache's shared tier
(``WHEELMILL_COMPILER_CACHE_TIERS=disk,redis``), and the index A publishes to, served over
HTTP (``wheelmill index serve``), which B reads as ``WHEELMILL_SERVED_INDEX``.

1. A builds the cell's recipes cold (an empty Redis, an empty local cache) and publishes them,
   the one build of its stable recipes first, in a cell of their ABI group's oldest torch
   (``--stable-from``), as a run orders them;
2. B builds the same cell with ``--no-publish``, nothing changed: every recipe's build key is
   in the served index, so B builds nothing and fetches every wheel (sha256 checked, checked
   after repair and install-tested there, as a stable recipe's one build served to the cell is);
3. B rebuilds the measured recipe (``--rebuild``), its local cache empty: its compiles come
   from the shared tier. Its build step against A's cold one is the ratio (target >= 5x,
   hits >= 95 %);
4. a pull request's builds (``GITHUB_EVENT_NAME=pull_request``: read-only) read the shared
   tier (the measured recipe again: hits) and write nothing to it (a recipe nobody compiled
   yet, ``--pull-request``: misses): Redis's key count before and after.

Engine none, as the other benchmarks. Usage: ``.venv/bin/python benchmarks/fleet.py
[--cell cuda130-py311] [--recipe example-cuda-ops] [--smoke]`` (needs the CUDA 13.0 toolkit for a
CUDA cell, and Debian's redis-server). ``--smoke`` builds the measured recipe (and what it needs)
rather than every recipe of the cell: ``--cell cpu-py311 --recipe example-cpp-ops --smoke
--pull-request cpu-py311:example-stable-ops``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import runs

TARGET = 5.0  # B's warm build step from the shared tier against A's cold one
HIT_TARGET = 0.95


def listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def process(argv: list[str], *, port: int, what: str, log: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    with log.open("a") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=runs.ROOT)
    try:
        runs.wait_until(lambda: listens(port), f"{what} on 127.0.0.1:{port}")
        yield
    finally:
        server.terminate()
        server.wait(timeout=30)


def redis_keys(port: int) -> int:
    """Redis's key count (DBSIZE), over its own protocol: no client library needed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"*1\r\n$6\r\nDBSIZE\r\n")
        answer = conn.recv(64).decode()
    return int(answer.strip().lstrip(":"))


def report(output: Path, cell: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((output / cell / "report.json").read_text())
    return data


def build_step(data: dict[str, Any], recipe: str) -> float | None:
    return next(
        (s["seconds"] for s in data["steps"] if s["recipe"] == recipe and s["step"] == "build" and s["status"] == "ok"),
        None,
    )


def statuses(data: dict[str, Any]) -> dict[str, str]:
    """Each recipe's status as its steps say: the worst, else ok."""
    found: dict[str, str] = {}
    for step in data["steps"]:
        if step["recipe"]:
            found[step["recipe"]] = step["status"] if step["status"] != "ok" else found.get(step["recipe"], "ok")
    return found


def cache_of(data: dict[str, Any], recipe: str) -> dict[str, Any]:
    return (data["facts"].get("compiler_cache") or {}).get(recipe) or {"hits": 0, "misses": 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="cuda130-py311")
    parser.add_argument("--recipe", default="example-cuda-ops", help="the recipe B rebuilds from the shared tier")
    parser.add_argument("--smoke", action="store_true", help="build the recipe alone (and what it needs)")
    parser.add_argument(
        "--pull-request",
        default="cpu-py311:example-cpp-ops",
        help="CELL:RECIPE the pull request's build makes, which neither runner compiled",
    )
    parser.add_argument(
        "--stable-from",
        default="cuda130-torch2.12-py311:example-stable-ops",
        help="CELL:RECIPE, a stable recipe's one build, made first by runner A; empty: none",
    )
    args = parser.parse_args()
    pr_cell, pr_recipe = args.pull_request.split(":")
    redis = shutil.which("redis-server", path="/usr/bin:/usr/sbin")
    if redis is None:
        return runs.broken("no redis-server (scripts/setup --system installs it)")
    with runs.workspace("wheelmill-fleet-bench-") as tmp:
        log, a, b = tmp / "fleet.log", tmp / "runner-a", tmp / "runner-b"
        (tmp / "redis").mkdir()
        redis_port, index_port = runs.free_port(), runs.free_port()
        shared = {
            "WHEELMILL_COMPILER_CACHE": "on",
            "WHEELMILL_COMPILER_CACHE_TIERS": "disk,redis",
            "WHEELMILL_COMPILER_CACHE_REDIS": f"redis://127.0.0.1:{redis_port}",
            "WHEELMILL_SHARED_WRITES": "read-write",
        }
        redis_argv = [redis, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        redis_argv += ["--dir", str(tmp / "redis")]
        with process(redis_argv, port=redis_port, what="redis-server", log=log):
            common = ["build", "--engine", "none", "--cell", args.cell, "--no-mirror"]
            common += ["--recipe", args.recipe] if args.smoke else []
            a_total = 0.0
            if args.stable_from and not args.smoke:
                cell, recipe = args.stable_from.split(":")
                one_build = ["build", "--engine", "none", "--cell", cell, "--recipe", recipe, "--no-mirror"]
                a_total += runs.wheelmill(one_build, output=a, log=log, env=shared)
            a_total += runs.wheelmill(common, output=a, log=log, env=shared)
            a_report = report(a, args.cell)
            a_build = build_step(a_report, args.recipe)
            if a_build is None:
                return runs.broken(f"runner A did not build {args.recipe}")
            serve = [sys.executable, "-m", "wheelmill", "index", "serve", "--host", "127.0.0.1", "--port"]
            env = {**os.environ, "WHEELMILL_OUTPUT": str(a)}
            with process([*serve, str(index_port)], port=index_port, what="the index server", log=log, env=env):
                served = {**shared, "WHEELMILL_SERVED_INDEX": f"http://127.0.0.1:{index_port}"}
                b_total = runs.wheelmill([*common, "--no-publish"], output=b, log=log, env=served)
                b_report = report(b, args.cell)
                again = [*common, "--no-publish", "--rebuild", args.recipe]
                again += [] if args.smoke else ["--recipe", args.recipe]
                b_rebuild_total = runs.wheelmill(again, output=b, log=log, env=served)
                b_rebuild = report(b, args.cell)
                # A pull request's builds: the measured recipe again (its compiles read from the
                # shared tier), then one neither runner compiled (its compiles written nowhere).
                before = redis_keys(redis_port)
                pull_request = {**served, "WHEELMILL_SHARED_WRITES": "auto", "GITHUB_EVENT_NAME": "pull_request"}
                reads = [*common, "--no-publish", "--recipe", args.recipe, "--rebuild", args.recipe]
                runs.wheelmill(reads, output=tmp / "pull-request", log=log, env=pull_request)
                pr_reads = cache_of(report(tmp / "pull-request", args.cell), args.recipe)
                pr = ["build", "--engine", "none", "--cell", pr_cell, "--recipe", pr_recipe, "--no-publish"]
                runs.wheelmill([*pr, "--rebuild", pr_recipe], output=tmp / "pull-request", log=log, env=pull_request)
                after = redis_keys(redis_port)
                pr_cache = cache_of(report(tmp / "pull-request", pr_cell), pr_recipe)
        return summary(
            args,
            Figures(
                a_total=a_total,
                a_build=a_build,
                a_report=a_report,
                b_total=b_total,
                b_report=b_report,
                b_rebuild_total=b_rebuild_total,
                b_rebuild=b_rebuild,
                keys_before=before,
                keys_after=after,
                pr_reads=pr_reads,
                pr_cache=pr_cache,
            ),
        )


@dataclass(frozen=True, kw_only=True)
class Figures:
    a_total: float  # runner A's whole command, cold
    a_build: float  # its build step of the measured recipe
    a_report: dict[str, Any]
    b_total: float  # runner B's whole command, nothing changed
    b_report: dict[str, Any]
    b_rebuild_total: float  # runner B's --rebuild of the measured recipe
    b_rebuild: dict[str, Any]
    keys_before: int  # Redis's keys before the pull request's build
    keys_after: int
    pr_reads: dict[str, Any]  # the pull request's rebuild of the measured recipe
    pr_cache: dict[str, Any]  # its build of a recipe no runner compiled


def summary(args: argparse.Namespace, f: Figures) -> int:
    a_cache, b_cache = cache_of(f.a_report, args.recipe), cache_of(f.b_rebuild, args.recipe)
    b_statuses = statuses(f.b_report)
    b_build = build_step(f.b_rebuild, args.recipe)
    print(f"fleet: {args.cell}, two runners, a Redis shared tier, runner A's index served over HTTP")
    print(
        f"  A cold (empty caches), built and published: whole command {f.a_total:6.1f} s; "
        f"{args.recipe} build step {f.a_build:6.1f} s ({a_cache['hits']} hits, {a_cache['misses']} misses)"
    )
    print(f"  B, nothing changed (--no-publish): whole command {f.b_total:6.1f} s; recipes {b_statuses}")
    if b_build is None:
        return runs.broken(f"runner B did not rebuild {args.recipe}")
    hits, misses = b_cache["hits"], b_cache["misses"]
    rate = hits / (hits + misses) if hits + misses else 0.0
    print(
        f"  B --rebuild {args.recipe}, its local cache empty: build step {b_build:6.1f} s "
        f"({hits} hits, {misses} misses, {rate:.0%}; by tier {b_cache.get('hits_by_tier')}, "
        f"by kind {b_cache.get('hits_by_language')}); whole command {f.b_rebuild_total:6.1f} s"
    )
    print(
        f"  ratio A cold / B from the shared tier: build step {f.a_build / b_build:.1f}x (target >= {TARGET:.0f}x); "
        f"hits {rate:.0%} (target >= {HIT_TARGET:.0%})"
    )
    print(
        f"  pull request (read-only): {args.recipe} again {f.pr_reads['hits']} hits, {f.pr_reads['misses']} misses "
        f"(read-only {f.pr_reads.get('read_only')}); {args.pull_request} {f.pr_cache['hits']} hits, "
        f"{f.pr_cache['misses']} misses; Redis keys {f.keys_before} before, {f.keys_after} after"
    )
    built = [s["recipe"] for s in f.b_report["steps"] if s["step"] == "build" and s["status"] == "ok"]
    if built or not set(b_statuses.values()) <= {"reused", "from-group"}:
        return runs.broken(f"runner B built {built} although nothing changed: {b_statuses}")
    if f.keys_after != f.keys_before:
        return runs.broken("the pull request's build wrote to the shared tier")
    return 0


if __name__ == "__main__":
    sys.exit(main())
