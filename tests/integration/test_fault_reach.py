"""Every writer of the index killed at the syscalls that change the tree: writes, fsyncs,
renames, hard and symbolic links, unlinks (``unlinkat`` too: removing an old generation of
pages), and the making and removing of directories (``tests.faults``: each point, or past
twenty, the first and the last of each syscall and a sample drawn by the day's seed), for
publish, mirror, yank, promote, prune, a migration from an earlier wheelmill's tree and the
conda channel's index.

After each kill a reader finds every page whole, and every file a page lists (a wheel, its
PEP 658 sidecar; a conda package in repodata.json) there with the page's sha256 (a page's
HTML and JSON may be a render apart: docs/design/storage.md); the same command run again
succeeds, leaves each pair agreeing and the channel valid, and lists everything. Each test
prints ``<command>: <N> injection points (<per syscall>); <K> of them sampled (<seed>), 0
inconsistent states`` (``-s`` shows them).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.channels import tree_channel
from tests.faults import (
    KILLED,
    Command,
    conda_problems,
    conda_unlisted,
    driver,
    fault_seed,
    index_problems,
    kill_everywhere,
    summary,
    wheelmill,
)
from tests.wheels import make_wheel
from wheelmill.index import channels
from wheelmill.index.objects import COMMITS
from wheelmill.index.roots import Index, problems, publish
from wheelmill.index.storage import TreeStorage
from wheelmill.inputs.versions import Track, VersionRule
from wheelmill.machine.net import sha256_of
from wheelmill.releases.records import Manifest, ReleasedFile, find_manifest, manifests, record

pytestmark = pytest.mark.integration
ANY = "py3-none-any"
HEAD = "a" * 40
LEGACY = Path(__file__).resolve().parent.parent / "data" / "legacy-index.tar.gz"
# Kills per command at most, drawn afresh each day (tests/faults.py): each run stays within
# minutes on two cores, and the days' runs together reach every point.
BUDGET = 20


def healed(index: Path) -> list[str]:
    """After the command ran again: every channel valid, each page pair agreeing."""
    found = index_problems(index)
    for name in Index(tree=index).channel_names():
        found += problems(tree_channel(index, name))
    return found


def read_back(index: Path) -> list[str]:
    """What a reader finds right after a kill: every page whole, listing only files that are
    there (a pair may be a render apart)."""
    return index_problems(index, pairs=False)


def killing(
    baseline: Path,
    where: Path,
    command: Callable[[Path], Command],
    *,
    check: Callable[[Path], list[str]] = read_back,
    done: Callable[[Path], list[str]],
    threaded: bool = False,
) -> Callable[[str, int], tuple[bool, list[str]]]:
    """One kill: a copy of ``baseline`` written by ``command``, killed at the point; what a
    reader finds (``check``); the command again, and what it must have done (``done``).
    Whether the kill came, and what went wrong. strace counts a syscall's calls per thread:
    a ``threaded`` command's run may finish before any thread makes its n-th call."""

    def attempt(syscall: str, n: int) -> tuple[bool, list[str]]:
        index = where / f"{syscall.replace('/', '_')}-{n}" / "index"
        shutil.copytree(baseline, index, symlinks=True)
        killed = command(index).run(inject=(syscall, n))
        reached = killed.returncode in KILLED
        finished = threaded and killed.returncode == 0
        problems = [] if reached or finished else [f"not killed: exit {killed.returncode} {killed.stderr[-300:]}"]
        problems += check(index)
        again = command(index).run()
        if again.returncode != 0:
            problems.append(f"run again: exit {again.returncode}: {(again.stdout + again.stderr)[-500:]}")
        else:
            problems += done(index)
        shutil.rmtree(index.parent, ignore_errors=True)
        return reached, [f"{syscall} #{n}: {p}" for p in problems]

    return attempt


def run_all(
    name: str,
    baseline: Path,
    tmp_path: Path,
    command: Callable[[Path], Command],
    **how: Any,
) -> None:
    """Count the command's points, kill it at each (or a sample), print the summary line,
    and fail on any inconsistent state."""
    counts = command(_copy(baseline, tmp_path / "counting" / "index")).counted(tmp_path / "trace.txt")
    assert sum(counts.values()) > 0, counts
    attempt = killing(baseline, tmp_path / "kills", command, **how)
    seed = fault_seed()
    outcomes = kill_everywhere(counts, budget=BUDGET, seed=seed, attempt=attempt)
    said = summary(name, counts, outcomes, seed)
    print(f"\n{said}")
    assert [p for o in outcomes for p in o.problems] == [], said
    assert sum(o.reached for o in outcomes) >= len(outcomes) // 2, "most runs were killed"


def _copy(index: Path, to: Path) -> Path:
    shutil.copytree(index, to, symlinks=True)
    return to


def _listed(index: Path, channel: str, project: str) -> dict[str, object]:
    """A project's files in a channel, by name, and whether each is yanked (None: not listed)."""
    found = tree_channel(index, channel).project(project) if tree_channel(index, channel).exists() else None
    return {f.filename: f.yanked for f in found.files} if found else {}


# --- publish, yank ------------------------------------------------------------------------


@pytest.fixture
def wheels(tmp_path: Path) -> dict[str, Path]:
    where = tmp_path / "wheels"
    return {
        "first": make_wheel(where, "wm-first", "1.0", tag=ANY, files={"wm_first/__init__.py": b"A = 1\n"}),
        "dep-mirrored": make_wheel(where / "up", "wm-dep", "1.0", tag=ANY),
        "second": make_wheel(where, "wm-second", "1.0", tag=ANY, files={"wm_second/__init__.py": b"B = 2\n" * 500}),
        "dep-built": make_wheel(where, "wm-dep", "2.0", tag=ANY, files={"wm_dep/__init__.py": b"built\n"}),
    }


@pytest.fixture
def baseline(tmp_path: Path, wheels: dict[str, Path]) -> Path:
    """One channel with a built project and a mirrored one."""
    index = tmp_path / "baseline"
    channel = tree_channel(index, "cpu")
    publish(channel, wheels["first"])
    publish(channel, wheels["dep-mirrored"], mirrored_from="https://upstream.example/wm_dep-1.0-py3-none-any.whl")
    return index


def test_a_publish_killed_at_every_point(baseline: Path, tmp_path: Path, wheels: dict[str, Path]) -> None:
    """Two wheels, one a built wheel of a mirrored project, whose mirrored file is unlinked
    once no page lists it. (Killed between that page and the unlink, the mirrored file is
    left unlisted: no page names it, and the publish run again does not remove it.)"""

    def published(index: Path) -> list[str]:
        problems = healed(index)
        if set(_listed(index, "cpu", "wm-dep")) != {wheels["dep-built"].name}:
            problems.append(f"wm-dep lists {_listed(index, 'cpu', 'wm-dep')}")
        if wheels["second"].name not in _listed(index, "cpu", "wm-second"):
            problems.append("wm-second is not listed")
        return problems

    def command(index: Path) -> Command:
        return driver(index, "publish", "cpu", str(wheels["second"]), str(wheels["dep-built"]))

    run_all("publish", baseline, tmp_path, command, done=published)


def test_a_yank_killed_at_every_point(baseline: Path, tmp_path: Path, wheels: dict[str, Path]) -> None:
    def yanked(index: Path) -> list[str]:
        said = _listed(index, "cpu", "wm-first")
        return healed(index) + ([] if said == {wheels["first"].name: "broken"} else [f"wm-first lists {said}"])

    def command(index: Path) -> Command:
        return driver(index, "yank", "cpu", "wm-first", "1.0", "broken")

    run_all("yank", baseline, tmp_path, command, done=yanked)


# --- mirror -------------------------------------------------------------------------------


def test_a_mirror_killed_at_every_point(baseline: Path, tmp_path: Path, wheels: dict[str, Path]) -> None:
    """A locked closure on this machine's disk (file:// URLs) mirrored into the channel:
    stored, published as mirrored, the built project left out."""
    upstream = tmp_path / "upstream"
    closure = [
        make_wheel(upstream, "wm-leaf", "2.0", tag=ANY),
        make_wheel(upstream, "wm-other", "0.3", tag=ANY, files={"wm_other/x.py": b"X = 3\n" * 200}),
        make_wheel(upstream, "wm-first", "0.9", tag=ANY),  # built in the channel: never mirrored there
    ]
    lock = tmp_path / "closure.toml"
    lock.write_text(
        "".join(
            f'[[packages]]\nname = "{w.name.split("-")[0]}"\n'
            f'wheels = [{{ url = "{w.resolve().as_uri()}", hashes = {{ sha256 = "{sha256_of(w)}" }}, '
            f"size = {w.stat().st_size} }}]\n"
            for w in closure
        )
    )

    def mirrored(index: Path) -> list[str]:
        problems = healed(index)
        for wheel, project in ((closure[0], "wm-leaf"), (closure[1], "wm-other")):
            if wheel.name not in _listed(index, "cpu", project):
                problems.append(f"{wheel.name} is not listed")
        if closure[2].name in _listed(index, "cpu", "wm-first"):
            problems.append("a built project was mirrored")
        return problems

    run_all("mirror", baseline, tmp_path, lambda index: driver(index, "mirror", "cpu", str(lock)), done=mirrored)


# --- promote, prune -----------------------------------------------------------------------


def test_a_promotion_killed_at_every_point(tmp_path: Path) -> None:
    """An rc of the test track (a re-stamped repo wheel, a third-party one, a mirrored
    dependency) promoted into the release track: files, pages, then the record."""
    index = tmp_path / "baseline"
    channel = tree_channel(index, "test/cu118")
    built = tmp_path / "built"
    ops = make_wheel(built, "wm-ops", "2.4.0rc1+cu118", files={"wm_ops/_C.so": b"\x7fELF" + bytes(range(256)) * 16})
    third = make_wheel(built, "thirdparty", "0.1.10+cu118", files={"thirdparty/_C.so": bytes(range(100))})
    dep = make_wheel(built, "wm-dep", "1.0", tag=ANY)
    files = []
    for wheel, rule in ((ops, VersionRule.REPO), (third, VersionRule.SOURCE)):
        publish(channel, wheel)
        files.append(
            ReleasedFile(
                channel=channel.name,
                cell="cuda118-py311",
                recipe=wheel.name.split("-")[0],
                filename=wheel.name,
                sha256=sha256_of(wheel),
                rule=rule,
            )
        )
    publish(channel, dep, mirrored_from="https://upstream.example/wm_dep-1.0-py3-none-any.whl")
    rc = Manifest(
        version="2.4.0rc1",
        track=Track.TEST,
        commit=HEAD,
        tag="v2.4.0-rc1",
        files=tuple(files),
        gpu_runners={"cuda118-py311": ()},  # no runner covers the variant: the gate lets it through
    )
    record(TreeStorage(index), rc)
    final = "wm_ops-2.4.0+cu118-cp311-cp311-linux_x86_64.whl"

    def promoted(root: Path) -> list[str]:
        problems = healed(root)
        listed = {
            **_listed(root, "cu118", "wm-ops"),
            **_listed(root, "cu118", "thirdparty"),
            **_listed(root, "cu118", "wm-dep"),
        }
        if set(listed) != {final, third.name, dep.name}:
            problems.append(f"cu118 lists {sorted(listed)}")
        found = find_manifest(TreeStorage(root), Track.RELEASE, "2.4.0")
        if found is None or sorted(f.filename for f in found.files) != sorted([final, third.name]):
            problems.append(f"the release's record: {found}")
        return problems

    def all_or_nothing(root: Path) -> list[str]:
        """Right after the kill: no promoted file listed before the promotion's commit point."""
        shown = {**_listed(root, "cu118", "wm-ops"), **_listed(root, "cu118", "thirdparty")}
        committed = TreeStorage(root).get(f"{COMMITS}promote/{Track.RELEASE}/2.4.0") is not None
        return [] if committed or not shown else [f"listed before the commit: {sorted(shown)}"]

    run_all(
        "promote",
        index,
        tmp_path,
        lambda root: driver(root, "promote", "2.4.0", HEAD),
        check=lambda root: read_back(root) + all_or_nothing(root),
        done=promoted,
    )


def test_a_prune_killed_at_every_point(tmp_path: Path) -> None:
    """Three nightlies, the newest kept: the others' own files' entries removed and their
    pages rendered, a shared one kept, their records removed. (Their bytes are the sweep's:
    ``wheelmill index sweep``.)"""
    index = tmp_path / "baseline"
    channel = tree_channel(index, "nightly/cpu")
    shared = make_wheel(tmp_path / "w", "thirdparty", "0.1.10+cpu")
    publish(channel, shared)
    days = ("20261120", "20261121", "20261122")
    own = {}
    for day in days:
        wheel = make_wheel(tmp_path / "w", "wm-ops", f"2.4.1.dev{day}+cpu")
        own[day] = wheel.name
        publish(channel, wheel)
        files = tuple(
            ReleasedFile(
                channel="nightly/cpu",
                cell="cpu-py311",
                recipe=w.name,
                filename=w.name,
                sha256=sha256_of(w),
                rule=VersionRule.REPO,
            )
            for w in (wheel, shared)
        )
        record(
            TreeStorage(index),
            Manifest(version=f"2.4.1.dev{day}", track=Track.NIGHTLY, commit=HEAD, tag=None, files=files),
        )

    def pruned(root: Path) -> list[str]:
        problems = healed(root)
        if set(_listed(root, "nightly/cpu", "wm-ops")) != {own[days[-1]]}:
            problems.append(f"wm-ops lists {_listed(root, 'nightly/cpu', 'wm-ops')}")
        if shared.name not in _listed(root, "nightly/cpu", "thirdparty"):
            problems.append("the shared file is not listed")
        storage = TreeStorage(root)  # a tree keeps emptied folders: a writer may be about to write in one
        gone = [own[d] for d in days[:-1] if storage.keys_under(f"nightly/cpu/entries/wm-ops/{own[d]}/")]
        problems += [f"{name}: still there" for name in gone]
        kept = [m.version for m in manifests(TreeStorage(root), Track.NIGHTLY)]
        return problems + ([] if kept == [f"2.4.1.dev{days[-1]}"] else [f"records kept: {kept}"])

    def command(root: Path) -> Command:
        return driver(root, "prune", "nightly", "1")

    run_all("prune", index, tmp_path, command, done=pruned)


# --- a migration ---------------------------------------------------------------------------


def test_a_migration_killed_at_every_point(tmp_path: Path) -> None:
    """An index an earlier wheelmill wrote (tests/unit/test_legacy.py says what it holds)
    migrated into objects: killed anywhere, a reader finds pages that list only files that
    are there (old pages link the old files, new ones the blobs); run again, every file is
    listed as before, with its keys, yank and provenance, and no old file is left."""
    with tarfile.open(LEGACY) as tar:
        tar.extractall(tmp_path / "legacy", filter="data")
    index = tmp_path / "legacy" / "index"
    before = {name: _files(channels.Channel(index, name).projects()) for name in ("cpu", "test/cpu")}

    def migrated(root: Path) -> list[str]:
        found = healed(root)
        for name, files in before.items():
            now = _files(tree_channel(root, name).projects())
            found += [] if now == files else [f"{name}: {sorted(now)} against {sorted(files)}"]
            found += [f"{name}: files/ left"] if (root / name / "files").exists() else []
        return found

    run_all("migrate", index, tmp_path, lambda root: driver(root, "migrate"), done=migrated)


def _files(projects: Any) -> dict[str, tuple[object, ...]]:
    return {
        f.filename: (f.sha256, f.yanked, f.build_keys, f.mirrored_from, f.provenance is not None)
        for project in projects
        for f in project.files
    }


# --- the conda channel's index -------------------------------------------------------------


def test_a_conda_index_killed_at_every_point(tmp_path: Path) -> None:
    """A conda channel with a package its repodata does not list yet (a writer killed
    before it indexed): ``conda index`` killed anywhere leaves each repodata.json whole, old
    or new, listing only packages that are there; run again, it lists every package."""
    wheels = tmp_path / "wheels"
    first = [
        make_wheel(wheels, "ops", "0.1.0+cpu", tag="cp311-cp311-manylinux_2_28_x86_64", files={"ops/x.py": b"X = 1\n"}),
        make_wheel(wheels, "filelock", "3.16.1", tag=ANY, files={"filelock/__init__.py": b""}),
    ]
    later = make_wheel(tmp_path / "later", "wm-late", "1.0", tag=ANY, files={"wm_late/__init__.py": b""})
    index = tmp_path / "baseline"
    conda = index / "conda" / "cpu"
    scratch = tmp_path / "scratch-channel"
    for wheel_files, channel in ((first, conda), ([later], scratch)):
        done = subprocess.run(
            [
                *wheelmill(index, "conda", "package", "--cell", "cpu-py311").argv,
                *map(str, wheel_files),
                "--channel",
                str(channel),
            ],
            env=wheelmill(index).env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    (package,) = scratch.glob("*/*.conda")
    shutil.copy(package, conda / package.parent.name / package.name)
    assert conda_unlisted(conda) == [f"{package.parent.name}/{package.name}"]

    def indexed(root: Path) -> list[str]:
        return conda_problems(root / "conda" / "cpu") + [
            f"{name}: not listed" for name in conda_unlisted(root / "conda" / "cpu")
        ]

    run_all(
        "conda index",
        index,
        tmp_path,
        lambda root: driver(root, "conda-index"),
        check=lambda root: conda_problems(root / "conda" / "cpu"),
        done=indexed,
        threaded=True,
    )
