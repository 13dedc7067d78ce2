"""The sweep of unnamed blobs (``wheelmill.index.sweep``) on the tree implementation of the
storage protocol: a blob is deleted only by a sweep a grace period after the one that found
it unnamed, never while an entry names it, and a publisher that names it just as a sweep
deletes it finds it put back. tests/integration/test_sweep.py races the two on both storages."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.wheels import make_wheel
from wheelmill.index.objects import TRASH, ObjectChannel, blob_key, publish, remove_files, verify
from wheelmill.index.storage import TreeStorage
from wheelmill.index.sweep import MARKS, sweep

GRACE = timedelta(days=2)
START = datetime(2026, 11, 1, tzinfo=UTC)


def wheel(tmp_path: Path, version: str = "1.0") -> Path:
    return make_wheel(tmp_path / "dist" / version, "demo", version, files={"demo/__init__.py": version.encode()})


@pytest.fixture
def storage(tmp_path: Path) -> TreeStorage:
    return TreeStorage(tmp_path / "index")


def blobs_of(storage: TreeStorage, one: Path) -> list[str]:
    return [k for k in storage.keys_under("blobs/") if k.rsplit("/", 1)[1].startswith(one.name)]


def test_a_removed_files_blobs_are_marked_then_deleted_after_the_grace_period(
    storage: TreeStorage, tmp_path: Path
) -> None:
    nightly, release = ObjectChannel(storage, "nightly/cpu"), ObjectChannel(storage, "cpu")
    old, kept = wheel(tmp_path, "1.0"), wheel(tmp_path, "2.0")
    publish(nightly, old, provenance=b'{"signed": 1}\n')
    publish(nightly, kept)
    publish(release, kept)  # the same bytes in another channel
    remove_files(nightly, "demo", [old.name, kept.name])
    unnamed = blobs_of(storage, old)
    assert len(unnamed) == 3, "the wheel, its sidecar, its provenance"

    first = sweep(storage, grace=GRACE, now=START)
    assert sorted(first.marked) == sorted(unnamed) and not first.deleted
    assert first.named == 2, "the kept wheel and its sidecar: the release channel names them"
    assert sweep(storage, grace=GRACE, now=START + timedelta(days=1)).waiting == first.marked
    last = sweep(storage, grace=GRACE, now=START + GRACE)
    assert sorted(last.deleted) == sorted(unnamed) and not last.marked
    assert blobs_of(storage, old) == [] and len(blobs_of(storage, kept)) == 2
    assert storage.keys_under("unlisted/") == [], "no mark, no trash left"
    assert verify(release, hashes=True) == []


def test_a_blob_named_again_within_the_grace_period_loses_its_mark(storage: TreeStorage, tmp_path: Path) -> None:
    channel = ObjectChannel(storage, "test/cpu")
    one = wheel(tmp_path)
    publish(channel, one)
    remove_files(channel, "demo", [one.name])
    assert len(sweep(storage, grace=GRACE, now=START).marked) == 2
    publish(channel, one)  # the same bytes, published again
    again = sweep(storage, grace=GRACE, now=START + GRACE)
    assert len(again.unmarked) == 2 and not again.deleted and not again.marked
    assert storage.keys_under(MARKS) == [] and verify(channel, hashes=True) == []


class PublishingAsItDeletes(TreeStorage):
    """A storage on which a publisher names the bytes a sweep is deleting: after the sweep's
    look for an entry, before its delete. The publisher runs in a thread of its own, and the
    delete goes on once its entry is made."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.racing: list[Path] = []
        self.publishers: list[threading.Thread] = []

    def delete(self, key: str) -> None:
        if key.startswith("blobs/") and self.racing:
            one = self.racing.pop()
            publisher = threading.Thread(target=publish, args=(ObjectChannel(self, "cpu"), one))
            publisher.start()
            self.publishers.append(publisher)
            entry = f"cpu/entries/demo/{one.name}/built.json"
            while self.get(entry) is None:
                time.sleep(0.01)
        super().delete(key)


def test_a_blob_named_while_the_sweep_deletes_it_is_put_back_before_the_publish_returns(tmp_path: Path) -> None:
    one = wheel(tmp_path)
    storage = PublishingAsItDeletes(tmp_path / "index")
    channel = ObjectChannel(storage, "cpu")
    publish(channel, one)
    remove_files(channel, "demo", [one.name])
    sweep(storage, grace=GRACE, now=START)
    storage.racing.append(one)
    swept = sweep(storage, grace=GRACE, now=START + GRACE)
    (publisher,) = storage.publishers
    publisher.join(timeout=30)
    assert not publisher.is_alive(), "the publisher waited for the sweep's last look, no longer"
    assert [key.rsplit("/", 1)[1] for key in swept.restored] == [one.name] and not swept.deleted
    assert len(blobs_of(storage, one)) == 2, "the wheel put back; its sidecar, named by then, never deleted"
    assert storage.keys_under(TRASH) == [] and verify(channel, hashes=True) == []


def test_a_sweep_killed_with_a_blob_in_the_trash_is_mended_by_the_next(storage: TreeStorage, tmp_path: Path) -> None:
    channel = ObjectChannel(storage, "cpu")
    one = wheel(tmp_path)
    publish(channel, one)
    blob = blob_key(next(f.sha256 for p in channel.projects() for f in p.files), one.name)
    storage.copy(blob, f"{TRASH}{blob}")  # killed after the copy into the trash...
    storage.delete(blob)  # ...and after the delete, before its last look
    sweep(storage, grace=GRACE, now=START)
    assert storage.get(blob) is not None and storage.keys_under(TRASH) == []
    assert verify(channel, hashes=True) == []


def test_the_sweep_command_removes_what_killed_writers_left_on_a_tree_and_nothing_being_written(
    tmp_path: Path, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer killed midway leaves its temporary file under the tree's ``.storage/tmp``; no
    reader sees it, and only the sweep removes it, once no write could still be using it."""
    root = tmp_path / "index"
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(root))
    publish(ObjectChannel(TreeStorage(root), "cpu"), wheel(tmp_path))
    work = root / ".storage" / "tmp"
    stale, fresh = work / ".wm-tmp-killed.part", work / ".wm-tmp-writing.part"
    for path in (stale, fresh):
        path.write_bytes(b"half a wheel")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    result = cli("index", "sweep")
    assert result.code == 0, result.err
    assert "work files: removed 1 that writers killed midway left" in result.out, result.out
    assert not stale.exists() and fresh.exists()
    assert verify(ObjectChannel(TreeStorage(root), "cpu")) == []
