"""A channel written as objects (``wheelmill.index.objects``) in a real S3 bucket (SeaweedFS,
conditional writes), by publisher processes, not threads of one: eight of them, each with
an output root of its own, racing into one bucket lose nothing and leave pages that agree;
a publisher killed before each of its requests in turn leaves no page that lists a missing
file, and the next publish, or a render, heals what it left unlisted; of two publishers
racing with other bytes under one name, exactly one wins. The same code on the tree
implementation is held to the same rules in tests/unit/test_objects.py."""

from __future__ import annotations

import json
import os
import posixpath
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.objectstore import ObjectStore
from tests.s3proxy import S3Proxy
from tests.wheels import make_wheel
from wheelmill.index import pages
from wheelmill.index.objects import MIRRORED, ObjectChannel, publish, render, set_yanked, verify
from wheelmill.index.s3 import BucketPath, S3Storage
from wheelmill.machine.net import sha256_of

if TYPE_CHECKING:
    from types_boto3_s3.client import S3Client

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
RUNNERS = 8
RACES = 4  # names raced for by two publishers with other bytes each
UPSTREAM = "https://upstream.example/files"
# One publisher: waits for the start file (where there is one), then runs its steps in
# order, a line of JSON for each, and exits with wheelmill's exit code for an error.
PUBLISHER = """
import json, sys, time
from pathlib import Path
from wheelmill.errors import WheelmillError
from wheelmill.index.objects import ObjectChannel, publish, set_yanked
from wheelmill.index.s3 import S3Storage
job = json.loads(sys.argv[1])
storage = S3Storage.of(job["root"])
while job["start"] and not Path(job["start"]).exists():
    time.sleep(0.005)
try:
    for step in job["steps"]:
        channel = ObjectChannel(storage, step["channel"])
        if step["yank"] is not None:
            print(json.dumps({"yanked": set_yanked(channel, step["project"], step["version"], step["yank"])}))
            continue
        done = publish(
            channel, Path(step["wheel"]), mirrored_from=step["mirrored_from"], build_key=step["build_key"]
        )
        print(json.dumps({"channel": done.channel, "project": done.project, "filename": done.filename,
                          "outcome": done.outcome.value, "replaced": list(done.replaced)}), flush=True)
except WheelmillError as exc:
    print(exc.message, file=sys.stderr)
    sys.exit(exc.exit_code)
"""


@dataclass(frozen=True, kw_only=True)
class Step:
    """One thing a publisher does: publish ``wheel``, or yank ``project`` ``version``."""

    channel: str
    wheel: str | None = None
    mirrored_from: str | None = None
    build_key: str | None = None
    project: str | None = None
    version: str | None = None
    yank: str | None = None

    def run_here(self, channel: ObjectChannel) -> None:
        """The same step in this process, straight to the bucket."""
        if self.yank is not None:
            assert self.project is not None and self.version is not None
            set_yanked(channel, self.project, self.version, self.yank)
        else:
            assert self.wheel is not None
            publish(channel, Path(self.wheel), mirrored_from=self.mirrored_from, build_key=self.build_key)


@pytest.fixture
def bucket(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bucket]:
    """A prefix of the bucket of its own, and a client that reaches the server directly;
    everything under the prefix removed afterwards."""
    for name, value in object_store.environ().items():
        monkeypatch.setenv(name, value)
    made = Bucket(store=object_store, client=S3Storage.of(object_store.url("")).client, prefix=uuid.uuid4().hex)
    yield made
    made.empty()


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """A test's part of the bucket: a run's index is under ``<prefix>/<under>/``."""

    store: ObjectStore
    client: S3Client
    prefix: str

    def storage(self, under: str) -> S3Storage:
        return S3Storage(BucketPath.parse(self.url(under)), self.client)

    def url(self, under: str) -> str:
        return self.store.url(f"{self.prefix}/{under}/")

    def copy(self, source: str, dest: str) -> None:
        """Every object under one run's prefix to another's, server-side."""
        whole = S3Storage(BucketPath.parse(self.store.url(f"{self.prefix}/")), self.client)
        for key in whole.keys_under(f"{source}/"):
            assert whole.copy(key, f"{dest}/{key.removeprefix(f'{source}/')}")

    def empty(self) -> None:
        pages_of_keys = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.store.bucket, Prefix=f"{self.prefix}/"
        )
        for page in pages_of_keys:
            if page.get("Contents"):
                self.client.delete_objects(
                    Bucket=self.store.bucket,
                    Delete={"Objects": [{"Key": item["Key"]} for item in page["Contents"]], "Quiet": True},
                )

    def head(self, under: str, key: str) -> dict[str, Any]:
        answer = self.client.head_object(Bucket=self.store.bucket, Key=f"{self.prefix}/{under}/{key}")
        return {"type": answer.get("ContentType"), "cache": answer.get("CacheControl")}


def started(root: str, steps: list[Step], *, start: Path | None, endpoint: str) -> subprocess.Popen[str]:
    """A publisher process for ``steps`` into ``root``, reaching the server at ``endpoint``."""
    job = {"root": root, "start": str(start) if start else None, "steps": [asdict(s) for s in steps]}
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, json.dumps(job)],
        cwd=ROOT,
        env={**os.environ, "AWS_ENDPOINT_URL_S3": endpoint},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def reaped(processes: list[subprocess.Popen[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    """The processes, each killed at the end of the block where it still runs (a failed check)."""
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()


def wheel(root: Path, name: str, version: str, body: str = "") -> Path:
    """A wheel of its own bytes in a directory of its own under ``root``."""
    unique = f"{name}-{version}-{body}"
    return make_wheel(
        root / uuid.uuid4().hex[:12], name, version, files={f"{name.replace('-', '_')}/__init__.py": unique.encode()}
    )


# -- what a bucket's pages say, read from the objects themselves ---------------------------


def listed_but_missing(channel: ObjectChannel) -> list[str]:
    """Each page that does not parse, and each file a page (JSON or HTML, project or root)
    lists whose blob, sidecar or project page is not there: what no kill may leave."""
    storage, problems, wanted = channel.storage, [], []
    simple = f"{channel.name}/simple/"
    for key in storage.keys_under(simple):
        found = storage.get(key)
        text = found.data.decode() if found is not None else ""
        try:
            hrefs = _hrefs(text, html=key.endswith(".html"), root=key.count("/") == simple.count("/"))
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"{key}: does not parse ({type(exc).__name__})")
            continue
        for href in hrefs:
            target = posixpath.normpath(posixpath.join(posixpath.dirname(key), urllib.parse.unquote(href)))
            if target.startswith("../"):
                problems.append(f"{key}: {href} leads out of the index")
            elif key.count("/") == simple.count("/"):  # the project list: each project's page
                wanted += [(key, href, f"{target}/index.{key.rpartition('.')[2]}")]
            else:
                wanted += [(key, href, target), (key, href, f"{target}.metadata")]
    there = set(storage.keys_under())  # after the pages: blobs are never removed
    problems += [
        f"{page} lists {href}, but {target} is not there" for page, href, target in wanted if target not in there
    ]
    return problems


def _hrefs(text: str, *, html: bool, root: bool) -> list[str]:
    """The links of a page, without their fragments."""
    if html:
        return [(a["href"] or "").split("#")[0] for a in pages.links(text)]
    if root:
        return [f"{urllib.parse.quote(name)}" for name in pages.parse_root_json(text)]
    return [f.url for f in pages.parse_project_json(text).files]


def shown(channel: ObjectChannel, *, keys: bool = True) -> dict[str, dict[str, tuple[str | None, tuple[str, ...]]]]:
    """Every project's files as its JSON page shows them: the yank, and the build keys."""
    return {p.name: {f.filename: (f.yanked, f.build_keys if keys else ()) for f in p.files} for p in channel.projects()}


def html_files(channel: ObjectChannel, project: str) -> dict[str, str]:
    """What the project's HTML page links, by filename: the sha256 of each."""
    found = channel.storage.get(channel.page_key(project, "html"))
    assert found is not None
    hrefs = [a["href"] or "" for a in pages.links(found.data.decode())]
    return {urllib.parse.unquote(h.split("#")[0].rsplit("/", 1)[-1]): h.split("#sha256=")[-1] for h in hrefs}


# -- eight runners at once -----------------------------------------------------------------


def runner_steps(roots: list[Path]) -> list[list[Step]]:
    """Each runner's steps, from wheels it made under its own output root: a version of a
    project every runner builds (odd runners also into the test track, the same bytes), a
    wheel two runners publish with the same bytes, two versions of a project of its own,
    mirrored or built versions of one project (built beats mirrored), a mirror-only project;
    each runner's in an order of its own."""
    pair_wheels = [wheel(roots[2 * m], "pair-ops", f"2.{m}") for m in range(RUNNERS // 2)]
    plans = []
    for n, root in enumerate(roots):
        shared = wheel(root, "shared-ops", f"1.{n}+cu130")
        pair = root / "pair" / pair_wheels[n // 2].name
        pair.parent.mkdir()
        shutil.copyfile(pair_wheels[n // 2], pair)  # the same bytes, in this runner's own root
        mixed = wheel(root, "mixed-ops", f"0.{n}") if n < 6 else wheel(root, "mixed-ops", f"1.{n}")
        mirror = wheel(root, "mirror-only", f"0.{n}")
        steps = [
            Step(channel="cu130", wheel=str(shared), build_key=f"runner-{n}"),
            Step(channel="cu130", wheel=str(pair), build_key="pair"),
            Step(channel="cu130", wheel=str(wheel(root, f"own-{n}", "1.0"))),
            Step(channel="cu130", wheel=str(wheel(root, f"own-{n}", "1.1"))),
            Step(channel="cu130", wheel=str(mixed), mirrored_from=f"{UPSTREAM}/{mixed.name}" if n < 6 else None),
            Step(channel="cu130", wheel=str(mirror), mirrored_from=f"{UPSTREAM}/{mirror.name}"),
            Step(channel="test/cu130", wheel=str(shared if n % 2 else pair)),
        ]
        random.Random(n).shuffle(steps)  # noqa: S311 - an order, not a secret
        plans.append(steps)
    return plans


def expected_pages(plans: list[list[Step]]) -> dict[str, dict[str, set[str]]]:
    """By channel and project, the files the pages must list: the built ones, or where a
    project has none, the mirrored ones."""
    built: dict[tuple[str, str], set[str]] = {}
    mirrored: dict[tuple[str, str], set[str]] = {}
    for step in (s for steps in plans for s in steps):
        assert step.wheel is not None
        name = Path(step.wheel).name
        project = name.split("-")[0].replace("_", "-")
        (mirrored if step.mirrored_from else built).setdefault((step.channel, project), set()).add(name)
        built.setdefault((step.channel, project), set())
    expected: dict[str, dict[str, set[str]]] = {}
    for (channel, project), names in built.items():
        expected.setdefault(channel, {})[project] = names or mirrored[(channel, project)]
    return expected


def test_eight_runners_publishing_at_once_lose_nothing_and_their_pages_agree(
    bucket: Bucket, object_store: ObjectStore, tmp_path: Path
) -> None:
    roots = [tmp_path / f"runner-{n}" for n in range(RUNNERS)]
    plans = runner_steps(roots)
    start = tmp_path / "start"
    runners = [started(bucket.url("index"), steps, start=start, endpoint=object_store.endpoint) for steps in plans]
    with reaped(runners):
        time.sleep(2.0)  # every runner imported and waiting
        began = time.monotonic()
        start.touch()
        said = []
        for runner in runners:
            out, err = runner.communicate(timeout=300)
            assert runner.returncode == 0, err[-2000:]
            said += [json.loads(line) for line in out.splitlines()]
    took = time.monotonic() - began
    outcomes = Counter((s["channel"], s["filename"], s["outcome"]) for s in said)
    built_names = {(s.channel, Path(s.wheel).name) for p in plans for s in p if s.wheel and not s.mirrored_from}
    for channel_name, filename in built_names:
        assert outcomes[(channel_name, filename, "added")] == 1, f"{channel_name}/{filename}: added once"

    expected = expected_pages(plans)
    storage = bucket.storage("index")
    for channel_name, projects in expected.items():
        channel = ObjectChannel(storage, channel_name)
        assert verify(channel) == [], "every listed file there with its sha256, every entry listed"
        assert listed_but_missing(channel) == []
        assert channel.project_names() == sorted(projects), "the project list complete"
        for project, names in projects.items():
            page = channel.project(project)
            assert page is not None
            assert {f.filename for f in page.files} == names, f"{channel_name}/{project}: every file listed"
            assert html_files(channel, project) == {f.filename: f.sha256 for f in page.files}, "HTML and JSON agree"
            cache = "no-cache" if "/" in channel_name else "max-age=600, must-revalidate"
            assert bucket.head("index", channel.page_key(project, "json")) == {"type": pages.JSON_TYPE, "cache": cache}
            assert bucket.head("index", channel.page_key(project, "html"))["type"] == "text/html; charset=utf-8"
        keys = {f.filename: f.build_keys for p in channel.projects() for f in p.files}
        for step in (s for p in plans for s in p if s.channel == channel_name and s.build_key):
            assert step.wheel is not None and step.build_key in keys[Path(step.wheel).name], "build keys learnt"
    files = sum(len(names) for projects in expected.values() for names in projects.values())
    blobs = len([k for k in storage.keys_under("blobs/") if not k.endswith(".metadata")])
    print(
        f"\n{RUNNERS} runners, {len(said)} publishes in {took:.1f} s: {files} files listed in "
        f"{sum(len(p) for p in expected.values())} projects of {len(expected)} channels, {blobs} blobs; "
        f"outcomes {dict(Counter(s['outcome'] for s in said))}"
    )


# -- killed before each request in turn ----------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A command run on a channel with some state already: ``prior`` makes the state, in
    this process; ``step`` is what the killed publisher does."""

    name: str
    channel: str
    prior: list[Step]
    step: Step

    @property
    def slug(self) -> str:
        """Its name as a key's segment."""
        return re.sub(r"[^a-z0-9]+", "-", self.name)


def scenarios(root: Path) -> list[Scenario]:
    demo = [wheel(root, "demo", v) for v in ("1.0", "1.1")]
    mirrored = [wheel(root, "demo", v) for v in ("0.8", "0.9")]
    return [
        Scenario(
            name="a built wheel into a project",
            channel="cu130",
            prior=[Step(channel="cu130", wheel=str(demo[0]), build_key="old")],
            step=Step(channel="cu130", wheel=str(demo[1]), build_key="new"),
        ),
        Scenario(
            name="a new project",
            channel="test/cu130",
            prior=[Step(channel="test/cu130", wheel=str(wheel(root, "other", "1.0")))],
            step=Step(channel="test/cu130", wheel=str(wheel(root, "fresh-ops", "1.0+cu130")), build_key="new"),
        ),
        Scenario(
            name="a yank",
            channel="cu130",
            prior=[Step(channel="cu130", wheel=str(w)) for w in demo],
            step=Step(channel="cu130", project="demo", version="1.1", yank="a broken build"),
        ),
        Scenario(
            name="a built wheel over mirrored ones",
            channel="cu130",
            prior=[Step(channel="cu130", wheel=str(w), mirrored_from=f"{UPSTREAM}/{w.name}") for w in mirrored],
            step=Step(channel="cu130", wheel=str(wheel(root, "demo", "1.0"))),
        ),
    ]


@dataclass(frozen=True, kw_only=True)
class Killed:
    """What one scenario's kills found."""

    requests: int  # the publisher's requests when it is not killed: as many kill points
    inconsistent: list[str]  # a page that does not parse or lists a missing file: none allowed
    unlisted: Counter[str]  # what verify said after a kill, by kind: each healed after


TRANSIENT = {  # what a kill may leave: something not listed yet, which the next write lists
    "not listed": "not listed (an interrupted publish)",
    "project list": "the project list",
    "html behind json": "index.html and index.json list different files",
    "root html behind json": "index.html links",
    "yank not shown yet": "show different yanks",
}


def kinds_of(problems: list[str]) -> tuple[Counter[str], list[str]]:
    """verify's problems after a kill: those of a file not listed yet, by kind, and the rest."""
    kinds: Counter[str] = Counter()
    rest = []
    for problem in problems:
        kind = next((k for k, words in TRANSIENT.items() if words in problem), None)
        if kind is None:
            rest.append(problem)
        else:
            kinds[kind] += 1
    return kinds, rest


def kill_each_request(bucket: Bucket, scenario: Scenario) -> Killed:
    """``killed_before_each_request`` through a proxy of its own: the scenarios run side by
    side (a kill's time is mostly a publisher starting and the server answering)."""
    with S3Proxy(bucket.store.endpoint).running() as proxy:
        return killed_before_each_request(bucket, proxy, scenario)


def killed_before_each_request(bucket: Bucket, proxy: S3Proxy, scenario: Scenario) -> Killed:
    """The scenario once through unharmed (its requests counted, the state it ends in), then
    once for each request, killed before it; after each kill, the pages checked, and the
    channel healed twice over, on two copies: by the same command again, and by a render."""
    unharmed, _ = _run(bucket, proxy, scenario, f"{scenario.slug}/whole", kill_at=None)
    requests = proxy.count
    final = shown(unharmed)
    final_files = shown(unharmed, keys=False)
    inconsistent: list[str] = []
    unlisted: Counter[str] = Counter()
    for k in range(1, requests + 1):
        under = f"{scenario.slug}/{k}"
        channel, before = _run(bucket, proxy, scenario, under, kill_at=k)
        inconsistent += [f"{under}: {p}" for p in listed_but_missing(channel)]
        kinds, rest = kinds_of(verify(channel, hashes=True))
        unlisted += kinds
        inconsistent += [f"{under}: {p}" for p in rest]
        bucket.copy(under, f"{under}-rendered")
        scenario.step.run_here(channel)
        assert verify(channel) == [], f"{under}: the same command again heals it"
        assert shown(channel) == final, f"{under}: the command again ends where an unharmed one does"
        rendered = ObjectChannel(bucket.storage(f"{under}-rendered"), scenario.channel)
        render(rendered)
        assert verify(rendered) == [], f"{under}: a render heals it"
        assert shown(rendered, keys=False) in (before, final_files), f"{under}: the command happened or did not"
    return Killed(requests=requests, inconsistent=inconsistent, unlisted=unlisted)


def _run(
    bucket: Bucket, proxy: S3Proxy, scenario: Scenario, under: str, *, kill_at: int | None
) -> tuple[ObjectChannel, dict[str, dict[str, tuple[str | None, tuple[str, ...]]]]]:
    """The scenario's prior state made under a prefix of its own, then its step by a
    publisher through the proxy, killed before request ``kill_at``; the channel, and what
    it showed before the step (without build keys)."""
    channel = ObjectChannel(bucket.storage(under), scenario.channel)
    for step in scenario.prior:
        step.run_here(channel)
    before = shown(channel, keys=False)
    proxy.arm(kill_at)
    publisher = started(bucket.url(under), [scenario.step], start=None, endpoint=proxy.url)
    with reaped([publisher]):
        proxy.aim(publisher.pid)
        _out, err = publisher.communicate(timeout=120)
    if kill_at is None:
        assert publisher.returncode == 0, err[-2000:]
    else:
        assert publisher.returncode == -signal.SIGKILL and proxy.killed, f"{under}: killed at request {kill_at}"
    return channel, before


def test_a_publisher_killed_before_any_request_leaves_no_page_listing_a_missing_file(
    bucket: Bucket, tmp_path: Path
) -> None:
    every = scenarios(tmp_path / "wheels")
    with ThreadPoolExecutor(max_workers=len(every)) as pool:
        found = dict(zip((s.name for s in every), pool.map(lambda s: kill_each_request(bucket, s), every), strict=True))
    for name, killed in found.items():
        print(
            f"\n{name}: {killed.requests} kill points, {len(killed.inconsistent)} inconsistent states; "
            f"left unlisted until healed: {dict(killed.unlisted) or 'nothing'}"
        )
    assert [p for killed in found.values() for p in killed.inconsistent] == []
    assert all(killed.requests >= 5 for killed in found.values()), "each command makes its requests"


# -- two publishers, one name, other bytes -------------------------------------------------


def test_of_two_publishers_racing_with_other_bytes_under_one_name_exactly_one_wins(
    bucket: Bucket, object_store: ObjectStore, tmp_path: Path
) -> None:
    start = tmp_path / "start"
    pairs = [
        [wheel(tmp_path / f"runner-{side}", "race-ops", f"1.{n}", body=side) for side in ("a", "b")]
        for n in range(RACES)
    ]
    steps = [[Step(channel="cu130", wheel=str(w))] for pair in pairs for w in pair]
    racers = [started(bucket.url("index"), s, start=start, endpoint=object_store.endpoint) for s in steps]
    channel = ObjectChannel(bucket.storage("index"), "cu130")
    with reaped(racers):
        time.sleep(2.0)  # every publisher imported and waiting
        start.touch()
        errors = [racer.communicate(timeout=120)[1] for racer in racers]
    for n, pair in enumerate(pairs):
        ended = [(racers[2 * n + side].returncode, errors[2 * n + side]) for side in (0, 1)]
        assert sorted(code for code, _ in ended) == [0, 14], ended
        assert "already published with other bytes" in next(err for code, err in ended if code == 14)
        winner = pair[[code for code, _ in ended].index(0)]
        page = channel.project("race-ops")
        assert page is not None
        assert {f.filename: f.sha256 for f in page.files}[winner.name] == sha256_of(winner), "the winner's bytes"
    assert verify(channel) == []
    listing = channel.listing("race-ops")
    assert len(listing) == RACES and all(MIRRORED not in listed.kinds for listed in listing.values())
