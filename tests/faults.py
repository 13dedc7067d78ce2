"""A command killed at each syscall that changes the tree it writes, and what a reader may
find after each kill (strace's fault injection: one run per kill).

The syscalls watched are every kind a writer of the index makes: writes and syncs, renames,
hard and symbolic links, unlinks (``shutil.rmtree`` removes an old generation of pages with
``unlinkat``), and the making and removing of directories. A clean traced run counts each;
strace counts calls per thread, so a syscall's points are 1 up to the most calls one thread
makes (``when=n`` kills the first thread that makes its n-th). Where a command has more
points than a run can afford, a sample is taken: the first and the last of each syscall, and
the rest drawn by a seed that the summary line prints (``WHEELMILL_TESTS_FAULT_SEED``; by
default the day's number, so a run is repeated by its seed, and the runs of a few weeks walk
every point, where a fixed sample would kill at the same few forever).

Run as ``python -m tests.faults mirror|promote|migrate ...``, it is the process the tests kill for
the commands that have no command line of their own here (a mirror of a locked closure, a
promotion of a recorded rc, without a git checkout or a resolver).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import urllib.parse
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WATCHED = (
    "write",
    "pwrite64",
    "writev",
    "fsync",
    "fdatasync",
    "rename",
    "renameat",
    "renameat2",
    "link",
    "linkat",
    "unlink",
    "unlinkat",
    "symlink",
    "symlinkat",
    "mkdir",
    "mkdirat",
    "rmdir",
)
KILLED = (-9, 137)
SEED = "WHEELMILL_TESTS_FAULT_SEED"


@dataclass(frozen=True)
class Command:
    """A command line and its environment, run from the repository's root."""

    argv: tuple[str, ...]
    env: dict[str, str]

    def run(self, *, inject: tuple[str, int] | None = None) -> subprocess.CompletedProcess[str]:
        """The command; with ``inject``, SIGKILLed at that syscall's n-th call (in the first
        thread to make an n-th one)."""
        argv: list[str] = list(self.argv)
        if inject is not None:
            syscall, n = inject
            trace = ["strace", "-f", "-qq", "-o", os.devnull, "-e", f"trace={syscall}"]
            argv = [*trace, "-e", f"inject={syscall}:signal=KILL:when={n}", *argv]
        return subprocess.run(argv, env=self.env, cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)

    def counted(self, trace: Path) -> Counter[str]:
        """Each watched syscall's injection points: the most calls of it one thread makes."""
        argv = ["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={','.join(WATCHED)}", *self.argv]
        done = subprocess.run(argv, env=self.env, cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        per_thread: Counter[tuple[str, str]] = Counter()
        for line in trace.read_text().splitlines():
            tid, _, rest = line.partition(" ")
            name = rest.lstrip().split("(", 1)[0]
            if name in WATCHED:  # a resumed call ("<... write resumed>") was counted where it began
                per_thread[(name, tid)] += 1
        counts: Counter[str] = Counter()
        for (name, _tid), n in per_thread.items():
            counts[name] = max(counts[name], n)
        return counts


def wheelmill(index_root: Path, *args: str) -> Command:
    return Command(
        (sys.executable, "-m", "wheelmill", "--recipes", str(ROOT / "recipes"), *args), environment(index_root)
    )


def driver(index_root: Path, *args: str) -> Command:
    """This module as the process to kill (see ``main``)."""
    return Command((sys.executable, "-m", "tests.faults", *args), environment(index_root))


def environment(index_root: Path) -> dict[str, str]:
    """The index, and a temporary directory of its own beside it: a process killed at a write
    may be Python's own probe of its temporary directory, which would otherwise stay in the
    machine's."""
    temporary = index_root.with_name(f"{index_root.name}-tmp")
    temporary.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "WHEELMILL_INDEX_ROOT": str(index_root),
        "WHEELMILL_OUTPUT": str(index_root.with_name(f"{index_root.name}-out")),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(temporary),
    }


def fault_seed(environ: dict[str, str] | None = None, *, today: datetime | None = None) -> int:
    """``WHEELMILL_TESTS_FAULT_SEED``, else the day's number (UTC).

    >>> fault_seed({"WHEELMILL_TESTS_FAULT_SEED": "7"}), fault_seed({}, today=datetime(2026, 12, 1, tzinfo=UTC))
    (7, 739951)
    """
    given = (os.environ if environ is None else environ).get(SEED, "").strip()
    return int(given) if given else (today or datetime.now(UTC)).toordinal()


def points(counts: Counter[str], budget: int, seed: int) -> list[tuple[str, int]]:
    """Every injection point, or where there are more than ``budget``: the first and the last
    of each syscall, and points of the rest drawn by ``seed`` up to ``budget``.

    >>> points(Counter(write=3), 10, 1)
    [('write', 1), ('write', 2), ('write', 3)]
    >>> chosen = points(Counter(write=50, rename=4), 8, 1)
    >>> len(chosen), {("write", 1), ("write", 50), ("rename", 1), ("rename", 4)} <= set(chosen)
    (8, True)
    >>> chosen == points(Counter(write=50, rename=4), 8, 1) != points(Counter(write=50, rename=4), 8, 2)
    True
    """
    every = [(name, n) for name in sorted(counts) for n in range(1, counts[name] + 1)]
    if len(every) <= budget:
        return every
    ends = {(name, n) for name in counts for n in (1, counts[name])}
    rest = [point for point in every if point not in ends]
    drawn = set(random.Random(seed).sample(rest, min(max(budget - len(ends), 0), len(rest))))  # noqa: S311 - a sample
    return [point for point in every if point in ends or point in drawn]


@dataclass(frozen=True)
class Outcome:
    point: tuple[str, int]
    reached: bool  # the kill came (a threaded command's run may never make a thread's n-th call)
    problems: tuple[str, ...]


def kill_everywhere(
    counts: Counter[str],
    *,
    budget: int,
    seed: int,
    attempt: Callable[[str, int], tuple[bool, list[str]]],
) -> list[Outcome]:
    """``attempt`` (a kill at a point, its checks, the command again and its checks) at each
    point of the sample, side by side."""
    chosen = points(counts, budget, seed)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda point: Outcome(point, *_tupled(attempt(*point))), chosen))


def _tupled(done: tuple[bool, list[str]]) -> tuple[bool, tuple[str, ...]]:
    return done[0], tuple(done[1])


def summary(command: str, counts: Counter[str], outcomes: Sequence[Outcome], seed: int) -> str:
    """``<command>: <N> injection points (<per syscall>), <M> inconsistent states``, with
    how many were sampled (and the seed that repeats the sample) and reached where not all."""
    total = sum(counts.values())
    per = ", ".join(f"{name} {counts[name]}" for name in sorted(counts))
    said = [f"{len(outcomes)} of them sampled ({SEED}={seed})"] if len(outcomes) != total else []
    unreached = sum(1 for o in outcomes if not o.reached)
    said += [f"{len(outcomes) - unreached} of {len(outcomes)} runs killed"] if unreached else []
    bad = sum(1 for o in outcomes if o.problems)
    return f"{command}: {total} injection points ({per}){''.join(f'; {s}' for s in said)}, {bad} inconsistent states"


# --- what a reader may find --------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listed(page: Path, url: str, sha256: str | None, what: str) -> list[str]:
    """A file a page lists (by a URL relative to the page's directory): there, with the
    listed sha256 where one is listed."""
    relative = urllib.parse.unquote(url.partition("#")[0])
    path = Path(os.path.normpath(page / relative))
    if not path.is_file():
        return [f"{what}: lists {relative}, which is missing"]
    if sha256 and _sha256(path) != sha256:
        return [f"{what}: lists {relative} with sha256 {sha256[:12]}, the file's differs"]
    return []


def channel_problems(channel: Path, *, pairs: bool = True) -> list[str]:
    """What a reader of a wheel channel could find wrong: a page that does not parse, a page
    that lists a file (a wheel, its PEP 658 sidecar, its provenance) that is missing or has
    other bytes than the page's sha256, or (``pairs``) a page's JSON and HTML that disagree:
    a writer killed between its two swaps leaves them a render apart, which its next run
    mends (docs/design/storage.md)."""
    from wheelmill.index.pages import links  # noqa: PLC0415 - a driver process imports only what it runs

    simple = channel / "simple"
    if not simple.exists():
        return [f"{simple}: a dangling link"] if simple.is_symlink() else []
    problems: list[str] = []
    for page in sorted(simple.rglob("index.*")):
        text = page.read_text(encoding="utf-8", errors="replace")
        if page.suffix == ".json":
            try:
                json.loads(text)
            except ValueError:
                problems.append(f"{page}: half written")
        elif not text.rstrip().endswith("</html>"):
            problems.append(f"{page}: half written")
    if problems or not (simple / "index.json").is_file():
        return problems
    names = sorted(p["name"] for p in json.loads((simple / "index.json").read_text())["projects"])
    linked = sorted(str(a["href"]).rstrip("/") for a in links((simple / "index.html").read_text()))
    if pairs and names != linked:
        problems.append(f"{channel.name}: project list JSON {names}, HTML {linked}")
    for name in names if pairs else sorted({*names, *linked}):
        problems += _project_problems(channel, name, pairs=pairs)
    return problems


def _project_problems(channel: Path, name: str, *, pairs: bool) -> list[str]:
    from wheelmill.index.pages import PROVENANCE_ATTRIBUTE, links  # noqa: PLC0415

    page = channel / "simple" / name
    if not (page / "index.json").is_file() or not (page / "index.html").is_file():
        # A project list a render behind its project's removal may name it a moment longer.
        return [f"{channel.name}/{name}: listed without its pages"] if pairs else []
    problems: list[str] = []
    in_json = set()
    for entry in json.loads((page / "index.json").read_text())["files"]:
        where = f"{channel.name}/{name}/index.json"
        problems += _listed(page, entry["url"], entry["hashes"].get("sha256"), where)
        metadata = entry.get("core-metadata")
        if isinstance(metadata, dict):
            problems += _listed(page, f"{entry['url'].partition('#')[0]}.metadata", metadata.get("sha256"), where)
        if entry.get("_provenance"):  # a sidecar the page names, with no hash of its own
            problems += _listed(page, entry["_provenance"], None, where)
        in_json.add((entry["filename"], entry.get("yanked") not in (None, False)))
    in_html = set()
    for anchor in links((page / "index.html").read_text()):
        url, _, sha256 = str(anchor["href"]).partition("#sha256=")
        filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        where = f"{channel.name}/{name}/index.html"
        problems += _listed(page, url, sha256, where)
        metadata = anchor.get("data-core-metadata")
        if metadata is not None:
            problems += _listed(page, f"{url}.metadata", metadata.removeprefix("sha256="), where)
        if anchor.get(PROVENANCE_ATTRIBUTE):
            problems += _listed(page, str(anchor[PROVENANCE_ATTRIBUTE]), None, where)
        in_html.add((filename, "data-yanked" in anchor))
    if pairs and in_json != in_html:
        problems.append(f"{channel.name}/{name}: JSON {sorted(in_json)}, HTML {sorted(in_html)}")
    return problems


def index_problems(index: Path, *, pairs: bool = True) -> list[str]:
    """Every wheel channel's problems, and a release record's object that does not parse."""
    from wheelmill.index.channels import channel_dirs  # noqa: PLC0415

    problems = [p for name in channel_dirs(index) for p in channel_problems(index / name, pairs=pairs)]
    for record in sorted((index / "releases").rglob("*.json")) if (index / "releases").is_dir() else []:
        if not any(part.startswith(".") for part in record.relative_to(index).parts):
            try:
                json.loads(record.read_text())
            except ValueError:
                problems.append(f"{record}: half written")
    return problems


def conda_problems(channel: Path) -> list[str]:
    """What a conda client could find wrong: a subdir's repodata.json that does not parse,
    or that lists a package missing from the subdir or with other bytes than its sha256."""
    problems: list[str] = []
    for repodata in sorted(channel.glob("*/repodata.json")):
        try:
            data = json.loads(repodata.read_text())
        except ValueError:
            problems.append(f"{repodata}: half written")
            continue
        for key in ("packages", "packages.conda"):
            for filename, record in data.get(key, {}).items():
                problems += _listed(repodata.parent, filename, record.get("sha256"), str(repodata))
    return problems


def conda_unlisted(channel: Path) -> list[str]:
    """Packages of the channel its repodata does not list."""
    listed = set()
    for repodata in channel.glob("*/repodata.json"):
        data = json.loads(repodata.read_text())
        listed |= {f"{repodata.parent.name}/{n}" for key in ("packages", "packages.conda") for n in data.get(key, {})}
    return sorted(
        f"{p.parent.name}/{p.name}" for p in channel.glob("*/*.conda") if f"{p.parent.name}/{p.name}" not in listed
    )


# --- the killed process: what each command runs, without the command line's start ------


def _publish(index: Path, channel: str, *wheels: str) -> None:
    """``wheelmill publish --channel``: each wheel, in order."""
    from wheelmill.index.roots import Index, publish  # noqa: PLC0415

    for wheel in wheels:
        print(publish(Index(tree=index).channel(channel), Path(wheel)).outcome)


def _yank(index: Path, channel: str, project: str, version: str, reason: str) -> None:
    from wheelmill.index.roots import Index, set_yanked  # noqa: PLC0415

    print(set_yanked(Index(tree=index).channel(channel), project, version, reason))


def _prune(index: Path, track: str, keep: str) -> None:
    """``wheelmill release prune``."""
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.inputs.versions import Track  # noqa: PLC0415
    from wheelmill.releases.publish import prune  # noqa: PLC0415

    print(prune(Index(tree=index), Track(track), int(keep)))


def _conda_index(index: Path) -> None:
    """``wheelmill conda index``: every local conda channel indexed again."""
    from wheelmill.index.conda_channels import index_channels  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415

    for channel in index_channels(Index(tree=index)):
        channel.reindex()


def _mirror(index: Path, channel: str, lock: str) -> None:
    """A build's mirror step: a locked closure into the channel."""
    from wheelmill.index.closure import mirror, read  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.machine.package_sources import PackageSources  # noqa: PLC0415
    from wheelmill.machine.process import StepLog  # noqa: PLC0415
    from wheelmill.retry import RetryPolicy  # noqa: PLC0415

    with StepLog(Path(os.environ["TMPDIR"]) / f"mirror-{os.getpid()}.log") as log:
        mirror(
            read(Path(lock)),
            Index(tree=index).channel(channel),
            downloads=index,
            sources=PackageSources(index_url=None),
            policy=RetryPolicy(attempts=1, base_delay=0.01, max_delay=0.01),
            log=log,
            on_line=print,
        )


def _promote(index: Path, version: str, commit: str) -> None:
    """``wheelmill release promote --from test --to release`` of the rc of ``commit``."""
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.inputs.versions import Track  # noqa: PLC0415
    from wheelmill.releases.promotion import promote  # noqa: PLC0415

    promote(Index(tree=index), Track.TEST, Track.RELEASE, version, commit=commit, on_file=print)


def _migrate(index: Path) -> None:
    """``wheelmill index migrate``."""
    from wheelmill.index.roots import Index, migrate  # noqa: PLC0415

    print(migrate(Index(tree=index), on_channel=print))


COMMANDS: dict[str, Callable[..., None]] = {
    "publish": _publish,
    "yank": _yank,
    "prune": _prune,
    "conda-index": _conda_index,
    "mirror": _mirror,
    "promote": _promote,
    "migrate": _migrate,
}


def main(argv: Sequence[str]) -> int:
    """The command ``argv`` names, on the index ``WHEELMILL_INDEX_ROOT`` names: the functions
    the command line calls, in a process that starts in a tenth of the time (every kill is a
    process of its own)."""
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m tests.faults {'|'.join(COMMANDS)} ARGS...", file=sys.stderr)
        return 2
    COMMANDS[argv[0]](Path(os.environ["WHEELMILL_INDEX_ROOT"]), *argv[1:])
    if "rattler" in sys.modules:  # as the command line does: its threads outlive the call
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
