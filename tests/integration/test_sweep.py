"""The sweep of unnamed blobs racing a publisher of the same bytes, on both storages (a
directory tree, and a real S3 server: SeaweedFS with conditional writes): round after
round, the publisher publishes a wheel, finds its bytes there, and removes it again, while
sweeps with no grace period run back to back, marking and deleting those bytes whenever no
entry names them. A listed file never lacks its bytes once its publish has returned; at the
end, two sweeps leave nothing of them. tests/unit/test_sweep.py holds the single steps."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.objectstore import ObjectStore
from tests.wheels import make_wheel
from wheelmill.index.objects import ObjectChannel, blob_key, publish, remove_files, verify
from wheelmill.index.s3 import S3Storage
from wheelmill.index.storage import Storage
from wheelmill.index.sweep import Swept, sweep

pytestmark = pytest.mark.integration
ROUNDS = 30
NO_GRACE = timedelta(0)


def test_the_sweep_racing_a_publisher_of_the_same_bytes_never_takes_a_listed_files_blob(
    storage: Storage, tmp_path: Path
) -> None:
    channel = ObjectChannel(storage, "nightly/cpu")
    one = make_wheel(tmp_path / "dist", "demo", "1.0.dev20261129", files={"demo/__init__.py": b"x = 1\n"})
    stop, swept, failed = threading.Event(), list[Swept](), list[BaseException]()

    def sweeping() -> None:
        try:
            while not stop.is_set():
                swept.append(sweep(storage, grace=NO_GRACE))
        except BaseException as exc:  # noqa: BLE001 - said by the test's thread
            failed.append(exc)

    sweeper = threading.Thread(target=sweeping)
    sweeper.start()
    missing = []
    try:
        for number in range(ROUNDS):
            publish(channel, one)
            project = channel.project("demo")
            assert project is not None and [f.filename for f in project.files] == [one.name]
            blob = blob_key(project.files[0].sha256, one.name)
            there = set(storage.keys_under(blob.rpartition("/")[0] + "/"))
            if not {blob, f"{blob}.metadata"} <= there:
                missing.append(f"round {number}: {sorted(there)}")
            remove_files(channel, "demo", [one.name])
    finally:
        stop.set()
        sweeper.join(timeout=120)
    assert not failed, failed
    assert missing == [], "a listed file lost its bytes after its publish returned"
    deleted = sum(len(s.deleted) + len(s.restored) for s in swept)
    assert deleted > 0, f"the sweeps ({len(swept)}) never deleted the bytes between rounds: no race was run"
    sweep(storage, grace=NO_GRACE)  # marks what the last round left, if the sweeper had not
    sweep(storage, grace=NO_GRACE)
    assert storage.keys_under("blobs/") == [] and storage.keys_under("unlisted/") == [], "the orphan is gone"
    assert verify(channel, hashes=True) == []


def test_index_sweep_marks_then_deletes_a_removed_files_bytes_in_a_bucket(
    object_store: ObjectStore, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wheelmill index sweep` on an s3:// index root: the first run marks what a removal left
    unlisted, a run within the grace period waits, a run with the period over deletes it."""
    for name, value in object_store.environ().items():
        monkeypatch.setenv(name, value)
    root = object_store.url(f"{uuid.uuid4().hex}/index")
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", root)
    channel = ObjectChannel(S3Storage.of(root), "nightly/cpu")
    old = make_wheel(tmp_path / "a", "demo", "1.0.dev1", files={"demo/__init__.py": b"1\n"})
    new = make_wheel(tmp_path / "b", "demo", "1.0.dev2", files={"demo/__init__.py": b"2\n"})
    publish(channel, old)
    publish(channel, new)
    remove_files(channel, "demo", [old.name])

    first = cli("index", "sweep")
    assert first.code == 0, first.err
    assert "4 blob objects, 2 named by an entry; 0 deleted, 2 newly unnamed (marked)" in first.out
    waiting = cli("index", "sweep")
    assert "0 deleted, 0 newly unnamed (marked), 2 waiting out the grace period" in waiting.out
    done = cli("index", "sweep", "--grace", "0")
    assert "2 deleted" in done.out and "deleted blobs/sha256/" in done.out and old.name in done.out
    assert verify(channel, hashes=True) == []
    assert [k for k in channel.storage.keys_under("blobs/") if old.name in k] == []

    wrong = cli("index", "sweep", "--grace", "-1")
    assert wrong.code == 2 and wrong.err.startswith("wheelmill: error: ") and "fix:" in wrong.err
