"""The compiler-cache step: the cell's sccache server, started where the network is and
handed to the pipeline, which stops it when the cell ends, whatever way it ends.

It never fails the cell: a cache that is off, missing or cannot be reached makes the
builds compile without it, and this step says so in one warning.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from wheelmill.building.compiler_cache import (
    CHECK,
    CompilerCache,
    Server,
    install_client,
    read_stats,
    server_environment,
    socket_problem,
)
from wheelmill.building.context import Outcome, StepContext
from wheelmill.checks import CheckResult
from wheelmill.machine.emulation import Execution, execution, host_machine
from wheelmill.machine.tools import sccache_bin
from wheelmill.planning.spec import CellPlan
from wheelmill.settings import CompilerCacheMode

SOCKET = "sccache.sock"
FIX = (
    "compiled without it, nothing else changes; fix the SCCACHE_* settings (read the server's log), "
    "or set WHEELMILL_COMPILER_CACHE=off"
)


def compiler_cache(ctx: StepContext) -> Outcome:
    if ctx.run.plan.choices.compiler_cache is CompilerCacheMode.OFF:
        return _without(
            CheckResult.skipped(CHECK, "off (WHEELMILL_COMPILER_CACHE=off): builds compile without a cache"),
            "WHEELMILL_COMPILER_CACHE=off",
        )
    platform = ctx.run.plan.cell.variant.platform
    if execution(platform) is Execution.EMULATED:
        # sccache's wheel is this machine's code, linked to its loader and libc, which the image lacks
        why = f"sccache is {host_machine()} code, and this cell's builds run emulated in its {platform} image"
        return _without(CheckResult.skipped(CHECK, f"off: {why}; builds compile without a cache"), why)
    layout = ctx.run.layout
    # As the runner sees it: in a container, /wheelmill/sccache.sock, short whatever the output root.
    binary, socket = sccache_bin(), ctx.where.runner.stable_path(layout.root / SOCKET)
    problem = "no sccache in wheelmill's env (run scripts/setup)" if binary is None else socket_problem(socket)
    if binary is not None and problem is None:
        client = install_client(binary, layout.cache / "bin")
        env = server_environment(
            os.environ, cache_dir=layout.cache / "sccache", socket_path=socket, basedirs=basedirs(ctx)
        )
        # Counted before it starts: a build that ends meanwhile restarts it, to be sure.
        seen = ctx.run.builds_before()
        server = ctx.hold(
            Server(
                ctx.where.runner,
                binary=client,
                env=env,
                log=ctx.log,
                output=layout.logs / "sccache-server.log",
                seen=seen,
            )
        )
        problem = server.failure
        if problem is None:
            cache = _located(ctx, CompilerCache(binary=client, socket=socket, server=server))
            return Outcome(
                checks=[CheckResult.passed(CHECK, f"sccache server on {socket}; cache: {cache.location}")],
                made=(cache,),
            )
    return _without(CheckResult.warned(CHECK, f"builds compile without it: {problem}", FIX), problem or "")


def basedirs(ctx: StepContext) -> list[Path]:
    """The directories sccache strips from paths before it hashes: the cell root as the
    build sees it (in a container it is ``/wheelmill`` already). It rewrites the
    preprocessed source and the working directory, not the arguments: with engine none
    the prefix maps name the cell root on every command line, so there the cells of a
    variant do not share compiles. Torch's headers need no entry of their own: builds see
    them through the env's site link (``envs/build/site``), a path without the Python's
    version."""
    return [ctx.where.runner.stable_path(ctx.run.layout.root)]


def _without(check: CheckResult, why: str) -> Outcome:
    return Outcome(checks=[check], made=(CompilerCache.off(why),))


def _located(ctx: StepContext, cache: CompilerCache) -> CompilerCache:
    """The cache with where the server keeps it, as its stats say (local disk, a bucket)."""
    stats = read_stats(cache, ctx.where.runner)
    return replace(
        cache, location=stats.location if stats is not None and stats.location else "as sccache is configured"
    )


def describe(plan: CellPlan) -> str:
    if plan.choices.compiler_cache is CompilerCacheMode.OFF:
        return "off (WHEELMILL_COMPILER_CACHE=off): builds compile without a cache"
    return (
        "sccache server where the network is, on a Unix socket in the cell's directory; "
        "cache on local disk (<output>/.cache/sccache) unless SCCACHE_* name another; "
        "unreachable: builds compile without it"
    )
