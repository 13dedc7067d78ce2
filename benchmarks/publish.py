"""How long publishing takes in a big index: one wheel at a time, and many publishers at once.

Fills a channel (cu130) with 10,000 wheels across 1,000 projects, and a second index with one
project of 1,000 files, then measures:

- one publish at a time, half into existing projects and half as new projects: the median,
  once through the API (the channel code itself) and once through the CLI (``wheelmill
  publish``, a whole process, as users and the build run it); and the same into the project
  of 1,000 files;
- 8 publisher processes at once, 10 wheels each through the API, half of each one's into a
  project they all share (so that their pages' compare-and-swaps race), the rest into
  existing projects and a new one of its own: the wall time for all 80 from the moment every
  process is ready; then every file published is listed and the index is valid.

Either way the channel is the one channel code (``wheelmill.index.objects``), only its
storage differs. ``--store tree`` (the default) is a directory tree (``TreeStorage``);
``--store s3`` is a bucket on a SeaweedFS of the benchmark's own (``weed mini`` on
127.0.0.1, removed afterwards). Either is filled in bulk: the objects a publish writes for
each wheel (its bytes, sidecar and entry, by the same helpers), many at once, then every
page rendered once: the state that publishing each would have left. Targets: one
wheel <= 0.5 s in a tree and <= 1 s in a bucket; the 80 wheels of 8 publishers <= 10 s on 2
cores. ``--smoke`` runs the smallest case (the script checked, no figure). Usage:
``.venv/bin/python benchmarks/publish.py [--store tree|s3] [--projects 1000 --files 10
--big-project 1000] [--smoke]``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import multiprocessing
import multiprocessing.synchronize
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from threading import BrokenBarrierError
from typing import TYPE_CHECKING
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
import runs  # noqa: E402 - beside this file, as for the other benchmarks
from botocore.config import Config  # noqa: E402
from packaging.utils import parse_wheel_filename  # noqa: E402

from tests.objectstore import running_object_store  # noqa: E402 - the tests' own SeaweedFS
from tests.storages import Watched  # noqa: E402
from tests.wheels import make_wheel  # noqa: E402 - the test helper that writes real wheels
from wheelmill.errors import WheelmillError  # noqa: E402
from wheelmill.index import objects  # noqa: E402
from wheelmill.index.channels import abi_of_wheel, agreeing, gpu_archs, now_rfc3339  # noqa: E402
from wheelmill.index.objects import ObjectChannel  # noqa: E402
from wheelmill.index.pages import FileEntry  # noqa: E402
from wheelmill.index.s3 import BucketPath, S3Storage  # noqa: E402
from wheelmill.index.storage import Headers, Storage, TreeStorage  # noqa: E402
from wheelmill.machine.net import sha256_of  # noqa: E402

if TYPE_CHECKING:
    from types_boto3_s3.client import S3Client

TARGETS = {"tree": 0.5, "s3": 1.0}  # one wheel, seconds
TARGET_AT_ONCE = 10.0  # the 80 wheels of 8 publishers at once, seconds on 2 cores
CHANNEL = "cu130"
TAG = "py3-none-any"
FILLERS = 32  # objects the bulk fill writes at once (and the connections its client keeps)
GATE_SECONDS = 120.0  # what the publisher processes may take to start and reach the gate
BLOB = Headers(content_type="application/octet-stream", cache_control=objects.IMMUTABLE)  # as publish sends them


class Broken(Exception):
    """What was measured did not happen as it must: no figure."""


@dataclass(frozen=True, kw_only=True)
class Sizes:
    projects: int
    files: int  # per project
    big: int  # files of the one project of the second index
    rounds: int
    publishers: int
    each: int  # wheels per publisher
    check_fill: bool  # verify the index after the fill too, not only at the end


SMOKE = Sizes(projects=2, files=2, big=4, rounds=2, publishers=3, each=2, check_fill=True)


@dataclass(frozen=True, kw_only=True)
class Index:
    """Where the benchmark publishes: a tree's directory, or ``s3://bucket/prefix``. Plain
    data, so that a publisher process opens the same index again."""

    kind: str  # tree or s3
    root: str

    def channel(self, *, counting: bool = False) -> ObjectChannel:
        """The one channel code on the index's storage; ``counting``: on a storage that counts
        the page writes that lost a race."""
        storage: Storage = TreeStorage(Path(self.root)) if self.kind == "tree" else S3Storage.of(self.root)
        return ObjectChannel(Counting(storage) if counting else storage, CHANNEL)


class Counting(Watched):
    """A storage that counts the page writes another writer's change refused (a page another
    made first, or changed since it was read): each a render of the page started again. A
    tree's writers race for its pages as a bucket's do: neither has a lock."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        self.lost = 0

    def written(self, key: str, done: bool) -> bool:
        self.lost += not done and key.startswith(f"{CHANNEL}/simple/")
        return done


def publish(channel: ObjectChannel, wheel: Path) -> float:
    """Seconds the publish of ``wheel`` took."""
    started = time.monotonic()
    objects.publish(channel, wheel)
    return time.monotonic() - started


def problems(channel: ObjectChannel) -> list[str]:
    return objects.verify(channel, hashes=False)


def in_a_tree(channel: ObjectChannel) -> bool:
    return isinstance(channel.storage, TreeStorage)


def unlisted(channel: ObjectChannel, wheels: Sequence[Path]) -> list[str]:
    """The wheels their project's page does not list."""
    names = {str(parse_wheel_filename(wheel.name)[0]) for wheel in wheels}
    listed = {f.filename for name in names if (project := channel.project(name)) for f in project.files}
    return [wheel.name for wheel in wheels if wheel.name not in listed]


# -- the fill ------------------------------------------------------------------------------


def fill(channel: ObjectChannel, work: Path, wheels: Sequence[tuple[str, str]]) -> float:
    """Seconds the channel took to hold a wheel of each (project, version): what publishing
    each wheel writes, FILLERS objects at once, then every page rendered once from the
    entries (one publish at a time, 10,000 would take hours)."""
    started = time.monotonic()
    filling = channel
    if not in_a_tree(channel):  # a client with a connection for each filler
        filling = ObjectChannel(
            S3Storage(BucketPath.parse(channel.storage.location), client=wide_client()), channel.name
        )
    with ThreadPoolExecutor(FILLERS) as pool:
        for count, _ in enumerate(pool.map(lambda name: write_objects(filling, work, *name), wheels), 1):
            if count % 1000 == 0:
                print(f"  wrote the objects of {count} files", flush=True)
    objects.render(filling)
    return time.monotonic() - started


def wide_client() -> S3Client:
    """A client of the SDK's settings (this server's, from the environment), with a
    connection for each filler."""
    config = Config(
        max_pool_connections=FILLERS, retries={"max_attempts": 6, "mode": "standard"}, s3={"addressing_style": "path"}
    )
    client: S3Client = boto3.session.Session().client("s3", region_name=os.environ["AWS_REGION"], config=config)
    return client


def write_objects(channel: ObjectChannel, work: Path, project: str, version: str) -> None:
    """A wheel's bytes, sidecar and entry, as ``objects.publish`` writes them for a file new
    to the channel; its pages are left to the one render after."""
    wheel = make_wheel(work / "fill", project, version, tag=TAG, files={"m.py": b"x = 1\n"})
    info = agreeing(wheel)
    entry = FileEntry(
        filename=wheel.name,
        version=str(info.version),
        sha256=sha256_of(wheel),
        size=wheel.stat().st_size,
        upload_time=now_rfc3339(),
        requires_python=info.requires_python,
        metadata_sha256=hashlib.sha256(info.metadata).hexdigest(),
        gpu_archs=gpu_archs(info),
        abi=abi_of_wheel(wheel),
    )
    blob = objects.blob_key(entry.sha256, wheel.name)
    channel.storage.create(blob, wheel, headers=BLOB)
    channel.storage.create(f"{blob}.metadata", info.metadata, headers=BLOB)
    entry_key = f"{channel.entries(info.name, wheel.name)}{objects.BUILT}"
    channel.storage.create(entry_key, objects.entry_bytes(info.name, entry))
    wheel.unlink()


def filled(channel: ObjectChannel, work: Path, wheels: Sequence[tuple[str, str]], *, check: bool) -> str:
    """The channel filled; how long it took, in words (and whether it is valid, where ``check``)."""
    seconds = fill(channel, work, wheels)
    how = ", in bulk"
    if not check:
        return f"filled in {seconds:.0f} s{how}"
    found = problems(channel)
    if found:
        raise Broken(f"the channel is not valid after the fill: {found[0]} ({len(found)} problems)")
    return f"filled in {seconds:.0f} s{how}; valid"


# -- one publish at a time -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Singles:
    api: list[float]
    cli: list[float]
    wheels: list[Path]  # every wheel published


def measure(index: Index, work: Path, projects: Sequence[str]) -> Singles:
    """A new version of each project in turn, once through the API and once through the CLI."""
    channel = index.channel()
    done = Singles(api=[], cli=[], wheels=[])
    for number, project in enumerate(projects):
        wheel = make_wheel(work / "api", project, f"2.{number}", tag=TAG)
        done.api.append(publish(channel, wheel))
        done.wheels.append(wheel)
        wheel = make_wheel(work / "cli", project, f"3.{number}", tag=TAG)
        done.cli.append(publish_by_cli(index, wheel, work))
        done.wheels.append(wheel)
    return done


def publish_by_cli(index: Index, wheel: Path, work: Path) -> float:
    """Seconds ``wheelmill publish`` took, in a process of its own (whose wheel the check at
    the end finds listed, or the benchmark is broken)."""
    env = {**os.environ, "WHEELMILL_INDEX_ROOT": index.root}
    argv = [sys.executable, "-m", "wheelmill", "publish", "--channel", CHANNEL, str(wheel)]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=work, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise Broken(f"wheelmill publish exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return time.monotonic() - started


def said(seconds: Sequence[float], target: float) -> str:
    median = statistics.median(seconds)
    return f"{median:.3f} s (max {max(seconds):.3f}): {median / target:.2f} of the target"


# -- publishers at once --------------------------------------------------------------------

_GATE: list[multiprocessing.synchronize.Barrier] = []  # in each publisher process: where all start at once


def _gated(gate: multiprocessing.synchronize.Barrier) -> None:
    _GATE.append(gate)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One publisher's: each publish's seconds, the page writes it lost to another's, its error."""

    seconds: tuple[float, ...]
    lost: int
    error: str | None = None


def publisher_wheels(work: Path, number: int, each: int, projects: int) -> tuple[Path, ...]:
    """Half into the project every publisher shares, a quarter into existing projects, a
    quarter into a new project of this publisher's own (the project list races too)."""
    wheels = []
    for k in range(each):
        if k % 2 == 0:
            project = "bench-shared"
        elif k % 4 == 1:
            project = f"bench-project-{(number * each + k) % projects:04d}"
        else:
            project = f"bench-publisher-{number}"
        wheels.append(make_wheel(work / "at-once", project, f"5.{number}.{k}", tag=TAG))
    return tuple(wheels)


def run_publisher(index: Index, wheels: tuple[Path, ...]) -> Outcome:
    """In a publisher process: its wheels one after another, once every publisher is ready."""
    channel = index.channel(counting=True)
    _GATE[0].wait(GATE_SECONDS)
    seconds: list[float] = []
    error = None
    try:
        seconds.extend(publish(channel, wheel) for wheel in wheels)
    except WheelmillError as exc:
        error = exc.one_line()
    storage = channel.storage
    return Outcome(seconds=tuple(seconds), lost=storage.lost if isinstance(storage, Counting) else 0, error=error)


def publish_at_once(index: Index, plans: Sequence[tuple[Path, ...]]) -> tuple[float, list[Outcome]]:
    """Seconds from the moment every publisher process is ready (started, imported, its
    client made) to the last one's end; what each said."""
    context = multiprocessing.get_context("spawn")  # a fresh process each, as runners are: no SDK state forked
    gate = context.Barrier(len(plans) + 1)
    with ProcessPoolExecutor(len(plans), mp_context=context, initializer=_gated, initargs=(gate,)) as pool:
        futures = [pool.submit(run_publisher, index, wheels) for wheels in plans]
        try:
            gate.wait(GATE_SECONDS)
        except BrokenBarrierError:
            raise Broken(f"the {len(plans)} publisher processes were not ready in {GATE_SECONDS:.0f} s") from None
        started = time.monotonic()
        outcomes = [future.result() for future in futures]
        return time.monotonic() - started, outcomes


# -- the run -------------------------------------------------------------------------------


@contextlib.contextmanager
def indexes(kind: str, work: Path) -> Iterator[tuple[Index, Index]]:
    """The main index and the one of a single big project: two trees, or two prefixes of a
    bucket on a SeaweedFS of their own, whose address and keys this process and its children
    take from the environment while it runs."""
    if kind == "tree":
        yield Index(kind=kind, root=str(work / "index")), Index(kind=kind, root=str(work / "big"))
        return
    with running_object_store() as server, mock.patch.dict(os.environ, server.environ()):
        yield Index(kind=kind, root=server.url("index")), Index(kind=kind, root=server.url("big"))


def benchmark(kind: str, sizes: Sizes, work: Path, index: Index, big: Index) -> int:
    channel, big_channel = index.channel(), big.channel()
    where = "a directory tree" if kind == "tree" else "a bucket on SeaweedFS (weed mini) on 127.0.0.1"
    where += ", the one channel code (wheelmill.index.objects)"
    print(f"store {kind}: {where}; {runs.cores()} cores", flush=True)
    fill_both(channel, big_channel, work, sizes)
    singles, into_big = one_at_a_time(index, big, work, sizes, TARGETS[kind])
    plans = [publisher_wheels(work, n, sizes.each, sizes.projects) for n in range(sizes.publishers)]
    wall, outcomes = at_once(index, plans, sizes)
    started = time.monotonic()
    missing = unlisted(channel, [*singles.wheels, *(w for wheels in plans for w in wheels)])
    missing += unlisted(big_channel, into_big.wheels)
    found = problems(channel) + problems(big_channel)
    checked = time.monotonic() - started
    print(f"every file listed: {not missing}; index valid afterwards: {not found} (checked in {checked:.0f} s)")
    summarize(kind, singles, wall, sum(len(o.seconds) for o in outcomes), sizes.publishers)
    if missing:
        raise Broken(f"{len(missing)} published files are not listed: {', '.join(missing[:3])}")
    if found:
        raise Broken(f"the index is not valid after the publishes: {found[0]} ({len(found)} problems)")
    return 0


def fill_both(channel: ObjectChannel, big_channel: ObjectChannel, work: Path, sizes: Sizes) -> None:
    wheels = [(f"bench-project-{p:04d}", f"1.{f}") for p in range(sizes.projects) for f in range(sizes.files)]
    how = filled(channel, work, wheels, check=sizes.check_fill)
    print(f"index: {len(wheels)} files in {sizes.projects} projects ({how})", flush=True)
    how = filled(big_channel, work, [("bench-big", f"1.{f}") for f in range(sizes.big)], check=sizes.check_fill)
    print(f"second index: one project of {sizes.big} files ({how})", flush=True)


def one_at_a_time(index: Index, big: Index, work: Path, sizes: Sizes, target: float) -> tuple[Singles, Singles]:
    """Single publishes into the index, half into existing projects, and into the big project."""
    projects = [
        f"bench-project-{r * 37 % sizes.projects:04d}" if r % 2 == 0 else f"bench-new-{r}" for r in range(sizes.rounds)
    ]
    singles = measure(index, work, projects)
    into_big = measure(big, work, ["bench-big"] * sizes.rounds)
    print(f"publish one wheel, median of {sizes.rounds} (target <= {target} s):")
    for what, done in (("", singles), (f"into one project of {sizes.big} files: ", into_big)):
        print(f"  {what}API {said(done.api, target)}")
        print(f"  {what}CLI {said(done.cli, target)}", flush=True)
    return singles, into_big


def at_once(index: Index, plans: Sequence[tuple[Path, ...]], sizes: Sizes) -> tuple[float, list[Outcome]]:
    wall, outcomes = publish_at_once(index, plans)
    failed = [o.error for o in outcomes if o.error]
    if failed:
        raise Broken(f"{len(failed)} of the publishers failed: {failed[0]}")
    each = [s for o in outcomes for s in o.seconds]
    shared = sum(1 for wheels in plans for w in wheels if w.name.startswith("bench_shared-"))
    print(
        f"{sizes.publishers} publishers at once, {sizes.each} wheels each ({shared} into one project): "
        f"all {len(each)} in {wall:.2f} s: {wall / TARGET_AT_ONCE:.2f} of the target "
        f"(80 wheels <= {TARGET_AT_ONCE:.0f} s on 2 cores)"
    )
    print(
        f"  each publish: median {statistics.median(each):.3f} s, max {max(each):.3f} s; "
        f"{sum(o.lost for o in outcomes)} page writes lost a race (that page rendered again)",
        flush=True,
    )
    return wall, outcomes


def summarize(kind: str, singles: Singles, wall: float, count: int, publishers: int) -> None:
    """The target of one wheel is the CLI's: a whole process, as users and the build publish."""
    target = TARGETS[kind]
    api, cli = statistics.median(singles.api), statistics.median(singles.cli)
    print(
        f"summary ({kind}): one wheel {api:.3f} s by the API, {cli:.3f} s by the CLI, "
        f"target <= {target} s: {met(max(api, cli), target)}; "
        f"{count} wheels of {publishers} publishers at once {wall:.2f} s, "
        f"target <= {TARGET_AT_ONCE:.0f} s: {met(wall, TARGET_AT_ONCE)}"
    )


def met(seconds: float, target: float) -> str:
    return "met" if seconds <= target else "not met"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("tree", "s3"), default="tree")
    parser.add_argument("--projects", type=int, default=1000)
    parser.add_argument("--files", type=int, default=10, help="files per project")
    parser.add_argument("--big-project", type=int, default=1000, help="files of the one project of a second index")
    parser.add_argument("--rounds", type=int, default=20, help="single publishes timed, each way")
    parser.add_argument("--publishers", type=int, default=8, help="processes publishing at once")
    parser.add_argument("--wheels", type=int, default=10, help="wheels each publisher publishes")
    parser.add_argument("--check-fill", action="store_true", help="verify the channel after the fill too (slow)")
    parser.add_argument("--smoke", action="store_true", help="the smallest case: the script checked, no figure")
    args = parser.parse_args()
    sizes = Sizes(
        projects=args.projects,
        files=args.files,
        big=args.big_project,
        rounds=args.rounds,
        publishers=args.publishers,
        each=args.wheels,
        check_fill=args.check_fill,
    )
    sizes = SMOKE if args.smoke else sizes
    if min(sizes.projects, sizes.files, sizes.big, sizes.rounds, sizes.publishers, sizes.each) < 1:
        parser.error("every size must be 1 or more")
    with tempfile.TemporaryDirectory(prefix="wheelmill-publish-bench-") as tmp:
        work = Path(tmp)
        try:
            with indexes(args.store, work) as (index, big):
                return benchmark(args.store, sizes, work, index, big)
        except Broken as exc:
            return runs.broken(str(exc))
        except WheelmillError as exc:  # the fill's, or a single publish's: said in one line, as wheelmill says it
            return runs.broken(exc.one_line())


if __name__ == "__main__":
    sys.exit(main())
