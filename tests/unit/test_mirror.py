"""The runtime closure and mirroring, against a local upstream index (offline, real uv):
the closure locks torch and every dependency as wheels with sha256; mirroring publishes
them as mirrored files that verify and install on their own; a file whose bytes differ
from the lock is exit 7 and an upstream that drops the connection exit 6, both leaving the
channel as it was; built beats mirrored both ways; two channels share one stored copy."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.reports import write_report as report_of
from tests.sandbox import PYTHON, Sandbox
from tests.wheels import make_wheel
from wheelmill.errors import EnvError
from wheelmill.index.blobs import Blobs
from wheelmill.index.closure import Closure, ClosureInputs, Mirrored, mirror, read, resolve
from wheelmill.index.promotion import promote_mirrored
from wheelmill.index.store import Channel, PublishOutcome, publish, usage
from wheelmill.index.verify import verify
from wheelmill.machine import envs
from wheelmill.machine.net import sha256_of
from wheelmill.machine.package_sources import PackageSources
from wheelmill.machine.process import HostRunner, StepLog
from wheelmill.machine.tools import uv_bin
from wheelmill.output.layout import CLOSURE_LOCK_NAME, CellLayout
from wheelmill.retry import RetryPolicy

FAST = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01)


class Upstream:
    """The sandbox's stand-in index (torch for each variant) plus a dependency chain."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.channel = Channel(sandbox.root / "stand-in-index", "torch")
        wheels = sandbox.root / "upstream-wheels"
        publish(self.channel, make_wheel(wheels, "dep", "1.0", requires=["leaf>=2"], tag="py3-none-any"))
        publish(self.channel, make_wheel(wheels, "leaf", "2.0", tag="py3-none-any"))
        self.url = sandbox.index

    def file(self, filename: str) -> Path:
        return self.channel.files / filename


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path / "repo")


@pytest.fixture
def upstream(sandbox: Sandbox) -> Upstream:
    return Upstream(sandbox)


def built_app(sandbox: Sandbox, *, requires: tuple[str, ...] = ("dep", "torch")) -> Path:
    """The cell's built wheel: made once (a zip records the time: made again, other bytes)."""
    path = sandbox.root / "dist" / "app-1.0+cpu-py3-none-any.whl"
    return (
        path
        if path.is_file()
        else make_wheel(sandbox.root / "dist", "app", "1.0+cpu", requires=requires, tag="py3-none-any")
    )


def inputs(sandbox: Sandbox, channel: Channel, wheel: Path, sources: str) -> ClosureInputs:
    return ClosureInputs(
        cell=sandbox.cell("cpu"),
        channel=channel,
        python=PYTHON,
        glibc="manylinux_2_28",
        machine="x86_64",
        torch="2.13.0+cpu",
        wheels=(wheel,),
        sources=PackageSources(index_url=sources, origin="test"),
    )


def resolved(sandbox: Sandbox, channel: Channel, wheel: Path, sources: str, tmp_path: Path) -> Closure:
    with StepLog(tmp_path / "closure.log") as log:
        return resolve(
            inputs(sandbox, channel, wheel, sources),
            backend=envs.backend("uv", HostRunner()),
            log=log,
            work=tmp_path / "work",
            lock=tmp_path / CLOSURE_LOCK_NAME,
        )


def mirrored(closure: Closure, channel: Channel, tmp_path: Path) -> Mirrored:
    with StepLog(tmp_path / "mirror.log") as log:
        return mirror(
            closure, channel, sources=PackageSources(index_url=None), policy=FAST, log=log, on_line=lambda _line: None
        )


def tree(root: Path) -> dict[str, bytes]:
    """Every file of a channel and its bytes (its lock file names the last writer's pid)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"
    }


def test_the_closure_locks_torch_and_every_dependency_as_hashed_wheels(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    channel = Channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    closure = resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path)
    assert {w.project for w in closure.wheels} == {"app", "dep", "leaf", "torch"}
    assert closure.built == {"app"}
    assert {w.project for w in closure.to_mirror} == {"dep", "leaf", "torch"}
    torch = next(w for w in closure.wheels if w.project == "torch")
    assert torch.version == "2.13.0+cpu"
    for wheel in closure.to_mirror:
        assert wheel.sha256 == sha256_of(upstream.file(wheel.filename))
    assert read(tmp_path / CLOSURE_LOCK_NAME) == closure  # the lock on disk says what was resolved
    assert (
        (tmp_path / CLOSURE_LOCK_NAME)
        .read_text()
        .startswith(f"# wheelmill runtime closure of {sandbox.cell('cpu')}: app==1.0+cpu, torch==2.13.0+cpu")
    )


def test_a_dependency_with_no_wheel_anywhere_is_a_one_line_env_error(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    channel = Channel(sandbox.output / "index", "cpu")
    with pytest.raises(EnvError, match="cannot resolve the runtime closure from wheels") as raised:
        resolved(sandbox, channel, built_app(sandbox, requires=("no-such-dependency",)), upstream.url, tmp_path)
    assert raised.value.exit_code == 8


def test_a_lock_with_a_package_that_has_no_wheel_is_refused(tmp_path: Path) -> None:
    lock = tmp_path / CLOSURE_LOCK_NAME
    lock.write_text(
        'lock-version = "1.0"\n[[packages]]\nname = "thing"\nversion = "1.0"\n'
        'sdist = { url = "https://x/thing-1.0.tar.gz" }\n'
    )
    with pytest.raises(EnvError, match=r"thing has no wheel in the lock \(an sdist is never mirrored\)"):
        read(lock)


def test_mirroring_publishes_the_closure_as_mirrored_and_the_channel_installs_on_its_own(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    channel = Channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    done = mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    assert sorted((p.project, p.outcome) for p in done.published) == [
        ("dep", PublishOutcome.ADDED),
        ("leaf", PublishOutcome.ADDED),
        ("torch", PublishOutcome.ADDED),
    ]
    assert verify(channel) == []
    page = json.loads((channel.simple / "dep" / "index.json").read_text())
    assert page["files"][0]["_mirrored-from"] == upstream.channel.files.joinpath("dep-1.0-py3-none-any.whl").as_uri()
    assert "_mirrored-from" not in json.loads((channel.simple / "app" / "index.json").read_text())["files"][0]
    assert (channel.files / "leaf-2.0-py3-none-any.whl.metadata").is_file()  # PEP 658, like a built wheel
    # The channel alone installs the built wheel with torch and every dependency.
    venv = tmp_path / "consumer"
    subprocess.run([uv_bin(), "venv", "--no-config", "--quiet", "--python", PYTHON, str(venv)], check=True)
    install = [
        uv_bin(),
        "pip",
        "install",
        "--no-config",
        "--quiet",
        "--python",
        str(venv / "bin" / "python"),
        "--index-url",
        channel.simple.resolve().as_uri(),
        "app",
    ]
    subprocess.run(install, check=True)
    listed = subprocess.run(
        [uv_bin(), "pip", "list", "--python", str(venv / "bin" / "python")], check=True, capture_output=True, text=True
    ).stdout
    assert all(name in listed for name in ("app", "dep", "leaf", "torch"))
    # Mirroring again changes nothing.
    again = mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    assert {p.outcome for p in again.published} == {PublishOutcome.UNCHANGED}
    assert again.fetched_bytes == 0


def test_index_list_shows_built_and_mirrored_and_the_bytes_stored(
    cli: CliRunner, sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    channel = Channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    result = cli("--output", str(sandbox.output), "index", "list", "--channel", "cpu")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert "app: 1.0+cpu  [built]" in lines
    assert f"leaf: 2.0  [mirrored from {upstream.file('leaf-2.0-py3-none-any.whl').as_uri()}]" in lines
    assert lines[-1].startswith("1 channel(s) list 4 files")


def write_report(sandbox: Sandbox, app: Path, sources: str) -> None:
    """What a build of the cell that published ``app`` leaves for `wheelmill mirror`."""
    dist = CellLayout(output=sandbox.output, cell=sandbox.cell("cpu")).dist
    dist.mkdir(parents=True, exist_ok=True)
    shutil.copy(app, dist / app.name)  # a report's wheels lie beside it
    facts = {"package_source_args": ["--index-url", sources]}
    report_of(
        sandbox.output,
        sandbox.cell("cpu"),
        wheels=[("app", app, sha256_of(app))],
        torch="2.13.0+cpu",
        python=PYTHON,
        facts=facts,
    )


def refused_mirror(
    cli: CliRunner,
    monkeypatch: pytest.MonkeyPatch,
    sandbox: Sandbox,
    *,
    retries: int,
    code: int,
    channel: Channel,
    before: dict[str, bytes],
) -> str:
    """`wheelmill mirror` from the command line, refused: the exit code, one line that says
    the channel is unchanged, and the channel byte for byte as it was; that line."""
    for key, value in {**sandbox.environ(), "WHEELMILL_RETRIES": str(retries), "WHEELMILL_RETRY_DELAY": "0.01"}.items():
        monkeypatch.setenv(key, value)
    result = cli("--recipes", str(sandbox.recipes), "mirror", "--cell", sandbox.cell("cpu"))
    assert result.code == code, result.out + result.err
    (line,) = result.err.splitlines()
    assert "the channel is unchanged" in line
    assert tree(channel.path) == before  # verified downloads may stay in the store, named by content
    assert not list(channel.root.rglob("*.part"))
    return line


def test_a_file_whose_bytes_differ_from_the_lock_is_exit_7_and_the_channel_is_unchanged(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, upstream: Upstream
) -> None:
    """From the command line: upstream's page still says one sha256, its file now has other
    bytes (a tampered or corrupted mirror); the download is refused, never retried."""
    channel = Channel(sandbox.output / "index", "cpu")
    app = built_app(sandbox)
    publish(channel, app)
    write_report(sandbox, app, upstream.url)
    before = tree(channel.path)
    leaf = upstream.file("leaf-2.0-py3-none-any.whl")
    leaf.unlink()  # its name now holds other bytes (it was a link into upstream's store)
    make_wheel(
        sandbox.root / "tampered", "leaf", "2.0", tag="py3-none-any", files={"leaf/evil.py": b"import os\n"}
    ).rename(leaf)
    line = refused_mirror(cli, monkeypatch, sandbox, retries=3, code=7, channel=channel, before=before)
    assert line.startswith("wheelmill: error: mirror: leaf-2.0-py3-none-any.whl: ") and "sha256 mismatch" in line, line
    log = (sandbox.output / sandbox.cell("cpu") / "logs" / "mirror.log").read_text()
    assert "attempt 1 failed" not in log  # a mismatch is never retried


class _DropsWheels(http.server.SimpleHTTPRequestHandler):
    """Serves pages and sidecars, and hangs up on every wheel: an upstream gone mid-mirror."""

    def do_GET(self) -> None:
        if self.path.endswith(".whl"):
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        super().do_GET()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def dropping(upstream: Upstream) -> Iterator[str]:
    def handler(*args: object) -> _DropsWheels:
        return _DropsWheels(*args, directory=str(upstream.channel.root))  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/torch/simple/"
    server.shutdown()
    server.server_close()


def test_an_upstream_that_drops_every_download_is_exit_6_after_the_retries(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, dropping: str, tmp_path: Path
) -> None:
    """From the command line, as a user runs it after a build: one line naming the file's
    URL, the retries spent, and the channel as it was."""
    channel = Channel(sandbox.output / "index", "cpu")
    app = built_app(sandbox)
    publish(channel, app)
    write_report(sandbox, app, dropping)
    before = tree(channel.path)
    line = refused_mirror(cli, monkeypatch, sandbox, retries=2, code=6, channel=channel, before=before)
    assert (
        line.startswith("wheelmill: error: mirror: http://127.0.0.1:")
        and ".whl is unreachable after 2 attempts" in line
    ), line
    assert (
        sandbox.output / sandbox.cell("cpu") / CLOSURE_LOCK_NAME
    ).is_file()  # the lock was written before the downloads


def test_built_beats_mirrored_both_ways(sandbox: Sandbox, upstream: Upstream, tmp_path: Path) -> None:
    # A project built in the channel before the closure is resolved is resolved from there and never mirrored.
    channel = Channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    publish(channel, make_wheel(sandbox.root / "dist", "leaf", "2.0+cpu", tag="py3-none-any"))
    closure = resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path)
    assert closure.built == {"app", "leaf"}
    mirrored(closure, channel, tmp_path)
    assert [f.filename for f in channel.project("leaf").files] == ["leaf-2.0+cpu-py3-none-any.whl"]  # type: ignore[union-attr]
    # A project mirrored first, then built: the built wheel replaces the mirrored files.
    assert not channel.project("dep").files[0].built  # type: ignore[union-attr]
    done = publish(
        channel, make_wheel(sandbox.root / "dist", "dep", "1.0+cpu", requires=["leaf>=2"], tag="py3-none-any")
    )
    assert done.replaced == ("dep-1.0-py3-none-any.whl",)
    assert [(f.filename, f.built) for f in channel.project("dep").files] == [("dep-1.0+cpu-py3-none-any.whl", True)]  # type: ignore[union-attr]
    assert not (channel.files / "dep-1.0-py3-none-any.whl").exists()
    assert verify(channel) == []
    # And a mirrored file offered for a built project is not added.
    again = publish(
        channel, upstream.file("dep-1.0-py3-none-any.whl"), mirrored_from="file:///upstream/dep-1.0-py3-none-any.whl"
    )
    assert again.outcome is PublishOutcome.BUILT_HERE


def test_a_wheel_on_local_disk_is_stored_as_another_name_of_its_file(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    """A file:// source (a mirror on this machine's disk): its bytes checked, then linked
    into the store, not copied a second time; its mode left as it was."""
    channel = Channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    leaf = upstream.file("leaf-2.0-py3-none-any.whl")
    leaf.chmod(0o444)
    mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    blob = Blobs(channel.root).path_of(sha256_of(leaf))
    assert blob.stat().st_ino == leaf.stat().st_ino == (channel.files / leaf.name).stat().st_ino
    assert leaf.stat().st_mode & 0o777 == 0o444
    assert "stored from" in (tmp_path / "mirror.log").read_text()


def test_two_channels_holding_the_same_dependency_store_it_once(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    root = sandbox.output / "index"
    first, second = Channel(root, "cpu"), Channel(root, "test/cpu")
    for channel in (first, second):
        publish(channel, built_app(sandbox))
        mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    torch = "torch-2.13.0+cpu-py3-none-any.whl"
    blob = Blobs(root).path_of(sha256_of(first.files / torch))
    assert (first.files / torch).stat().st_ino == (second.files / torch).stat().st_ino == blob.stat().st_ino
    # Three names in the index (a local source's file may be one more name of it outside).
    assert len([p for p in root.rglob("*") if p.is_file() and p.stat().st_ino == blob.stat().st_ino]) == 3
    used = usage(root)
    assert used.listed_files == 8
    assert used.stored_files == 4  # app, dep, leaf, torch: once each
    assert used.stored_bytes * 2 == used.listed_bytes


def test_verify_checks_mirrored_files_like_built_ones(sandbox: Sandbox, upstream: Upstream, tmp_path: Path) -> None:
    channel = Channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    target = channel.files / "leaf-2.0-py3-none-any.whl"
    target.write_bytes(target.read_bytes()[:-1] + b"X")
    assert verify(channel) == [f"{channel.name}/leaf-2.0-py3-none-any.whl: sha256 differs from the page"]


def test_a_killed_mirrors_download_is_noted_by_verify_and_removed_by_repair(
    cli: CliRunner, sandbox: Sandbox, tmp_path: Path
) -> None:
    root = sandbox.output / "index"
    publish(Channel(root, "cpu"), built_app(sandbox))
    blobs = Blobs(root)
    stale = blobs.incoming / ".wm-tmp-torch-2.13.0.whl.x1.part"
    live = blobs.incoming / ".wm-tmp-nvidia_cublas.whl.x2.part"
    for path in (stale, live):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a download")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    checked = cli("--output", str(sandbox.output), "index", "verify")
    assert checked.code == 0, checked.err
    assert f"note: store: {stale.name}, left by an interrupted mirror" in checked.out
    assert live.name not in checked.out  # still being written, for all it knows
    # A stored file no channel links to any more (a killed publish's, a pruned nightly's).
    orphan = blobs.path_of("f" * 64)
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"x" * 1000)
    os.utime(orphan, (time.time() - 3600, time.time() - 3600))
    repaired = cli("--output", str(sandbox.output), "index", "repair")
    assert repaired.code == 0, repaired.err
    assert f"store: removed {stale.name}" in repaired.out
    assert "store: removed 1 stored files no channel holds (1000 B)" in repaired.out
    assert not stale.exists() and live.exists() and not orphan.exists()
    assert len(list(blobs.all())) == 1  # the app's, linked from the channel


def test_promotion_takes_the_mirrored_closure_along_as_links(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    root = sandbox.output / "index"
    tested, released = Channel(root, "test/cpu"), Channel(root, "cpu")
    publish(tested, built_app(sandbox))
    mirrored(resolved(sandbox, tested, built_app(sandbox), upstream.url, tmp_path), tested, tmp_path)
    publish(released, make_wheel(sandbox.root / "built", "leaf", "2.0+cpu", tag="py3-none-any"))  # built in the target
    done: list[str] = []
    promote_mirrored(
        tested, released, on_file=lambda published: done.append(f"{published.project} {published.outcome}")
    )
    assert sorted(done) == ["dep added", "leaf built here", "torch added"]
    torch = "torch-2.13.0+cpu-py3-none-any.whl"
    assert (released.files / torch).stat().st_ino == (tested.files / torch).stat().st_ino
    assert verify(released) == []
