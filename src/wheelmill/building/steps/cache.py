"""The compiler-cache step: the cell's sccache server, started where the network is and
handed to the pipeline, which stops it when the cell ends, whatever way it ends.

It never fails the cell: a cache that is off, missing or cannot be reached makes the
builds compile without it, and this step says so in one warning. Shared tiers that cannot
be used (a credential file missing, a server that does not answer with them) are left out:
the builds compile through local disk alone, with the same one warning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, TypeVar

from wheelmill.building.cache_tiers import Tiers, credential_files, files_to_mount, missing_files
from wheelmill.building.compiler_cache import (
    CHECK,
    CompilerCache,
    Server,
    install_client,
    read_stats,
    remote_variables,
    server_environment,
    socket_problem,
)
from wheelmill.building.context import Outcome, StepContext
from wheelmill.checks import CheckResult
from wheelmill.machine.emulation import Execution, execution, host_machine
from wheelmill.machine.tools import sccache_bin
from wheelmill.planning.spec import CellPlan
from wheelmill.settings import CompilerCacheMode, Settings

SOCKET = "sccache.sock"
FIX = (
    "compiled without it, nothing else changes; fix the SCCACHE_* settings (read the server's log), "
    "or set WHEELMILL_COMPILER_CACHE=off"
)
FIX_TIERS = (
    "compiled through the rest, nothing else changes; fix the WHEELMILL_COMPILER_CACHE_* settings or the "
    "credentials (read the server's log), or set WHEELMILL_COMPILER_CACHE_TIERS=disk"
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
        tiers, notes = usable_tiers(ctx.run.settings, os.environ, toolkit=ctx.run.plan.cell.variant.base_name)
        server, tiers, notes = serve(tiers, notes, lambda chosen: _started(ctx, client, socket, chosen))
        if server.failure is None:
            cache = _located(ctx, CompilerCache(binary=client, socket=socket, server=server), tiers)
            return Outcome(checks=[server_verdict(cache, tiers, notes)], made=(cache,))
        problem = "; ".join([server.failure, *notes])
    return _without(CheckResult.warned(CHECK, f"builds compile without it: {problem}", FIX), problem or "")


class Answering(Protocol):
    failure: str | None  # why it does not answer


S = TypeVar("S", bound=Answering)


def serve(tiers: Tiers, notes: Sequence[str], start: Callable[[Tiers], S]) -> tuple[S, Tiers, list[str]]:
    """A server started with ``tiers``; where it does not answer with shared ones, one with
    local disk alone (a shared tier that cannot be reached costs the builds that tier, not
    the cache); and what the step's verdict says of it."""
    said = list(notes)
    server = start(tiers)
    if server.failure is not None and tiers.shared:
        said.append(f"without the shared tiers {', '.join(tiers.shared)}: {server.failure}")
        tiers = tiers.local()
        server = start(tiers)
    return server, tiers, said


def server_verdict(cache: CompilerCache, tiers: Tiers, notes: Sequence[str]) -> CheckResult:
    """``sccache server on <socket>; tiers disk, redis (read-only), s3 (read-only)``, or the
    one tier where it lives; a warning where shared tiers or their files were left out."""
    where = cache.location if tiers.shared else f"cache: {cache.location}"
    detail = f"sccache server on {cache.socket}; {where}"
    if notes:
        return CheckResult.warned(CHECK, f"{detail}; {'; '.join(notes)}", FIX_TIERS)
    return CheckResult.passed(CHECK, detail)


def usable_tiers(settings: Settings, environ: Mapping[str, str], *, toolkit: str) -> tuple[Tiers, list[str]]:
    """The settings' tiers, less the shared ones where a file that the server's variables
    name is missing (a credential, most likely: the shared tiers would fail without it, or
    take other credentials); and what the step's verdict says of it."""
    tiers = Tiers.chosen(settings.cache_tiers, settings.shared_writes, toolkit=toolkit)
    missing = missing_files(credential_files(remote_variables(environ)))
    if missing and tiers.shared:
        return tiers.local(), [f"without the shared tiers {', '.join(tiers.shared)}: {'; '.join(missing)}"]
    return tiers, missing


def server_files(ctx: StepContext) -> list[Path]:
    """The files of this machine that the cell's sccache server reads (credentials, its
    configuration), for the online container to mount read-only at the same path: none
    where the cache is off, or the files are under the output root it mounts already."""
    if ctx.run.plan.choices.compiler_cache is CompilerCacheMode.OFF:
        return []
    files = credential_files(remote_variables(os.environ))
    return files_to_mount(files, visible=[ctx.run.layout.output])


def _started(ctx: StepContext, client: Path, socket: Path, tiers: Tiers) -> Server:
    """A server of the cell with these tiers, started (``failure`` says why it does not answer)."""
    layout = ctx.run.layout
    env = server_environment(
        os.environ, cache_dir=layout.cache / "sccache", socket_path=socket, basedirs=basedirs(ctx), tiers=tiers
    )
    return ctx.hold(
        Server(
            ctx.where.runner,
            binary=client,
            env=env,
            log=ctx.log,
            output=layout.logs / "sccache-server.log",
            # Counted before it starts: a build that ends meanwhile restarts it, to be sure.
            seen=ctx.run.builds_before(),
        )
    )


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


def _located(ctx: StepContext, cache: CompilerCache, tiers: Tiers) -> CompilerCache:
    """The cache with its tiers, and where the server keeps it: a chain by its tiers, one
    tier as its stats say (local disk, a bucket)."""
    cache = replace(cache, tiers=tiers.chain, read_only=tiers.read_only and bool(tiers.shared))
    if tiers.shared:
        return replace(cache, location=f"tiers {tiers.describe()}")
    stats = read_stats(cache, ctx.where.runner)
    return replace(
        cache, location=stats.location if stats is not None and stats.location else "as sccache is configured"
    )


def describe(plan: CellPlan) -> str:
    if plan.choices.compiler_cache is CompilerCacheMode.OFF:
        return "off (WHEELMILL_COMPILER_CACHE=off): builds compile without a cache"
    where = (
        f"tiers {plan.choices.cache_tiers}, local disk (<output>/.cache/sccache) first, keys of its toolkit "
        "under a folder of their own in the shared ones"
        if plan.choices.cache_tiers
        else "cache on local disk (<output>/.cache/sccache) unless SCCACHE_* name another"
    )
    return (
        "sccache server where the network is, on a Unix socket in the cell's directory; "
        f"{where}; unreachable: builds compile without it"
    )
