"""Builder images shared through a registry, for real: Debian's docker-registry on loopback
and two "machines", each a podman image store of its own in a temporary directory. Machine A
has a base (a tiny file system imported, standing in for a bootstrapped one), builds the
builder image from a small Containerfile and pushes both; machine B, with an empty store and
no way to bootstrap or build (its Debian mirror is a question that fails the test), pulls
both and gets the same tag and the same digests; a read-only machine pushes nothing; an
unreachable registry is a warning. Then the real base and builder, through the command line,
between stores that start empty. Every store and image goes with the test."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.images import cpu_builder, holds, run_registry
from tests.integration.test_cells import ROOT
from tests.ports import free_port
from tests.registry import loopback_registry
from wheelmill.errors import PrecheckError
from wheelmill.machine.builder_images import (
    SHARED_BUILDER,
    Base,
    BaseKind,
    BuilderImage,
    Ready,
    Sharing,
    base_identity,
    base_tag,
    prepare_builder,
)
from wheelmill.machine.engine import Engine, EngineName, detect
from wheelmill.machine.image_transfers import Miss, Origin
from wheelmill.machine.pins import PythonSource
from wheelmill.machine.process import StepLog
from wheelmill.machine.registry import resolve_digest
from wheelmill.retry import RetryPolicy
from wheelmill.settings import SharedWrites

pytestmark = [pytest.mark.integration, pytest.mark.engine]

CONTAINERFILE = """\
ARG BASE
FROM ${BASE}
ARG PYTHON_VERSION
ARG PYTHON_URL
ARG PYTHON_SHA256
COPY hello.txt /opt/hello.txt
LABEL org.opencontainers.image.title="wheelmill test builder"
"""
QUICK = RetryPolicy(attempts=2, base_delay=0.1)


@pytest.fixture(scope="module")
def podman() -> str:
    try:
        engine = detect("podman")
    except PrecheckError as exc:
        pytest.skip(exc.one_line())
    assert engine is not None
    return engine.binary


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """``127.0.0.1:port/wheelmill`` on a registry that answers."""
    (tmp_path / "registry").mkdir()
    with loopback_registry(tmp_path / "registry") as address:
        deadline = time.monotonic() + 20
        while not _answers(address):
            assert time.monotonic() < deadline, f"the registry at {address} never answered"
            time.sleep(0.1)
        yield f"{address}/wheelmill"


@pytest.fixture
def machines(podman: str, tmp_path: Path) -> Iterator[dict[str, Engine]]:
    """An image store per machine (A, B, ...), each emptied and removed afterwards."""
    made: dict[str, Engine] = {}

    class Stores(dict[str, Engine]):
        def __missing__(self, name: str) -> Engine:
            made[name] = self[name] = Engine(name=EngineName.PODMAN, binary=podman, store=tmp_path / f"store-{name}")
            return made[name]

    try:
        yield Stores()
    finally:
        for engine in made.values():
            subprocess.run([*engine.command, "rmi", "--all", "--force"], capture_output=True, check=False)
            for directory in (engine.store, engine.runroot):
                assert directory is not None
                shutil.rmtree(directory, ignore_errors=True)


def _answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def definition(tmp_path: Path, hello: str = "hello") -> BuilderImage:
    """A builder image of a small Containerfile FROM a bootstrap-kind base."""
    directory = tmp_path / f"definition-{hello}" / "builder"
    directory.mkdir(parents=True)
    (directory / "Containerfile").write_text(f'{CONTAINERFILE}LABEL test.hello="{hello}"\n')  # the tag hashes it
    (directory / "hello.txt").write_text(f"{hello}\n")
    base = Base(
        kind=BaseKind.BOOTSTRAP,
        reference="localhost/wheelmill-base:bullseye-minbase",
        description="a tiny stand-in",
        glibc="2.31",
        suite="bullseye",
    )
    python = PythonSource(version="3.11", path="pool/python.tar.xz", sha256="0" * 64)
    return BuilderImage(containerfile=directory / "Containerfile", base=base, python=python)


def import_base(engine: Engine, image: BuilderImage, tmp_path: Path) -> None:
    """A base made on this machine, as a bootstrap would: a root file system imported."""
    tarball = tmp_path / "rootfs.tar"
    with tarfile.open(tarball, "w") as archive:
        info = tarfile.TarInfo("etc/wheelmill-base")
        content = b"a tiny base\n"
        info.size = len(content)
        archive.addfile(info, io.BytesIO(content))
    done = subprocess.run(
        engine.import_rootfs(tarball=tarball, tag=image.base.reference), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def never() -> str:
    raise AssertionError("this machine must not bootstrap or build: it asked for a Debian mirror")


def get(engine: Engine, image: BuilderImage, sharing: Sharing, tmp_path: Path, *, may_make: bool = False) -> Ready:
    """wheelmill's prepare-image path on ``engine``'s store; a machine that ``may_make`` nothing
    fails the test where it asks for a Debian mirror (to bootstrap or build)."""
    with StepLog(tmp_path / f"{engine.store.name if engine.store else 'engine'}.log") as log:
        return prepare_builder(
            engine,
            image,
            mirror=(lambda: "http://127.0.0.1:9/debian") if may_make else never,
            work=tmp_path / "work",
            log=log,
            on_line=lambda _line: None,
            sharing=sharing,
            policy=QUICK,
        )


def listing(registry: str) -> dict[str, list[str]]:
    """Every repository of the registry and its tags."""
    address = registry.split("/", 1)[0]
    with urllib.request.urlopen(f"http://{address}/v2/_catalog", timeout=10) as answer:
        repositories = json.loads(answer.read())["repositories"] or []
    tags = {}
    for repository in repositories:
        with urllib.request.urlopen(f"http://{address}/v2/{repository}/tags/list", timeout=10) as answer:
            tags[repository] = sorted(json.loads(answer.read())["tags"] or [])
    return tags


def digests(ready: Ready) -> dict[str, str]:
    return {t.image: t.digest for t in ready.transfers}


def test_one_machine_builds_and_pushes_another_pulls_the_same_bytes(
    registry: str, machines: dict[str, Engine], tmp_path: Path
) -> None:
    image = definition(tmp_path)
    import_base(machines["a"], image, tmp_path)
    started = time.monotonic()
    made = get(machines["a"], image, Sharing(registry=registry), tmp_path, may_make=True)
    a_seconds = time.monotonic() - started
    assert (made.origin, made.base_origin) == (Origin.BUILT, Origin.REUSED)
    assert [(t.image, t.action) for t in made.transfers] == [("base", "pushed"), ("builder", "pushed")]
    assert made.warnings == ()

    started = time.monotonic()
    pulled = get(machines["b"], image, Sharing(registry=registry), tmp_path)  # no mirror: it may make nothing
    b_seconds = time.monotonic() - started
    print(f"\nA built and pushed {made.tag} in {a_seconds:.1f}s: {digests(made)}")
    print(f"B pulled {pulled.tag} in {b_seconds:.1f}s: {digests(pulled)}")
    print(f"base identity A {made.base_identity}, B {pulled.base_identity}")
    print(f"image id A {made.image_id[:19]}, B {pulled.image_id[:19]}")
    assert (pulled.origin, pulled.base_origin) == (Origin.PULLED, Origin.PULLED)
    assert [(t.image, t.action) for t in pulled.transfers] == [("base", "pulled"), ("builder", "pulled")]
    assert pulled.tag == made.tag and pulled.base_identity == made.base_identity
    assert digests(pulled) == digests(made) and all(d.startswith("sha256:") for d in digests(made).values())
    assert pulled.image_id == made.image_id
    facts = pulled.facts()["image"]
    assert isinstance(facts, dict) and facts["origin"] == facts["base_origin"] == "pulled"
    assert pulled.unpushed is None and facts["transfers"] == [t.facts() for t in pulled.transfers]
    assert listing(registry) == {
        "wheelmill/wheelmill-base": [Sharing(registry=registry).base(image.base).rsplit(":", 1)[1]],
        "wheelmill/wheelmill-builder": [made.tag.rsplit(":", 1)[1]],
    }

    # a read-only machine (a pull request's build) pulls the base, builds a builder the
    # registry lacks, and pushes nothing
    before = listing(registry)
    other = definition(tmp_path, hello="changed")
    read_only = get(
        machines["c"], other, Sharing(registry=registry, writes=SharedWrites.READ_ONLY), tmp_path, may_make=True
    )
    assert (read_only.origin, read_only.base_origin) == (Origin.BUILT, Origin.PULLED)
    assert read_only.unpushed is not None and read_only.unpushed.startswith("read-only: pushed nothing")
    assert [t.action for t in read_only.transfers] == ["pulled"]
    assert listing(registry) == before
    print(f"C (read-only) built {read_only.tag}; the registry still holds {before}")


def test_a_registry_that_does_not_answer_is_a_warning_and_the_image_is_built_here(
    machines: dict[str, Engine], tmp_path: Path
) -> None:
    image = definition(tmp_path)
    import_base(machines["d"], image, tmp_path)
    nowhere = Sharing(registry=f"127.0.0.1:{free_port()}/wheelmill")
    ready = get(machines["d"], image, nowhere, tmp_path, may_make=True)
    assert (ready.origin, ready.base_origin) == (Origin.BUILT, Origin.REUSED)
    assert [m.why for m in ready.warnings] == [Miss.UNREACHABLE]
    assert ready.unpushed == f"{nowhere.registry} did not answer: pushed nothing"


def test_a_runner_with_an_empty_store_builds_a_cell_in_the_image_another_empty_store_made(
    podman: str, tmp_path: Path
) -> None:
    """Through the command line, as two CI jobs of a fleet that starts empty run it. Runner A,
    an image store that started empty, made the base and cpu-py311's builder and pushed both:
    in the suite, the rootless test's new account (the run's one maker of them: tests/images.py);
    run alone, this test's own runner A, a store of its own, read-write. Runner B, a store of
    its own that starts empty, builds the same cell read-only: it pulls the base and the
    builder under the tag A pushed (a base has one name on every machine that holds it,
    bootstrapped or pulled), bootstraps and builds no image, and builds the recipe in it."""
    registry = run_registry()
    if registry is None:
        pytest.skip("docker-registry is not installed (scripts/setup --system installs it)")
    image = cpu_builder()
    tag = image.tag(base_identity(image.base))
    env = {**os.environ, "WHEELMILL_ENGINE": "podman", "WHEELMILL_IMAGE_REGISTRY": registry}
    argv = [sys.executable, "-m", "wheelmill", "build", "--cell", "cpu-py311", "--recipe", "example-cpp-ops"]
    argv += ["--no-publish", "--no-mirror"]
    made_here = None
    with ExitStack() as stores:
        if not holds(registry, SHARED_BUILDER, tag.rsplit(":", 1)[1]):
            a_path = stores.enter_context(own_store(podman, tmp_path / "store-a"))
            a_env = {**env, "WHEELMILL_OUTPUT": str(tmp_path / "a"), "WHEELMILL_SHARED_WRITES": "read-write"}
            made_here = _cli(argv, {**a_env, "PATH": f"{a_path}:{os.environ['PATH']}"})["facts"]["image"]
            assert (made_here["origin"], made_here["base_origin"]) == ("built", "built"), made_here
            assert [(t["image"], t["action"]) for t in made_here["transfers"]] == [
                ("base", "pushed"),
                ("builder", "pushed"),
            ]
        b_path = stores.enter_context(own_store(podman, tmp_path / "store-b"))
        b_env = {**env, "WHEELMILL_OUTPUT": str(tmp_path / "b"), "WHEELMILL_SHARED_WRITES": "read-only"}
        b = _cli(argv, {**b_env, "PATH": f"{b_path}:{os.environ['PATH']}"})
    pulled = b["facts"]["image"]
    print(f"\nA {'was this test' if made_here else 'made them earlier in the run'}: {made_here or 'the registry'}")
    print(f"B: {pulled}")
    assert (pulled["origin"], pulled["base_origin"]) == ("pulled", "pulled"), pulled
    assert pulled["tag"] == tag and pulled["base_identity"] == f"bootstrap:{base_tag(image.base)}"
    served = {
        "base": registry_digest(Sharing(registry=registry).base(image.base)),
        "builder": registry_digest(Sharing(registry=registry).builder(tag)),
    }
    assert {t["image"]: t["digest"] for t in pulled["transfers"]} == served, "the bytes A pushed"
    if made_here is not None:
        assert {t["image"]: t["digest"] for t in made_here["transfers"]} == served
        assert made_here["tag"] == tag
    assert b["status"] == "ok" and {s["step"] for s in b["steps"] if s["recipe"] and s["status"] == "ok"} >= {
        "build",
        "install-test",
    }
    names = subprocess.run(
        [podman, "images", "--format", "{{.Repository}}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [name for name in names if name.startswith(registry)], "the registry's names are untagged after a move"


def registry_digest(reference: str) -> str:
    name, _, tag = reference.rpartition(":")
    return resolve_digest(name, tag, timeout=30)


@contextmanager
def own_store(podman: str, store: Path) -> Iterator[Path]:
    """A directory with a ``podman`` that keeps its images in ``store`` (empty at first) for
    the block, as a runner of its own: put it first on a build's PATH. The store goes after."""
    run = Path("/tmp") / f"wheelmill-run-{store.name}-{free_port()}"
    wrapper = store.parent / f"bin-{store.name}" / "podman"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(
        f'#!/bin/sh\nexec {podman} --root {store / "root"} --runroot {run} --tmpdir {store / "tmp"} "$@"\n'
    )
    wrapper.chmod(0o755)
    try:
        yield wrapper.parent
    finally:
        subprocess.run([str(wrapper), "system", "reset", "--force"], capture_output=True, check=False)
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


def _cli(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report: dict[str, Any] = json.loads((Path(env["WHEELMILL_OUTPUT"]) / "cpu-py311" / "report.json").read_text())
    return report
