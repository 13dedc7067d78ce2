"""The sweep: a blob no channel's entry names any more (a pruned nightly, a removed file, the
loser of two writers racing under one name) is deleted, on any ``Storage``, while any number
of publishers write, with no lock:

    unlisted/marks/<blob key>    the time a sweep first found that blob named by no entry
    unlisted/trash/<blob key>    a blob being deleted, kept until the sweep's last look

A blob is deleted only by a sweep that finds it unnamed a grace period after the one that
marked it (the mark of a blob named again in between is dropped). The grace period (days,
in a scheduled job) keeps a blob that a publisher is about to name from being a candidate at
all. What is left is a publisher that finds the bytes there (and so does not store them)
and names them in its entry just as a sweep deletes them. The sweep copies the blob into the
trash, then looks for an entry naming it (the few objects where one would be: that file
name's entries in each channel), and deletes it only where there is none; after its
deletes it looks again, and puts back from the trash every blob an entry names by then.
The publisher, after its pages, looks for its blob and sidecar: while a trash copy of them
is there it waits for the sweep's last look, and it stores again from its own file what is
gone (``objects.publish``). An entry made after the sweep's look therefore meets the trash
copy, and one made before it stops the delete: when a publish has returned, its file's
bytes are there, and no later sweep takes them while it is listed. A reader may find them
missing only between that delete and the put-back, on a page written in that moment.
Two sweeps at once are safe too (one may empty the other's trash: the publisher then
stores the bytes itself); one at a time is cheaper.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from packaging.utils import canonicalize_name

from wheelmill.errors import ChannelError
from wheelmill.index.channels import BLOBS_DIR, RESERVED, TRACK_DIRS, UNLISTED_DIR, is_channel_name
from wheelmill.index.objects import (
    BUILT,
    LEARNT,
    MIRRORED,
    TRASH,
    ObjectChannel,
    blob_key,
    entry_of,
    provenance_sha256,
    read_all,
)
from wheelmill.index.storage import Storage
from wheelmill.provenance.statement import SUFFIX as PROVENANCE

MARKS = f"{UNLISTED_DIR}/marks/"
SIDECAR = ".metadata"


@dataclass(frozen=True, kw_only=True)
class Swept:
    """What one sweep found and did, by blob key."""

    blobs: int  # blob objects the storage holds
    named: int  # of them, named by an entry
    marked: tuple[str, ...] = ()  # found unnamed for the first time
    waiting: tuple[str, ...] = ()  # marked before, within the grace period
    deleted: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()  # named again while being deleted: put back
    unmarked: tuple[str, ...] = ()  # marked before, named again (or gone)

    def describe(self) -> str:
        return (
            f"{self.blobs} blob objects, {self.named} named by an entry; {len(self.deleted)} deleted, "
            f"{len(self.marked)} newly unnamed (marked), {len(self.waiting)} waiting out the grace period, "
            f"{len(self.unmarked)} named again" + (f", {len(self.restored)} put back" if self.restored else "")
        )


def stored_names(storage: Storage) -> list[str]:
    """The names under which ``storage`` holds something where a channel would be: each top
    level name but the index's own, and each name under a track, sorted."""
    tops = [n for n in storage.children("") if n not in RESERVED]
    return sorted([*tops, *(f"{t}/{n}" for t in TRACK_DIRS for n in storage.children(f"{t}/"))])


def channels_of(storage: Storage) -> list[ObjectChannel]:
    """Every channel that may hold entries (those of the tracks too), listed now: one that
    has none yet may have one by the time a sweep looks again. Anything else beside the
    channels is none of the sweep's."""
    return [ObjectChannel(storage, name) for name in stored_names(storage) if is_channel_name(name)]


def sweep(storage: Storage, *, grace: timedelta, now: datetime | None = None) -> Swept:
    """One sweep of ``storage``'s blobs against every channel's entries (see the module)."""
    now = now or datetime.now(UTC)
    _empty_the_trash(storage)
    blobs = set(storage.keys_under(f"{BLOBS_DIR}/"))
    named = _named(storage, (channel.entries() for channel in channels_of(storage)))
    marks = {key.removeprefix(MARKS): key for key in storage.keys_under(MARKS)}
    unmarked = [blob for blob in marks if blob in named or blob not in blobs]
    for blob in unmarked:
        storage.delete(marks[blob])
    marked, waiting, due = [], [], []
    for blob in sorted(blobs - named):
        if blob not in marks:
            storage.create(f"{MARKS}{blob}", f"{now.isoformat()}\n".encode())
            marked.append(blob)
        elif _since(storage, marks[blob], now) >= grace:
            due.append(blob)
        else:
            waiting.append(blob)
    deleted = [blob for blob in due if _delete(storage, blob)]
    restored = _last_look(storage, deleted)
    return Swept(
        blobs=len(blobs),
        named=len(blobs & named),
        marked=tuple(marked),
        waiting=tuple(waiting),
        deleted=tuple(b for b in deleted if b not in restored),
        restored=tuple(restored),
        unmarked=tuple(unmarked),
    )


def _named(storage: Storage, prefixes: Iterable[str]) -> set[str]:
    """Every blob key an entry under ``prefixes`` names: its file, the file's sidecar, its
    provenance."""
    naming = (f"/{BUILT}", f"/{MIRRORED}", f"/{LEARNT}")
    keys = [key for prefix in prefixes for key in storage.keys_under(prefix) if key.endswith(naming)]
    return {
        blob for key, found in read_all(storage, keys).items() if found is not None for blob in _names(key, found.data)
    }


def _names(key: str, data: bytes) -> Iterable[str]:
    filename = key.rsplit("/", 2)[-2]
    if key.endswith(f"/{LEARNT}"):
        yield blob_key(data.decode().strip(), f"{filename}{PROVENANCE}")
        return
    entry = entry_of(data)
    yield from (blob_key(entry.sha256, f"{filename}{end}") for end in ("", SIDECAR))
    if (provenance := provenance_sha256(data)) is not None:
        yield blob_key(provenance, f"{filename}{PROVENANCE}")


def _since(storage: Storage, mark: str, now: datetime) -> timedelta:
    found = storage.get(mark)
    try:
        then = datetime.fromisoformat(found.data.decode().strip()) if found else now
    except ValueError:  # a damaged mark starts the grace period again
        storage.delete(mark)
        return timedelta(0)
    return now - then


def _is_named(storage: Storage, blob: str) -> bool:
    """Whether an entry names ``blob`` now: the few objects where one would be (its file
    name's entries in each channel there is now), read again."""
    filename = blob.rsplit("/", 1)[1].removesuffix(SIDECAR).removesuffix(PROVENANCE)
    project = str(canonicalize_name(filename.split("-", 1)[0]))
    return blob in _named(storage, (channel.entries(project, filename) for channel in channels_of(storage)))


def _delete(storage: Storage, blob: str) -> bool:
    """``blob`` gone from its place, unless an entry names it now. Into the trash first: a
    publisher that names it from then on waits for this sweep's last look (``objects``)."""
    storage.copy(blob, f"{TRASH}{blob}")
    storage.delete(f"{MARKS}{blob}")
    if _is_named(storage, blob):
        storage.delete(f"{TRASH}{blob}")
        return False
    storage.delete(blob)
    return True


def _empty_the_trash(storage: Storage) -> None:
    """What a sweep killed midway (or one running beside this) left in the trash: put back
    where an entry names it and it is gone from its place; the trash emptied. A publisher
    waiting on it then finds its blob, or stores it again itself."""
    left = [key.removeprefix(TRASH) for key in storage.keys_under(TRASH)]
    there = set(storage.keys_under(f"{BLOBS_DIR}/")) if left else set()
    for blob in left:
        if blob not in there and _is_named(storage, blob):
            _put_back(storage, blob)
        storage.delete(f"{TRASH}{blob}")


def _last_look(storage: Storage, deleted: Sequence[str]) -> list[str]:
    """The deleted blobs an entry names by now, put back from the trash; the trash emptied."""
    restored = []
    for blob in deleted:
        if _is_named(storage, blob) and _put_back(storage, blob):
            restored.append(blob)
        storage.delete(f"{TRASH}{blob}")
    return restored


def _put_back(storage: Storage, blob: str) -> bool:
    try:
        return storage.copy(f"{TRASH}{blob}", blob) or True
    except ChannelError:  # emptied by another sweep: the waiting publisher stores it again
        return False
