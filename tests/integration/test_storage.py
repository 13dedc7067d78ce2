"""The storage protocol's guarantees, the same test for both implementations: a directory
tree, and a real S3 server (SeaweedFS, conditional writes). Create-once, compare-and-swap,
server-side copy, listing, and of sixteen processes racing to create each of thirty keys,
exactly one winner a key, whose bytes the key holds; and release records written on it by
eight jobs at once, none lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from tests.objectstore import ObjectStore
from tests.ports import free_port
from wheelmill.errors import ChannelError, ConfigError, FetchError, IndexWriteError
from wheelmill.index.s3 import BucketPath, S3Storage
from wheelmill.index.storage import Headers, Storage, TreeStorage
from wheelmill.inputs.versions import Track
from wheelmill.releases.records import load_manifest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
RACERS, KEYS = 16, 30
# One racer: waits for the start, then tries to create every key with its own bytes, and
# prints the keys it made.
RACER = """
import json, os, sys, time
from pathlib import Path
from wheelmill.index.s3 import S3Storage
from wheelmill.index.storage import TreeStorage
kind, where, name, start, keys = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
storage = TreeStorage(Path(where)) if kind == "tree" else S3Storage.of(where)
while not start.exists():
    time.sleep(0.005)
won = [f"race/{k}" for k in range(keys) if storage.create(f"race/{k}", name.encode())]
print(json.dumps(won))
"""


@pytest.fixture(params=["tree", "s3"])
def storage_at(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Storage, str, dict[str, str]]]:
    """A storage of each kind, empty: a directory, or a prefix of the bucket of its own; its
    location, and the environment that reaches it."""
    if request.param == "tree":
        yield TreeStorage(tmp_path / "index"), str(tmp_path / "index"), {}
        return
    store: ObjectStore = request.getfixturevalue("object_store")
    for name, value in store.environ().items():
        monkeypatch.setenv(name, value)
    url = store.url(f"{uuid.uuid4().hex}/")
    s3 = S3Storage.of(url)
    yield s3, url, store.environ()
    for key in s3.keys_under():
        s3.delete(key)


def test_an_object_is_created_once_and_swapped_only_from_the_version_read(
    storage_at: tuple[Storage, str, dict[str, str]],
) -> None:
    storage, _, _ = storage_at
    assert storage.get("cu130/simple/index.json") is None
    assert storage.create("cu130/simple/index.json", b"one", headers=Headers(cache_control="no-cache"))
    assert not storage.create("cu130/simple/index.json", b"two"), "a second create finds it there"
    first = storage.get("cu130/simple/index.json")
    assert first is not None and first.data == b"one"
    assert storage.swap("cu130/simple/index.json", b"three", version=first.version)
    assert not storage.swap("cu130/simple/index.json", b"four", version=first.version), "a stale version loses"
    now = storage.get("cu130/simple/index.json")
    assert now is not None and now.data == b"three" and now.version != first.version
    assert not storage.swap("cu130/simple/none.json", b"x", version=first.version), "nothing there to swap"
    assert storage.get("cu130/simple/none.json") is None


def test_a_copy_is_made_once_from_another_object_and_keys_list_by_prefix(
    storage_at: tuple[Storage, str, dict[str, str]], tmp_path: Path
) -> None:
    storage, _, _ = storage_at
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(os.urandom(3 << 20))  # a file, streamed, not read whole by the caller
    assert storage.create("blobs/sha256/ab/w.whl", wheel)
    assert storage.copy("blobs/sha256/ab/w.whl", "cu130/files/w.whl")
    assert not storage.copy("blobs/sha256/ab/w.whl", "cu130/files/w.whl"), "the copy is there already"
    fetched = tmp_path / "fetched.whl"
    assert storage.fetch("cu130/files/w.whl", fetched) and fetched.read_bytes() == wheel.read_bytes()
    assert not storage.fetch("cu130/files/none.whl", tmp_path / "none.whl")
    with pytest.raises(ChannelError, match="no object blobs/none to copy"):
        storage.copy("blobs/none", "cu130/files/none.whl")
    assert storage.create("cu130/simple/index.json", b"{}")
    assert storage.keys_under("cu130/") == ["cu130/files/w.whl", "cu130/simple/index.json"]
    assert storage.keys_under() == ["blobs/sha256/ab/w.whl", "cu130/files/w.whl", "cu130/simple/index.json"]
    assert storage.children("") == ["blobs", "cu130"] and storage.children("cu130/") == ["files", "simple"]
    assert storage.children("none/") == []
    storage.delete("cu130/files/w.whl")
    storage.delete("cu130/files/w.whl")  # gone already: no error
    assert storage.keys_under("cu130/") == ["cu130/simple/index.json"]
    with pytest.raises(ChannelError, match=r"'\.\./x' is not a storage key"):
        storage.get("../x")


def test_of_sixteen_processes_racing_to_create_a_key_exactly_one_wins(
    storage_at: tuple[Storage, str, dict[str, str]], tmp_path: Path
) -> None:
    storage, where, environ = storage_at
    start = tmp_path / "start"
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACER,
                "tree" if isinstance(storage, TreeStorage) else "s3",
                where,
                f"racer-{n}",
                str(start),
                str(KEYS),
            ],
            cwd=ROOT,
            env={**os.environ, **environ},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(RACERS)
    ]
    time.sleep(2.0)  # every racer imported and waiting
    start.touch()
    won: dict[str, list[str]] = {}
    for n, racer in enumerate(racers):
        out, err = racer.communicate(timeout=300)
        assert racer.returncode == 0, err[-2000:]
        won[f"racer-{n}"] = json.loads(out)
    winners = Counter(key for keys in won.values() for key in keys)
    assert winners == dict.fromkeys((f"race/{k}" for k in range(KEYS)), 1), "each key made once"
    for name, keys in won.items():
        for key in keys:
            stored = storage.get(key)
            assert stored is not None and stored.data == name.encode(), "the key holds its winner's bytes"


def test_a_bucket_location_is_parsed_or_refused_in_one_line() -> None:
    assert str(BucketPath.parse("s3://wheels/index")) == "s3://wheels/index/"
    for bad in ("s3:///index", "https://wheels/index", "s3://wheels/../x", "s3://wheels/x?y=1"):
        with pytest.raises(Exception, match="is not") as refused:
            BucketPath.parse(bad)
        assert "fix" not in str(refused.value)


def test_a_bucket_that_is_not_there_wrong_credentials_or_no_server_are_one_error_each(
    object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The exit codes docs/design/storage.md gives: no bucket or no credentials 3, a read the
    store refuses or cannot answer 6, such a write 19; each names the object."""
    for name, value in object_store.environ().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="the bucket does not exist") as missing:
        S3Storage.of(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x/").get("a")
    assert missing.value.exit_code == 3
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    wrong = S3Storage.of(object_store.url("x/"))
    with pytest.raises(FetchError, match=r"refused access to a \(SignatureDoesNotMatch\)") as read:
        wrong.get("a")
    with pytest.raises(IndexWriteError, match=r"refused access to a ") as written:
        wrong.create("a", b"1")
    assert (read.value.exit_code, written.value.exit_code) == (6, 19)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="no credentials for the object store"):
        S3Storage.of(object_store.url("x/")).get("a")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wheelmill")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    once = boto3.client("s3", config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))
    with pytest.raises(FetchError, match="the object store did not answer"):
        S3Storage(BucketPath.parse(object_store.url("x/")), once).get("a")


# One job of a release: records its own cell's file, and a GPU result of it, with no lock.
RECORDER = """
import sys
from pathlib import Path
from wheelmill.checks.gpu import GpuOutcome
from wheelmill.releases.records import GpuRecord, Manifest, ReleasedFile, record, record_gpu
from wheelmill.index.s3 import S3Storage
from wheelmill.index.storage import TreeStorage
from wheelmill.inputs.versions import Track, VersionRule
kind, where, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
storage = TreeStorage(Path(where)) if kind == "tree" else S3Storage.of(where)
cell = f"cuda130-job{n}-py311"
released = ReleasedFile(channel="test/cu130", cell=cell, recipe="ops", filename=f"ops-{n}.whl", sha256=f"{n:064x}",
                        rule=VersionRule.REPO)
record(storage, Manifest(version="2.4.0rc1", track=Track.TEST, commit="a" * 40, tag="v2.4.0-rc1",
                         files=(released,), gpu_runners={cell: ("linux-gpu-h100",)}))
tested = {released.sha256: GpuOutcome.PASSED}
passed = GpuRecord(cell=cell, status=GpuOutcome.PASSED, runner="linux-gpu-h100", tested=tested)
record_gpu(storage, Track.TEST, "2.4.0rc1", [passed])
"""


def test_jobs_recording_one_release_at_once_lose_nothing(storage_at: tuple[Storage, str, dict[str, str]]) -> None:
    """Eight jobs of one rc, each publishing its cell and recording its GPU stage, at once:
    the record read afterwards holds every one of them (objects made once, never rewritten)."""
    storage, where, environ = storage_at
    kind = "tree" if isinstance(storage, TreeStorage) else "s3"
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", RECORDER, kind, where, str(n)],
            cwd=ROOT,
            env={**os.environ, **environ},
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(8)
    ]
    for job in jobs:
        _, err = job.communicate(timeout=300)
        assert job.returncode == 0, err[-2000:]
    read = load_manifest(storage, Track.TEST, "2.4.0rc1")
    assert sorted(f.filename for f in read.files) == [f"ops-{n}.whl" for n in range(8)]
    assert sorted(g.cell for g in read.gpu if g.passed) == sorted(f"cuda130-job{n}-py311" for n in range(8))
    assert read.gpu_runners == {f"cuda130-job{n}-py311": ("linux-gpu-h100",) for n in range(8)}
