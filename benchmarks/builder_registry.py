"""Builder images through a registry: one machine builds and pushes, another pulls.

Debian's docker-registry on a loopback port of its own, and two machines, each a podman
image store of its own in the work directory, both through wheelmill's prepare-image path
(``get_builder`` with the engine):

1. A: the cell's bootstrapped base (copied in from this machine's store, as if A had
   bootstrapped it; not timed), then the builder image built and both pushed;
2. B: an empty store and no Debian mirror (asking for one stops the benchmark: B may make
   nothing): both pulled.

Prints A's time to build and to push, B's time to pull, each image's digest as A pushed and
B pulled it and whether they match, and that B never bootstrapped or built. ``--smoke``: a
tiny base and Containerfile instead of the cell's (seconds, no figure). Usage:
``.venv/bin/python benchmarks/builder_registry.py [--cell cpu-py311] [--smoke]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import runs

from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine.builder_images import (
    Base,
    BaseKind,
    BuilderImage,
    EngineImages,
    Ready,
    Sharing,
    choose,
    debian_mirror,
    get_builder,
    image_id,
)
from wheelmill.machine.engine import Engine, EngineName, detect
from wheelmill.machine.image_transfers import Missed, Transfer
from wheelmill.machine.pins import PythonSource, load_pins
from wheelmill.machine.process import StepLog
from wheelmill.retry import RetryPolicy
from wheelmill.settings import Settings

TINY_CONTAINERFILE = (
    "ARG BASE\nFROM ${BASE}\nARG PYTHON_VERSION\nARG PYTHON_URL\nARG PYTHON_SHA256\nCOPY hello /hello\n"
)


@dataclass
class Timed:
    """wheelmill's engine operations, each call's seconds recorded by what it did."""

    ops: EngineImages
    seconds: dict[str, float] = field(default_factory=dict)

    def _time(self, what: str, started: float) -> None:
        self.seconds[what] = self.seconds.get(what, 0.0) + time.monotonic() - started

    def layers(self, reference: str) -> tuple[str, ...] | None:
        return self.ops.layers(reference)

    def image_id(self, reference: str) -> str | None:
        return self.ops.image_id(reference)

    def listed(self, reference: str) -> bool | None:
        return self.ops.listed(reference)

    def pull(self, reference: str, *, local: str, image: str, platform: str | None) -> Transfer | Missed:
        started = time.monotonic()
        try:
            return self.ops.pull(reference, local=local, image=image, platform=platform)
        finally:
            self._time(f"pull {image}", started)

    def push(self, local: str, reference: str, *, image: str) -> Transfer | Missed:
        started = time.monotonic()
        try:
            return self.ops.push(local, reference, image=image)
        finally:
            self._time(f"push {image}", started)

    def bootstrap(self) -> None:
        started = time.monotonic()
        try:
            self.ops.bootstrap()
        finally:
            self._time("bootstrap", started)

    def build(self, tag: str) -> None:
        started = time.monotonic()
        try:
            self.ops.build(tag)
        finally:
            self._time("build", started)


@contextlib.contextmanager
def loopback_registry(directory: Path) -> Iterator[str]:
    """Debian's docker-registry storing under ``directory``, answering at the yielded address."""
    binary = shutil.which("docker-registry", path="/usr/bin:/usr/sbin")
    if binary is None:
        raise SystemExit(runs.broken("docker-registry is not installed (scripts/setup --system installs it)"))
    address = f"127.0.0.1:{runs.free_port()}"
    config = directory / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {directory}/store\nhttp:\n  addr: {address}\n"
    )
    server = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        runs.wait_until(lambda: _answers(address), f"the registry at {address}", seconds=20)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=10)


def _answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def own_store(podman: str, directory: Path) -> Iterator[Engine]:
    """A machine: podman with an image store of its own, emptied and removed afterwards."""
    engine = Engine(name=EngineName.PODMAN, binary=podman, store=directory)
    try:
        yield engine
    finally:
        subprocess.run([*engine.command, "rmi", "--all", "--force"], capture_output=True, check=False)
        for path in (engine.store, engine.runroot):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)


def cell_image(cell_id: str) -> BuilderImage:
    settings = Settings.from_environ()
    matrix = load_matrix(settings.recipes / "matrix.toml")
    cell = matrix.cell(cell_id)
    pins = load_pins(runs.ROOT / "containers" / "pins.toml")
    return choose(pins, cell.variant, cell.python, containers=runs.ROOT / "containers", policy="bootstrap")


def tiny_image(work: Path) -> BuilderImage:
    directory = work / "tiny" / "builder"
    directory.mkdir(parents=True)
    (directory / "Containerfile").write_text(TINY_CONTAINERFILE)
    (directory / "hello").write_text("hello\n")
    base = Base(
        kind=BaseKind.BOOTSTRAP,
        reference="localhost/wheelmill-base:bullseye-minbase",
        description="tiny",
        glibc="2.31",
        suite="bullseye",
    )
    python = PythonSource(version="3.11", path="pool/python.tar.xz", sha256="0" * 64)
    return BuilderImage(containerfile=directory / "Containerfile", base=base, python=python)


def give_base(engine: Engine, image: BuilderImage, *, machine: Engine, smoke: bool, work: Path) -> None:
    """Machine A's base: this machine's bootstrapped one, copied in (its layers unchanged); a
    tiny file system for a smoke."""
    archive = work / "base.tar"
    if smoke:
        with tarfile.open(archive, "w") as tar:
            info = tarfile.TarInfo("etc/wheelmill-base")
            info.size = 5
            tar.addfile(info, io.BytesIO(b"tiny\n"))
        runs.timed(engine.import_rootfs(tarball=archive, tag=image.base.reference), log=work / "bench.log")
        return
    if image_id(machine, image.base.reference) is None:
        raise SystemExit(runs.broken(f"{image.base.reference} is not in this machine's store: build the cell once"))
    runs.timed(
        [*machine.command, "save", "--format", "docker-archive", "-o", str(archive), image.base.reference],
        log=work / "bench.log",
    )
    runs.timed([*engine.command, "load", "-i", str(archive)], log=work / "bench.log")
    archive.unlink()


@dataclass(frozen=True)
class Run:
    """One machine's prepare-image: what it gave, each operation's seconds, and all of it."""

    ready: Ready
    seconds: dict[str, float]
    total: float

    def took(self, *what: str) -> float:
        return sum(self.seconds.get(name, 0.0) for name in what)

    def digests(self, action: str) -> dict[str, str]:
        return {t.image: t.digest for t in self.ready.transfers if t.action == action}


def run_machine(engine: Engine, image: BuilderImage, sharing: Sharing, *, mirror: Callable[[], str], work: Path) -> Run:
    """wheelmill's prepare-image path on ``engine``'s store, each engine operation timed."""
    name = engine.store.name if engine.store else "engine"
    with StepLog(work / f"prepare-image-{name}.log") as log:
        ops = EngineImages(
            engine=engine,
            image=image,
            mirror=mirror,
            work=work / f"bootstrap-{name}",
            log=log,
            on_line=lambda _line: None,
            policy=RetryPolicy(attempts=3, base_delay=1.0),
        )
        timed = Timed(ops)
        started = time.monotonic()
        ready = get_builder(image, timed, sharing)
        return Run(ready=ready, seconds=timed.seconds, total=time.monotonic() - started)


def say(image: BuilderImage, a: Run, b: Run, *, registry: str, mirror_asked: bool) -> int:
    print(f"builder {a.ready.tag}: {image.describe()}")
    print(f"registry {registry} (docker-registry on loopback); each machine a podman store of its own")
    print(
        f"A: base {a.ready.base_origin}, builder {a.ready.origin} in {a.took('build'):.1f} s, "
        f"pushed in {a.took('push base', 'push builder'):.1f} s "
        f"(base {a.took('push base'):.1f} s, builder {a.took('push builder'):.1f} s); all {a.total:.1f} s"
    )
    for transfer in a.ready.transfers:
        print(f"   {transfer.describe()}")
    print(
        f"B: base {b.ready.base_origin}, builder {b.ready.origin}; pulled in {b.total:.1f} s "
        f"(base {b.took('pull base'):.1f} s, builder {b.took('pull builder'):.1f} s)"
    )
    for transfer in b.ready.transfers:
        print(f"   {transfer.describe()}")
    pushed, pulled = a.digests("pushed"), b.digests("pulled")
    same = {what: pushed.get(what) == pulled.get(what) for what in ("base", "builder")}
    print(
        f"same tag: {a.ready.tag == b.ready.tag}; same base identity: {a.ready.base_identity == b.ready.base_identity}"
    )
    ids = a.ready.image_id == b.ready.image_id
    print(f"digests match: base {same['base']}, builder {same['builder']}; image ids match: {ids}")
    made_by_b = [what for what in ("bootstrap", "build") if what in b.seconds]
    print(f"B bootstrapped: {'bootstrap' in made_by_b}; B built: {'build' in made_by_b}; ", end="")
    print(f"B asked for a Debian mirror: {mirror_asked}")
    if a.ready.tag != b.ready.tag or not all(same.values()) or made_by_b or mirror_asked:
        return runs.broken("machine B did not get A's images from the registry")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="cpu-py311")
    parser.add_argument("--smoke", action="store_true", help="a tiny base and Containerfile: seconds, no figure")
    args = parser.parse_args()
    machine = detect("podman")
    if machine is None:
        return runs.broken("podman does not answer here")
    asked: list[str] = []

    def no_mirror() -> str:
        asked.append("mirror")
        raise SystemExit(runs.broken("machine B asked for a Debian mirror: it was about to bootstrap or build"))

    def mirror() -> str:
        return "http://127.0.0.1:9/debian" if args.smoke else debian_mirror(Settings.from_environ().debian_mirror)

    with runs.workspace("wheelmill-bench-registry-") as work:
        image = tiny_image(work) if args.smoke else cell_image(args.cell)
        (work / "registry").mkdir()
        with (
            loopback_registry(work / "registry") as address,
            own_store(machine.binary, work / "a") as a,
            own_store(machine.binary, work / "b") as b,
        ):
            sharing = Sharing(registry=f"{address}/wheelmill")
            give_base(a, image, machine=machine, smoke=args.smoke, work=work)
            made = run_machine(a, image, sharing, mirror=mirror, work=work)
            pulled = run_machine(b, image, sharing, mirror=no_mirror, work=work)
    return say(image, made, pulled, registry=sharing.registry, mirror_asked=bool(asked))


if __name__ == "__main__":
    sys.exit(main())
