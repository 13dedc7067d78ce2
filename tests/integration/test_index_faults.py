"""The index under faults, for real: a publisher SIGKILLed at its writes, fsyncs, renames,
hard links and unlinks (strace's fault injection, one run per kill; past twenty points, the
first and the last of each syscall and a sample of the rest drawn by the day's seed:
tests/faults.py), a full disk at every point of a publish (a small tmpfs, filled a page at a
time), and a read-only index. The
other syscalls that change the tree (unlinkat, symlink, mkdir, rmdir) and the other writers
(mirror, promote, prune, the conda channel's index) are test_fault_reach.py's.

The promise (the one channel code's, on a tree as on a bucket: docs/design/storage.md):
whatever instant a publish dies at, no file of the tree is half written (a reader sees each
page and file whole, old or new), no page lists a file that is not there (a page's JSON and
HTML may be a render apart), and the next publish, or ``wheelmill index render``, leaves a
valid index that lists everything published. An OS error while writing is one line with its
own exit code, and leaves no page listing a file that is not there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from tests.channels import tree_channel
from tests.faults import SEED, channel_problems, fault_seed, points
from tests.wheels import make_wheel
from wheelmill.cli import main
from wheelmill.errors import IndexWriteError
from wheelmill.index.objects import blob_key
from wheelmill.index.roots import problems as verify
from wheelmill.machine.net import sha256_of
from wheelmill.wheel.wheelfile import read_wheel

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
ANY = "py3-none-any"
WATCHED = ("write", "fsync", "rename", "link", "linkat", "unlink")
BUDGET = 20  # kills per command at most: the ends of each syscall, the rest drawn by the day (tests/faults.py)


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


def mend(index_root: Path, *args: str) -> int:
    """wheelmill in this process, its exit code: for the commands after a kill, which need no
    process of their own to die in (each process's start costs some 0.4 s of imports, and a
    test here runs hundreds of them)."""
    with mock.patch.dict(os.environ, {"WHEELMILL_INDEX_ROOT": str(index_root)}):
        return main(["--recipes", str(ROOT / "recipes"), *args])


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


def whole(index: Path, wheel: Path) -> list[str]:
    """What a reader could find half written: every page parses, the wheel's bytes and its
    sidecar are absent or complete."""
    problems = []
    for page in (index / "cpu").rglob("index.*"):
        text = page.read_text()
        if page.suffix == ".json":
            try:
                json.loads(text)
            except ValueError:
                problems.append(f"{page}: half written")
        elif not text.rstrip().endswith("</html>"):
            problems.append(f"{page}: half written")
    copied = index / blob_key(sha256_of(wheel), wheel.name)
    sidecar = copied.with_name(f"{wheel.name}.metadata")
    if copied.exists() and copied.read_bytes() != wheel.read_bytes():
        problems.append(f"{copied}: half written")
    if sidecar.exists() and sidecar.read_bytes() != read_wheel(wheel).metadata:
        problems.append(f"{sidecar}: half written")
    return problems


def listed(index: Path, wheel: Path) -> bool:
    project = tree_channel(index, "cpu").project(wheel.name.split("-")[0].replace("_", "-"))
    return project is not None and any(f.filename == wheel.name for f in project.files)


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
    # wheel, sidecar, entry and the new project's two pages linked in; the project list swapped
    assert counted["link"] >= 5 and counted["rename"] >= 2, counted
    seed = fault_seed()
    chosen = points(counted, BUDGET, seed)
    for syscall, n in chosen:
        at = (syscall, n, f"{SEED}={seed}")
        index = _copy(baseline, tmp_path / f"{syscall}-{n}")
        killed = wheelmill(index, "publish", "--channel", "cpu", str(wheel), inject=(syscall, n))
        assert killed.returncode in (-9, 137), (*at, killed.returncode, killed.stderr[-500:])
        assert whole(index, wheel) == [], at
        assert channel_problems(index / "cpu", pairs=False) == [], at
        mended = _copy(index, tmp_path / f"{syscall}-{n}-rendered")
        # The next writer, of anything, renders its own project's pages; then the wheel again.
        other = make_wheel(tmp_path / "others", f"wm-other-{syscall}-{n}", "1.0", tag=ANY)
        assert mend(index, "publish", "--channel", "cpu", str(other)) == 0
        assert mend(index, "publish", "--channel", "cpu", str(wheel)) == 0
        channel = tree_channel(index, "cpu")
        assert verify(channel) == [], at
        assert {"wm-first", "wm-second"} <= set(channel.project_names()) and listed(index, wheel)
        # Or `index render`: valid, listing the wheel where its entry was made; the job's
        # retry (the same publish) lists it in any case.
        assert mend(mended, "index", "render", "--channel", "cpu") == 0, at
        assert verify(tree_channel(mended, "cpu")) == [], at
        assert mend(mended, "publish", "--channel", "cpu", str(wheel)) == 0
        assert verify(tree_channel(mended, "cpu")) == [] and listed(mended, wheel), at
    print(
        f"\n{len(chosen)} kills of {sum(counted.values())} points ({SEED}={seed}): {dict(counted)}; "
        "0 states with a page listing a file that is not there"
    )


YANK = ("yank", "--channel", "cpu", "--reason", "broken kernels", "wm-first", "1.0")


def test_a_yank_killed_at_every_write_leaves_pages_that_list_what_is_there(baseline: Path, tmp_path: Path) -> None:
    """A yank changes a project's JSON and HTML pages: killed at any of its writes, renames,
    links or unlinks, a reader finds every page whole and listing only files that are there
    (the pair may be a render apart, yanked in one and not yet in the other); the yank run
    again leaves both saying yanked."""
    counted = calls(_copy(baseline, tmp_path / "counting"), *YANK)
    seed = fault_seed()
    chosen = points(counted, BUDGET, seed)
    for syscall, n in chosen:
        at = (syscall, n, f"{SEED}={seed}")
        index = _copy(baseline, tmp_path / f"yank-{syscall}-{n}")
        killed = wheelmill(index, *YANK, inject=(syscall, n))
        assert killed.returncode in (-9, 137), (*at, killed.returncode, killed.stderr[-500:])
        assert channel_problems(index / "cpu", pairs=False) == [], at
        assert mend(index, *YANK) == 0
        channel = tree_channel(index, "cpu")
        assert verify(channel) == [] and channel_problems(index / "cpu") == [], at
        (entry,) = channel.project("wm-first").files  # type: ignore[union-attr]
        assert entry.yanked is not None, at
    print(
        f"\n{len(chosen)} kills of a yank, of {sum(counted.values())} points ({SEED}={seed}): {dict(counted)}; "
        "0 states with a page listing a file that is not there"
    )


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


def test_a_full_disk_at_every_point_of_a_publish_is_one_line_and_leaves_no_page_listing_a_missing_file(
    tmpfs: Path, tmp_path: Path
) -> None:
    index = tmpfs / "index"
    first = make_wheel(tmp_path / "wheels", "wm-first", "1.0", tag=ANY)
    assert wheelmill(index, "publish", "--channel", "cpu", str(first)).returncode == 0
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
        assert channel_problems(index / "cpu", pairs=False) == [], size
        assert whole(index, wheel) == [], size
        if result.returncode == 0:
            outcomes["published"] += 1
            break
        assert result.returncode == IndexWriteError.exit_code, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert "No space left on device" in line and "fix:" in line, line
        outcomes["refused"] += 1
    assert outcomes["refused"] >= 10 and outcomes["published"] == 1, outcomes
    channel = tree_channel(index, "cpu")
    assert verify(channel) == [] and listed(index, wheel)
    print(
        f"\n{outcomes['refused']} publishes refused for lack of space, each leaving no page that lists a missing "
        "file; then published"
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
    assert verify(tree_channel(index, "cpu")) == []
