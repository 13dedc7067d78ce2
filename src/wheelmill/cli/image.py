"""``wheelmill image build``: a cell's runtime or devel image (and the extras image on it)
from the cell's channel alone, smoke-tested in tiers, optionally pushed."""

from __future__ import annotations

import argparse
import json
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from wheelmill.cli.basics import Commands, load_inputs, print_error
from wheelmill.config import format_size
from wheelmill.errors import ConfigError, ImageError, PrecheckError, UsageError
from wheelmill.files import write_atomic
from wheelmill.images import doctor
from wheelmill.images.editions import (
    BuiltImage,
    CellOutput,
    Edition,
    ImageSpec,
    build_images,
    built_installed,
    missing_from_channel,
    plan_images,
    push,
    read_cell_output,
    read_release_output,
    released_files,
    remove,
    stored_file,
    too_new,
)
from wheelmill.images.manifests import members_of, plan_lists, push_list
from wheelmill.images.smoke import Smoke
from wheelmill.index.closure import read as read_closure
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.roots import Index, Installable, tree_to_install_from
from wheelmill.index.serve import make_server
from wheelmill.inputs.variants import Cell, Family
from wheelmill.inputs.versions import Track
from wheelmill.machine import builder_images as images
from wheelmill.machine.emulation import CPU_SYSFS, emulated_cpu
from wheelmill.machine.engine import Engine, Mount, detect
from wheelmill.machine.pins import load_pins
from wheelmill.machine.process import StepLog, capture
from wheelmill.machine.registry import is_registry
from wheelmill.output.layout import CLOSURE_LOCK_NAME, CellLayout
from wheelmill.output.report import ReportError, load_report
from wheelmill.provenance.signing import trusted_keys_of
from wheelmill.releases.attested import local_source
from wheelmill.releases.preinstall import verify_before_install
from wheelmill.releases.records import ReleasedImage, record_images
from wheelmill.settings import Settings


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
        choices=[e.value for e in Edition],
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
    if not is_registry(text):
        raise UsageError(
            f"--push {text!r}: not a registry (host[:port][/path], lower case, no scheme)",
            fix="give one like ghcr.io/my-org/wheelmill or 127.0.0.1:5000/wheelmill",
        )
    return text


def cmd_image_build(args: argparse.Namespace, settings: Settings, console: Console) -> int:
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
        return _image_build(args, settings, console, cell=cell, layout=layout, released=released, root=root)


def _installable(index: Index, args: argparse.Namespace, cell: Cell, layout: CellLayout) -> Installable:
    """What the cell's images install: the files built here that the release's record names,
    or its build's, and the mirrored closure its build locked (every mirrored file of the
    channel where that lock is not here, as for a release built by another job)."""
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
    checked = verify_before_install(
        local_source(index.channel(wanted.channel)),
        built_installed(list(wanted.built), extras=args.extras),
        trusted=trusted_keys_of(settings),
        on_failure=print_error,
    )
    console.print(checked.line(), highlight=False, markup=False)
    return checked.code


def _image_build(
    args: argparse.Namespace,
    settings: Settings,
    console: Console,
    *,
    cell: Cell,
    layout: CellLayout,
    released: tuple[Track, str] | None,
    root: Path,
) -> int:
    index = Index.of(settings)
    released_output = (
        read_release_output(index.storage, root, Track(args.track), args.release, cell) if args.release else None
    )
    output = released_output or read_cell_output(layout, cell)
    commit = _commit(settings.root)
    edition = Edition(args.edition)
    containers = settings.root / "containers"
    pins = load_pins(containers / "pins.toml")
    builder = images.choose(pins, cell.variant, cell.python, containers=containers, policy="bootstrap")
    suite = str(builder.base.suite)
    packages, glibc = pins.runtime_packages.get(suite), pins.glibc_of(suite)
    if packages is None:
        raise ConfigError(
            f"{pins.file}: runtime.packages: no packages for Debian {suite}",
            fix="add the suite to [runtime.packages]",
        )
    newer = too_new(output, glibc)
    if newer:
        raise ImageError(
            f"{cell.id}: the images run Debian {suite} (glibc {glibc}), but {'; '.join(newer)}",
            fix=f"build the cell in its container (wheelmill build --cell {cell.id} --engine podman), "
            "whose glibc is the image's",
        )

    def planned(index_url: str, builder_tag: str) -> tuple[ImageSpec, ...]:
        return plan_images(
            output, edition=edition, extras=args.extras, commit=commit, builder=builder_tag,
            base=builder.base.reference, runtime_packages=packages, index_url=index_url, containers=containers,
        )  # fmt: skip

    planned("", "")  # every tag is checked before anything runs
    channel = Index(tree=root).channel(output.channel)
    missing = missing_from_channel(output, channel)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ImageError(
            f"{cell.id}: channel {channel.name} lacks {', '.join(missing[:5])}{more}",
            fix=f"mirror the cell's closure: wheelmill mirror --cell {cell.id}",
        )
    engine = detect(args.engine or (settings.engine if settings.engine != "none" else "auto"))
    if engine is None:
        raise UsageError(
            "image build: no container engine answers", fix="run scripts/setup --system (podman), or start docker"
        )
    cut_off = engine.network_access()
    if cut_off is not None:  # before anything is built: every image's tier c starts two nodes on an engine network
        raise PrecheckError(
            f"image build: the smoke tests' two-node tier needs an engine network, but {cut_off}",
            fix="as root, chmod 0666 /dev/net/tun (the mode most distributions give it); or build images as root, "
            "or with docker as a member of its group",
        )
    with StepLog(layout.logs / f"image-{edition.value}{'-extras' if args.extras else ''}.log") as log:
        access_log = args.access_log or layout.logs / "image-index-access.log"
        built = _build(
            engine,
            output=output,
            builder=builder,
            planned=planned,
            settings=settings,
            root=root,
            log=log,
            console=console,
            access_log=access_log,
        )
        try:
            built = [
                _smoked(engine, image, output=output, channel=channel, log=log, console=console, work=layout.cache)
                for image in built
            ]
            if args.push:
                built = [push(engine, image, args.push, log=log) for image in built]
        except BaseException:
            remove(engine, [b.spec.reference for b in built])
            raise
    _record(layout.images, built)
    if released is not None and args.push:
        path = record_images(
            index.storage,
            *released,
            [ReleasedImage(cell=cell.id, kind=b.spec.kind, reference=str(b.pushed)) for b in built],
        )
        console.print(f"recorded in {path}", highlight=False)
    _summary(console, built)
    return 0


def _released(args: argparse.Namespace, layout: CellLayout) -> tuple[Track, str] | None:
    """The release the images belong to: --release, or the one the cell was built for."""
    if args.release:
        return Track(args.track), args.release
    try:
        release = load_report(layout.report, cell=layout.cell).release
    except (OSError, ReportError):
        return None
    return None if release is None else (release.track, release.version)


def _commit(root: Path) -> str:
    done = capture(["git", "-C", str(root), "rev-parse", "HEAD"], timeout=30)
    commit = done.stdout.strip()
    if done.returncode != 0 or len(commit) != 40:
        raise ConfigError(
            f"{root}: not a git checkout: an image is tagged with its commit",
            fix="build images from a clone of the repository",
        )
    return commit


def _build(
    engine: Engine,
    *,
    output: CellOutput,
    builder: images.BuilderImage,
    planned: Callable[[str, str], tuple[ImageSpec, ...]],
    settings: Settings,
    root: Path,
    log: StepLog,
    console: Console,
    access_log: Path,
) -> list[BuiltImage]:
    """The cell's builder image (its CPython; from the shared registry where one is set, as a
    build gets it), then the images, while the index is served on loopback for them to
    install from."""

    def say(line: str) -> None:
        console.print(f"  {line}", highlight=False, markup=False)

    ready = images.prepare_builder(
        engine,
        builder,
        mirror=lambda: images.debian_mirror(settings.debian_mirror),  # asked only where something is made
        work=settings.output.resolve() / ".work",
        log=log,
        on_line=log.write,
        sharing=images.Sharing.of(settings.image_registry, settings.shared_writes),
        policy=settings.retry,
    )
    access_log.parent.mkdir(parents=True, exist_ok=True)
    with access_log.open("a", encoding="utf-8") as handle:
        server = make_server(root, "127.0.0.1", 0, handle)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/{output.channel}/simple/"
            say(f"serving {output.channel} at {url} for the images to install from (access log {access_log})")
            specs = planned(url, ready.tag)
            return build_images(
                engine,
                specs,
                log=log,
                on_line=lambda line: log.write(line) if not line.startswith("building ") else say(line),
            )
        finally:
            server.shutdown()
            server.server_close()


def _smoked(
    engine: Engine,
    image: BuiltImage,
    *,
    output: CellOutput,
    channel: ObjectChannel,
    log: StepLog,
    console: Console,
    work: Path,
) -> BuiltImage:
    """Every tier on the image; the lines they printed, kept with it."""
    console.print(f"smoke-testing {image.spec.reference}", highlight=False)
    # as in the build's container: emulated aarch64 code reads CPU registers sysfs lacks here
    standin = emulated_cpu(output.cell.variant.platform, work / "emulation" / "cpu")
    always = [Mount(source=standin, target=CPU_SYSFS)] if standin else []
    smoke = Smoke(
        engine,
        image.spec.reference,
        log=log,
        on_line=lambda line: console.print(f"  {line}", highlight=False, markup=False),
        always=always,
    )
    extras = image.spec.kind.endswith("-extras")
    modules = sorted({m for w in output.wheels for m in top_level(stored_file(channel, w.filename))}) if extras else []
    smoke.imports(output.torch, modules)
    smoke.sboms([w.requirement for w in output.wheels], every=extras)
    if image.spec.kind == Edition.RUNTIME.value:
        smoke.no_compiler()
    if image.spec.kind == Edition.DEVEL.value:
        smoke.compiles()
    smoke.standalone()
    smoke.pytorchjob(trainer_v2=False)
    smoke.pytorchjob(trainer_v2=True)
    gpus = doctor.visible()
    smoke.nccl(
        cuda=output.cell.variant.family is Family.CUDA,
        gpus=[gpu.label for gpu in gpus.found if gpu.family == "cuda"],
        why_none="; ".join(gpus.notes) or "none found",
    )
    return BuiltImage(
        spec=image.spec, image_id=image.image_id, size=image.size, smoke=tuple(smoke.said), pushed=image.pushed
    )


def top_level(wheel: Path) -> set[str]:
    """The importable top-level names a wheel installs (its packages and modules)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    found = set()
    for name in names:
        head, _, rest = name.partition("/")
        if head.endswith((".dist-info", ".data", ".libs")):
            continue
        if rest == "__init__.py" or (not rest and head.endswith((".py", ".so"))):
            found.add(head.split(".", 1)[0])
    return found


def _record(path: Path, built: list[BuiltImage]) -> None:
    """``<cell>/images.json``: every image built for the cell, the newest of each kind."""
    try:
        known = {entry["kind"]: entry for entry in json.loads(path.read_text(encoding="utf-8"))["images"]}
    except (OSError, ValueError, KeyError, TypeError):
        known = {}
    known |= {image.spec.kind: image.as_dict() for image in built}
    write_atomic(path, (json.dumps({"images": list(known.values())}, indent=2) + "\n").encode())


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
