"""A cell's images, built: the runtime or devel image (and the extras image on it) from the
cell's channel alone, served on loopback while they build, each smoke-tested (the launch
tiers on the top of the chain), optionally pushed, and recorded (``<cell>/images.json``; a
release's record where they were pushed for one). What ``wheelmill image build`` runs,
after it has checked what the images install against its provenance."""

from __future__ import annotations

import json
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wheelmill.errors import ConfigError, ImageError, PrecheckError, UsageError, redact_data
from wheelmill.files import write_atomic
from wheelmill.images import doctor
from wheelmill.images.editions import (
    BuiltImage,
    CellOutput,
    Edition,
    ImageSpec,
    build_images,
    missing_from_channel,
    plan_images,
    push,
    read_cell_output,
    read_release_output,
    remove,
    stored_file,
    too_new,
)
from wheelmill.images.smoke import Smoke
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.roots import Index
from wheelmill.index.serve import make_server
from wheelmill.inputs.variants import Cell, Family
from wheelmill.inputs.versions import Track
from wheelmill.machine import builder_images as images
from wheelmill.machine.emulation import CPU_SYSFS, emulated_cpu
from wheelmill.machine.engine import Engine, Mount, detect
from wheelmill.machine.pins import load_pins
from wheelmill.machine.process import StepLog, capture
from wheelmill.output.layout import CellLayout
from wheelmill.releases.records import ReleasedImage, record_images
from wheelmill.settings import Settings


@dataclass(frozen=True, kw_only=True)
class ImageJob:
    """What to build for one cell, as ``wheelmill image build`` was asked."""

    cell: Cell
    layout: CellLayout
    edition: Edition
    extras: bool
    engine: str | None  # None: the settings' engine (auto where it is none)
    push: str | None  # a registry to push to, or None
    access_log: Path | None  # None: the cell's logs/image-index-access.log
    release: tuple[Track, str] | None  # the release whose record names the files; None: the cell's build
    record_in: tuple[Track, str] | None  # the release the pushed images are recorded in


def build_cell_images(job: ImageJob, settings: Settings, *, root: Path, say: Callable[[str], None]) -> list[BuiltImage]:
    """The job's images from the index tree ``root`` (served on loopback while they build),
    each smoke-tested (the launch tiers on the top of the chain), pushed where the job says,
    recorded in the cell's ``images.json`` (and, pushed for a release, in its record); every
    image removed again where a tier or a push fails."""
    cell, layout, edition = job.cell, job.layout, job.edition
    index = Index.of(settings)
    output = (
        read_release_output(index.storage, root, *job.release, cell) if job.release else read_cell_output(layout, cell)
    )
    commit, containers = _commit(settings.root), settings.root / "containers"
    builder, packages = _runtime_base(containers, output)

    def planned(index_url: str, builder_tag: str) -> tuple[ImageSpec, ...]:
        return plan_images(
            output, edition=edition, extras=job.extras, commit=commit, builder=builder_tag,
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
    engine = _engine(job, settings)
    with StepLog(layout.logs / f"image-{edition.value}{'-extras' if job.extras else ''}.log") as log:
        access_log = job.access_log or layout.logs / "image-index-access.log"
        built = _build(
            engine,
            output=output,
            builder=builder,
            planned=planned,
            settings=settings,
            root=root,
            log=log,
            say=say,
            access_log=access_log,
        )
        try:
            top = built[-1].spec.reference  # the images are a chain, each FROM the one before
            built = [
                _smoked(engine, image, output=output, channel=channel, log=log, say=say, work=layout.cache, top=top)
                for image in built
            ]
            if job.push:
                built = [push(engine, image, job.push, log=log) for image in built]
        except BaseException:
            remove(engine, [b.spec.reference for b in built])
            raise
    _record(layout.images, built)
    if job.record_in is not None and job.push:
        path = record_images(
            index.storage,
            *job.record_in,
            [ReleasedImage(cell=cell.id, kind=b.spec.kind, reference=str(b.pushed)) for b in built],
        )
        say(f"recorded in {path}")
    return built


def _runtime_base(containers: Path, output: CellOutput) -> tuple[images.BuilderImage, tuple[str, ...]]:
    """The cell's builder image (whose bootstrapped base the runtime image starts from) and
    the Debian packages the runtime adds; refused where a wheel needs a newer glibc."""
    pins = load_pins(containers / "pins.toml")
    cell = output.cell
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
    return builder, packages


def _engine(job: ImageJob, settings: Settings) -> Engine:
    """The engine the images are built with, checked before anything is built: every
    image's tier c starts two nodes on an engine network."""
    engine = detect(job.engine or (settings.engine if settings.engine != "none" else "auto"))
    if engine is None:
        raise UsageError(
            "image build: no container engine answers", fix="run scripts/setup --system (podman), or start docker"
        )
    cut_off = engine.network_access()
    if cut_off is not None:
        raise PrecheckError(
            f"image build: the smoke tests' two-node tier needs an engine network, but {cut_off}",
            fix="as root, chmod 0666 /dev/net/tun (the mode most distributions give it); or build images as root, "
            "or with docker as a member of its group",
        )
    return engine


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
    say: Callable[[str], None],
    access_log: Path,
) -> list[BuiltImage]:
    """The cell's builder image (its CPython; from the shared registry where one is set, as a
    build gets it), then the images, while the index is served on loopback for them to
    install from."""

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
            say(f"  serving {output.channel} at {url} for the images to install from (access log {access_log})")
            specs = planned(url, ready.tag)
            return build_images(
                engine,
                specs,
                log=log,
                on_line=lambda line: log.write(line) if not line.startswith("building ") else say(f"  {line}"),
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
    say: Callable[[str], None],
    work: Path,
    top: str,
) -> BuiltImage:
    """Tier a on the image, and the launch tiers (b, c, d) on the top of the chain alone
    (``top``): it holds every layer of the images below it, so a launch that works there
    works with their torch and variables, and they are not started again for each (a dozen
    containers, each importing torch). The lines they printed, kept with the image."""
    say(f"smoke-testing {image.spec.reference}")
    # as in the build's container: emulated aarch64 code reads CPU registers sysfs lacks here
    standin = emulated_cpu(output.cell.variant.platform, work / "emulation" / "cpu")
    always = [Mount(source=standin, target=CPU_SYSFS)] if standin else []
    smoke = Smoke(
        engine,
        image.spec.reference,
        log=log,
        on_line=lambda line: say(f"  {line}"),
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
    if image.spec.reference == top:
        _launch_tiers(smoke, cuda=output.cell.variant.family is Family.CUDA)
    else:
        smoke.say(f"tiers b, c, d: run on {top}, which is built on this image")
    return BuiltImage(
        spec=image.spec, image_id=image.image_id, size=image.size, smoke=tuple(smoke.said), pushed=image.pushed
    )


def _launch_tiers(smoke: Smoke, *, cuda: bool) -> None:
    """torchrun standalone, the PyTorchJob emulation of both operators, NCCL where a GPU is."""
    smoke.standalone()
    smoke.pytorchjob(trainer_v2=False)
    smoke.pytorchjob(trainer_v2=True)
    gpus = doctor.visible()
    smoke.nccl(
        cuda=cuda,
        gpus=[gpu.label for gpu in gpus.found if gpu.family == "cuda"],
        why_none="; ".join(gpus.notes) or "none found",
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
    write_atomic(path, (json.dumps(redact_data({"images": list(known.values())}), indent=2) + "\n").encode())
