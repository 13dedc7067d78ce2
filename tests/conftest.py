"""Shared fixtures: the repository's own data, copies of it to break, the CLI run
in-process (so a test sees the exit code and the exact stderr a user would), a real S3
server (one per worker, started where a test first asks for it), the run's images
(tests/images.py: made once a run, shared between the image stores through a registry),
the run's compiler cache (tests/compiles.py: a shared tier the integration tests
compile through), and the CPU each test cost (tests/cpu.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.compiles import RunCache, run_cache
from tests.cpu import CpuTimes
from tests.images import RunImages, run_registry
from tests.objectstore import ObjectStore, running_object_store
from wheelmill.cli import main
from wheelmill.index.s3 import S3Storage
from wheelmill.index.storage import Storage, TreeStorage

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str


CliRunner = Callable[..., CliResult]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipsInCi(), "wheelmill-skips-in-ci")
    config.pluginmanager.register(NamelessImages(), "wheelmill-nameless-images")
    config.pluginmanager.register(CpuTimes(), "wheelmill-cpu-times")
    _run_directories(config)
    if not hasattr(config, "workerinput"):  # the controller's, before the workers start: they inherit them
        images, cache = RunImages(), RunCache()
        config.pluginmanager.register(images, "wheelmill-run-images")  # each one's pytest_unconfigure stops it
        config.pluginmanager.register(cache, "wheelmill-run-cache")
        images.start()
        cache.start()


# Directories of the whole run, each named by its variable, made before the workers start
# (they inherit the environment, and so share them) and removed at the run's end:
RUN_DIRECTORIES = {
    # uv keys a wheel by the URL it came from, and the tests serve channels on new ports every
    # time: in the user's cache, each run would leave gigabytes of unpacked torch behind.
    "UV_CACHE_DIR": "uv-cache-of-wheelmill-tests-",
    # Every test builds into an output root of its own: one bytecode store for them all
    # compiles torch's modules once a run, not once a test (docs/design/compiler-cache.md).
    "WHEELMILL_BYTECODE_STORE": "bytecode-of-wheelmill-tests-",
    # py-rattler-build (conda seed's interpreter package) keeps a cache in the user's home
    # unless told otherwise: the run's own, gone at its end.
    "RATTLER_CACHE_DIR": "rattler-cache-of-wheelmill-tests-",
}


def _run_directories(config: pytest.Config) -> None:
    """Each of RUN_DIRECTORIES that the caller's environment does not name already."""
    made = {}
    for variable, prefix in RUN_DIRECTORIES.items():
        if variable not in os.environ:
            made[variable] = Path(tempfile.mkdtemp(prefix=prefix))
            os.environ[variable] = str(made[variable])
    config.stash[_MADE_DIRECTORIES] = made


def pytest_unconfigure(config: pytest.Config) -> None:
    for variable, path in config.stash.get(_MADE_DIRECTORIES, {}).items():
        del os.environ[variable]
        shutil.rmtree(path, ignore_errors=True)


_MADE_DIRECTORIES = pytest.StashKey[dict[str, Path]]()

# In CI (CI=true) a skipped test fails the run: scripts/setup --system installs every
# prerequisite there, so a skip means one went missing and its checks silently did not run.
# A skip that is right in CI goes here, by test id prefix, with why.
EXPECTED_SKIPS: dict[str, str] = {}


class SkipsInCi:
    """Every skip of the run (workers' reports reach the controller); at its end in CI, each
    unexpected one named and the run failed."""

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
            self.skipped.append((report.nodeid, str(reason)))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not strict_skips() or hasattr(session.config, "workerinput"):
            return
        unexpected = unexpected_skips(self.skipped)
        reporter: pytest.TerminalReporter | None = session.config.pluginmanager.get_plugin("terminalreporter")
        for nodeid, reason in unexpected:
            line = f"SKIPPED IN CI (a prerequisite is missing): {nodeid}: {reason}"
            if reporter is not None:
                reporter.write_line(line, red=True)
        if unexpected:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


class NamelessImages:
    """podman keeps each layer and each stage of a multi-stage build as a nameless image, its
    build cache. The tests remove the images they build by name, which leaves those behind for
    good: about 400 MB a run. On a process that ran an engine test, the nameless images made
    since its first one are removed at the end; named ones (the builder images that the next
    run reuses) stay, and so do the layers they are built on."""

    def __init__(self) -> None:
        self.before: set[str] | None = None

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.before is None and item.get_closest_marker("engine") and shutil.which("podman"):
            self.before = podman_images("-a")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.before is None:
            return
        for _ in range(16):  # a nameless image with a nameless parent: the child first, then the parent
            made = podman_images("-a", "--filter", "dangling=true") - self.before
            if not made:
                return
            subprocess.run(["podman", "rmi", *sorted(made)], capture_output=True, check=False)


def podman_images(*args: str) -> set[str]:
    listed = subprocess.run(
        ["podman", "images", "--quiet", "--no-trunc", *args], capture_output=True, text=True, check=False
    )
    return set(listed.stdout.split())


def strict_skips() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unexpected_skips(skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(n, r) for n, r in skipped if not any(n.startswith(prefix) for prefix in EXPECTED_SKIPS)]


# The scope of every test that drives a container engine, when the tests run on several
# workers (pytest-xdist's loadgroup): they run one after another on one worker, since they
# look for their containers by cell label and build and remove images of the same names.
ENGINE_GROUP = "container-engine"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On several workers: the engine tests in one group, and the slow tests first (engine
    tests, then the other integration tests, then the unit tests), so that the seconds-long
    ones fill the end of the run instead of a build of minutes starting last."""
    if not getattr(config.option, "loadgroup", False):  # set on each worker of --dist=loadgroup
        return
    for item in items:
        if item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.xdist_group(ENGINE_GROUP))
    items.sort(key=_slow_first)


def _slow_first(item: pytest.Item) -> int:
    if item.get_closest_marker("makes_images"):
        return 0  # first of the engine tests: the stores after it pull what it makes
    if item.get_closest_marker("engine"):
        return 1
    return 2 if item.get_closest_marker("integration") else 3


@pytest.fixture(autouse=True)
def run_images(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that drives an engine builds with the run's registry, pushing nothing to it: the
    builder images another store made this run are pulled, not made again (tests/images.py).
    It writes the compiler cache's shared tier (tests/compiles.py), as a fleet's build jobs
    that hold no push credential do. The one that makes the images says so with its own
    settings."""
    registry = run_registry()
    if registry is not None and request.node.get_closest_marker("engine"):
        monkeypatch.setenv("WHEELMILL_IMAGE_REGISTRY", registry)
        monkeypatch.setenv("WHEELMILL_SHARED_WRITES", "compiler-cache")


@pytest.fixture(autouse=True)
def run_compiles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """An integration test compiles through the run's shared tier: what another
    test compiled it takes from there (tests/compiles.py). A test marked own_compiler_cache
    keeps the tiers its own settings give it."""
    cache, node = run_cache(), request.node
    if cache is None or not node.get_closest_marker("integration"):
        return
    if node.get_closest_marker("own_compiler_cache"):
        return
    monkeypatch.setenv("WHEELMILL_COMPILER_CACHE_TIERS", "disk,redis")
    monkeypatch.setenv("WHEELMILL_COMPILER_CACHE_REDIS", cache)


@pytest.fixture(scope="session", autouse=True)
def temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every temporary file the suite and the processes it starts make without a place of
    their own (uv's environment locks, a tool's scratch) goes under one directory, removed at
    the end: nothing is left in the machine's /tmp, whichever test made it. The tests' own
    directories stay where pytest puts them, decided first (a longer path could outgrow a
    unix socket's name, 108 bytes)."""
    tmp_path_factory.getbasetemp()
    work = Path(tempfile.mkdtemp(prefix="wheelmill-tests-"))
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(work), str(work)
    try:
        yield work
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def object_store() -> Iterator[ObjectStore]:
    """SeaweedFS's S3 server on loopback, with an empty bucket of its own."""
    with running_object_store() as store:
        yield store


@pytest.fixture(params=["tree", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Storage]:
    """An empty storage of each kind, for the tests that hold both to one rule: a directory,
    or a prefix of its own in the worker's SeaweedFS bucket (emptied afterwards). A module
    with a ``storage`` of its own keeps that one."""
    if request.param == "tree":
        yield TreeStorage(tmp_path / "index")
        return
    store: ObjectStore = request.getfixturevalue("object_store")
    for name, value in store.environ().items():
        monkeypatch.setenv(name, value)
    s3 = S3Storage.of(store.url(f"{uuid.uuid4().hex}/"))
    yield s3
    for key in s3.keys_under():
        s3.delete(key)


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def recipes_copy(tmp_path: Path) -> Path:
    """A writable copy of recipes/ (and the extension sources its paths point at)."""
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    shutil.copytree(ROOT / "extensions", tmp_path / "extensions", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    return tmp_path / "recipes"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CliRunner:
    monkeypatch.setenv("WHEELMILL_OUTPUT", str(tmp_path / "wheels"))

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        return CliResult(code=code, out=captured.out, err=captured.err)

    return run
