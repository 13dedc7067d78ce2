"""Level 1: the builder image (made or reused) and the cell's long-lived container.

After ``prepare-container`` every command of the cell runs in the container: the runner
and the env backend of the run are swapped for ones that exec there. The executor removes
the container when the cell ends, whatever way it ends.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from pathlib import Path

from wheelmill import envs
from wheelmill.checks import CheckResult
from wheelmill.containers.engine import Engine, Mount
from wheelmill.containers.images import debian_mirror, ensure_image
from wheelmill.containers.runner import ContainerRunner
from wheelmill.context import CellRun
from wheelmill.runner import StepLog
from wheelmill.sources import machine_sources
from wheelmill.tools import uv_bin


def engine_of(run: CellRun) -> Engine:
    assert run.engine is not None, "the command line detected the engine"
    return run.engine


def prepare_image(run: CellRun, log: StepLog) -> list[CheckResult]:
    image = run.plan.image
    if image is None:
        log.note("engine none: no image")
        return [CheckResult.passed("image", "none (this machine)")]
    setup = run.containers
    assert setup is not None
    started = time.monotonic()
    ready = ensure_image(engine_of(run), image, setup.pins, mirror=debian_mirror(), work=run.layout.cache / "bootstrap", log=log, on_line=run.on_line)
    run.image = ready
    seconds = time.monotonic() - started
    what = "built" if ready.built else "reused"
    base = " (base bootstrapped)" if ready.bootstrapped else ""
    log.note(f"image step: {what} {ready.tag} in {seconds:.1f}s")
    return [CheckResult.passed("image", f"{what} {ready.tag} ({ready.image_id[:19]}) in {seconds:.1f}s{base}")]


def prepare_container(run: CellRun, log: StepLog) -> list[CheckResult]:
    if run.image is None:
        log.note("engine none: every command runs on this machine, with an explicit environment")
        return [CheckResult.passed("engine", "none (this machine)")]
    container = ContainerRunner(engine_of(run), cell=run.plan.cell.id, same_path=[run.layout.output])
    stale = container.remove_stale(log)
    container.start(image=run.image.tag, mounts=mounts(run), log=log)
    run.container = container
    run.runner = container
    run.backend = envs.backend(run.settings.env_backend, container, cache_dir=run.layout.cache / "uv")
    removed = f"; removed {len(stale)} left behind" if stale else ""
    return [CheckResult.passed("container", f"{container.container} from {run.image.tag}{removed}")]


def mounts(run: CellRun) -> list[Mount]:
    """The output (read-write), and read-only what commands inside need from here: the uv
    binary, local package sources and the trust store (a proxy's CA travels with it)."""
    output = run.layout.output
    found = [Mount(source=output, target=output, readonly=False)]
    uv = Path(uv_bin())
    found.append(Mount(source=uv.resolve(), target=uv))
    found += [Mount(source=path, target=path) for path in local_sources(run)]
    for key in ("SSL_CERT_DIR", "SSL_CERT_FILE"):
        value = os.environ.get(key)
        if value and Path(value).exists() and not any(Path(value).is_relative_to(m.target) for m in found[1:]):
            found.append(Mount(source=Path(value), target=Path(value)))
    return found


def local_sources(run: CellRun) -> list[Path]:
    """Package sources that are directories of this machine (file:// indexes, find-links)."""
    sources = machine_sources(run.settings)
    locations = [sources.index_url or "", *sources.extra_index_urls, *sources.find_links, run.plan.torch_index or ""]
    paths = []
    for location in locations:
        path = Path(urllib.parse.urlparse(location).path) if location.startswith("file://") else Path(location) if location.startswith("/") else None
        if path is not None and path.exists():
            # A file:// simple index links its files beside it (../../files/...): take the tree.
            paths.append(path.parent if path.name == "simple" else path)
    return list(dict.fromkeys(paths))
