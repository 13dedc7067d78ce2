"""The runtime closure and mirroring, against a local upstream index (offline, real uv):
the closure locks torch and every dependency as wheels with sha256; mirroring publishes
them as mirrored files that verify and install on their own; a file whose bytes differ
from the lock is exit 7 and an upstream that drops the connection exit 6, both leaving the
channel as it was; built beats mirrored both ways; two channels share one stored copy; what a
killed mirror leaves in the download area is noted by verify and removed by sweep."""

from __future__ import annotations

import base64
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

from tests.channels import pages_dir, stored_file, tree_channel
from tests.conftest import CliRunner
from tests.reports import write_report as report_of
from tests.sandbox import PYTHON, TORCH, Sandbox
from tests.wheels import make_wheel
from wheelmill.errors import EnvError, SignatureError, SubjectMismatch
from wheelmill.index.channels import PublishOutcome
from wheelmill.index.closure import Closure, ClosureInputs, Mirrored, mirror, read, resolve
from wheelmill.index.downloads import Downloads
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.objects import publish as publish_object
from wheelmill.index.roots import Index, problems, provenance_of, publish, usage
from wheelmill.index.storage import TreeStorage
from wheelmill.machine import envs
from wheelmill.machine.net import sha256_of
from wheelmill.machine.package_sources import PackageSources
from wheelmill.machine.process import HostRunner, StepLog
from wheelmill.machine.tools import uv_bin
from wheelmill.output.layout import CLOSURE_LOCK_NAME, CellLayout
from wheelmill.provenance.mirroring import MirrorSigner, mirror_signer
from wheelmill.provenance.signing import new_signing_key, trusted_keys_of
from wheelmill.provenance.verification import Claims, Verdict, verify_file
from wheelmill.releases.attested import local_source, verify_channel
from wheelmill.releases.promotion import promote_mirrored
from wheelmill.retry import RetryPolicy
from wheelmill.settings import Settings

FAST = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01)


class Upstream:
    """A package index on this machine's disk: a stand-in torch of the cpu cell's version
    (as the sandbox's) plus a dependency chain, in a tree of its own that the one channel
    code writes, so that what it serves does not hang on how the sandbox writes its index."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.root = sandbox.root / "upstream-index"
        self.channel = tree_channel(self.root, "upstream")
        wheels = sandbox.root / "upstream-wheels"
        version, label, cuda, hip = TORCH["cpu"]
        version_py = f"__version__ = '{version}+{label}'\ncuda = {cuda!r}\nhip = {hip!r}\n".encode()
        torch = {"torch/__init__.py": b"", "torch/version.py": version_py}
        publish(self.channel, make_wheel(wheels, "torch", f"{version}+{label}", files=torch, tag="py3-none-any"))
        publish(self.channel, make_wheel(wheels, "dep", "1.0", requires=["leaf>=2"], tag="py3-none-any"))
        publish(self.channel, make_wheel(wheels, "leaf", "2.0", tag="py3-none-any"))
        self.url = pages_dir(self.channel).as_uri() + "/"

    def file(self, filename: str) -> Path:
        """Where upstream keeps the file: the path of the URL its page links, as the lock records it."""
        return stored_file(self.channel, filename)


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


def inputs(sandbox: Sandbox, channel: ObjectChannel, wheel: Path, sources: str) -> ClosureInputs:
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


def resolved(sandbox: Sandbox, channel: ObjectChannel, wheel: Path, sources: str, tmp_path: Path) -> Closure:
    with StepLog(tmp_path / "closure.log") as log:
        return resolve(
            inputs(sandbox, channel, wheel, sources),
            backend=envs.backend("uv", HostRunner()),
            log=log,
            work=tmp_path / "work",
            lock=tmp_path / CLOSURE_LOCK_NAME,
        )


def index_root(channel: ObjectChannel) -> Path:
    return Path(channel.storage.location)


def mirrored(
    closure: Closure, channel: ObjectChannel, tmp_path: Path, *, signer: MirrorSigner | None = None
) -> Mirrored:
    # A tree index keeps the downloads in the tree itself: what it publishes is another name of them.
    with StepLog(tmp_path / "mirror.log") as log:
        return mirror(
            closure,
            channel,
            downloads=Index(tree=index_root(channel)).downloads(tmp_path),
            sources=PackageSources(index_url=None),
            policy=FAST,
            log=log,
            on_line=lambda _line: None,
            signer=signer,
        )


def objects_of(root: Path) -> dict[str, bytes]:
    """Every object of an index tree and its bytes: every channel's entries and pages, and the
    blobs; not the download area or the tree's own work (dot directories, no objects)."""
    storage = TreeStorage(root)
    return {key: storage.path(key).read_bytes() for key in storage.keys_under()}


def test_the_closure_locks_torch_and_every_dependency_as_hashed_wheels(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    channel = tree_channel(sandbox.output / "index", "cpu")
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
    channel = tree_channel(sandbox.output / "index", "cpu")
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
    channel = tree_channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    done = mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    assert sorted((p.project, p.outcome) for p in done.published) == [
        ("dep", PublishOutcome.ADDED),
        ("leaf", PublishOutcome.ADDED),
        ("torch", PublishOutcome.ADDED),
    ]
    assert problems(channel) == []
    page = json.loads((pages_dir(channel) / "dep" / "index.json").read_text())
    assert page["files"][0]["_mirrored-from"] == upstream.file("dep-1.0-py3-none-any.whl").as_uri()
    assert "_mirrored-from" not in json.loads((pages_dir(channel) / "app" / "index.json").read_text())["files"][0]
    leaf = stored_file(channel, "leaf-2.0-py3-none-any.whl")
    assert leaf.with_name(f"{leaf.name}.metadata").is_file()  # PEP 658, like a built wheel
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
        pages_dir(channel).resolve().as_uri(),
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
    channel = tree_channel(sandbox.output / "index", "cpu")
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
    root: Path,
    before: dict[str, bytes],
) -> str:
    """`wheelmill mirror` from the command line, refused: the exit code, one line that says
    the channel is unchanged, and the index (its channels and blobs) byte for byte as it was;
    that line."""
    for key, value in {**sandbox.environ(), "WHEELMILL_RETRIES": str(retries), "WHEELMILL_RETRY_DELAY": "0.01"}.items():
        monkeypatch.setenv(key, value)
    result = cli("--recipes", str(sandbox.recipes), "mirror", "--cell", sandbox.cell("cpu"))
    assert result.code == code, result.out + result.err
    (line,) = result.err.splitlines()
    assert "the channel is unchanged" in line
    assert objects_of(root) == before  # verified downloads may stay in the download area, named by content
    assert not list(root.rglob("*.part"))
    return line


def test_a_file_whose_bytes_differ_from_the_lock_is_exit_7_and_the_channel_is_unchanged(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, upstream: Upstream
) -> None:
    """From the command line: upstream's page still says one sha256, its file now has other
    bytes (a tampered or corrupted mirror); the download is refused, never retried."""
    channel = tree_channel(sandbox.output / "index", "cpu")
    app = built_app(sandbox)
    publish(channel, app)
    write_report(sandbox, app, upstream.url)
    before = objects_of(index_root(channel))
    leaf = upstream.file("leaf-2.0-py3-none-any.whl")
    leaf.unlink()  # its name now holds other bytes, a file of their own
    make_wheel(
        sandbox.root / "tampered", "leaf", "2.0", tag="py3-none-any", files={"leaf/evil.py": b"import os\n"}
    ).rename(leaf)
    line = refused_mirror(cli, monkeypatch, sandbox, retries=3, code=7, root=index_root(channel), before=before)
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
        return _DropsWheels(*args, directory=str(upstream.root))  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{upstream.channel.name}/simple/"
    server.shutdown()
    server.server_close()


def test_an_upstream_that_drops_every_download_is_exit_6_after_the_retries(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, dropping: str, tmp_path: Path
) -> None:
    """From the command line, as a user runs it after a build: one line naming the file's
    URL, the retries spent, and the channel as it was."""
    channel = tree_channel(sandbox.output / "index", "cpu")
    app = built_app(sandbox)
    publish(channel, app)
    write_report(sandbox, app, dropping)
    before = objects_of(index_root(channel))
    line = refused_mirror(cli, monkeypatch, sandbox, retries=2, code=6, root=index_root(channel), before=before)
    assert (
        line.startswith("wheelmill: error: mirror: http://127.0.0.1:")
        and ".whl is unreachable after 2 attempts" in line
    ), line
    assert (
        sandbox.output / sandbox.cell("cpu") / CLOSURE_LOCK_NAME
    ).is_file()  # the lock was written before the downloads


def test_built_beats_mirrored_both_ways(sandbox: Sandbox, upstream: Upstream, tmp_path: Path) -> None:
    # A project built in the channel before the closure is resolved is resolved from there and never mirrored.
    channel = tree_channel(sandbox.output / "index", "cpu")
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
    assert "dep-1.0-py3-none-any.whl" not in channel.listing("dep"), "its entry is gone, not only unlisted"
    assert problems(channel) == []
    # And a mirrored file offered for a built project is not added.
    again = publish(
        channel, upstream.file("dep-1.0-py3-none-any.whl"), mirrored_from="file:///upstream/dep-1.0-py3-none-any.whl"
    )
    assert again.outcome is PublishOutcome.BUILT_HERE


def test_a_wheel_on_local_disk_is_stored_as_another_name_of_its_file(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    """A file:// source (a mirror on this machine's disk): its bytes checked, then linked
    into the download area, not copied a second time; its mode left as it was."""
    channel = tree_channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    leaf = upstream.file("leaf-2.0-py3-none-any.whl")
    leaf.chmod(0o444)
    mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    download = Downloads(index_root(channel)).path_of(sha256_of(leaf))
    assert download.stat().st_ino == leaf.stat().st_ino == stored_file(channel, leaf.name).stat().st_ino
    assert leaf.stat().st_mode & 0o777 == 0o444
    assert "stored from" in (tmp_path / "mirror.log").read_text()


def test_two_channels_holding_the_same_dependency_store_it_once(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    root = sandbox.output / "index"
    first, second = tree_channel(root, "cpu"), tree_channel(root, "test/cpu")
    for channel in (first, second):
        publish(channel, built_app(sandbox))
        mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    torch = "torch-2.13.0+cpu-py3-none-any.whl"
    assert stored_file(first, torch) == stored_file(second, torch), "both entries name the one blob"
    download = Downloads(root).path_of(sha256_of(stored_file(first, torch)))
    assert stored_file(first, torch).stat().st_ino == download.stat().st_ino
    # Two names in the index, the blob and the download (a local source's file may be one more outside).
    assert len([p for p in root.rglob("*") if p.is_file() and p.stat().st_ino == download.stat().st_ino]) == 2
    used = usage(Index(tree=root))
    assert used.listed_files == 8
    assert used.stored_files == 4  # app, dep, leaf, torch: once each
    assert used.stored_bytes * 2 == used.listed_bytes


def test_verify_checks_mirrored_files_like_built_ones(sandbox: Sandbox, upstream: Upstream, tmp_path: Path) -> None:
    channel = tree_channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    target = stored_file(channel, "leaf-2.0-py3-none-any.whl")
    damaged = target.read_bytes()[:-1] + b"X"
    target.unlink()  # a file of its own: the download and upstream's file are other names of the bytes
    target.write_bytes(damaged)
    assert problems(channel) == [f"{channel.name}/leaf-2.0-py3-none-any.whl: sha256 differs from the page"]


def test_a_signed_mirroring_holds_each_mirrored_file_to_its_locked_sha256_not_to_its_page(
    cli: CliRunner, sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    """Mirrored with a signing key, each file carries a signed statement of the sha256 its
    closure lock pinned: `verify --mirrored` passes them; a forger who lists other bytes under
    the name with a page that agrees (and the real statement beside them) is caught; a file
    mirrored without a key is named as vouched for by its page alone."""
    key = new_signing_key("ed25519")
    settings = Settings(signing_key=key.private_pem().decode())
    channel = tree_channel(sandbox.output / "index", "cpu")
    publish(channel, built_app(sandbox))
    closure = resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path)
    mirrored(closure, channel, tmp_path, signer=mirror_signer(settings, channel=channel.name))
    trusted = trusted_keys_of(settings)

    def verdicts(of: ObjectChannel) -> dict[str, Verdict]:
        found = verify_channel(local_source(of), trusted=trusted, mirrored=True, on_verdict=lambda _v: None)
        return {v.filename: v for v in found}

    genuine = verdicts(channel)
    mirrored_files = {f"{w.filename}" for w in closure.to_mirror}
    assert mirrored_files <= set(genuine) and all(genuine[name].ok for name in mirrored_files), genuine
    assert {genuine[name].checked for name in mirrored_files} == {"sha256 against its signed mirroring, signature"}
    leaf = "leaf-2.0-py3-none-any.whl"
    (project,) = [p for p in channel.projects() if p.name == "leaf"]
    statement = provenance_of(channel, project.files[0])
    assert statement is not None and b"urn:wheelmill:mirror:v1" in base64.b64decode(json.loads(statement)["payload"])
    # Other bytes under the name, a page that lists them, the genuine statement beside them.
    forged = tree_channel(tmp_path / "forged-index", "cpu")
    other = make_wheel(tmp_path / "forger", "leaf", "2.0", files={"leaf/evil.py": b"x = 1\n"}, tag="py3-none-any")
    assert other.name == leaf
    publish_object(forged, other, mirrored_from=upstream.file(leaf).as_uri(), provenance=statement)
    assert problems(forged) == [], "the page agrees with the bytes: index verify finds nothing"
    caught = verdicts(forged)[leaf]
    assert not caught.ok and caught.failures[0].code == SubjectMismatch.exit_code
    assert f"its provenance is for {leaf} (sha256 {sha256_of(upstream.file(leaf))[:16]}...)" in caught.failures[0].line
    # One file at the door of `wheelmill verify FILE`: held to its mirroring, not taken for a build.
    public = tmp_path / "team.pub"
    public.write_bytes(key.public_pem())
    beside = tmp_path / "statement.intoto.jsonl"
    beside.write_bytes(statement)
    genuine_file = cli("verify", str(upstream.file(leaf)), "--provenance", str(beside), "--key", str(public))
    assert genuine_file.code == 0, genuine_file.err
    forged_file = cli("verify", str(other), "--provenance", str(beside), "--key", str(public))
    # A door that expects a build (fleet reuse, publish) does not take a mirroring for one.
    as_built = verify_file(upstream.file(leaf), Claims(filename=leaf, provenance=statement), trusted=trusted)
    assert not as_built.ok and "not a build's" in as_built.failures[0].line
    assert forged_file.code == SubjectMismatch.exit_code and f"its provenance is for {leaf}" in forged_file.err
    # Mirrored with no key: its page alone vouches for it, and verify says so.
    unsigned = tree_channel(tmp_path / "unsigned-index", "cpu")
    publish(unsigned, built_app(sandbox))
    mirrored(resolved(sandbox, unsigned, built_app(sandbox), upstream.url, tmp_path / "u"), unsigned, tmp_path / "u")
    bare = verdicts(unsigned)[leaf]
    assert not bare.ok and bare.failures[0].code == SignatureError.exit_code
    assert "mirrored with no signed statement of its upstream sha256" in bare.failures[0].line
    # Mirrored again with the key, the listed file learns its statement.
    mirrored(
        resolved(sandbox, unsigned, built_app(sandbox), upstream.url, tmp_path / "u"),
        unsigned,
        tmp_path / "u",
        signer=mirror_signer(settings, channel=unsigned.name),
    )
    assert verdicts(unsigned)[leaf].ok


def test_a_killed_mirrors_download_is_noted_by_verify_and_removed_by_sweep(
    cli: CliRunner, sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    root = sandbox.output / "index"
    channel = tree_channel(root, "cpu")
    publish(channel, built_app(sandbox))
    mirrored(resolved(sandbox, channel, built_app(sandbox), upstream.url, tmp_path), channel, tmp_path)
    downloads = Downloads(root)
    kept = sorted(downloads.all())  # the mirrored downloads, each another name of a blob the channel lists
    assert len(kept) == 3
    stale = downloads.incoming / ".wm-tmp-torch-2.13.0.whl.x1.part"
    live = downloads.incoming / ".wm-tmp-nvidia_cublas.whl.x2.part"
    for path in (stale, live):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a download")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    checked = cli("--output", str(sandbox.output), "index", "verify")
    assert checked.code == 0, checked.err
    assert f"note: downloads: {stale.name}, left by an interrupted mirror (`wheelmill index sweep` removes it)" in (
        checked.out
    )
    assert live.name not in checked.out  # still being written, for all it knows
    # A download that no blob of the index is another name of (its file removed everywhere, then swept).
    orphan = downloads.path_of("f" * 64)
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"x" * 1000)
    os.utime(orphan, (time.time() - 3600, time.time() - 3600))
    swept = cli("--output", str(sandbox.output), "index", "sweep")
    assert swept.code == 0, swept.err
    assert "downloads: removed 2 files no channel holds or a mirror left (1015 B)" in swept.out
    assert not stale.exists() and live.exists() and not orphan.exists()
    assert sorted(downloads.all()) == kept, "a download the channel's blob is another name of stays"
    assert problems(channel) == []


def test_promotion_takes_the_mirrored_closure_along_as_links(
    sandbox: Sandbox, upstream: Upstream, tmp_path: Path
) -> None:
    root = sandbox.output / "index"
    tested, released = tree_channel(root, "test/cpu"), tree_channel(root, "cpu")
    publish(tested, built_app(sandbox))
    mirrored(resolved(sandbox, tested, built_app(sandbox), upstream.url, tmp_path), tested, tmp_path)
    publish(released, make_wheel(sandbox.root / "built", "leaf", "2.0+cpu", tag="py3-none-any"))  # built in the target
    done: list[str] = []
    promote_mirrored(
        tested, released, on_file=lambda published: done.append(f"{published.project} {published.outcome}")
    )
    assert sorted(done) == ["dep added", "leaf built here", "torch added"]
    torch = "torch-2.13.0+cpu-py3-none-any.whl"
    assert stored_file(released, torch) == stored_file(tested, torch), "its entry names the tested one's blob"
    assert len(list((root / "blobs").rglob(torch))) == 1, "no second copy of the bytes"
    assert problems(released) == []
