"""Channels of a tree written before every channel was objects (``wheelmill.index.objects``),
read where they are and migrated once by ``wheelmill index migrate``:

    <root>/<channel>/simple -> .simple-<n>/       the pages (a link to their current generation)
    <root>/<channel>/files/<wheel>                the bytes (another name of a download in <root>/.store)
    <root>/<channel>/files/<wheel>.metadata       the core metadata; .intoto.jsonl: the provenance

Such a channel is served as it is (its pages link to ``files/``), and no command writes it:
one that would says to migrate. A migration makes every listed file an object of the same
tree (the blob another name of the same bytes, no copy), then its entry, its build keys and
its yank, then renders the pages from the entries, which now link to the blobs, and checks
the channel. Only then is ``files/`` renamed out of the way (one step: from then on the
channel is an object channel) and removed. A reader finds a valid page at every instant,
old or new; a migration killed at any point and run again ends whole, and one run over a
migrated tree changes nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wheelmill.errors import ChannelError
from wheelmill.index import channels, objects
from wheelmill.index.objects import BUILT, KEYS, MIRRORED, YANKED, ObjectChannel, blob_key
from wheelmill.index.pages import FileEntry
from wheelmill.index.storage import TreeStorage
from wheelmill.provenance.statement import SUFFIX as PROVENANCE

FILES = "files"
_RETIRED = ".files-migrated"  # files/ once the pages no longer link to it; removed after
_LEFT = (".tmp", ".pending", ".lock", _RETIRED)  # what the old channel code kept beside its pages


@dataclass(frozen=True, kw_only=True)
class Migrated:
    channel: str
    projects: int
    files: int

    def describe(self) -> str:
        return f"{self.channel}: {self.files} files of {self.projects} projects are objects now"


def is_legacy(root: Path, name: str) -> bool:
    return (root / name / FILES).is_dir()


def legacy_channels(root: Path) -> list[str]:
    """The channels under ``root`` still in the old layout, those of the tracks included."""
    return [name for name in channels.channel_dirs(root) if is_legacy(root, name)]


def refuse_legacy(root: Path, name: str) -> None:
    """A ``ChannelError`` where channel ``name`` of the tree at ``root`` is in the old layout."""
    if is_legacy(root, name):
        raise ChannelError(
            f"{root}: channel {name} is in the layout of an earlier wheelmill ({name}/{FILES}/ beside its pages)",
            fix=f"run `wheelmill index migrate` once (WHEELMILL_INDEX_ROOT={root}); it is served as it is meanwhile",
        )


def migrate(root: Path, *, on_channel: Callable[[Migrated], None] = lambda _m: None) -> list[Migrated]:
    """Every old-layout channel under ``root`` written again as objects of the same tree."""
    done = []
    for name in legacy_channels(root):
        done.append(_migrate_channel(root, name))
        on_channel(done[-1])
    for name in channels.channel_dirs(root):
        _drop_leftovers(root / name)
    return done


def _migrate_channel(root: Path, name: str) -> Migrated:
    old = channels.Channel(root, name)
    channel = ObjectChannel(TreeStorage(root), name)
    projects = list(old.projects()) if old.exists() else []
    for project in projects:
        for entry in project.files:
            _migrate_file(channel, old, project.name, entry)
        objects.render_project(channel, project.name, from_entries=True)
    objects.render_root(channel)
    problems = objects.verify(channel, hashes=False)
    if problems:
        raise ChannelError(
            f"{root}: channel {name} after its migration: {'; '.join(problems[:3])}",
            fix=f"the old files are still in {name}/{FILES}/: see `wheelmill index verify`, then migrate again",
        )
    (old.path / FILES).rename(old.path / _RETIRED)
    return Migrated(channel=name, projects=len(projects), files=sum(len(p.files) for p in projects))


def _migrate_file(channel: ObjectChannel, old: channels.Channel, project: str, entry: FileEntry) -> None:
    """One listed file as objects: its bytes and sidecar (other names of the old ones), its
    provenance, then its entry, keys and yank; each made once, so a second run skips it."""
    storage = channel.storage
    assert isinstance(storage, TreeStorage)
    prefix = channel.entries(project, entry.filename)
    kind = BUILT if entry.built else MIRRORED
    blob, files = blob_key(entry.sha256, entry.filename), f"{old.name}/{FILES}/{entry.filename}"
    for suffix in ("", ".metadata"):
        if storage.local(f"{blob}{suffix}") is None:
            storage.copy(f"{files}{suffix}", f"{blob}{suffix}")
    if storage.get(f"{prefix}{kind}") is None:
        provenance = _provenance(storage, files, entry)
        storage.create(f"{prefix}{kind}", objects.entry_bytes(project, entry, provenance=provenance))
    for key in entry.build_keys:
        storage.create(f"{prefix}{KEYS}/{key}", b"")
    if entry.yanked is not None and storage.get(f"{prefix}{YANKED}") is None:
        storage.create(f"{prefix}{YANKED}", entry.yanked.encode())


def _provenance(storage: TreeStorage, files: str, entry: FileEntry) -> str | None:
    """The old file's provenance as a blob of its own bytes; its sha256 (None: it had none)."""
    if entry.provenance is None:
        return None
    found = storage.get(f"{files}{PROVENANCE}")
    if found is None:
        raise ChannelError(
            f"{storage.location}: {files}: listed with a provenance that is not there",
            fix="publish the file again with its provenance, or remove it, then migrate again",
        )
    return objects.put_provenance(storage, entry.filename, found.data)


def _drop_leftovers(path: Path) -> None:
    """What the old channel code kept beside the pages: its work directories, the retired
    files, and every generation of pages but the one ``simple`` links to."""
    if (path / FILES).is_dir():
        return
    for name in _LEFT:
        leftover = path / name
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink(missing_ok=True)
    current = (path / "simple").readlink().name if (path / "simple").is_symlink() else None
    for generation in path.glob(f"{channels.GENERATION}*"):
        if generation.name != current:
            shutil.rmtree(generation)
