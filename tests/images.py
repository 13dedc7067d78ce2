"""The run's images. The builder images the suite's containers need are made once a run and
shared between the image stores that need them (root's podman, docker, a new account's
rootless podman, a test's empty store) through a loopback registry of the run's own; and the
run's summary says what the stores held at the start and at the end, so that a green run on
a machine whose stores were warm is not mistaken for one on an empty machine.

The registry (Debian's docker-registry on 127.0.0.1) is started by the run's controller
before the workers start, which inherit its address in ``RUN_REGISTRY``; it and its files go
at the end. The tests that drive an engine build with ``WHEELMILL_IMAGE_REGISTRY`` set to it,
read-only: they pull what it holds and make, without pushing, what it does not. The test
marked ``makes_images`` writes to it: the rootless test, whose new account starts with an
empty store and makes the base (mmdebstrap) and cpu-py311's builder, as a new runner of a
fleet would, and pushes both. It runs first of the engine tests (``first_of_the_engines``),
so that every store after it pulls rather than makes. Where it does not run (a user who is
not root, or a test run alone), the registry test's runner A fills the registry instead, and
the other tests make what they need, as they would with no registry at all.

Where root's podman store already holds both of those images (a machine that made them
before), the rootless test first pushes them from there into the registry (``seed``): the
account then pulls them, as a fleet's next runner does, rather than compiling CPython again
for a store of its own. On an empty machine nothing is seeded and the account makes them,
the run's one maker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.ports import free_port
from wheelmill.inputs.matrix import load_matrix
from wheelmill.machine.builder_images import ONE_TRY, BuilderImage, EngineImages, Sharing, choose, get_builder
from wheelmill.machine.engine import detect
from wheelmill.machine.pins import load_pins
from wheelmill.machine.process import StepLog
from wheelmill.settings import SharedWrites

ROOT = Path(__file__).resolve().parent.parent

RUN_REGISTRY = "WHEELMILL_TESTS_IMAGE_REGISTRY"  # host:port/namespace, set by the controller
SEED_CELL = "cpu-py311"  # the cell whose base and builder the rootless test makes
NAMESPACE = "wheelmill-tests"
OURS = "localhost/wheelmill-"  # what wheelmill names its images in an engine's store
ENGINES = ("podman", "docker")


def run_registry() -> str | None:
    """The run's registry (``127.0.0.1:port/wheelmill-tests``), or None where none was started."""
    return os.environ.get(RUN_REGISTRY) or None


class _Absent(Exception):
    """Seeding would have to make an image: it makes none."""


class _FoundOnly(EngineImages):
    """The engine's images as a build finds them, but nothing bootstrapped or built."""

    def bootstrap(self) -> None:
        raise _Absent

    def build(self, tag: str) -> None:
        raise _Absent


def cpu_builder() -> BuilderImage:
    """``SEED_CELL``'s builder image on its bootstrapped base, as a build chooses it."""
    cell = load_matrix(ROOT / "recipes" / "matrix.toml").cell(SEED_CELL)
    pins = load_pins(ROOT / "containers" / "pins.toml")
    return choose(pins, cell.variant, cell.python, containers=ROOT / "containers", policy="bootstrap")


def seed(registry: str, work: Path) -> bool:
    """``SEED_CELL``'s base and builder image pushed from root's podman store into
    ``registry``, as a read-write build pushes what its store holds and the registry lacks;
    False, pushing nothing, where the store lacks either (nothing is made here)."""
    engine = detect("podman", probe=None) if shutil.which("podman") else None
    if engine is None or os.geteuid() != 0:
        return False
    image = cpu_builder()
    log = StepLog(work / "seed.log")
    ops = _FoundOnly(
        engine=engine, image=image, mirror=lambda: "", work=work, log=log, on_line=log.write, policy=ONE_TRY
    )
    try:  # a push that fails is the test's error: it would otherwise fail later, as a puzzle
        ready = get_builder(image, ops, Sharing(registry=registry, writes=SharedWrites.READ_WRITE))
    except _Absent:
        return False
    finally:
        log.close()
    return ready.unpushed is None and {t.image for t in ready.transfers if t.action == "pushed"} == {"base", "builder"}


@contextmanager
def serving_registry(directory: Path) -> Iterator[str | None]:
    """Debian's docker-registry storing under ``directory``, answering on a loopback port:
    its address; None where docker-registry is not installed (the tests then make their own
    images, and the ones that need a registry skip or fail as they say)."""
    binary = shutil.which("docker-registry", path="/usr/bin:/usr/sbin")
    if binary is None:
        yield None
        return
    address = f"127.0.0.1:{free_port()}"
    config = directory / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {directory / 'store'}\nhttp:\n  addr: {address}\n"
    )
    server = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not answers(address):
            if time.monotonic() > deadline or server.poll() is not None:
                yield None
                return
            time.sleep(0.1)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=10)


def answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def holds(registry: str, repository: str, tag: str) -> bool:
    """Whether ``registry`` (``host:port/namespace``) has ``repository:tag``."""
    address, _, namespace = registry.partition("/")
    try:
        with urllib.request.urlopen(f"http://{address}/v2/{namespace}/{repository}/tags/list", timeout=10) as answer:
            return tag in (json.loads(answer.read()).get("tags") or [])
    except (urllib.error.URLError, OSError, ValueError):
        return False


def listing(registry: str) -> list[str]:
    """Every ``repository:tag`` the registry holds, under its namespace."""
    address, _, namespace = registry.partition("/")
    try:
        with urllib.request.urlopen(f"http://{address}/v2/_catalog", timeout=10) as answer:
            repositories = json.loads(answer.read()).get("repositories") or []
        found = []
        for repository in repositories:
            with urllib.request.urlopen(f"http://{address}/v2/{repository}/tags/list", timeout=10) as answer:
                tags = json.loads(answer.read()).get("tags") or []
            found += [f"{repository.removeprefix(namespace + '/')}:{tag}" for tag in sorted(tags)]
        return found
    except (urllib.error.URLError, OSError, ValueError):
        return []


def stored(engine: str) -> list[str] | None:
    """wheelmill's named images in ``engine``'s store (root's, for podman); None where the
    engine does not answer."""
    if shutil.which(engine) is None:
        return None
    listed = subprocess.run(
        [engine, "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if listed.returncode != 0:
        return None
    return sorted({name for name in listed.stdout.split() if name.startswith(OURS)})


class RunImages:
    """The controller's: the run's registry for the whole run, the stores' contents at the
    start, and the summary at the end."""

    def __init__(self) -> None:
        self.stack = ExitStack()
        self.registry: str | None = None
        self.at_start: dict[str, list[str] | None] = {}
        self.engine_ran = False  # a summary only where a test drove an engine

    def start(self) -> None:
        self.at_start = {engine: stored(engine) for engine in ENGINES}
        directory = Path(tempfile.mkdtemp(prefix="wheelmill-tests-images-"))
        self.stack.callback(shutil.rmtree, directory, ignore_errors=True)
        address = self.stack.enter_context(serving_registry(directory))
        if address is not None:
            self.registry = f"{address}/{NAMESPACE}"
            os.environ[RUN_REGISTRY] = self.registry
            self.stack.callback(os.environ.pop, RUN_REGISTRY, None)

    def pytest_unconfigure(self) -> None:
        """The registry stopped and its files removed, wherever this plugin was registered."""
        self.stack.close()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.engine_ran = self.engine_ran or "engine" in report.keywords

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.engine_ran:
            terminalreporter.section("image stores")
            for line in self.summary():
                terminalreporter.write_line(line)

    def summary(self) -> list[str]:
        """A line a store: what it held at the start (found) and what the run added to it
        (made here or pulled from the run's registry); then what the registry received."""
        lines = []
        for engine in ENGINES:
            before, after = self.at_start.get(engine), stored(engine)
            if before is None or after is None:
                lines.append(f"{engine}: does not answer")
                continue
            added = [name for name in after if name not in before]
            lines.append(f"{engine}: found {len(before)} at the start{_names(before)}")
            lines.append(f"{engine}: the run added {len(added)}{_names(added)}")
        if self.registry is not None:
            made = listing(self.registry)
            lines.append(f"the run's registry {self.registry}: received {len(made)}{_names(made)}")
        return lines


def _names(names: list[str]) -> str:
    return f": {', '.join(name.removeprefix(OURS) for name in names)}" if names else ""
