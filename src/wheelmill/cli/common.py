"""What the build-like commands share (``plan``, ``build``, ``release``, and the commands that
find a cell's Python): the cell options (``--cell``, ``--recipe``, ``--engine``,
``--no-publish``, ``--rebuild``), planning, and running the plans."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wheelmill.cli.basics import load_inputs, print_error
from wheelmill.errors import EnvError, SignatureError, UsageError
from wheelmill.inputs import REBUILD_ALL
from wheelmill.settings import ENGINE_CHOICES, InstallTests, Settings, Signatures

# What planning, building and mirroring need loads when a command plans, builds or mirrors,
# never to parse a command line or print its help (wheelmill.cli: a command's start).
if TYPE_CHECKING:
    from rich.console import Console

    from wheelmill.inputs.variants import Cell
    from wheelmill.inputs.versions import Release
    from wheelmill.machine.engine import Engine
    from wheelmill.planning.spec import CellPlan


def add_cell_options(
    parser: argparse.ArgumentParser,
    *,
    cell_required: bool = True,
    publish_help: str = "keep the wheels in dist/, out of the local index",
) -> None:
    """The options of every command that builds or plans cells."""
    cell_help = "cell id or glob, e.g. cuda118-py311 (repeatable)" + ("" if cell_required else "; default: every cell")
    parser.add_argument("--cell", action="append", required=cell_required, help=cell_help)
    parser.add_argument(
        "--recipe", action="append", default=[], help="only this recipe and what it depends on (repeatable)"
    )
    parser.add_argument("--no-publish", dest="publish", action="store_false", help=publish_help)
    parser.add_argument(
        "--no-mirror",
        dest="mirror",
        action="store_false",
        help="publish the built wheels only, not the runtime closure (torch and its dependencies)",
    )
    parser.add_argument(
        "--rebuild",
        nargs="?",
        const=REBUILD_ALL,
        action="append",
        default=[],
        metavar="RECIPE",
        help=(
            "build again what the channel has published for its build key (from the same inputs): "
            "every recipe, or only RECIPE (repeatable)"
        ),
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="end each cell with the table of every step and every wheel's sha256 (default: what failed, warned, "
        "was slow or was built)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default=None,
        help=(
            "where commands run: a podman or docker container (auto: whichever answers), or none (this machine); "
            "default $WHEELMILL_ENGINE or auto"
        ),
    )


@dataclass(frozen=True, kw_only=True)
class Prepared:
    plans: tuple[CellPlan, ...]
    settings: Settings
    engine: Engine | None
    verbose: bool = False


def prepare(args: argparse.Namespace, settings: Settings, *, probe: bool, release: Release | None = None) -> Prepared:
    """Load, pick the engine (``probe``: ask it to answer; ``plan`` only looks for it),
    and plan the cells ``args`` selects."""
    from wheelmill.building.plan import ContainerSetup, Options, plan  # noqa: PLC0415 - see the imports
    from wheelmill.machine.engine import detect  # noqa: PLC0415
    from wheelmill.machine.pins import load_pins  # noqa: PLC0415

    publishes = bool(getattr(args, "publish", False) or release is not None)
    if publishes and settings.install_tests is InstallTests.NONE:
        raise UsageError(
            "WHEELMILL_INSTALL_TESTS=none delivers wheels that no install test has run: they are never published",
            fix="build with --no-publish, or unset WHEELMILL_INSTALL_TESTS",
        )
    if probe:  # a build: its key is read before anything is built (a malformed one is exit 3 now, not after)
        _signing(settings, publishes=publishes)
    matrix, recipes = load_inputs(settings)
    cells = matrix.select(args.cell)
    engine = detect(settings.engine) if probe else detect(settings.engine, probe=None)
    containers = None
    if engine is not None:
        containers = ContainerSetup(
            pins=load_pins(settings.root / "containers" / "pins.toml"),
            directory=settings.root / "containers",
            base_policy=settings.base_policy,
        )
    options = Options(
        publish=args.publish,
        mirror=args.mirror,
        engine=engine.name.value if engine else "none",
        containers=containers,
        locks_dir=settings.root / "locks",
        release=release,
        rebuild=tuple(args.rebuild),
    )
    return Prepared(
        plans=plan(matrix, recipes, cells, args.recipe, settings, options),
        settings=settings,
        engine=engine,
        verbose=getattr(args, "verbose", False),
    )


def _signing(settings: Settings, *, publishes: bool) -> None:
    """A build that publishes where signatures are required has a key to sign with."""
    from wheelmill.provenance.signing import signing_key_of  # noqa: PLC0415 - see the imports

    if signing_key_of(settings) is None and publishes and settings.signatures is Signatures.REQUIRED:
        raise SignatureError(
            "build: WHEELMILL_SIGNATURES is required and no signing key is set: its wheels would be published unsigned",
            fix="set WHEELMILL_SIGNING_KEY (a CI secret) or WHEELMILL_SIGNING_KEY_FILE, or build with --no-publish",
        )


def build_cells(prepared: Prepared, console: Console) -> int:
    """Run every cell's plan (``wheelmill.building.cells``); the exit status of the first failed
    cell, else 0."""
    from wheelmill.building.cells import RunOfCells  # noqa: PLC0415 - the build machinery loads only to build

    run = RunOfCells(
        prepared.plans,
        settings=prepared.settings,
        engine=prepared.engine,
        console=console,
        say_error=print_error,
        verbose=prepared.verbose,
    )
    return run.run()


def mirror_cells(cells: Sequence[str], settings: Settings, console: Console) -> None:
    """Resolve and mirror the runtime closure of each cell these ids or globs select, from
    its report under the output root (a cell built earlier, with --no-mirror, or for a
    release), then say what the index stores."""
    from wheelmill.index.closure import inputs_of_report, mirror, resolve  # noqa: PLC0415 - loads only to mirror
    from wheelmill.index.roots import Index, usage  # noqa: PLC0415 - loads only to mirror
    from wheelmill.machine import envs  # noqa: PLC0415 - loads only to mirror
    from wheelmill.machine.process import HostRunner, StepLog  # noqa: PLC0415 - loads only to mirror
    from wheelmill.output.layout import CellLayout  # noqa: PLC0415 - loads only to mirror
    from wheelmill.provenance.mirroring import mirror_signer  # noqa: PLC0415 - loads only to mirror

    matrix, _recipes = load_inputs(settings)
    backend = envs.backend(settings.env_backend, HostRunner())
    index = Index.of(settings)
    for cell in matrix.select(list(cells)):
        layout = CellLayout(output=settings.output.resolve(), cell=cell.id)
        inputs = inputs_of_report(
            layout,
            channel_of=index.channel,
            glibc=cell.variant.glibc,
            machine=cell.variant.platform,
            toolkit=cell.variant.toolkit_wheels,
        )
        with StepLog(layout.logs / "mirror.log") as log:
            found = resolve(inputs, backend=backend, log=log, work=layout.build / "closure", lock=layout.closure_lock)
            console.print(f"{cell.id}: closure: {found.describe()}", highlight=False)
            done = mirror(
                found,
                inputs.channel,
                downloads=index.downloads(settings.output),
                sources=inputs.sources,
                policy=settings.retry,
                log=log,
                on_line=lambda line: console.print(line, highlight=False),
                signer=mirror_signer(settings, channel=inputs.channel.name),
            )
        console.print(f"{cell.id}: mirror: {done.describe()}", highlight=False)
    console.print(usage(index).describe(), highlight=False)


def cell_python(cell: Cell, *, command: str, fix: str) -> Path:
    """The CPython of ``cell`` on this machine, or an ``EnvError`` naming where ``command``
    looked (``fix``: what else the user may give)."""
    from wheelmill.machine.process import HostRunner  # noqa: PLC0415 - see the imports
    from wheelmill.machine.toolchain import NotFound, find_python  # noqa: PLC0415

    found = find_python(cell.python, HostRunner())
    if isinstance(found, NotFound):
        raise EnvError(f"{command}: no CPython {cell.python} on this machine ({'; '.join(found.looked)})", fix=fix)
    return found.path
