"""The index under faults, for real: a publisher SIGKILLed at every write, fsync, rename,
hard link and unlink it makes (strace's fault injection, one run per invocation), a full disk at every
point of a publish (a small tmpfs, filled a page at a time), and a read-only index. The
other syscalls that change the tree (unlinkat, symlink, mkdir, rmdir) and the other writers
(mirror, promote, prune, the conda channel's index) are test_fault_reach.py's.

The promise: whatever instant a publish dies at, no file of the tree is half written (a
reader sees each page and file whole, old or new), and the next publish, or
``wheelmill index repair``, leaves a valid index that lists everything published. An OS
error while writing is one line with its own exit code, and leaves the index as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.wheels import make_wheel
from wheelmill.errors import IndexWriteError
from wheelmill.index.pages import links
from wheelmill.index.store import Channel
from wheelmill.index.verify import verify
from wheelmill.wheel.wheelfile import read_wheel

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
ANY = "py3-none-any"
WATCHED = ("write", "fsync", "rename", "link", "linkat", "unlink")


def wheelmill(index_root: Path, *args: str, inject: tuple[str, int] | None = None) -> subprocess.CompletedProcess[str]:
    """wheelmill in its own process; with ``inject``, SIGKILLed at that syscall's n-th call."""
    env = _environment(index_root)
    argv = [sys.executable, "-m", "wheelmill", "--recipes", str(ROOT / "recipes"), *args]
    if inject is not None:
        syscall, n = inject
        argv = [
            "strace",
            "-f",
            "-qq",
            "-o",
            os.devnull,
            "-e",
            f"trace={syscall}",
            "-e",
            f"inject={syscall}:signal=KILL:when={n}",
            *argv,
        ]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=120)


def _environment(index_root: Path) -> dict[str, str]:
    """The index, and a temporary directory of its own beside it: a process killed at a write
    may be Python's own probe of its temporary directory (a file it writes and removes), which
    would otherwise stay in the machine's."""
    temporary = index_root.with_name(f"{index_root.name}-tmp")
    temporary.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "WHEELMILL_INDEX_ROOT": str(index_root),
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": str(temporary),
    }


def calls(index_root: Path, *args: str) -> Counter[str]:
    """How often a command makes each watched syscall, from a traced run of it."""
    trace = index_root.parent / "trace.txt"
    env = _environment(index_root)
    argv = [sys.executable, "-m", "wheelmill", "--recipes", str(ROOT / "recipes"), *args]
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={','.join(WATCHED)}", *argv],
        env=env,
        check=True,
        capture_output=True,
    )
    names = [line.split(None, 1)[1].split("(", 1)[0] for line in trace.read_text().splitlines() if "(" in line]
    return Counter(name for name in names if name in WATCHED)


def disagreeing(channel: Channel) -> list[str]:
    """The page pairs a reader could find saying different things: the project list's HTML
    and JSON, and each project's (read through ``simple``, as a server does)."""
    if not channel.simple.exists():
        return []
    problems = []
    root_json = json.loads((channel.simple / "index.json").read_text())
    listed = sorted(p["name"] for p in root_json["projects"])
    linked = sorted(str(a["href"]).rstrip("/") for a in links((channel.simple / "index.html").read_text()))
    if listed != linked:
        problems.append(f"project list: JSON {listed}, HTML {linked}")
    for name in listed:
        page = channel.simple / name
        if not (page / "index.json").is_file():
            problems.append(f"{name}: listed without a page")
            continue
        files = json.loads((page / "index.json").read_text())["files"]
        in_json = sorted((f["filename"], f.get("yanked") not in (None, False)) for f in files)
        anchors = links((page / "index.html").read_text())
        in_html = sorted((str(a["href"]).rsplit("/", 1)[-1].split("#")[0], "data-yanked" in a) for a in anchors)
        in_html = [(urllib.parse.unquote(name), yanked) for name, yanked in in_html]
        if in_json != in_html:
            problems.append(f"{name}: JSON {in_json}, HTML {in_html}")
    return problems


def whole(channel: Channel, wheel: Path) -> list[str]:
    """What a reader could find half written: every page parses, the wheel and its sidecar
    are absent or complete."""
    problems = []
    for page in channel.path.rglob("index.*"):
        text = page.read_text()
        if page.suffix == ".json":
            try:
                json.loads(text)
            except ValueError:
                problems.append(f"{page}: half written")
        elif not text.rstrip().endswith("</html>"):
            problems.append(f"{page}: half written")
    copied, sidecar = channel.files / wheel.name, channel.files / f"{wheel.name}.metadata"
    if copied.exists() and copied.read_bytes() != wheel.read_bytes():
        problems.append(f"{copied}: half written")
    if sidecar.exists() and sidecar.read_bytes() != read_wheel(wheel).metadata:
        problems.append(f"{sidecar}: half written")
    return problems


@pytest.fixture
def baseline(tmp_path: Path) -> Path:
    """An index with one project, and the wheel of a second one to publish into it."""
    index = tmp_path / "baseline"
    first = make_wheel(tmp_path / "wheels", "wm-first", "1.0", tag=ANY, files={"wm_first/__init__.py": b"A = 1\n"})
    assert wheelmill(index, "publish", "--channel", "cpu", str(first)).returncode == 0
    return index


def test_a_publisher_killed_at_every_write_leaves_nothing_half_written_and_the_next_writer_mends(
    baseline: Path, tmp_path: Path
) -> None:
    wheel = make_wheel(
        tmp_path / "wheels", "wm-second", "1.0", tag=ANY, files={"wm_second/__init__.py": b"B = 2\n" * 500}
    )
    counted = calls(_copy(baseline, tmp_path / "counting"), "publish", "--channel", "cpu", str(wheel))
    assert counted["rename"] >= 6 and counted["write"] >= 6, counted  # sidecar, wheel, pending, 4 pages
    runs = 0
    for syscall, total in sorted(counted.items()):
        for n in range(1, total + 1):
            index = _copy(baseline, tmp_path / f"{syscall}-{n}")
            killed = wheelmill(index, "publish", "--channel", "cpu", str(wheel), inject=(syscall, n))
            assert killed.returncode in (-9, 137), (syscall, n, killed.returncode, killed.stderr[-500:])
            channel = Channel(index, "cpu")
            assert whole(channel, wheel) == [], (syscall, n)
            assert disagreeing(channel) == [], (syscall, n)
            mended = _copy(index, tmp_path / f"{syscall}-{n}-repaired")
            # The next writer, of anything, finishes what was left; then the wheel again.
            other = make_wheel(tmp_path / "others", f"wm-other-{syscall}-{n}", "1.0", tag=ANY)
            assert wheelmill(index, "publish", "--channel", "cpu", str(other)).returncode == 0
            assert wheelmill(index, "publish", "--channel", "cpu", str(wheel)).returncode == 0
            assert verify(channel) == [], (syscall, n)
            assert {"wm-first", "wm-second"} <= set(channel.project_names())
            # Or `index repair`: valid, and the wheel listed or reported for republishing.
            repaired = wheelmill(mended, "index", "repair", "--channel", "cpu")
            assert repaired.returncode == 0, (syscall, n, repaired.stdout + repaired.stderr)
            assert verify(Channel(mended, "cpu")) == [], (syscall, n)
            project = Channel(mended, "cpu").project("wm-second")
            listed = project is not None and any(f.filename == wheel.name for f in project.files)
            assert (
                listed
                or f"{wheel.name} is not listed" in repaired.stdout
                or not (mended / "cpu" / "files" / wheel.name).exists()
            )
            runs += 1
    print(f"\n{runs} kills: {dict(counted)}; 0 states with pages that disagree")


YANK = ("yank", "--channel", "cpu", "--reason", "broken kernels", "wm-first", "1.0")


def test_a_yank_killed_at_every_write_leaves_every_page_pair_agreeing(baseline: Path, tmp_path: Path) -> None:
    """A yank changes a project's JSON and HTML pages: killed at any of its writes, renames,
    links or unlinks, a reader finds both old (not yanked) or both new (yanked), never one
    of each."""
    counted = calls(_copy(baseline, tmp_path / "counting"), *YANK)
    runs = 0
    for syscall, total in sorted(counted.items()):
        for n in range(1, total + 1):
            index = _copy(baseline, tmp_path / f"yank-{syscall}-{n}")
            killed = wheelmill(index, *YANK, inject=(syscall, n))
            assert killed.returncode in (-9, 137), (syscall, n, killed.returncode, killed.stderr[-500:])
            channel = Channel(index, "cpu")
            assert disagreeing(channel) == [], (syscall, n)
            assert wheelmill(index, *YANK).returncode == 0
            assert verify(channel) == [] and disagreeing(channel) == [], (syscall, n)
            (entry,) = channel.project("wm-first").files  # type: ignore[union-attr]
            assert entry.yanked is not None, (syscall, n)
            assert len(list((index / "cpu").glob(".simple-*"))) == 1, "the next writer leaves one generation"
            runs += 1
    print(f"\n{runs} kills of a yank: {dict(counted)}; 0 states with pages that disagree")


def _copy(index: Path, to: Path) -> Path:
    shutil.copytree(index, to, symlinks=True)
    return to


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB file system of its own (mount needs root, as CI and scripts/setup have)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_at_every_point_of_a_publish_is_one_line_and_leaves_the_index_as_it_was(
    tmpfs: Path, tmp_path: Path
) -> None:
    index = tmpfs / "index"
    first = make_wheel(tmp_path / "wheels", "wm-first", "1.0", tag=ANY)
    assert wheelmill(index, "publish", "--channel", "cpu", str(first)).returncode == 0
    before = {p: p.read_bytes() for p in index.rglob("*") if p.is_file() and ".lock" not in p.name}
    directories = {p for p in index.rglob("*") if p.is_dir()}
    # An incompressible payload of 64 KiB, published while the free space shrinks by a page.
    wheel = make_wheel(
        tmp_path / "wheels", "wm-big", "1.0", tag=ANY, files={"wm_big/blob.bin": os.urandom(64 * 1024)}, stored=True
    )
    outcomes: Counter[str] = Counter()
    filler = tmpfs / "filler"
    free = shutil.disk_usage(tmpfs).free
    for size in range(free, 0, -4096):
        filler.write_bytes(b"\0" * size)
        result = wheelmill(index, "publish", "--channel", "cpu", str(wheel))
        filler.unlink()
        channel = Channel(index, "cpu")
        assert verify(channel) == [], size
        if result.returncode == 0:
            outcomes["published"] += 1
            break
        assert result.returncode == IndexWriteError.exit_code, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert "No space left on device" in line and "the channel is as it was" in line, line
        assert {p: p.read_bytes() for p in index.rglob("*") if p.is_file() and ".lock" not in p.name} == before
        assert {p for p in index.rglob("*") if p.is_dir()} == directories, "no directory of a refused publish left"
        outcomes["refused"] += 1
    assert outcomes["refused"] >= 10 and outcomes["published"] == 1, outcomes
    print(
        f"\n{outcomes['refused']} publishes refused for lack of space, each leaving the index as it was; then published"
    )


def test_a_read_only_index_is_one_line(tmpfs: Path, tmp_path: Path) -> None:
    index = tmpfs / "index"
    first = make_wheel(tmp_path / "wheels", "wm-first", "1.0", tag=ANY)
    assert wheelmill(index, "publish", "--channel", "cpu", str(first)).returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    second = make_wheel(tmp_path / "wheels", "wm-second", "1.0", tag=ANY)
    for args in (
        ["publish", "--channel", "cpu", str(second)],
        [*YANK, "--reason", "x"],
    ):
        result = wheelmill(index, *args)
        assert result.returncode == IndexWriteError.exit_code, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert "Read-only file system" in line and "fix:" in line, line
    assert verify(Channel(index, "cpu")) == []
