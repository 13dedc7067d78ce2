"""Builder images: which definition and base a cell uses, what the image is called (a hash
of its definition and pins, so it is rebuilt exactly when they change), and making it:
bootstrapping the air-gapped base from Debian packages when that is the base, then building.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from wheelmill.errors import CommandFailed, ConfigError, PrecheckError
from wheelmill.inputs.manylinux import manylinux_of
from wheelmill.inputs.variants import X86_64, Family, Variant
from wheelmill.machine.emulation import DEBIAN_ARCH, foreign_platform
from wheelmill.machine.engine import Engine
from wheelmill.machine.pins import Pins, PythonSource, RegistryBase
from wheelmill.machine.process import HostRunner, StepLog, base_environment, capture

BASE_REPOSITORY = "localhost/wheelmill-base"
BUILDER_REPOSITORY = "localhost/wheelmill-builder"


class BaseKind(StrEnum):
    REGISTRY = "registry"
    BOOTSTRAP = "bootstrap"


@dataclass(frozen=True, kw_only=True)
class Base:
    kind: BaseKind
    reference: str
    description: str
    glibc: str  # 2.31: the newest glibc a wheel built on it can need
    suite: str | None = None  # the Debian suite of a bootstrapped base
    bootstrap_variant: str = "minbase"  # debootstrap --variant
    platform: str = X86_64  # the machine its programs are code for
    unpinned: str | None = None  # why it cannot be used yet: a registry base without a digest

    @property
    def baseline(self) -> str:
        """The manylinux tag its wheels promise at most (``manylinux_2_31``): its glibc's."""
        return manylinux_of(self.glibc)


@dataclass(frozen=True, kw_only=True)
class BuilderImage:
    """A builder image as data: the definition, its base and the cell's CPython."""

    containerfile: Path
    base: Base
    python: PythonSource
    platform: str = X86_64  # the machine the image's programs are code for

    @property
    def oci_platform(self) -> str | None:
        """``linux/arm64`` for an image of another machine than x86_64 (the engines' own
        default), which the engine must be told; None for x86_64."""
        return foreign_platform(self.platform)

    def build_args(self, mirror: str) -> dict[str, str]:
        return {
            "BASE": self.base.reference,
            "PYTHON_VERSION": self.python.version,
            "PYTHON_URL": self.python.location(mirror),
            "PYTHON_SHA256": self.python.sha256,
        }

    def tag(self, base_identity: str, mirror: str) -> str:
        """``<repository>:<definition>-py311-<hash>``: the hash of the Containerfile, the build
        arguments and the base's identity (its digest, or the bootstrapped image's id)."""
        digest = hashlib.sha256(self.containerfile.read_bytes())
        for key, value in sorted(self.build_args(mirror).items()):
            digest.update(f"\0{key}={value}".encode())
        digest.update(f"\0base={base_identity}".encode())
        digest.update(f"\0platform={self.platform}".encode() if self.platform != X86_64 else b"")
        name = self.containerfile.parent.name + ("" if self.platform == X86_64 else f"-{DEBIAN_ARCH[self.platform]}")
        return f"{BUILDER_REPOSITORY}:{name}-py{self.python.version.replace('.', '')}-{digest.hexdigest()[:12]}"

    def describe(self) -> str:
        machine = f", {self.platform} code" if self.platform != X86_64 else ""
        return (
            f"{self.containerfile.parent.name}/{self.containerfile.name} FROM {self.base.description}, "
            f"CPython {self.python.version}{machine}"
        )


def choose(pins: Pins, variant: Variant, python: str, *, containers: Path, policy: str) -> BuilderImage:
    """The builder image of a cell. ``policy``: ``auto`` uses a registry base once pinned,
    else the bootstrapped one; ``bootstrap`` or ``registry`` force one."""
    base = choose_base(pins, variant, policy=policy)
    if base.kind is BaseKind.BOOTSTRAP:
        definition = "builder"
    else:
        definition = "rocm" if variant.family is Family.ROCM else "manylinux"
    # A manylinux base holds every CPython of its time: nothing to fetch or pin for it.
    source = PythonSource(version=python) if definition == "manylinux" else pins.python(python)
    return BuilderImage(
        containerfile=containers / definition / "Containerfile", base=base, python=source, platform=variant.platform
    )


def choose_base(pins: Pins, variant: Variant, *, policy: str) -> Base:
    """The base a variant's builder images are made FROM, under a base policy (see ``choose``)."""
    registry_key = "rocm" if variant.family is Family.ROCM else "manylinux_2_28"
    registry = pins.bases.get(registry_key)
    use_registry = policy == "registry" or (policy == "auto" and registry is not None and registry.pinned)
    # The registry bases are x86_64 images: another platform's cells build on its bootstrapped base.
    if variant.family is Family.ROCM or (use_registry and variant.platform == X86_64):
        return _registry(pins, registry_key, registry)
    # a slim variant, or one of another torch, builds on its parent's base; a platform its own
    suite = pins.suite_for(variant.base_name, variant.platform_tag)
    arch = "" if variant.platform == X86_64 else f"-{DEBIAN_ARCH[variant.platform]}"
    reference = f"{BASE_REPOSITORY}:{suite}-{pins.variant}{arch}"
    return Base(
        kind=BaseKind.BOOTSTRAP,
        reference=reference,
        description=f"{reference} (debootstrap of Debian {suite}{arch.replace('-', ' for ')})",
        glibc=pins.glibc_of(suite),
        suite=suite,
        bootstrap_variant=pins.variant,
        platform=variant.platform,
    )


@dataclass(frozen=True, kw_only=True)
class Baselines:
    """The manylinux tag a variant's wheels promise on each kind of base: on its registry base
    (pinned and reachable) and on its bootstrapped one; None where it never builds on that kind
    (an aarch64 cell on a registry base, a ROCm one on a bootstrapped base)."""

    registry: str | None
    bootstrap: str | None


def baselines(pins: Pins, variant: Variant) -> Baselines:
    """What ``choose_base`` gives under each forced policy: the promises docs/matrix.md shows."""
    registry = choose_base(pins, variant, policy="registry")
    bootstrap = choose_base(pins, variant, policy="bootstrap")
    return Baselines(
        registry=registry.baseline if registry.kind is BaseKind.REGISTRY else None,
        bootstrap=bootstrap.baseline if bootstrap.kind is BaseKind.BOOTSTRAP else None,
    )


def _registry(pins: Pins, key: str, base: RegistryBase | None) -> Base:
    """The registry base; one not pinned by digest is planned, and refused when built."""
    if base is None:
        raise ConfigError(
            f"{pins.file}: bases.{key}: missing",
            fix=f"add [bases.{key}] with image, tag, digest and glibc (see the other bases)",
        )
    if not base.glibc:
        raise ConfigError(
            f"{pins.file}: bases.{key}.glibc: missing (its wheels' baseline follows from it)",
            fix='add the glibc of the image\'s distribution, e.g. glibc = "2.28" for a manylinux_2_28 image',
        )
    if not base.pinned:
        problem = f"{pins.file}: bases.{key}: not pinned by digest"
        return Base(
            kind=BaseKind.REGISTRY,
            reference=f"{base.image}:{base.tag}",
            description=f"{base.image}:{base.tag} (not pinned by digest: the build stops here until it is)",
            glibc=base.glibc,
            unpinned=problem,
        )
    return Base(
        kind=BaseKind.REGISTRY,
        reference=base.reference,
        description=f"{base.image}:{base.tag} ({base.digest[:19]}...)",
        glibc=base.glibc,
    )


def require_pinned(image: BuilderImage) -> None:
    """wheelmill builds FROM a registry base only by digest: a tag can change under it."""
    if image.base.unpinned:
        raise ConfigError(
            image.base.unpinned,
            fix="run scripts/update_pins.py where the registry is reachable (or WHEELMILL_BASE=bootstrap for cpu/cuda)",
        )


_APT_URI = re.compile(r"^(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", re.MULTILINE)


def debian_mirror(setting: str | None, apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror: the setting (WHEELMILL_DEBIAN_MIRROR), else the one this machine's
    apt uses."""
    if setting:
        return setting.rstrip("/")
    files = [
        apt_dir / "sources.list",
        *sorted((apt_dir / "sources.list.d").glob("*.list")),
        *sorted((apt_dir / "sources.list.d").glob("*.sources")),
    ]
    for file in files:
        text = file.read_text(errors="replace") if file.is_file() else ""
        for uri in _APT_URI.findall(text):
            mirror = str(uri).rstrip("/")
            if mirror.endswith("/debian"):
                return mirror
    raise PrecheckError(
        "no Debian mirror: none is configured for apt here",
        fix="set WHEELMILL_DEBIAN_MIRROR to a Debian mirror URL (ending in /debian)",
    )


def image_id(engine: Engine, reference: str) -> str | None:
    """The local image's id, or None when the engine has no such image."""
    result = capture(engine.image_id(reference), timeout=60)
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def bootstrap_base(engine: Engine, image: BuilderImage, *, mirror: str, work: Path, log: StepLog) -> str:
    """debootstrap the base suite into a directory, import it as an image; return its id."""
    debootstrap = shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if debootstrap is None or os.geteuid() != 0:
        raise PrecheckError(
            f"the base {image.base.reference} is missing and cannot be bootstrapped here (needs root and debootstrap)",
            fix="run scripts/setup --system as root, or build with --engine none",
        )
    runner = HostRunner()
    env = base_environment([])
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheelmill-bootstrap-", dir=work) as tmp:
        rootfs, tarball = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        try:
            # another machine's suite: debootstrap runs its second stage through qemu-user
            runner.run(
                [
                    debootstrap,
                    f"--variant={image.base.bootstrap_variant}",
                    f"--arch={DEBIAN_ARCH[image.base.platform]}",
                    str(image.base.suite),
                    str(rootfs),
                    mirror,
                ],
                env=env,
                log=log,
            )
            runner.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], env=env, log=log)
            runner.run(
                engine.import_rootfs(tarball=tarball, tag=image.base.reference, platform=image.base.platform),
                env=env,
                log=log,
            )
        except CommandFailed as failed:
            raise PrecheckError(
                f"bootstrapping {image.base.reference} failed: {failed.last_line()}", fix=f"read {failed.log}"
            ) from None
    identity = image_id(engine, image.base.reference)
    if identity is None:
        raise PrecheckError(f"{image.base.reference} was imported but cannot be inspected", fix=f"read {log.path}")
    return identity


def base_identity(engine: Engine, image: BuilderImage, *, mirror: str, work: Path, log: StepLog) -> tuple[str, bool]:
    """What the base is (a digest, or the local image's id) and whether it was made now."""
    require_pinned(image)
    if image.base.kind is BaseKind.REGISTRY:
        return image.base.reference.split("@", 1)[1], False
    existing = image_id(engine, image.base.reference)
    if existing:
        return existing, False
    log.note(f"{image.base.reference} is missing: bootstrapping it from {mirror}")
    return bootstrap_base(engine, image, mirror=mirror, work=work, log=log), True


@dataclass(frozen=True, kw_only=True)
class Ready:
    """A builder image that exists: made now or reused."""

    tag: str
    image_id: str
    base: str  # the reference it was built FROM
    built: bool
    bootstrapped: bool

    def facts(self) -> dict[str, object]:
        return {"image": {"tag": self.tag, "id": self.image_id, "built": self.built, "base": self.base}}


def ensure_image(
    engine: Engine, image: BuilderImage, *, mirror: str, work: Path, log: StepLog, on_line: Callable[[str], None]
) -> Ready:
    """The builder image, reused when its tag exists, built (and its base bootstrapped) when not."""
    identity, bootstrapped = base_identity(engine, image, mirror=mirror, work=work, log=log)
    tag = image.tag(identity, mirror)
    existing = image_id(engine, tag)
    if existing:
        log.note(f"reusing {tag} ({existing[:19]})")
        return Ready(tag=tag, image_id=existing, base=image.base.reference, built=False, bootstrapped=bootstrapped)
    argv = engine.build(
        tag=tag,
        containerfile=image.containerfile,
        context=image.containerfile.parent,
        build_args=image.build_args(mirror),
        platform=image.oci_platform,
    )
    try:
        HostRunner().run(argv, env=base_environment([]), log=log, on_line=on_line)
    except CommandFailed as failed:
        raise image_build_failure(tag, failed) from None
    built = image_id(engine, tag)
    if built is None:
        raise PrecheckError(f"{tag} was built but cannot be inspected", fix=f"read {log.path}")
    return Ready(tag=tag, image_id=built, base=image.base.reference, built=True, bootstrapped=bootstrapped)


def image_build_failure(tag: str, failed: CommandFailed) -> PrecheckError:
    """The Containerfiles say what went wrong in a line of their own ("wheelmill: <what>;
    fix: <how>"); that line, where there is one, rather than the engine's last words."""
    said = [line.strip().removeprefix("wheelmill: ") for line in failed.tail if line.strip().startswith("wheelmill: ")]
    if said and "; fix: " in said[-1]:
        what, fix = said[-1].split("; fix: ", 1)
        return PrecheckError(f"building {tag} failed: {what}", fix=fix)
    return PrecheckError(f"building {tag} failed: {failed.last_line()}", fix=f"read {failed.log}")
