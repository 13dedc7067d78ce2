"""Level 1: the builder image (made or reused) and the cell's long-lived container.

``prepare-container`` hands the container to the pipeline, which removes it when the cell
ends, whatever way it ends, and makes it where every later command runs.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from pathlib import Path

from wheelmill.building.context import Outcome, StepContext, Where
from wheelmill.building.steps.cache import server_files
from wheelmill.checks import CheckResult
from wheelmill.config import format_duration
from wheelmill.machine import envs
from wheelmill.machine.builder_images import Ready, debian_mirror, prepare_builder
from wheelmill.machine.container import Container
from wheelmill.machine.emulation import CPU_SYSFS, Execution, emulated_cpu, execution
from wheelmill.machine.engine import SLOW_STORE_FIX, Engine, Mount
from wheelmill.machine.package_sources import machine_sources
from wheelmill.machine.tools import pinned_hashes, uv_bin, uv_static_bin
from wheelmill.planning.spec import CellPlan

# Where a build sees its cell's root, in every cell: the name compiled into its output.
STABLE_ROOT = Path("/wheelmill")


def _engine(ctx: StepContext) -> Engine:
    assert ctx.run.engine is not None, "the plan has container steps only where the command line found an engine"
    return ctx.run.engine


def prepare_image(ctx: StepContext) -> Outcome:
    """The builder image: this engine's, else the shared registry's, else made here (and,
    read-write, pushed there). A registry that does not answer is a warning, never a failure."""
    image = ctx.run.plan.image
    assert image is not None, "the plan has this step only with an image"
    started = time.monotonic()
    ready = prepare_builder(
        _engine(ctx),
        image,
        mirror=lambda: debian_mirror(ctx.run.settings.debian_mirror),  # asked only where something is made
        work=ctx.run.layout.cache / "bootstrap",
        log=ctx.log,
        on_line=ctx.run.on_line,
        sharing=ctx.run.plan.choices.image_sharing,
        policy=ctx.run.settings.retry,
    )
    seconds = time.monotonic() - started
    detail = describe_ready(ready, seconds)
    ctx.log.note(f"image step: {detail}")
    fix = "check the registry and the engine's login to it; this build went on without it"
    warnings = [CheckResult.warned("image-registry", missed.describe(), fix=fix) for missed in ready.warnings]
    return Outcome(checks=[CheckResult.passed("image", detail), *warnings, *store_checks(_engine(ctx))], made=(ready,))


def store_checks(engine: Engine) -> list[CheckResult]:
    """A warning where the engine's image store makes every container slow: the build goes on."""
    slow = engine.slow_store()
    return [CheckResult.warned("image-store", slow, fix=SLOW_STORE_FIX[engine.name])] if slow else []


def describe_ready(ready: Ready, seconds: float) -> str:
    """``built <tag> (<id>) in 93.1s; base bootstrapped; pushed to <ref> (digest sha256:...)``."""
    made = f"{ready.origin} {ready.tag} ({ready.image_id[:19]}) in {format_duration(seconds)}"
    parts = [made, f"base {ready.base_origin}"]
    parts += [transfer.describe() for transfer in ready.transfers]
    parts += [ready.unpushed] if ready.unpushed else []
    return "; ".join(parts)


def prepare_container(ctx: StepContext) -> Outcome:
    """Two containers of the cell from one image with the same mounts: one with the host's
    network for the steps that download, one with none for the steps that must not."""
    layout, ready, backend, cell = (
        ctx.run.layout,
        ctx.done.get(Ready),
        ctx.run.plan.choices.env_backend,
        ctx.run.plan.cell.id,
    )
    stable = Mount(source=layout.root, target=STABLE_ROOT, readonly=False)
    online, netless = (
        ctx.hold(
            Container(
                _engine(ctx),
                cell=cell,
                image=ready.tag,
                mounts=mounts(ctx),
                same_path=[layout.output],
                stable=stable,
                log=ctx.log,
                network=network,
                platform=ctx.run.plan.image.oci_platform if ctx.run.plan.image else None,
                server_files=server_files(ctx),
            )
        )
        for network in (True, False)
    )
    channels = ctx.where.backend.channels  # the conda backend's, as on this machine
    offline = Where(
        runner=netless,
        backend=envs.backend(backend, netless, cache_dir=layout.cache / "uv", offline=True, channels=channels),
    )
    where = Where(
        runner=online,
        backend=envs.backend(backend, online, cache_dir=layout.cache / "uv", channels=channels),
        netless=offline,
    )
    removed = f"; removed {len(online.stale)} left behind" if online.stale else ""
    return Outcome(
        checks=[
            CheckResult.passed(
                "container", f"{online.name} from {ready.tag}, and {netless.name} with no network{removed}"
            )
        ],
        made=(where,),
    )


def mounts(ctx: StepContext) -> list[Mount]:
    """The output (read-write), and read-only what commands inside need from here: the uv
    binary, local package sources and the trust store (a proxy's CA travels with it)."""
    output = ctx.run.layout.output
    found = [Mount(source=output, target=output, readonly=False)]
    uv = Path(uv_bin())
    # another machine's image has no loader for this machine's uv: its static build runs there
    emulated = execution(ctx.run.plan.cell.variant.platform) is Execution.EMULATED
    hashes = pinned_hashes(ctx.run.settings.root / "requirements" / "dev.txt", "uv")
    source = uv_static_bin(ctx.run.layout.cache / "tools", log=ctx.log, hashes=hashes) if emulated else uv.resolve()
    found.append(Mount(source=source, target=uv))
    # qemu-user shows aarch64 code this machine's sysfs, without the CPU registers it reads
    standin = emulated_cpu(ctx.run.plan.cell.variant.platform, ctx.run.layout.cache / "emulation" / "cpu")
    found += [Mount(source=standin, target=CPU_SYSFS)] if standin else []
    found += [Mount(source=path, target=path) for path in local_sources(ctx)]
    for key in ("SSL_CERT_DIR", "SSL_CERT_FILE"):
        value = os.environ.get(key)
        if value and Path(value).exists() and not any(Path(value).is_relative_to(m.target) for m in found[1:]):
            found.append(Mount(source=Path(value), target=Path(value)))
    return found


def local_sources(ctx: StepContext) -> list[Path]:
    """Package sources that are directories of this machine (file:// indexes, find-links)."""
    sources = machine_sources(ctx.run.settings)
    locations = [
        sources.index_url or "",
        *sources.extra_index_urls,
        *sources.find_links,
        ctx.run.plan.torch_index or "",
    ]
    paths = []
    for location in locations:
        path = (
            Path(urllib.parse.urlparse(location).path)
            if location.startswith("file://")
            else Path(location)
            if location.startswith("/")
            else None
        )
        if path is not None and path.exists():
            # A file:// simple index links its files beside it (../../files/...): take the tree.
            paths.append(path.parent if path.name == "simple" else path)
    return list(dict.fromkeys(paths))


def describe_image(plan: CellPlan) -> str:
    assert plan.image is not None
    said = (
        f"{plan.engine}: builder image from {plan.image.describe()}; tagged by a hash of both, reused while it exists"
    )
    sharing = plan.choices.image_sharing
    if sharing is None:
        return said
    writes = "what is made here pushed there" if sharing.pushes else "read-only: nothing pushed"
    return f"{said}; else pulled from {sharing.registry} (and its base), else made; {writes}"


def describe_container(plan: CellPlan) -> str:
    return (
        f"{plan.engine}: one container for the cell, the output mounted, package sources read-only; removed at the end"
    )
