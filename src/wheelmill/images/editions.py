"""Container images from the index: a cell's runtime and devel editions, and an extras
image on top of either, defined as data in ``containers/{runtime,devel,extras}`` and built
by the same engine code as the builder images.

Every image installs with pip from the cell's channel alone, served on loopback while it
builds, and carries ``wheelmill-doctor`` (``wheelmill/doctor.py``, copied into the runtime
image's build context, so the devel and extras images have it too); its tag says what is
inside (``<sha7>-<edition>[-extras]-<toolkit>-torch<v>-py<v>``, at most 128 characters)
and its labels carry the channel and every wheel's name and sha256. Planning is pure
(``plan_images``); building and the smoke tests are ``build_images`` and
``wheelmill.images.smoke``.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from wheelmill.errors import CommandFailed, ConfigError, ImageError, PrecheckError, ReleaseError
from wheelmill.images import doctor
from wheelmill.index.closure import read
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.roots import Index
from wheelmill.index.storage import Storage
from wheelmill.inputs.manylinux import oldest_glibc
from wheelmill.inputs.variants import Cell, Family
from wheelmill.inputs.versions import Track
from wheelmill.machine.builder_images import image_id
from wheelmill.machine.emulation import DEBIAN_ARCH, foreign_platform
from wheelmill.machine.engine import Engine, insecure_registry
from wheelmill.machine.process import HostRunner, StepLog, base_environment, capture
from wheelmill.output.layout import CellLayout
from wheelmill.output.report import ReportError, Status, load_report
from wheelmill.releases.records import ReleasedFile, load_manifest
from wheelmill.wheel.wheelfile import read_wheel

REPOSITORY = "localhost/wheelmill"
MAX_TAG = 128  # the OCI distribution spec's limit on a tag
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
LABEL_PREFIX = "io.wheelmill"
# Standard library only, so it runs alone in an image, with the image's Python.
DOCTOR = Path(doctor.__file__)


class Edition(StrEnum):
    RUNTIME = "runtime"
    DEVEL = "devel"


@dataclass(frozen=True, kw_only=True)
class Delivered:
    """A wheel the cell built and published."""

    project: str
    version: str
    filename: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"


@dataclass(frozen=True, kw_only=True)
class CellOutput:
    """What a build of the cell left: its channel, its torch and its wheels."""

    cell: Cell
    channel: str
    torch: str
    wheels: tuple[Delivered, ...]
    closure: Path | None  # its runtime closure's lock, where it was mirrored


def read_cell_output(layout: CellLayout, cell: Cell) -> CellOutput:
    """The cell's output from its report; a cell never built (or not built whole) here is
    one error that says how to build it."""
    fix = f"build it first: wheelmill build --cell {cell.id}"
    try:
        built = load_report(layout.report, cell=layout.cell)
    except FileNotFoundError:
        raise PrecheckError(f"{cell.id}: never built here (no {layout.report})", fix=fix) from None
    except (OSError, ReportError) as exc:
        raise PrecheckError(f"{layout.report}: not a report of a built cell ({exc})", fix=fix) from None
    if built.status is not Status.OK or not built.wheels:
        raise PrecheckError(f"{cell.id}: its last build did not deliver every wheel (status {built.status})", fix=fix)
    try:
        torch = built.torch
    except (KeyError, TypeError) as exc:
        raise PrecheckError(f"{layout.report}: not a report of a built cell (no torch: {exc})", fix=fix) from None
    delivered = []
    for wheel in built.wheels:
        project, version, *_ = parse_wheel_filename(wheel.name)
        delivered.append(
            Delivered(project=str(project), version=str(version), filename=wheel.name, sha256=wheel.sha256)
        )
    lock = layout.closure_lock
    return CellOutput(
        cell=cell, channel=built.channel, torch=torch, wheels=tuple(delivered), closure=lock if lock.is_file() else None
    )


def released_files(records: Storage, track: Track, version: str, cell: Cell) -> list[ReleasedFile]:
    """The files a release's record names for ``cell``; none is an error naming the cells it has."""
    manifest = load_manifest(records, track, version)
    files = [f for f in manifest.files if f.cell == cell.id]
    if not files:
        raise ReleaseError(
            f"{track.value} {version}: no files of {cell.id}",
            fix=f"cells released: {', '.join(sorted({f.cell for f in manifest.files}))}",
        )
    return files


def read_release_output(records: Storage, root: Path, track: Track, version: str, cell: Cell) -> CellOutput:
    """A released cell's output from the release's record (in ``records``) and its channel
    (in the tree ``root``; what a promoted final release has: no build of its own): its files
    there, and the torch they pin."""
    files = released_files(records, track, version, cell)
    channel = Index(tree=root).channel(files[0].channel)
    wheels, pins = [], set()
    for released in files:
        project, wheel_version, *_ = parse_wheel_filename(released.filename)
        wheels.append(
            Delivered(
                project=str(project), version=str(wheel_version), filename=released.filename, sha256=released.sha256
            )
        )
        info = read_wheel(stored_file(channel, released.filename))
        pins |= {
            str(req.specifier).removeprefix("==")
            for req in map(Requirement, info.requires_dist)
            if req.name == "torch" and str(req.specifier).startswith("==")
        }
    if len(pins) != 1:
        raise ReleaseError(
            f"{track.value} {version}: the wheels of {cell.id} pin {len(pins)} torch versions "
            f"({', '.join(sorted(pins)) or 'none'})",
            fix="release cells whose wheels pin their torch exactly",
        )
    return CellOutput(cell=cell, channel=channel.name, torch=pins.pop(), wheels=tuple(wheels), closure=None)


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """One image to build: its definition, its arguments, its labels and its name."""

    kind: str  # runtime | devel | runtime-extras | devel-extras
    reference: str  # localhost/wheelmill:<tag>
    containerfile: Path
    build_args: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)
    context_files: Mapping[str, Path] = field(default_factory=dict)  # a name in the build context -> the file it copies
    platform: str | None = None  # the OCI platform of another machine's image (linux/arm64); None: x86_64

    @property
    def tag(self) -> str:
        return self.reference.rsplit(":", 1)[1]


def toolkit_label(cell: Cell) -> str:
    """``cuda13.0.2``; a slim cell's arch after it (``cuda13.0.2-sm90``), so the images of a
    slim cell never take the tags of its parent's, whose wheels carry every arch."""
    variant = cell.variant
    toolkit = {Family.CUDA: f"cuda{variant.toolkit}", Family.ROCM: f"rocm{variant.toolkit}"}.get(variant.family, "cpu")
    return f"{toolkit}-{variant.slim_tag}" if variant.slim_tag else toolkit


def image_tag(commit: str, kind: str, cell: Cell, torch: str) -> str:
    """What the image holds, as a tag; refused where it would be no valid tag. An image of
    another machine than x86_64 ends in its Debian arch (``-arm64``): the two machines'
    images of a cell never share a tag."""
    platform = cell.variant.platform_tag and f"-{DEBIAN_ARCH[cell.variant.platform]}"
    tag = f"{commit[:7]}-{kind}-{toolkit_label(cell)}-torch{Version(torch).public}-py{cell.python}{platform or ''}"
    if len(tag) > MAX_TAG:
        raise ConfigError(
            f"{cell.id}: the image tag {tag[:40]}... would be {len(tag)} characters, "
            f"over the {MAX_TAG} a registry accepts",
            fix="shorten what it is made of: the variant's toolkit or torch version",
        )
    if not _TAG.match(tag):
        raise ConfigError(
            f"{cell.id}: {tag!r} is not a valid image tag",
            fix="the toolkit and torch versions may use letters, digits, '.', '_' and '-'",
        )
    return tag


def plan_images(
    output: CellOutput,
    *,
    edition: Edition,
    extras: bool,
    commit: str,
    builder: str,
    base: str,
    runtime_packages: Sequence[str],
    index_url: str,
    containers: Path,
) -> tuple[ImageSpec, ...]:
    """The images to build, each FROM the one before: the runtime edition, the devel edition
    on it, and the extras image on the chosen edition."""
    cell = output.cell
    platform = foreign_platform(cell.variant.platform)
    built = " ".join(sorted(w.requirement for w in output.wheels))
    # torch reports its label (2.10.0+cpu), which PyPI's file does not carry: pinned by release there
    torch = Version(output.torch).public if cell.variant.torch_on_pypi else output.torch
    labels = {
        "org.opencontainers.image.revision": commit,
        f"{LABEL_PREFIX}.cell": cell.id,
        f"{LABEL_PREFIX}.channel": output.channel,
        f"{LABEL_PREFIX}.torch": output.torch,
    }
    runtime = ImageSpec(
        kind=Edition.RUNTIME.value,
        reference=f"{REPOSITORY}:{image_tag(commit, Edition.RUNTIME.value, cell, output.torch)}",
        containerfile=containers / "runtime" / "Containerfile",
        build_args={
            "BUILDER": builder,
            "BASE": base,
            "PYTHON_VERSION": cell.python,
            "RUNTIME_PACKAGES": " ".join(runtime_packages),
            "INDEX_URL": index_url,
            "TORCH": torch,
            "CONSTRAINTS": f"torch=={torch} {built}",
        },
        labels={**labels, f"{LABEL_PREFIX}.edition": Edition.RUNTIME.value},
        context_files={"wheelmill-doctor": DOCTOR},
        platform=platform,
    )
    specs = [runtime]
    if edition is Edition.DEVEL:
        specs.append(
            ImageSpec(
                kind=Edition.DEVEL.value,
                reference=f"{REPOSITORY}:{image_tag(commit, Edition.DEVEL.value, cell, output.torch)}",
                containerfile=containers / "devel" / "Containerfile",
                build_args={
                    "RUNTIME": runtime.reference,
                    "INDEX_URL": index_url,
                    "TOOLKIT": " ".join(cell.variant.toolkit_wheels),
                },
                labels={**labels, f"{LABEL_PREFIX}.edition": Edition.DEVEL.value},
                platform=platform,
            )
        )
    if extras:
        kind = f"{edition.value}-extras"
        wheels = {
            f"{LABEL_PREFIX}.wheels": json.dumps(
                {w.filename: w.sha256 for w in output.wheels}, sort_keys=True, separators=(",", ":")
            )
        }
        specs.append(
            ImageSpec(
                kind=kind,
                reference=f"{REPOSITORY}:{image_tag(commit, kind, cell, output.torch)}",
                containerfile=containers / "extras" / "Containerfile",
                build_args={"EDITION": specs[-1].reference, "INDEX_URL": index_url, "WHEELS": built},
                labels={**labels, **wheels, f"{LABEL_PREFIX}.edition": edition.value},
                platform=platform,
            )
        )
    return tuple(specs)


def stored_file(channel: ObjectChannel, filename: str) -> Path:
    """A listed file of a tree's channel where it lies."""
    project = channel.project(str(parse_wheel_filename(filename)[0]))
    entry = next((f for f in project.files if f.filename == filename), None) if project else None
    local = channel.local_file(entry) if entry is not None else None
    if local is None:
        raise ReleaseError(
            f"{channel.name}: {filename} is not in the channel's files",
            fix="`wheelmill index verify` says what is missing; publish the release's files again",
        )
    return local


def missing_from_channel(output: CellOutput, channel: ObjectChannel) -> list[str]:
    """What the images would install that the channel does not hold: torch, the cell's
    wheels, and every wheel of its runtime closure (where it was mirrored)."""
    wanted = {"torch": output.torch, **{w.project: w.version for w in output.wheels}}
    if output.closure is not None:
        wanted |= {w.project: w.version for w in read(output.closure).wheels}
    missing = []
    for project, version in sorted(wanted.items()):
        found = channel.project(project) if channel.exists() else None
        if found is None or not any(Version(f.version) == Version(version) for f in found.files):
            missing.append(f"{project}=={version}")
    return missing


def built_installed(filenames: Sequence[str], *, extras: bool) -> list[str]:
    """Which of the cell's files (built here) its images install: every one where the extras
    image is built; else only a torch the cell built itself, which the runtime image takes
    (its constraint file pins the others, but nothing installs them)."""
    return [name for name in filenames if extras or str(parse_wheel_filename(name)[0]) == "torch"]


def too_new(output: CellOutput, glibc: str) -> list[str]:
    """The cell's wheels that need a newer glibc than the image's (a wheel built on a newer
    machine than the image's base: pip would find no wheel it can install)."""
    have = tuple(int(part) for part in glibc.split("."))
    found = []
    for wheel in output.wheels:
        needs = oldest_glibc(tag.platform for tag in parse_wheel_filename(wheel.filename)[3])
        if needs and needs > have:
            found.append(f"{wheel.filename} needs glibc {'.'.join(map(str, needs))}")
    return found


@dataclass(frozen=True, kw_only=True)
class BuiltImage:
    spec: ImageSpec
    image_id: str
    size: int
    smoke: tuple[str, ...] = ()
    pushed: str | None = None  # registry reference @ digest

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.spec.kind,
            "reference": self.spec.reference,
            "id": self.image_id,
            "size": self.size,
            "labels": dict(self.spec.labels),
            "smoke": list(self.smoke),
            "pushed": self.pushed,
            "platform": self.spec.platform or "linux/amd64",
        }


def build_images(
    engine: Engine, specs: Sequence[ImageSpec], *, log: StepLog, on_line: Callable[[str], None]
) -> list[BuiltImage]:
    """Build each image in turn; when one fails, what this call built is removed again."""
    built: list[BuiltImage] = []
    try:
        for spec in specs:
            on_line(f"building {spec.reference}")
            built.append(_build_one(engine, spec, log=log, on_line=on_line))
    except BaseException:
        remove(engine, [b.spec.reference for b in built])
        raise
    return built


@contextmanager
def build_context(spec: ImageSpec) -> Iterator[Path]:
    """The directory an image is built from: its Containerfile's own, or a temporary copy
    of it with the spec's files from elsewhere (the doctor, from the package) added as
    executables, since an engine reads nothing outside the context."""
    if not spec.context_files:
        yield spec.containerfile.parent
        return
    with tempfile.TemporaryDirectory(prefix="wheelmill-context-") as tmp:
        context = Path(tmp) / spec.containerfile.parent.name
        shutil.copytree(spec.containerfile.parent, context)
        for name, source in spec.context_files.items():
            shutil.copyfile(source, context / name)
            (context / name).chmod(0o755)
        yield context


def _build_one(engine: Engine, spec: ImageSpec, *, log: StepLog, on_line: Callable[[str], None]) -> BuiltImage:
    try:
        with build_context(spec) as context:
            argv = engine.build(
                tag=spec.reference,
                containerfile=context / spec.containerfile.name,
                context=context,
                build_args=spec.build_args,
                labels=spec.labels,
                platform=spec.platform,
            )
            HostRunner().run(argv, env=base_environment([]), log=log, on_line=on_line)
    except CommandFailed as failed:
        remove(engine, [spec.reference])
        raise ImageError(f"building {spec.reference} failed: {_pip_said(failed)}", fix=f"read {failed.log}") from None
    identity = image_id(engine, spec.reference)
    if identity is None:
        raise ImageError(f"{spec.reference} was built but cannot be inspected", fix=f"read {log.path}")
    size = capture(engine.image_size(spec.reference), timeout=60).stdout.strip()
    return BuiltImage(spec=spec, image_id=identity, size=int(size) if size.isdigit() else 0)


def _pip_said(failed: CommandFailed) -> str:
    """pip's own first error line where there is one ("No matching distribution found for x")."""
    said = [line.strip() for line in failed.tail if line.strip().startswith("ERROR:")]
    return said[0] if said else failed.last_line()


def remove(engine: Engine, references: Sequence[str]) -> None:
    for reference in reversed(references):
        capture(engine.remove_image(reference), timeout=120)


def push(engine: Engine, image: BuiltImage, registry: str, *, log: StepLog, attempts: int = 3) -> BuiltImage:
    """Push the image to ``registry`` under its own tag; the image, with the pushed
    reference and digest recorded. A registry on loopback is spoken to without TLS."""
    target = f"{registry.rstrip('/')}/wheelmill:{image.spec.tag}"
    insecure = insecure_registry(registry)
    runner = HostRunner()
    with tempfile.TemporaryDirectory(prefix="wheelmill-push-") as tmp:
        digest_file = Path(tmp) / "digest"
        try:
            runner.run(engine.tag(image.spec.reference, target), env=base_environment([]), log=log)
            for attempt in range(1, attempts + 1):
                try:
                    runner.run(
                        engine.push(target, digest_file=digest_file, insecure=insecure),
                        env=base_environment([]),
                        log=log,
                    )
                    break
                except CommandFailed:
                    if attempt == attempts:
                        raise
                    time.sleep(attempt)
        except CommandFailed as failed:
            raise ImageError(
                f"pushing {target} failed: {failed.last_line()}", fix=f"check the registry; read {failed.log}"
            ) from None
        digest = (
            digest_file.read_text(encoding="utf-8").strip() if digest_file.is_file() else _repo_digest(engine, target)
        )
    if not digest.startswith("sha256:"):
        raise ImageError(f"pushed {target}, but the registry gave no digest", fix=f"read {log.path}")
    return replace(image, pushed=f"{target.rsplit(':', 1)[0]}@{digest}")


def _repo_digest(engine: Engine, target: str) -> str:
    repository = target.rsplit(":", 1)[0]
    lines = capture(engine.repo_digests(target), timeout=60).stdout.split()
    return next((line.split("@", 1)[1] for line in lines if line.startswith(f"{repository}@")), "")
