"""Damaged packages in a real local conda channel, through the command as a user runs it: a
package overwritten in place stops ``conda index`` with the package named and the repodata as
it was, and one whose bytes changed after the channel was indexed is refused by ``conda
create`` with both digests (exit 7), from a local channel or one served over HTTP. Each
channel is a package or two: seconds. py-rattler runs in the command's process only."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_conda import LINUX, wheelmill
from tests.unit.test_bad_input import assert_one_line_error
from tests.wheels import make_wheel
from wheelmill.errors import ChannelError, IntegrityError

pytestmark = pytest.mark.integration
TINY = "noarch/tiny-1.0-0.conda"


def _overwrite_middle(path: Path, length: int = 64) -> None:
    """Other bytes in the middle of ``path``, its size kept (a bad block, a writer gone astray)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + length] = bytes(b ^ 0xFF for b in data[middle : middle + length])
    path.write_bytes(bytes(data))


def _files(root: Path) -> dict[str, bytes]:
    """Every file of a channel and its bytes, but the writers' lock file (it names its last holder)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"
    }


@pytest.mark.parametrize(("payload", "member"), [(0, "info"), (300_000, "pkg")], ids=["its-info", "its-files"])
def test_a_package_overwritten_in_place_stops_conda_index_naming_it(tmp_path: Path, payload: int, member: str) -> None:
    """A small package's middle is its info tarball (the indexer said "No index.json found",
    exit 19); a larger one's is its files (the indexer listed it with its new sha256)."""
    noise = b"".join(hashlib.sha256(n.to_bytes(4, "big")).digest() for n in range(payload // 32))  # no zstd shrinks it
    files = {"ops/__init__.py": b"LABEL = 'cpu'\n", "ops/data.bin": noise}
    wheel = make_wheel(tmp_path / "wheels", "ops", "0.1.0+cpu", tag=LINUX, files=files, stored=True)
    env = {"WHEELMILL_INDEX_ROOT": str(tmp_path / "index")}
    made = wheelmill("conda", "package", "--cell", "cpu-py311", wheel, output=tmp_path / "out", env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    channel = tmp_path / "index" / "conda" / "cpu"
    package = channel / "linux-64" / "ops-0.1.0-cpu_py311_0.conda"
    _overwrite_middle(package)
    before = _files(channel)
    done = wheelmill("conda", "index", output=tmp_path / "out", env=env)
    assert_one_line_error(
        done.stderr,
        code=done.returncode,
        expected_code=ChannelError.exit_code,
        expected=[f"{channel}: linux-64/ops-0.1.0-cpu_py311_0.conda is not a .conda archive", f"its member {member}-"],
    )
    assert "free space" not in done.stderr and "index.json" not in done.stderr
    assert _files(channel) == before, "every repodata.json byte for byte as it was, nothing left beside them"


def _tiny(out: Path, text: str) -> Path:
    """``tiny-1.0-0.conda``, noarch, no dependencies: a package a solve takes alone. Made by
    py-rattler-build in a process of its own, like every native call of these tests."""
    script = (
        "import sys; from pathlib import Path; from rattler_build import assemble_package; "
        "files = Path(sys.argv[1]) / 'files' / 'share'; files.mkdir(parents=True); "
        "(files / 'tiny.txt').write_text(sys.argv[2]); "
        "print(assemble_package(name='tiny', version='1.0', target_platform='noarch', build_string='0', "
        "output_dir=Path(sys.argv[1]), files_dir=files.parent, summary='tiny').path)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, out, text], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _locked_channel(tmp_path: Path, recipes_copy: Path) -> tuple[Path, Path, str]:
    """A local channel holding ``tiny``, indexed, and a lock of it made by ``conda lock``:
    (the channel, the lock, the locked sha256)."""
    channel = tmp_path / "index" / "conda" / "cpu"
    (channel / "noarch").mkdir(parents=True)
    _tiny(tmp_path / "made", "one\n").rename(channel / TINY)
    indexed = wheelmill(
        "conda", "index", output=tmp_path / "out", env={"WHEELMILL_INDEX_ROOT": str(tmp_path / "index")}
    )
    assert indexed.returncode == 0, indexed.stdout + indexed.stderr
    (recipes_copy / "conda" / "envs.toml").write_text('schema = 1\nspecs = ["tiny"]\n')
    lock = tmp_path / "tiny.lock"
    args = ("--recipes", recipes_copy, "conda", "lock", "--cell", "cpu-py311", "--out", lock, "--channel", channel)
    made = wheelmill(*args, output=tmp_path / "out")
    assert made.returncode == 0, made.stdout + made.stderr
    return channel, lock, hashlib.sha256((channel / TINY).read_bytes()).hexdigest()


def _create(prefix: Path, *args: str | Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return wheelmill("conda", "create", prefix, *args, "--pkgs-dir", tmp_path / "pkgs", output=tmp_path / "out")


def test_a_locked_package_changed_after_indexing_is_exit_7_with_both_digests(
    tmp_path: Path, recipes_copy: Path
) -> None:
    """rattler installs a local package unhashed: the bytes overwritten in its middle failed
    to unpack ("Data corruption detected", exit 8), and other whole bytes were installed."""
    channel, lock, locked = _locked_channel(tmp_path, recipes_copy)
    _overwrite_middle(channel / TINY)
    found = hashlib.sha256((channel / TINY).read_bytes()).hexdigest()
    from_lock = _create(tmp_path / "env", "--lock", lock, "--channel", channel, tmp_path=tmp_path)
    assert_one_line_error(
        from_lock.stderr,
        code=from_lock.returncode,
        expected_code=IntegrityError.exit_code,
        expected=[f"conda: {TINY} in", f"has sha256 {found}, {lock} locks {locked}", "publish its wheel again"],
    )
    from_specs = _create(tmp_path / "env", "tiny", "--channel", channel, tmp_path=tmp_path)
    assert_one_line_error(
        from_specs.stderr,
        code=from_specs.returncode,
        expected_code=IntegrityError.exit_code,
        expected=[f"conda: {TINY} in", f"has sha256 {found}, its channel's repodata lists {locked}"],
    )
    assert not (tmp_path / "env").exists(), "no env, not even a half-made one"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served over HTTP on 127.0.0.1, and its URL."""
    root = tmp_path / "served"
    root.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", root, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield root, f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_served_package_with_other_bytes_than_locked_is_exit_7_with_both_digests(
    tmp_path: Path, recipes_copy: Path, served: tuple[Path, str]
) -> None:
    """Over HTTP rattler hashes what it downloads: its mismatch is the integrity error too."""
    channel, lock, locked = _locked_channel(tmp_path, recipes_copy)
    root, url = served
    channel.rename(root / "cpu")
    other = _tiny(tmp_path / "other", "two: other bytes\n")
    other.replace(root / "cpu" / TINY)
    found = hashlib.sha256((root / "cpu" / TINY).read_bytes()).hexdigest()
    done = _create(tmp_path / "env", "--lock", lock, "--channel", f"{url}cpu/", tmp_path=tmp_path)
    assert_one_line_error(
        done.stderr,
        code=done.returncode,
        expected_code=IntegrityError.exit_code,
        expected=[f"conda: {url}cpu/{TINY} has sha256 {found}, {lock} locks {locked}"],
    )
    assert not (tmp_path / "env").exists()
