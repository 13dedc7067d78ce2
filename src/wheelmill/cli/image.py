"""``wheelmill image build``: a cell's runtime or devel image (and the extras image on it)
from the cell's channel alone, smoke-tested in tiers, optionally pushed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from wheelmill.cli.basics import Commands, load_inputs, print_error
from wheelmill.config import format_size
from wheelmill.errors import UsageError
from wheelmill.inputs.versions import Track
from wheelmill.settings import Settings, Signatures

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.images.editions import BuiltImage
    from wheelmill.index.roots import Index, Installable
    from wheelmill.inputs.variants import Cell
    from wheelmill.output.layout import CellLayout


# Edition's values, for --edition's choices without loading the images' machinery to parse a
# command line (a unit test holds the two equal).
EDITIONS = ("runtime", "devel")


def register(commands: Commands) -> None:
    image = commands.add_parser("image", help="container images that install from a cell's channel alone")
    actions = image.add_subparsers(dest="action", required=True, parser_class=type(image))
    build = actions.add_parser(
        "build", help="build a cell's runtime or devel image (and its extras image), smoke-test it, push it"
    )
    build.add_argument("--cell", required=True, help="a built cell, e.g. cpu-py311")
    build.add_argument(
        "--edition",
        required=True,
        choices=EDITIONS,
        help="runtime: no compiler; devel: a compiler, ninja and the toolkit",
    )
    build.add_argument(
        "--extras", action="store_true", help="also the extras image: the edition with the cell's extension wheels"
    )
    build.add_argument(
        "--push",
        metavar="REGISTRY",
        type=registry,
        help="push every image built to this registry (host[:port][/path]) and record its digest",
    )
    build.add_argument(
        "--engine", choices=("auto", "podman", "docker"), default=None, help="default $WHEELMILL_ENGINE or auto"
    )
    build.add_argument(
        "--release",
        metavar="VERSION",
        help="the cell as released (its record and channel), e.g. a promoted final: no build of its own needed",
    )
    build.add_argument(
        "--track",
        choices=[t.value for t in Track],
        default=Track.RELEASE.value,
        help="with --release: the release's track (default release)",
    )
    build.add_argument(
        "--access-log", type=Path, help="the loopback index's access log (default <cell>/logs/image-index-access.log)"
    )
    build.set_defaults(func=cmd_image_build)
    manifest = actions.add_parser(
        "manifest",
        help="join the pushed images of a cell and its aarch64 twin under one tag: a multi-platform manifest list",
    )
    manifest.add_argument(
        "--cell", action="append", required=True, help="a cell whose images were pushed (repeatable: one per platform)"
    )
    manifest.add_argument(
        "--push", metavar="REGISTRY", type=registry, required=True, help="the registry the images were pushed to"
    )
    manifest.add_argument(
        "--engine", choices=("auto", "podman", "docker"), default=None, help="default $WHEELMILL_ENGINE or auto"
    )
    manifest.set_defaults(func=cmd_image_manifest)


def registry(text: str) -> str:
    """``--push``'s value, checked as the command line is read: a malformed one is refused
    before any channel is read or engine asked, not after the images are built."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.machine.registry import is_registry  # noqa: PLC0415

    if not is_registry(text):
        raise UsageError(
            f"--push {text!r}: not a registry (host[:port][/path], lower case, no scheme)",
            fix="give one like ghcr.io/my-org/wheelmill or 127.0.0.1:5000/wheelmill",
        )
    return text


def cmd_image_build(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.images.build import ImageJob, build_cell_images  # noqa: PLC0415
    from wheelmill.images.editions import Edition  # noqa: PLC0415
    from wheelmill.index.roots import Index, tree_to_install_from  # noqa: PLC0415
    from wheelmill.output.layout import CellLayout  # noqa: PLC0415

    matrix, _recipes = load_inputs(settings)
    cells = matrix.select([args.cell])
    if len(cells) != 1:
        raise UsageError(f"image build: --cell {args.cell} names {len(cells)} cells", fix="name one cell")
    cell = cells[0]
    layout = CellLayout(output=settings.output.resolve(), cell=cell.id)
    released = _released(args, layout)
    index = Index.of(settings)
    wanted = _installable(index, args, cell, layout)
    refused = _verify_provenance(index, wanted, args, settings, console)
    if refused:
        return refused
    with tree_to_install_from(index, wanted, work=layout.root) as (root, fetched):
        if fetched:
            print(f"{wanted.channel}: {len(fetched)} files from {index.location} for the images", flush=True)
        job = ImageJob(
            cell=cell,
            layout=layout,
            edition=Edition(args.edition),
            extras=args.extras,
            engine=args.engine,
            push=args.push,
            access_log=args.access_log,
            release=(Track(args.track), args.release) if args.release else None,
            record_in=released,
        )
        built = build_cell_images(job, settings, root=root, say=lambda line: _say(console, line))
    _summary(console, built)
    return 0


def _say(console: Console, line: str) -> None:
    console.print(line, highlight=False, markup=False)


def _installable(index: Index, args: argparse.Namespace, cell: Cell, layout: CellLayout) -> Installable:
    """What the cell's images install: the files built here that the release's record names,
    or its build's, and the mirrored closure its build locked (every mirrored file of the
    channel where that lock is not here, as for a release built by another job)."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.images.editions import read_cell_output, released_files  # noqa: PLC0415
    from wheelmill.index.closure import read as read_closure  # noqa: PLC0415
    from wheelmill.index.roots import Installable  # noqa: PLC0415
    from wheelmill.output.layout import CLOSURE_LOCK_NAME  # noqa: PLC0415

    lock = layout.root / CLOSURE_LOCK_NAME
    closure = tuple(w.filename for w in read_closure(lock).to_mirror) if lock.is_file() else None
    if args.release:
        files = released_files(index.storage, Track(args.track), args.release, cell)
        return Installable(channel=files[0].channel, built=tuple(f.filename for f in files), closure=closure)
    output = read_cell_output(layout, cell)
    return Installable(channel=output.channel, built=tuple(w.filename for w in output.wheels), closure=closure)


def _verify_provenance(
    index: Index, wanted: Installable, args: argparse.Namespace, settings: Settings, console: Console
) -> int:
    """The files built here that the images install, held to their provenance in the index
    before anything is fetched or built, where trusted keys are configured: each failure one
    line, and the first one's exit code; 0 to go on (also where no key is: said in a line)."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.images.editions import built_installed  # noqa: PLC0415
    from wheelmill.provenance.signing import trusted_keys_of  # noqa: PLC0415
    from wheelmill.releases.attested import local_source  # noqa: PLC0415
    from wheelmill.releases.preinstall import verify_before_install  # noqa: PLC0415

    checked = verify_before_install(
        local_source(index.channel(wanted.channel)),
        built_installed(list(wanted.built), extras=args.extras),
        trusted=trusted_keys_of(settings),
        on_failure=print_error,
        required=settings.signatures is Signatures.REQUIRED,
    )
    console.print(checked.line(), highlight=False, markup=False)
    return checked.code


def _released(args: argparse.Namespace, layout: CellLayout) -> tuple[Track, str] | None:
    """The release the images belong to: --release, or the one the cell was built for."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.output.report import ReportError, load_report  # noqa: PLC0415

    if args.release:
        return Track(args.track), args.release
    try:
        release = load_report(layout.report, cell=layout.cell).release
    except (OSError, ReportError):
        return None
    return None if release is None else (release.track, release.version)


def _summary(console: Console, built: list[BuiltImage]) -> None:
    table = Table(title="images", title_justify="left")
    for column in ("kind", "image", "size", "pushed"):
        table.add_column(column, overflow="fold")
    for image in built:
        table.add_row(image.spec.kind, image.spec.reference, format_size(image.size), image.pushed or "-")
    Console(highlight=False, width=max(console.width, 200)).print(table)


def cmd_image_manifest(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    """One manifest list per edition the cells pushed, of their images' digests, pushed to
    the registry; recorded in ``<output>/manifests.json``."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.files import write_atomic  # noqa: PLC0415
    from wheelmill.images.manifests import members_of, plan_lists, push_list  # noqa: PLC0415
    from wheelmill.machine.engine import detect  # noqa: PLC0415
    from wheelmill.machine.process import StepLog  # noqa: PLC0415
    from wheelmill.output.layout import CellLayout  # noqa: PLC0415

    matrix, _recipes = load_inputs(settings)
    cells = [matrix.cell(cell_id) for cell_id in dict.fromkeys(args.cell)]
    members = [
        member
        for cell in cells
        for member in members_of(cell.id, CellLayout(output=settings.output.resolve(), cell=cell.id).images)
        if member.pushed.startswith(args.push.rstrip("/") + "/")
    ]
    plans = plan_lists(members, args.push)
    engine = detect(args.engine or (settings.engine if settings.engine != "none" else "auto"))
    if engine is None:
        raise UsageError(
            "image manifest: no container engine answers", fix="run scripts/setup --system (podman), or start docker"
        )
    with StepLog(settings.output.resolve() / "logs" / "image-manifest.log") as log:
        pushed = [push_list(engine, plan, log=log) for plan in plans]
    record = settings.output.resolve() / "manifests.json"
    write_atomic(record, (json.dumps({"lists": [p.as_dict() for p in pushed]}, indent=2) + "\n").encode())
    for each in pushed:
        platforms = ", ".join(f"{m.platform} ({m.cell})" for m in each.plan.members)
        console.print(f"{each.plan.target} ({each.digest[:19]}...): {platforms}", highlight=False)
    console.print(f"recorded in {record}", highlight=False)
    return 0
