"""Builder images: which definition and base a cell uses, what the image is called (a hash
of its definition, pins and base's identity, so it is rebuilt exactly when they change, and
named alike on every machine), and getting it: the engine's own, else pulled from the
shared registry, else made (the air-gapped base bootstrapped from Debian packages, then the
image built) and, read-write, pushed there.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Protocol

from wheelmill.errors import CommandFailed, ConfigError, FetchError, PrecheckError
from wheelmill.inputs.manylinux import manylinux_of
from wheelmill.inputs.variants import X86_64, Family, Variant
from wheelmill.machine.bootstrap import bootstrap_base
from wheelmill.machine.emulation import DEBIAN_ARCH, foreign_platform
from wheelmill.machine.engine import Engine
from wheelmill.machine.image_transfers import Missed, Origin, Sourced, Transfer, obtain, pull, push, rootfs_layers
from wheelmill.machine.pins import Pins, PythonSource, RegistryBase
from wheelmill.machine.process import HostRunner, StepLog, base_environment, capture
from wheelmill.machine.registry import is_registry, resolve_digest
from wheelmill.retry import RetryPolicy
from wheelmill.settings import SharedWrites

BASE_REPOSITORY = "localhost/wheelmill-base"
BUILDER_REPOSITORY = "localhost/wheelmill-builder"
ONE_TRY = RetryPolicy(attempts=1)


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

    def tag(self, base_identity: str) -> str:
        """``<repository>:<definition>-py311-<hash>``: the hash of the Containerfile, the build
        arguments that say what goes in and the base's identity (``base_identity``): the same
        on every machine that builds it, so one machine's image serves another's through a
        registry."""
        digest = hashlib.sha256(self.containerfile.read_bytes())
        for key, value in sorted(self.build_args("").items()):
            # Where CPython is downloaded from is this machine's mirror; its sha256 says what it is.
            if key != "PYTHON_URL":
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
        description=f"{reference} (Debian {suite}{arch.replace('-', ' for ')}, bootstrapped)",
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


def bootstrap(engine: Engine, image: BuilderImage, *, mirror: str, work: Path, log: StepLog) -> str:
    """Bootstrap the base suite (``wheelmill.machine.bootstrap``), import it; return its id."""
    bootstrap_base(engine, image.base, mirror=mirror, work=work, log=log)
    identity = image_id(engine, image.base.reference)
    if identity is None:
        raise PrecheckError(f"{image.base.reference} was imported but cannot be inspected", fix=f"read {log.path}")
    return identity


def base_identity(base: Base) -> str:
    """The base's name in its builders' tags: a registry base's digest; a bootstrapped base's
    definition (``bootstrap:`` and its registry tag: suite, variant, machine, the way it is
    made). A definition, as the builder's own tag is one, and for the same reason: every
    machine holds it before it holds any bytes, whether it bootstrapped the base (with
    debootstrap or mmdebstrap), pulled it, or pushed and pulled it again; the bytes are named
    by the image id and the registry's digest (``Ready``). A file-system digest was tried and
    split a fleet: a base whose layers changed on the way got another name on the machine
    that pulled it, which then built a builder of its own.

    >>> base_identity(Base(kind=BaseKind.BOOTSTRAP, reference="r", description="d", glibc="2.31", suite="bullseye"))
    'bootstrap:bullseye-minbase-amd64-3c4e010046bc'
    """
    if base.kind is BaseKind.REGISTRY:
        return base.reference.split("@", 1)[1]
    return f"bootstrap:{base_tag(base)}"


def rootfs_identity(layers: Sequence[str]) -> str:
    """What a base's file system is on this machine: one digest of its layers' diff ids (the
    digests of its file system, uncompressed); reported beside the identity, never part of a
    tag (two machines that bootstrapped the base at other times hold other bytes).

    >>> rootfs_identity(["sha256:" + "a" * 64])
    'rootfs:sha256:9f447b1b473d359884f2b8541a1ad0b7d194ed59b79e8eee48047ec4830564fd'
    """
    return "rootfs:sha256:" + hashlib.sha256("\n".join(layers).encode()).hexdigest()


# Raised when the way a base is bootstrapped changes (debootstrap's arguments, the import):
# its registry tag changes with it, so no machine pulls a base made the old way.
BOOTSTRAP_RECIPE = "1"
SHARED_BASE = "wheelmill-base"
SHARED_BUILDER = "wheelmill-builder"


def base_tag(base: Base) -> str:
    """A bootstrapped base's tag in the registry: what defines it, readable (suite, debootstrap
    variant, machine), then a short hash of the same with the way it is made.

    >>> base_tag(Base(kind=BaseKind.BOOTSTRAP, reference="r", description="d", glibc="2.31", suite="bullseye"))
    'bullseye-minbase-amd64-3c4e010046bc'
    """
    arch = DEBIAN_ARCH[base.platform]
    definition = f"debootstrap\0{base.suite}\0{base.bootstrap_variant}\0{arch}\0recipe={BOOTSTRAP_RECIPE}"
    return f"{base.suite}-{base.bootstrap_variant}-{arch}-{hashlib.sha256(definition.encode()).hexdigest()[:12]}"


@dataclass(frozen=True, kw_only=True)
class Sharing:
    """The registry where machines share builder images and bootstrapped bases
    (``host[:port]/namespace``), and whether this build writes to it (a pull request's reads)."""

    registry: str
    writes: SharedWrites = SharedWrites.READ_WRITE

    @classmethod
    def of(cls, registry: str | None, writes: SharedWrites) -> Sharing | None:
        """The setting's value, checked: None where no registry is set."""
        if not registry:
            return None
        if not is_registry(registry):
            raise ConfigError(
                f"environment: WHEELMILL_IMAGE_REGISTRY={registry!r} is not host[:port]/namespace in lower case",
                fix="set it like ghcr.io/my-org/wheelmill or 127.0.0.1:5000/wheelmill (no scheme)",
            )
        return cls(registry=registry.rstrip("/"), writes=writes)

    @property
    def pushes(self) -> bool:
        return self.writes.images

    def base(self, base: Base) -> str:
        return f"{self.registry}/{SHARED_BASE}:{base_tag(base)}"

    def builder(self, tag: str) -> str:
        """The builder image's reference there: the same tag as on this machine."""
        return f"{self.registry}/{SHARED_BUILDER}:{tag.rsplit(':', 1)[1]}"


def to_push(
    kind: BaseKind, base: Sourced, builder: Sourced, *, lacks: Callable[[str], bool] = lambda _image: False
) -> tuple[str, ...]:
    """What a read-write build pushes: a builder it built, with its base where that was
    bootstrapped here (the base's tag in the registry then names the base of the builders
    pushed there), or a base it bootstrapped; and what this engine had already that the
    registry lacks (``lacks("base")``, ``lacks("builder")``, asked only of those): a registry
    set up after the images were made gets them from the next read-write build. Nothing
    pulled or pinned."""
    built = builder.origin is Origin.BUILT or (builder.origin is Origin.REUSED and lacks("builder"))
    ours = kind is BaseKind.BOOTSTRAP and base.origin in (Origin.BUILT, Origin.REUSED)
    base_too = ours and (built or base.origin is Origin.BUILT or lacks("base"))
    return (("base",) if base_too else ()) + (("builder",) if built else ())


class ImageOps(Protocol):
    """What getting a builder image does with the engine; a test gives a stand-in."""

    def layers(self, reference: str) -> tuple[str, ...] | None:
        """The local image's diff ids; None when the engine has no such image."""
        ...

    def image_id(self, reference: str) -> str | None: ...

    def listed(self, reference: str) -> bool | None:
        """Whether the registry has ``reference``; None where it cannot say."""
        ...

    def pull(self, reference: str, *, local: str, image: str, platform: str | None) -> Transfer | Missed: ...

    def push(self, local: str, reference: str, *, image: str) -> Transfer | Missed: ...

    def bootstrap(self) -> None: ...

    def build(self, tag: str) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Ready:
    """A builder image that exists, where it and its base came from, and what moved."""

    tag: str
    image_id: str
    base: str  # the reference it was built FROM
    base_identity: str  # base_identity(): its digest, or a bootstrapped base's definition
    origin: Origin
    base_origin: Origin
    moves: tuple[Transfer | Missed, ...] = ()
    registry: str | None = None
    unpushed: str | None = None  # why what was made here was not pushed: read-only, unreachable
    base_rootfs: str | None = None  # a bootstrapped base's rootfs_identity on this machine

    @property
    def built(self) -> bool:
        return self.origin is Origin.BUILT

    @property
    def bootstrapped(self) -> bool:
        return self.base_origin is Origin.BUILT

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(m for m in self.moves if isinstance(m, Transfer))

    @property
    def warnings(self) -> tuple[Missed, ...]:
        return tuple(m for m in self.moves if isinstance(m, Missed) and m.warning)

    def facts(self) -> dict[str, object]:
        image: dict[str, object] = {
            "tag": self.tag,
            "id": self.image_id,
            "built": self.built,
            "base": self.base,
            "origin": self.origin.value,
            "base_origin": self.base_origin.value,
            "base_identity": self.base_identity,
        }
        if self.base_rootfs is not None:
            image["base_rootfs"] = self.base_rootfs
        if self.registry is not None:
            image["registry"] = self.registry
            image["transfers"] = [t.facts() for t in self.transfers]
            image["unpushed"] = self.unpushed
        return {"image": image}


def get_builder(image: BuilderImage, ops: ImageOps, sharing: Sharing | None) -> Ready:
    """The builder image in the order of ``obtain``, its base first (a builder made here is
    built FROM it, and the registry's base tag names the base of the builders pushed there);
    then, read-write, what was made here is pushed. A registry that did not answer is asked
    nothing more: this build goes on without it."""
    require_pinned(image)
    identity = base_identity(image.base)
    rootfs, base = _get_base(image, ops, sharing)
    online = sharing if sharing is not None and not base.unreachable else None
    tag = image.tag(identity)
    existing = ops.image_id(tag)
    fetch = (
        None
        if online is None
        else partial(ops.pull, online.builder(tag), local=tag, image="builder", platform=image.oci_platform)
    )
    builder = obtain(present=existing is not None, fetch=fetch, make=partial(ops.build, tag))
    made = existing or ops.image_id(tag)
    if made is None:
        raise PrecheckError(f"{tag} is here but cannot be inspected", fix="check the engine's storage")
    unreachable = base.unreachable or builder.unreachable

    def lacks(what: str) -> bool:
        if sharing is None or not sharing.pushes or unreachable:
            return False  # nothing is pushed: no need to ask
        return ops.listed(sharing.base(image.base) if what == "base" else sharing.builder(tag)) is not True

    wanted = to_push(image.base.kind, base, builder, lacks=lacks) if sharing is not None else ()
    pushed, unpushed = _push(wanted, image, tag, ops, sharing, unreachable=unreachable)
    return Ready(
        tag=tag,
        image_id=made,
        base=image.base.reference,
        base_identity=identity,
        origin=builder.origin,
        base_origin=base.origin,
        moves=base.moves + builder.moves + pushed,
        registry=sharing.registry if sharing is not None else None,
        unpushed=unpushed,
        base_rootfs=rootfs,
    )


def _get_base(image: BuilderImage, ops: ImageOps, sharing: Sharing | None) -> tuple[str | None, Sourced]:
    """How the base came here, and a bootstrapped one's file system on this machine: a
    registry base is fetched by the engine for FROM; a bootstrapped one is pulled or made."""
    if image.base.kind is BaseKind.REGISTRY:
        return None, Sourced(origin=Origin.PINNED)
    reference = image.base.reference
    platform = foreign_platform(image.base.platform)
    fetch = (
        None
        if sharing is None
        else partial(ops.pull, sharing.base(image.base), local=reference, image="base", platform=platform)
    )
    base = obtain(present=ops.layers(reference) is not None, fetch=fetch, make=ops.bootstrap)
    layers = ops.layers(reference)
    if layers is None:
        raise PrecheckError(f"{reference} is here but cannot be inspected", fix="check the engine's storage")
    return rootfs_identity(layers), base


def _push(
    wanted: Sequence[str],
    image: BuilderImage,
    tag: str,
    ops: ImageOps,
    sharing: Sharing | None,
    *,
    unreachable: bool,
) -> tuple[tuple[Transfer | Missed, ...], str | None]:
    """Push ``wanted`` (base, builder), or say why not."""
    if not wanted or sharing is None:
        return (), None
    if not sharing.pushes:
        said = f"{sharing.writes.value}: pushed nothing"  # read-only, or compiler-cache (writes no image)
        return (), f"{said} (a build that writes images would push the {' and the '.join(wanted)})"
    if unreachable:
        return (), f"{sharing.registry} did not answer: pushed nothing"
    references = {"base": (image.base.reference, sharing.base(image.base)), "builder": (tag, sharing.builder(tag))}
    return tuple(ops.push(*references[what], image=what) for what in wanted), None


@dataclass(frozen=True, kw_only=True)
class EngineImages:
    """``ImageOps`` with the engine: every command in the step's log. ``mirror`` is asked only
    where something is made here (a machine that pulls everything needs no Debian mirror)."""

    engine: Engine
    image: BuilderImage
    mirror: Callable[[], str]
    work: Path
    log: StepLog
    on_line: Callable[[str], None]
    policy: RetryPolicy

    def layers(self, reference: str) -> tuple[str, ...] | None:
        return rootfs_layers(self.engine, reference)

    def image_id(self, reference: str) -> str | None:
        return image_id(self.engine, reference)

    def listed(self, reference: str) -> bool | None:
        """A HEAD of the tag's manifest, anonymous (or with the registry's anonymous token):
        None where the registry wants more (a private one pushed to after a login)."""
        name, _, tag = reference.rpartition(":")
        try:
            resolve_digest(name, tag, timeout=30)
        except FetchError as exc:
            return False if "HTTP 404" in str(exc) else None
        except OSError:
            return None
        return True

    def pull(self, reference: str, *, local: str, image: str, platform: str | None) -> Transfer | Missed:
        self.log.note(f"{local} is missing: pulling {reference}")
        got = pull(
            self.engine, reference, image=image, local=local, platform=platform, policy=self.policy, log=self.log
        )
        self.log.note(got.describe())
        return got

    def push(self, local: str, reference: str, *, image: str) -> Transfer | Missed:
        sent = push(self.engine, local, reference, image=image, policy=self.policy, log=self.log)
        self.log.note(sent.describe())
        return sent

    def bootstrap(self) -> None:
        mirror = self.mirror()
        self.log.note(f"{self.image.base.reference} is missing: bootstrapping it from {mirror}")
        bootstrap(self.engine, self.image, mirror=mirror, work=self.work, log=self.log)

    def build(self, tag: str) -> None:
        argv = self.engine.build(
            tag=tag,
            containerfile=self.image.containerfile,
            context=self.image.containerfile.parent,
            build_args=self.image.build_args(self.mirror()),
            platform=self.image.oci_platform,
        )
        try:
            HostRunner().run(argv, env=base_environment([]), log=self.log, on_line=self.on_line)
        except CommandFailed as failed:
            raise image_build_failure(tag, failed) from None


def prepare_builder(
    engine: Engine,
    image: BuilderImage,
    *,
    mirror: Callable[[], str],
    work: Path,
    log: StepLog,
    on_line: Callable[[str], None],
    sharing: Sharing | None = None,
    policy: RetryPolicy = ONE_TRY,
) -> Ready:
    """The builder image with this engine, shared through ``sharing``'s registry where one is set."""
    ops = EngineImages(engine=engine, image=image, mirror=mirror, work=work, log=log, on_line=on_line, policy=policy)
    ready = get_builder(image, ops, sharing)
    if ready.origin is Origin.REUSED:
        log.note(f"reusing {ready.tag} ({ready.image_id[:19]})")
    if ready.unpushed:
        log.note(ready.unpushed)
    return ready


def image_build_failure(tag: str, failed: CommandFailed) -> PrecheckError:
    """The Containerfiles say what went wrong in a line of their own ("wheelmill: <what>;
    fix: <how>"); that line, where there is one, rather than the engine's last words."""
    said = [line.strip().removeprefix("wheelmill: ") for line in failed.tail if line.strip().startswith("wheelmill: ")]
    if said and "; fix: " in said[-1]:
        what, fix = said[-1].split("; fix: ", 1)
        return PrecheckError(f"building {tag} failed: {what}", fix=fix)
    return PrecheckError(f"building {tag} failed: {failed.last_line()}", fix=f"read {failed.log}")
