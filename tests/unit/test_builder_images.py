"""Builder images shared through a registry: the tag names the base by its definition (not
this machine's image id, nor the bytes a bootstrap happened to give), the registry's
references, and the order an image is got in (the engine's own, the registry's, made here;
then pushed, read-write only), with a stand-in for the engine that records what it was asked."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from wheelmill.errors import ConfigError, UsageError
from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine.builder_images import (
    BaseKind,
    BuilderImage,
    Sharing,
    base_identity,
    base_tag,
    choose,
    get_builder,
    rootfs_identity,
)
from wheelmill.machine.engine import Engine, EngineName
from wheelmill.machine.image_transfers import Miss, Missed, Origin, Transfer, classify, pull
from wheelmill.machine.pins import load_pins
from wheelmill.machine.process import StepLog
from wheelmill.retry import RetryPolicy
from wheelmill.settings import SharedWrites

ROOT = Path(__file__).resolve().parent.parent.parent
REGISTRY = "127.0.0.1:5000/wheelmill"
BASE_LAYERS = ("sha256:" + "1" * 64,)
DIGEST = "sha256:" + "d" * 64


def cpu_image(python: str = "3.11", variant: str = "cpu") -> BuilderImage:
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    pins = load_pins(ROOT / "containers" / "pins.toml")
    return choose(pins, matrix.variant(variant), python, containers=ROOT / "containers", policy="bootstrap")


@dataclass
class Machine:
    """A stand-in engine and registry: what this machine's engine holds (reference -> layers),
    what the registry holds (reference -> layers), and every call, in order."""

    local: dict[str, tuple[str, ...]] = field(default_factory=dict)
    registry: dict[str, tuple[str, ...]] | None = field(default_factory=dict)  # None: nothing answers
    bootstrap_layers: tuple[str, ...] = BASE_LAYERS
    calls: list[str] = field(default_factory=list)
    image: BuilderImage = field(default_factory=cpu_image)

    def layers(self, reference: str) -> tuple[str, ...] | None:
        return self.local.get(reference)

    def image_id(self, reference: str) -> str | None:
        return f"id-of-{reference}" if reference in self.local else None

    def listed(self, reference: str) -> bool | None:
        self.calls.append(f"ask {reference.rsplit('/', 1)[1].split(':', maxsplit=1)[0].removeprefix('wheelmill-')}")
        return None if self.registry is None else reference in self.registry

    def pull(self, reference: str, *, local: str, image: str, platform: str | None) -> Transfer | Missed:
        self.calls.append(f"pull {image}")
        if self.registry is None:
            return Missed(image=image, action="pull", reference=reference, why=Miss.UNREACHABLE, detail="refused")
        if reference not in self.registry:
            return Missed(image=image, action="pull", reference=reference, why=Miss.ABSENT, detail="unknown")
        self.local[local] = self.registry[reference]
        return Transfer(image=image, action="pulled", reference=reference, digest=DIGEST)

    def push(self, local: str, reference: str, *, image: str) -> Transfer | Missed:
        self.calls.append(f"push {image}")
        assert self.registry is not None
        self.registry[reference] = self.local[local]
        return Transfer(image=image, action="pushed", reference=reference, digest=DIGEST)

    def bootstrap(self) -> None:
        self.calls.append("bootstrap")
        self.local[self.image.base.reference] = self.bootstrap_layers

    def build(self, tag: str) -> None:
        self.calls.append("build")
        self.local[tag] = (*self.local[self.image.base.reference], "sha256:" + "b" * 64)


def test_the_tag_names_the_base_by_its_definition_wherever_its_bytes_came_from() -> None:
    """A machine that bootstrapped the base, one that pulled it (another image id), and one
    whose bootstrap gave other bytes (another day's packages, mmdebstrap instead of
    debootstrap) give the builder one tag; the report tells their bytes apart. Another
    definition of the base (its debootstrap variant), another tag."""
    image = cpu_image()
    first, second = Machine(), Machine(local={image.base.reference: BASE_LAYERS})
    other_bytes = Machine(bootstrap_layers=("sha256:" + "2" * 64,))
    made, pulled, other = (get_builder(image, machine, None) for machine in (first, second, other_bytes))
    assert made.tag == pulled.tag == other.tag == image.tag(base_identity(image.base))
    assert made.base_identity == other.base_identity == f"bootstrap:{base_tag(image.base)}"
    assert made.base_rootfs == pulled.base_rootfs == rootfs_identity(BASE_LAYERS) != other.base_rootfs
    changed = replace(image, base=replace(image.base, bootstrap_variant="buildd"))
    assert get_builder(changed, Machine(image=changed), None).tag != made.tag
    assert rootfs_identity(["sha256:a", "sha256:b"]) != rootfs_identity(["sha256:b", "sha256:a"])


def test_the_tag_does_not_depend_on_the_debian_mirror() -> None:
    """Where CPython is downloaded from is a machine's mirror; the pinned sha256 says what it
    is. Two machines with other mirrors name one image alike (the build still gets the URL)."""
    image = cpu_image("3.9")
    assert image.build_args("http://a.example/debian") != image.build_args("http://b.example/debian")
    assert image.tag("rootfs:x") == image.tag("rootfs:x")
    changed = replace(image, python=replace(image.python, sha256="0" * 64))
    assert changed.tag("rootfs:x") != image.tag("rootfs:x")


def test_registry_references_name_the_base_by_its_definition_and_the_builder_by_its_tag() -> None:
    image = cpu_image()
    sharing = Sharing(registry=REGISTRY)
    base = sharing.base(image.base)
    assert base.startswith(f"{REGISTRY}/wheelmill-base:bullseye-minbase-amd64-"), base
    assert len(base.rsplit("-", 1)[1]) == 12
    tag = image.tag(base_identity(image.base))
    assert sharing.builder(tag) == f"{REGISTRY}/wheelmill-builder:{tag.rsplit(':', 1)[1]}"
    arm = cpu_image(variant="cpu-aarch64")
    assert base_tag(arm.base).startswith("bookworm-minbase-arm64-")
    assert base_tag(replace(image.base, bootstrap_variant="buildd")) != base_tag(image.base)


@pytest.mark.parametrize("bad", ["https://ghcr.io/org/wheelmill", "ghcr.io/Org/wheelmill", "/wheelmill"])
def test_a_registry_setting_that_is_no_reference_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="WHEELMILL_IMAGE_REGISTRY"):
        Sharing.of(bad, SharedWrites.READ_WRITE)


def test_a_registry_setting_becomes_sharing() -> None:
    assert Sharing.of(None, SharedWrites.READ_WRITE) is None
    assert Sharing.of("ghcr.io/org/wheelmill/", SharedWrites.READ_ONLY) == Sharing(
        registry="ghcr.io/org/wheelmill", writes=SharedWrites.READ_ONLY
    )


def test_a_builder_this_engine_has_is_reused_and_pushed_only_where_the_registry_lacks_it() -> None:
    """Read-write, a registry set up after the images were made: the next build pushes what
    this engine has and the registry lacks; the build after it asks, and pushes nothing.
    Read-only asks nothing."""
    image = cpu_image()
    machine = Machine(local={image.base.reference: BASE_LAYERS})
    machine.local[image.tag(base_identity(image.base))] = ("x",)
    ready = get_builder(image, machine, Sharing(registry=REGISTRY))
    assert machine.calls == ["ask builder", "push base", "push builder"]
    assert (ready.origin, ready.base_origin, ready.unpushed) == (Origin.REUSED, Origin.REUSED, None)
    assert [t.action for t in ready.transfers] == ["pushed", "pushed"]
    machine.calls.clear()
    again = get_builder(image, machine, Sharing(registry=REGISTRY))
    assert machine.calls == ["ask builder", "ask base"] and again.transfers == ()
    machine.calls.clear()
    assert get_builder(image, machine, Sharing(registry=REGISTRY, writes=SharedWrites.READ_ONLY)).transfers == ()
    assert machine.calls == []


def test_a_first_machine_makes_both_and_pushes_both_a_second_pulls_both_and_makes_nothing() -> None:
    """Read-write, an empty registry: pull (nothing there), bootstrap, pull (nothing), build,
    push the base and the builder. Then an empty machine: pull the base, pull the builder
    (the same tag, as its base has the same layers); no bootstrap, no build, no push."""
    image, registry = cpu_image(), dict[str, tuple[str, ...]]()
    first = Machine(registry=registry)
    made = get_builder(image, first, Sharing(registry=REGISTRY))
    assert first.calls == ["pull base", "bootstrap", "pull builder", "build", "push base", "push builder"]
    assert (made.origin, made.base_origin) == (Origin.BUILT, Origin.BUILT) and made.bootstrapped
    assert [t.describe() for t in made.transfers] == [
        f"pushed to {Sharing(registry=REGISTRY).base(image.base)} (digest {DIGEST})",
        f"pushed to {Sharing(registry=REGISTRY).builder(made.tag)} (digest {DIGEST})",
    ]
    second = Machine(registry=registry)
    pulled = get_builder(image, second, Sharing(registry=REGISTRY, writes=SharedWrites.READ_WRITE))
    assert second.calls == ["pull base", "pull builder"]
    assert (pulled.origin, pulled.base_origin, pulled.tag) == (Origin.PULLED, Origin.PULLED, made.tag)
    facts = pulled.facts()["image"]
    assert isinstance(facts, dict) and facts["origin"] == "pulled" and facts["base_origin"] == "pulled"
    assert [t["action"] for t in facts["transfers"]] == ["pulled", "pulled"] and facts["registry"] == REGISTRY


def test_read_only_pushes_nothing_and_says_so() -> None:
    image, registry = cpu_image(), dict[str, tuple[str, ...]]()
    machine = Machine(registry=registry)
    ready = get_builder(image, machine, Sharing(registry=REGISTRY, writes=SharedWrites.READ_ONLY))
    assert machine.calls == ["pull base", "bootstrap", "pull builder", "build"]
    assert registry == {} and ready.transfers == ()
    assert (
        ready.unpushed == "read-only: pushed nothing (a build that writes images would push the base and the builder)"
    )


def test_a_build_that_writes_only_the_compiler_cache_pushes_no_image() -> None:
    image, registry = cpu_image(), dict[str, tuple[str, ...]]()
    machine = Machine(registry=registry)
    ready = get_builder(image, machine, Sharing(registry=REGISTRY, writes=SharedWrites.COMPILER_CACHE))
    assert machine.calls == ["pull base", "bootstrap", "pull builder", "build"] and registry == {}
    assert ready.unpushed is not None and ready.unpushed.startswith("compiler-cache: pushed nothing")
    pushing = get_builder(image, Machine(registry=registry), Sharing(registry=REGISTRY, writes=SharedWrites.IMAGES))
    assert [t.action for t in pushing.transfers] == ["pushed", "pushed"]


def test_a_registry_that_does_not_answer_is_a_warning_and_is_asked_nothing_more() -> None:
    image = cpu_image()
    machine = Machine(registry=None)
    ready = get_builder(image, machine, Sharing(registry=REGISTRY))
    assert machine.calls == ["pull base", "bootstrap", "build"]
    assert [m.why for m in ready.warnings] == [Miss.UNREACHABLE]
    assert ready.unpushed == f"{REGISTRY} did not answer: pushed nothing"


def test_an_absent_image_is_no_warning() -> None:
    ready = get_builder(cpu_image(), Machine(), Sharing(registry=REGISTRY))
    assert ready.warnings == () and [m.why for m in ready.moves if isinstance(m, Missed)] == [Miss.ABSENT] * 2


def test_without_a_registry_the_image_is_made_here_as_before() -> None:
    image, machine = cpu_image(), Machine()
    ready = get_builder(image, machine, None)
    assert machine.calls == ["bootstrap", "build"]
    assert ready.facts()["image"] == {
        "tag": ready.tag,
        "id": f"id-of-{ready.tag}",
        "built": True,
        "base": image.base.reference,
        "origin": "built",
        "base_origin": "built",
        "base_identity": base_identity(image.base),
        "base_rootfs": rootfs_identity(BASE_LAYERS),
    }


def test_a_builder_built_on_a_base_this_engine_had_is_pushed_with_its_base() -> None:
    """The base's tag in the registry then names the base of the builders pushed there."""
    image = cpu_image()
    machine = Machine(local={image.base.reference: BASE_LAYERS})
    get_builder(image, machine, Sharing(registry=REGISTRY))
    assert machine.calls == ["pull builder", "build", "push base", "push builder"]


def test_a_pulled_base_is_not_pushed_back() -> None:
    image = cpu_image()
    registry: dict[str, tuple[str, ...]] = {Sharing(registry=REGISTRY).base(image.base): BASE_LAYERS}
    machine = Machine(registry=registry)
    get_builder(image, machine, Sharing(registry=REGISTRY))
    assert machine.calls == ["pull base", "pull builder", "build", "push builder"]


def test_a_registry_base_is_named_by_digest_and_never_pulled_or_pushed_here() -> None:
    """A pinned registry base (manylinux) is fetched by the engine for FROM; only the builder moves."""
    pins = load_pins(ROOT / "containers" / "pins.toml")
    digest = "sha256:" + "a" * 64
    pinned = replace(pins, bases={**pins.bases, "manylinux_2_28": replace(pins.bases["manylinux_2_28"], digest=digest)})
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    image = choose(pinned, matrix.variant("cuda130"), "3.12", containers=ROOT / "containers", policy="registry")
    assert image.base.kind is BaseKind.REGISTRY
    machine = Machine(image=image)
    machine.local[image.base.reference] = BASE_LAYERS  # what the engine fetches for FROM
    ready = get_builder(image, machine, Sharing(registry=REGISTRY))
    assert machine.calls == ["pull builder", "build", "push builder"]
    assert (ready.base_origin, ready.base_identity, ready.tag) == (Origin.PINNED, digest, image.tag(digest))


@pytest.mark.parametrize(
    ("said", "why"),
    [
        ("Error: initializing source docker://h/x:t: reading manifest t in h/x: manifest unknown", Miss.ABSENT),
        ("Error response from daemon: manifest for h/x:t not found: manifest unknown", Miss.ABSENT),
        ("reading manifest t in ghcr.io/org/x: denied", Miss.REFUSED),
        ("unauthorized: authentication required", Miss.REFUSED),
        ('Get "http://127.0.0.1:40404/v2/": dial tcp 127.0.0.1:40404: connect: connection refused', Miss.UNREACHABLE),
        ("dial tcp: lookup registry.invalid: no such host", Miss.UNREACHABLE),
        ("received unexpected HTTP status: 503 Service Unavailable", None),
        ("writing blob: connection reset by peer", None),
        ("net/http: TLS handshake timeout", None),
    ],
)
def test_what_the_engines_say_is_read_into_one_answer(said: str, why: Miss | None) -> None:
    assert classify(said) == why


def test_a_pull_that_hiccups_is_tried_again_then_tagged_here(tmp_path: Path) -> None:
    """An engine (a script) that answers 503 twice, then pulls: three attempts, then the tag
    and the digest the engine recorded for the registry's repository."""
    calls, count = tmp_path / "calls", tmp_path / "count"
    engine = tmp_path / "podman"
    engine.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'if [ "$1" = pull ]; then n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}\n'
        '  if [ "$n" -lt 2 ]; then echo "received unexpected HTTP status: 503 Service Unavailable" >&2; exit 125; fi\n'
        "fi\n"
        f'if [ "$1" = image ]; then echo "127.0.0.1:5000/w/wheelmill-base@{DIGEST}"; fi\n'
    )
    engine.chmod(0o755)
    podman = Engine(name=EngineName.PODMAN, binary=str(engine))
    reference = "127.0.0.1:5000/w/wheelmill-base:t"
    with StepLog(tmp_path / "log") as log:
        got = pull(
            podman,
            reference,
            image="base",
            local="localhost/wheelmill-base:b",
            platform=None,
            policy=RetryPolicy(attempts=5, base_delay=0.0),
            log=log,
        )
    assert got == Transfer(image="base", action="pulled", reference=reference, digest=DIGEST)
    said = calls.read_text().splitlines()
    assert said[:4] == [f"pull --tls-verify=false {reference}"] * 3 + [f"tag {reference} localhost/wheelmill-base:b"]
    assert "pull attempt 2 failed" in (tmp_path / "log").read_text()


def test_a_pull_of_nothing_there_is_not_retried(tmp_path: Path) -> None:
    engine = tmp_path / "podman"
    engine.write_text("#!/bin/sh\necho 'reading manifest t in h/x: manifest unknown' >&2\nexit 125\n")
    engine.chmod(0o755)
    with StepLog(tmp_path / "log") as log:
        got = pull(
            Engine(name=EngineName.PODMAN, binary=str(engine)),
            "registry.example/x:t",
            image="builder",
            local="l",
            platform=None,
            policy=RetryPolicy(attempts=5, base_delay=0.0),
            log=log,
        )
    assert isinstance(got, Missed) and got.why is Miss.ABSENT and not got.warning
    assert "attempt" not in (tmp_path / "log").read_text()


def test_pull_and_layers_commands_of_both_engines(tmp_path: Path) -> None:
    podman = Engine(name=EngineName.PODMAN, binary="podman")
    docker = Engine(name=EngineName.DOCKER, binary="docker")
    assert podman.pull("127.0.0.1:5000/w/x:t", insecure=True) == [
        "podman",
        "pull",
        "--tls-verify=false",
        "127.0.0.1:5000/w/x:t",
    ]
    assert docker.pull("127.0.0.1:5000/w/x:t", insecure=True, platform="linux/arm64") == [
        "docker",
        "pull",
        "--platform",
        "linux/arm64",
        "127.0.0.1:5000/w/x:t",
    ]
    assert podman.pull("ghcr.io/o/x:t", insecure=False) == ["podman", "pull", "ghcr.io/o/x:t"]
    inspect = ["image", "inspect", "--format", "{{range .RootFS.Layers}}{{println .}}{{end}}", "x"]
    assert podman.rootfs_layers("x") == ["podman", *inspect] and docker.rootfs_layers("x") == ["docker", *inspect]


def test_podman_with_a_store_of_its_own_says_so_in_every_command(tmp_path: Path) -> None:
    """A second machine's image store on this one: every command names it."""
    own = Engine(name=EngineName.PODMAN, binary="podman", store=tmp_path)
    assert own.runroot is not None and len(str(own.runroot)) <= 50  # podman refuses a longer one
    store = ["--root", str(tmp_path / "root"), "--runroot", str(own.runroot), "--tmpdir", str(tmp_path / "tmp")]
    assert own.pull("x", insecure=False) == ["podman", *store, "pull", "x"]
    assert own.image_id("x")[: len(store) + 1] == ["podman", *store]
    assert own.remove_image("x") == ["podman", *store, "rmi", "--force", "x"]
    with pytest.raises(UsageError, match="needs podman"):
        Engine(name=EngineName.DOCKER, binary="docker", store=tmp_path)
