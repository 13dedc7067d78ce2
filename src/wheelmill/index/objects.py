"""A channel written as objects on any ``Storage`` (an S3 bucket, or a tree), by any number
of writers on any number of machines at once, with no lock of wheelmill's own:

    blobs/sha256/<hex>/<filename>                        a file's bytes, once for every channel
    blobs/sha256/<hex>/<filename>.metadata               its core metadata (PEP 658)
    blobs/sha256/<hex>/<filename>.intoto.jsonl           a signed provenance of a file of that name
                                                         (<hex>: the provenance's own sha256)
    <channel>/entries/<project>/<filename>/built.json    the listing of a file built here,
                                                         or mirrored.json: one mirrored; made once
    <channel>/entries/<project>/<filename>/keys/<key>    a build key it answers for; made once
    <channel>/entries/<project>/<filename>/yanked        its yank reason, while it is yanked
    <channel>/entries/<project>/<filename>/provenance    the sha256 of a provenance learnt after the
                                                         entry was made without one; made once
    <channel>/entries/<project>/<filename>/staged        the transaction it waits for, where one made it
    unlisted/commits/<transaction>                       a transaction's commit point; made once
    <channel>/simple/index.json, index.html              the project list
    <channel>/simple/<project>/index.json, index.html    a project's files

A writer writes the bytes, then the entry, then the pages: no page lists a file that is not
there, whatever request a writer dies after. The pages are a function of the entries alone
(``render_project``, ``render_root``), written by compare-and-swap: a renderer reads the
pages with their versions, then lists the entries, then replaces each page only where it is
still the version read, and starts again where it is not. So the last page written comes
from a listing taken after every entry whose writer had finished creating it, and racing
writers converge on the pages of every entry. A writer killed after its entry and before
the pages leaves the file unlisted until the next render of its project: the next publish
there, or ``wheelmill index render``. Blobs are never removed here: other channels and
tracks may name the same bytes; ``wheelmill.index.sweep`` deletes those no entry names.

A writer of several files that must appear together (a cell's release publish, a promotion)
makes them in one ``Staging``: each entry it makes is named ``staged`` by the transaction
first, and no page lists a staged entry until the transaction's commit point exists, one
object made once (``commit``); then its projects are rendered. A transaction has the same
name when run again, so a retry after a kill stages the same entries and commits them; a
refused one is rolled back (``roll_back``: its uncommitted entries removed, their names free
again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from wheelmill.errors import NAME_TAKEN_FIX, ChannelError, IndexConflict, IndexWriteError, WheelmillError
from wheelmill.files import Linked
from wheelmill.index import pages
from wheelmill.index.channels import (
    BLOBS_DIR,
    UNLISTED_DIR,
    Published,
    PublishOutcome,
    abi_of_wheel,
    agreeing,
    checked_channel,
    gpu_archs,
    now_rfc3339,
)
from wheelmill.index.pages import FileEntry, Project, agreement
from wheelmill.index.storage import Headers, Storage, Stored
from wheelmill.machine.net import sha256_of
from wheelmill.provenance.statement import SUFFIX as PROVENANCE
from wheelmill.wheel.wheelfile import check_record

BUILT, MIRRORED, KEYS, YANKED, LEARNT = "built.json", "mirrored.json", "keys", "yanked", "provenance"
STAGED = "staged"  # under a file's entry: the transaction whose commit lists it (Staging)
COMMITS = f"{UNLISTED_DIR}/commits/"  # each transaction's commit point, made once
IMMUTABLE = "public, max-age=31536000, immutable"
_IMMUTABLE_BYTES = Headers(content_type="application/octet-stream", cache_control=IMMUTABLE)
T = TypeVar("T")
RENDER_TRIES = 30  # renders of one page that another writer's change may interrupt
READERS = 16  # objects read at once where a render or a check meets many
TRASH = f"{UNLISTED_DIR}/trash/"  # where a sweep keeps a blob it is deleting (wheelmill.index.sweep)
SWEEP_WAIT = 60.0  # seconds a publish waits for a sweep's last look (one killed leaves its trash)


def page_cache(channel: str) -> str:
    """The release track's pages may be kept ten minutes; the test and nightly tracks' change
    with every build, so a client asks each time (the ETag makes that a 304)."""
    return "no-cache" if "/" in channel else "max-age=600, must-revalidate"


@dataclass(frozen=True, kw_only=True)
class Listed:
    """What the entries' keys say of one file, without reading an object."""

    kinds: frozenset[str] = frozenset()  # BUILT and/or MIRRORED
    keys: tuple[str, ...] = ()
    yanked: bool = False
    learnt: bool = False  # a provenance learnt after the entry was made (LEARNT)
    staged: bool = False  # made by a transaction, listed once it commits (STAGED)

    @property
    def kind(self) -> str | None:
        """Built beats mirrored: the listing of a file built here wins."""
        return BUILT if BUILT in self.kinds else (MIRRORED if MIRRORED in self.kinds else None)


class ObjectChannel:
    """One channel (``cu130``, ``test/cu130``) of an index on ``storage``."""

    def __init__(self, storage: Storage, name: str) -> None:
        self.storage = storage
        self.name = checked_channel(name)

    def __repr__(self) -> str:
        return f"ObjectChannel({self.storage.location!r}, {self.name!r})"

    def page_key(self, project: str | None, form: str) -> str:
        """``form``: json or html."""
        return "/".join((self.name, "simple", *([project] if project else []), f"index.{form}"))

    def entries(self, project: str | None = None, filename: str | None = None) -> str:
        """The prefix of the entries of the channel, a project, or one file."""
        return "/".join((self.name, "entries", *(x for x in (project, filename) if x))) + "/"

    def href(self, sha256: str, filename: str) -> str:
        """The blob, relative to a project page (``<channel>/simple/<project>/``)."""
        up = "../" * (self.name.count("/") + 3)
        return f"{up}{BLOBS_DIR}/sha256/{sha256}/{urllib.parse.quote(filename, safe='')}"

    @property
    def headers(self) -> Headers:
        return Headers(content_type=pages.JSON_TYPE, cache_control=page_cache(self.name))

    def exists(self) -> bool:
        return self.storage.get(self.page_key(None, "json")) is not None

    def project(self, name: str) -> Project | None:
        found = self.storage.get(self.page_key(canonicalize_name(name), "json"))
        return _parsed(found, pages.parse_project_json, f"{self.name}/{name}") if found else None

    def project_names(self) -> list[str]:
        found = self.storage.get(self.page_key(None, "json"))
        return _parsed(found, pages.parse_root_json, self.name) if found else []

    def projects(self) -> Iterator[Project]:
        return (p for p in (self.project(n) for n in self.project_names()) if p is not None)

    def listing(self, project: str, filename: str | None = None) -> dict[str, Listed]:
        """Every file of ``project`` its entries name (or only ``filename``), by the keys alone."""
        prefix = self.entries(project)
        found: dict[str, Listed] = {}
        for key in self.storage.keys_under(self.entries(project, filename)):
            filename, _, rest = key.removeprefix(prefix).partition("/")
            now = found.get(filename, Listed())
            if rest in (BUILT, MIRRORED):
                now = replace(now, kinds=now.kinds | {rest})
            elif rest == YANKED:
                now = replace(now, yanked=True)
            elif rest == LEARNT:
                now = replace(now, learnt=True)
            elif rest == STAGED:
                now = replace(now, staged=True)
            elif rest.startswith(f"{KEYS}/"):
                now = replace(now, keys=tuple(sorted({*now.keys, rest.removeprefix(f"{KEYS}/")})))
            found[filename] = now
        return found

    def fetch(self, entry: FileEntry, dest: Path) -> bool:
        """A listed file's bytes into ``dest``."""
        return self.storage.fetch(blob_key(entry.sha256, entry.filename), dest)

    def local_file(self, entry: FileEntry) -> Path | None:
        """A listed file as a file of this machine, where its storage keeps it as one (a
        tree's); None elsewhere, or where it is gone: a reader fetches it then."""
        return self.storage.local(blob_key(entry.sha256, entry.filename))


def blob_key(sha256: str, filename: str) -> str:
    return f"{BLOBS_DIR}/sha256/{sha256}/{filename}"


def _parsed(found: Stored, parse: Callable[[str], T], where: str) -> T:
    try:
        return parse(found.data.decode())
    except (ValueError, KeyError, TypeError) as exc:
        raise ChannelError(
            f"{where}: not a valid index page ({type(exc).__name__}: {str(exc)[:120]})",
            fix="run `wheelmill index render`: it writes the pages again from the entries",
        ) from None


def entry_bytes(project: str, entry: FileEntry, *, provenance: str | None = None) -> bytes:
    """What an entry object holds: the file's listing, but for what other objects say (its
    build keys, its yank) and where its bytes are (the channel's to say)."""
    data = {
        "project": project,
        "filename": entry.filename,
        "version": entry.version,
        "sha256": entry.sha256,
        "size": entry.size,
        "upload-time": entry.upload_time,
        "requires-python": entry.requires_python,
        "metadata-sha256": entry.metadata_sha256,
        "mirrored-from": entry.mirrored_from,
        "gpu-archs": entry.gpu_archs,
        "abi": entry.abi,
    }
    if provenance is not None:  # the sha256 of its blob: where it is depends on the channel's depth
        data["provenance-sha256"] = provenance
    return (json.dumps(data, indent=1) + "\n").encode()


def entry_of(data: bytes) -> FileEntry:
    found: dict[str, Any] = json.loads(data)
    return FileEntry(
        filename=found["filename"],
        version=found["version"],
        sha256=found["sha256"],
        size=found["size"],
        upload_time=found["upload-time"],
        requires_python=found["requires-python"],
        metadata_sha256=found["metadata-sha256"],
        mirrored_from=found["mirrored-from"],
        gpu_archs=found["gpu-archs"],
        abi=found["abi"],
    )


def provenance_sha256(data: bytes) -> str | None:
    """The sha256 of the provenance an entry object names; None: it names none."""
    found = json.loads(data).get("provenance-sha256")
    return None if found is None else str(found)


def read_all(storage: Storage, keys: Sequence[str]) -> dict[str, Stored | None]:
    if len(keys) < 4:
        return {key: storage.get(key) for key in keys}
    with ThreadPoolExecutor(READERS) as pool:
        return dict(zip(keys, pool.map(storage.get, keys), strict=True))


def _assembled(
    channel: ObjectChannel, project: str, listing: Mapping[str, Listed], known: Mapping[str, FileEntry]
) -> tuple[FileEntry, ...]:
    """The project's files from its entries: an entry the page lists already is taken from
    the page (entries never change), the others read; the keys and yanks from the listing."""
    waiting = uncommitted(channel, project, listing, known)
    kinds = {name: listed.kind for name, listed in listing.items() if listed.kind is not None and name not in waiting}

    def trusted(name: str) -> bool:
        page = known.get(name)
        return (
            page is not None
            and page.built == (kinds[name] == BUILT)
            and (page.provenance is not None or not listing[name].learnt)
        )

    reads = [f"{channel.entries(project, n)}{k}" for n, k in kinds.items() if not trusted(n)]
    reads += [f"{channel.entries(project, n)}{LEARNT}" for n in kinds if listing[n].learnt and not trusted(n)]
    reads += [f"{channel.entries(project, n)}{YANKED}" for n in kinds if listing[n].yanked]
    read = read_all(channel.storage, reads)
    files = []
    for name, kind in kinds.items():
        found = known[name] if trusted(name) else read.get(f"{channel.entries(project, name)}{kind}")
        base = _read_entry(channel, name, found.data) if isinstance(found, Stored) else found
        if base is None:  # removed since the listing
            continue
        learnt = read.get(f"{channel.entries(project, name)}{LEARNT}")
        if base.provenance is None and learnt is not None:
            base = replace(base, provenance=channel.href(learnt.data.decode().strip(), f"{name}{PROVENANCE}"))
        yank = read.get(f"{channel.entries(project, name)}{YANKED}")
        files.append(
            replace(
                base,
                yanked=yank.data.decode() if yank is not None else None,
                build_keys=listing[name].keys if kind == BUILT else (),
                href=channel.href(base.sha256, name),
            )
        )
    built_here = any(f.built for f in files)
    kept = [f for f in files if f.built or not built_here]  # built beats mirrored
    return tuple(sorted(kept, key=lambda f: (f.upload_time, f.filename)))


def uncommitted(
    channel: ObjectChannel, project: str, listing: Mapping[str, Listed], known: Mapping[str, FileEntry]
) -> dict[str, str]:
    """The project's staged entries whose transaction has not committed, with its name. One
    its page lists committed before (a page lists no other): it is not read again."""
    staged = [name for name, listed in listing.items() if listed.staged and name not in known]
    if not staged:
        return {}
    markers = read_all(channel.storage, [f"{channel.entries(project, name)}{STAGED}" for name in staged])
    waits = {
        name: found.data.decode() for name in staged if (found := markers[f"{channel.entries(project, name)}{STAGED}"])
    }
    committed = {name for name in set(waits.values()) if channel.storage.get(f"{COMMITS}{name}") is not None}
    return {name: transaction for name, transaction in waits.items() if transaction not in committed}


def _read_entry(channel: ObjectChannel, filename: str, data: bytes) -> FileEntry:
    provenance = provenance_sha256(data)
    href = None if provenance is None else channel.href(provenance, f"{filename}{PROVENANCE}")
    return replace(entry_of(data), provenance=href)


def _put_page(storage: Storage, key: str, now: Stored | None, data: bytes, headers: Headers) -> bool:
    """The page is ``data`` now: it was, or this write made it; False where another writer
    changed it since ``now`` was read."""
    if now is not None and now.data == data:
        return True
    if now is None:
        return storage.create(key, data, headers=headers)
    return storage.swap(key, data, version=now.version, headers=headers)


def _put_pair(
    channel: ObjectChannel, keys: Mapping[str, str], now: Mapping[str, Stored | None], json_page: str, html_page: str
) -> bool:
    """A page's two forms, JSON first, each compare-and-swapped against the version read."""
    headers = channel.headers
    return _put_page(channel.storage, keys["json"], now["json"], json_page.encode(), headers) and _put_page(
        channel.storage,
        keys["html"],
        now["html"],
        html_page.encode(),
        replace(headers, content_type="text/html; charset=utf-8"),
    )


def _converging(what: str, channel: ObjectChannel, attempt: Callable[[], bool]) -> None:
    """``attempt`` again until it writes over no other writer's change; each wait longer,
    and at random, so racing renderers fall apart."""
    for tries in range(RENDER_TRIES):
        if attempt():
            return
        time.sleep(random.uniform(0, min(1.0, 0.01 * 2**tries)))  # noqa: S311 - a pause, not a secret
    raise IndexWriteError(
        f"{channel.storage.location}: {channel.name}: {what} changed under each of {RENDER_TRIES} renders",
        fix=f"run `wheelmill index render --channel {channel.name}` once the other writers are done",
    )


def render_project(channel: ObjectChannel, project: str, *, from_entries: bool = False) -> Project:
    """The project's pages written from its entries (read the pages, then the entries, then
    compare-and-swap each page); what they list. ``from_entries``: every entry read, none
    taken from the page (a page another layout wrote)."""
    return _rendered(channel, project, from_entries=from_entries)[0]


def _rendered(channel: ObjectChannel, project: str, *, from_entries: bool = False) -> tuple[Project, dict[str, Listed]]:
    """The project's pages written, what they list, and the listing they were written from."""
    keys = {form: channel.page_key(project, form) for form in ("json", "html")}
    rendered: list[tuple[Project, dict[str, Listed]]] = []

    def attempt() -> bool:
        now = {form: channel.storage.get(key) for form, key in keys.items()}
        try:
            known = {f.filename: f for f in pages.parse_project_json(_text(now["json"])).files}
        except (ValueError, KeyError, TypeError):  # none yet, or damaged: every entry is read
            known = {}
        known = {} if from_entries else known
        listing = channel.listing(project)
        result = Project(name=project, files=_assembled(channel, project, listing, known))
        rendered[:] = [(result, listing)]
        return _put_pair(channel, keys, now, pages.project_json(result), pages.project_html(result))

    _converging(f"the pages of {project}", channel, attempt)
    return rendered[0]


def render_root(channel: ObjectChannel) -> list[str]:
    """The project list written from the projects that have entries; the names."""
    keys = {form: channel.page_key(None, form) for form in ("json", "html")}
    names: list[str] = []

    def attempt() -> bool:
        now = {form: channel.storage.get(key) for form, key in keys.items()}
        names[:] = channel.storage.children(channel.entries())
        return _put_pair(channel, keys, now, pages.root_json(names), pages.root_html(names))

    _converging("the project list", channel, attempt)
    return list(names)


def _listed(channel: ObjectChannel, project: str) -> dict[str, Listed]:
    """The project's pages, and the project list: each rendered, and written only where it
    differs. Both, and both forms of each, every time: a writer killed between its JSON page
    and its HTML one leaves the JSON listing the file and the HTML not, and only a render
    mends that (the same publish again, as a job's retry does, included)."""
    _project, listing = _rendered(channel, project)
    render_root(channel)
    return listing


def publish(
    channel: ObjectChannel,
    wheel: Path,
    *,
    upload_time: str | None = None,
    mirrored_from: str | None = None,
    sha256: str | None = None,
    build_key: str | None = None,
    provenance: bytes | None = None,
    handed_over: bool = False,
    staging: Staging | None = None,
) -> Published:
    """Add ``wheel`` to ``channel`` (immutable files, built beats mirrored, build keys learnt,
    a provenance learnt by a file listed without one), as objects: the bytes, the entry, the
    pages, each made once or swapped, never locked. ``handed_over``: the file is the index's
    to keep (a download made for it), so a tree stores it as another name, not a copy. In a
    ``staging``, a new entry is listed once the staging commits."""
    info = agreeing(wheel)
    kind = MIRRORED if mirrored_from is not None else BUILT
    if kind == BUILT:  # a mirrored file's bytes are its lock's: pinned by sha256, as its upstream made them
        check_record(wheel, info)
    sha256 = sha256 or sha256_of(wheel)
    there = channel.listing(info.name, wheel.name).get(wheel.name, Listed())

    def done(outcome: PublishOutcome, replaced: Sequence[str] = ()) -> Published:
        return Published(
            channel=channel.name, project=info.name, filename=wheel.name, outcome=outcome, replaced=tuple(replaced)
        )

    if there.kind is not None:
        _same_bytes(channel, info.name, wheel.name, there.kind, sha256)
    if kind == MIRRORED and _built_here(channel, info.name):
        return done(PublishOutcome.BUILT_HERE)
    entry = FileEntry(
        filename=wheel.name,
        version=str(info.version),
        sha256=sha256,
        size=wheel.stat().st_size,
        upload_time=upload_time or now_rfc3339(),
        requires_python=info.requires_python,
        metadata_sha256=hashlib.sha256(info.metadata).hexdigest(),
        mirrored_from=mirrored_from,
        gpu_archs=gpu_archs(info) if kind == BUILT else None,
        abi=abi_of_wheel(wheel) if kind == BUILT else None,
    )
    source = Linked(wheel) if handed_over else wheel
    if staging is not None:
        staging.stage(channel, info.name, wheel.name, new=kind not in there.kinds)
    made = kind not in there.kinds and _put_file(
        channel, source, info.metadata, project=info.name, entry=entry, kind=kind, provenance=provenance
    )
    if not made and provenance is not None and not there.learnt:
        _learn_provenance(channel, info.name, wheel.name, kind, provenance)
    learnt = build_key is not None and build_key not in there.keys
    if learnt and build_key is not None:
        channel.storage.create(f"{channel.entries(info.name, wheel.name)}{KEYS}/{build_key}", b"")
    listing = _listed(channel, info.name)
    _keep_bytes(channel, source, info.metadata, sha256, provenance if made else None)
    replaced = _drop_mirrored(channel, info.name, listing) if kind == BUILT else []
    return done(PublishOutcome.ADDED if made else PublishOutcome.UNCHANGED, replaced)


def _same_bytes(channel: ObjectChannel, project: str, filename: str, kind: str, sha256: str) -> None:
    """A published name keeps its bytes: other bytes under it are refused (exit 14)."""
    found = channel.storage.get(f"{channel.entries(project, filename)}{kind}")
    listed = entry_of(found.data).sha256 if found is not None else sha256
    if listed != sha256:
        raise IndexConflict(
            f"{channel.name}: {filename} is already published with other bytes "
            f"(sha256 {listed[:16]}..., this one {sha256[:16]}...)",
            fix=NAME_TAKEN_FIX,
        )


def _put_file(
    channel: ObjectChannel,
    wheel: Path | Linked,
    metadata: bytes,
    *,
    project: str,
    entry: FileEntry,
    kind: str,
    provenance: bytes | None = None,
) -> bool:
    """The bytes and the sidecars (each once, wherever other channels have them already), then
    the entry; False where another writer made the same entry first."""
    _put_bytes(channel, wheel, metadata, entry.sha256)
    key = f"{channel.entries(project, entry.filename)}{kind}"
    if channel.storage.create(
        key, entry_bytes(project, entry, provenance=_put_provenance(channel, entry.filename, provenance))
    ):
        return True
    _same_bytes(channel, project, entry.filename, kind, entry.sha256)  # a racing writer's: the same bytes, or refused
    return False


def _keep_bytes(
    channel: ObjectChannel, wheel: Path | Linked, metadata: bytes, sha256: str, provenance: bytes | None
) -> None:
    """The file's bytes, sidecar and provenance there when the publish returns: a sweep that
    is deleting them as unnamed (a copy in its trash) is waited for, and what it took is
    stored again (``wheelmill.index.sweep``)."""
    name = _name(wheel)
    folder = blob_key(sha256, name).rpartition("/")[0] + "/"
    waited = time.monotonic() + SWEEP_WAIT
    while channel.storage.keys_under(f"{TRASH}{folder}") and time.monotonic() < waited:
        time.sleep(0.05)
    _put_bytes(channel, wheel, metadata, sha256)
    _put_provenance(channel, name, provenance)


def _name(wheel: Path | Linked) -> str:
    return (wheel.source if isinstance(wheel, Linked) else wheel).name


def _put_bytes(channel: ObjectChannel, wheel: Path | Linked, metadata: bytes, sha256: str) -> None:
    """The file's bytes and its sidecar, each stored where it is not yet (other channels
    may have it already): one listing of the blob's folder, then what is missing."""
    blob = blob_key(sha256, _name(wheel))
    there = set(channel.storage.keys_under(blob.rpartition("/")[0] + "/"))
    if blob not in there:
        channel.storage.create(blob, wheel, headers=_IMMUTABLE_BYTES)
    if f"{blob}.metadata" not in there:
        channel.storage.create(f"{blob}.metadata", metadata, headers=_IMMUTABLE_BYTES)


def _put_provenance(channel: ObjectChannel, filename: str, provenance: bytes | None) -> str | None:
    """A provenance as a blob of its own bytes (before the entry that names it); its sha256."""
    return None if provenance is None else put_provenance(channel.storage, filename, provenance)


def put_provenance(storage: Storage, filename: str, provenance: bytes) -> str:
    """The provenance of a file named ``filename`` stored as a blob, where it is not yet; its sha256."""
    sha256 = hashlib.sha256(provenance).hexdigest()
    key = blob_key(sha256, f"{filename}{PROVENANCE}")
    if storage.get(key) is None:
        storage.create(key, provenance, headers=_IMMUTABLE_BYTES)
    return sha256


def _learn_provenance(channel: ObjectChannel, project: str, filename: str, kind: str, provenance: bytes) -> None:
    """The same bytes published again with a provenance, where the entry names none: the
    provenance is stored, then named beside the entry (made once: the first one learnt
    stays), so that a build that signs later is not listed unsigned for good."""
    found = channel.storage.get(f"{channel.entries(project, filename)}{kind}")
    if found is None or provenance_sha256(found.data) is not None:
        return
    sha256 = _put_provenance(channel, filename, provenance)
    channel.storage.create(f"{channel.entries(project, filename)}{LEARNT}", f"{sha256}\n".encode())


def provenance_of(channel: ObjectChannel, entry: FileEntry) -> bytes | None:
    """The provenance a listed file's entry names; None where it names none."""
    if entry.provenance is None:
        return None
    sha256 = entry.provenance.rsplit("/", 2)[-2]
    found = channel.storage.get(blob_key(sha256, f"{entry.filename}{PROVENANCE}"))
    return None if found is None else found.data


def _built_here(channel: ObjectChannel, project: str) -> bool:
    """Whether the project's page lists a file built here (a mirrored file is not added then;
    one added in a race with the first build is never listed: built beats mirrored)."""
    try:
        page = channel.project(project)
    except ChannelError:  # a damaged page: the render after the entry mends it
        return False
    return page is not None and any(f.built for f in page.files)


def _drop_mirrored(channel: ObjectChannel, project: str, listing: Mapping[str, Listed]) -> list[str]:
    """The mirrored entries of a project built here, after its pages stopped listing them (by
    the listing they were rendered from; one a racing mirror adds later is never listed)."""
    gone = []
    for filename, listed in listing.items():
        if MIRRORED in listed.kinds:
            channel.storage.delete(f"{channel.entries(project, filename)}{MIRRORED}")
            gone.append(filename)
    return gone


def set_yanked(channel: ObjectChannel, project_name: str, version: str, reason: str | None) -> list[str]:
    """Yank (``reason`` a string, maybe empty) or unyank (None) every file of a version."""
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise ChannelError(
            f"'{version}' is not a version", fix="give the version as the index lists it (`wheelmill index list`)"
        ) from None
    project = channel.project(project_name)
    if project is None:
        raise ChannelError(
            f"{channel.name}: no project '{project_name}'",
            fix=f"`wheelmill index list --channel {channel.name}` shows what is there",
        )
    hits = [f for f in project.files if Version(f.version) == wanted]
    if not hits:
        raise ChannelError(
            f"{channel.name}: {project.name} has no version {version}",
            fix=f"published versions: {', '.join(project.versions)}",
        )
    for entry in hits:
        _set_yank(channel.storage, f"{channel.entries(project.name, entry.filename)}{YANKED}", reason)
    render_project(channel, project.name)
    return [f.filename for f in hits]


def _set_yank(storage: Storage, key: str, reason: str | None) -> None:
    if reason is None:
        storage.delete(key)
        return
    data = reason.encode()
    for _ in range(RENDER_TRIES):
        now = storage.get(key)
        if now is not None and now.data == data:
            return
        if storage.create(key, data) if now is None else storage.swap(key, data, version=now.version):
            return
    raise IndexWriteError(f"{storage.location}: {key} changed under each try", fix="yank it again")


def remove_files(channel: ObjectChannel, project_name: str, filenames: Collection[str]) -> list[str]:
    """Drop these files of a project (a nightly track's retention): their entries, then the
    pages; their bytes stay, as other channels may list them."""
    project = canonicalize_name(project_name)
    listing = channel.listing(project)
    # A page still listing a file whose entry is gone: a remover killed before its render.
    gone = sorted(name for name in filenames if name in listing or name in _on_the_page(channel, project))
    for filename in gone:
        for key in channel.storage.keys_under(channel.entries(project, filename)):
            channel.storage.delete(key)
    # Rendered whatever was found: a remover killed between the two forms of a page left the
    # other one listing what is gone, and only a render mends that (the same remove again).
    render_project(channel, project)
    render_root(channel)
    if not channel.storage.keys_under(channel.entries(project)):
        _drop_pages(channel, project)
    return gone


def _on_the_page(channel: ObjectChannel, project: str) -> set[str]:
    """The files the project's page lists (none where it has no readable page)."""
    try:
        found = channel.project(project)
    except ChannelError:
        return set()
    return {f.filename for f in found.files} if found is not None else set()


def _drop_pages(channel: ObjectChannel, project: str) -> None:
    """A project without files leaves the index: its pages go after the list stopped naming
    it; where a publisher made an entry meanwhile, its pages are rendered again."""
    for form in ("json", "html"):
        channel.storage.delete(channel.page_key(project, form))
    if channel.storage.keys_under(channel.entries(project)):
        render_project(channel, project)
        render_root(channel)


def render(channel: ObjectChannel) -> list[str]:
    """Every project's pages and the project list written again from the entries (what a
    scheduled job, or anyone after a writer died, runs); what changed, in words."""
    before = {p.name: {f.filename for f in p.files} for p in _readable_projects(channel)}
    names = channel.storage.children(channel.entries())
    said = []
    for name in names:  # the projects' pages before the list that links them: no link leads nowhere
        now = {f.filename for f in render_project(channel, name).files}
        said += [f"{name}: listed {f} (unlisted before)" for f in sorted(now - before.get(name, set()))]
        said += [f"{name}: no longer lists {f} (its entry is gone)" for f in sorted(before.get(name, set()) - now)]
    names = render_root(channel)
    for gone in sorted(set(before) - set(names)):  # every entry of the project removed
        _drop_pages(channel, gone)
        said.append(f"{gone}: removed its pages (it has no files)")
    return said


def _readable_projects(channel: ObjectChannel) -> Iterator[Project]:
    """Every project that has pages, listed or not, whose JSON page reads (a damaged one as
    a project without files)."""
    for name in channel.storage.children(f"{channel.name}/simple/"):
        found: Project | None = Project(name=name, files=())
        with contextlib.suppress(ChannelError):
            found = channel.project(name)
        if found is not None:
            yield found


def verify(channel: ObjectChannel, *, hashes: bool = True) -> list[str]:
    """Every problem found (none: the channel is a valid index): the pages parse and agree,
    every listed file and sidecar is stored (with the listed sha256 where ``hashes``), and
    every entry is listed."""

    root = {form: channel.storage.get(channel.page_key(None, form)) for form in ("json", "html")}
    if root["json"] is None:
        return [f"{channel.name}: no simple/index.json"]
    try:
        names = channel.project_names()
    except ChannelError as exc:
        return [exc.message]
    problems = []
    with_entries = channel.storage.children(channel.entries())
    if sorted(names) != with_entries:
        problems.append(f"{channel.name}: the project list {sorted(names)} differs from the projects {with_entries}")
    linked = sorted(urllib.parse.unquote(a["href"] or "").rstrip("/") for a in pages.links(_text(root["html"])))
    if linked != sorted(names):
        problems.append(f"{channel.name}: index.html links {linked}, index.json lists {sorted(names)}")
    for name in names:
        problems += _project_problems(channel, name, agreement, hashes=hashes)
    return problems


def _text(found: Stored | None) -> str:
    return found.data.decode(errors="replace") if found is not None else ""


def _project_problems(
    channel: ObjectChannel, name: str, agreement: Callable[..., Iterator[str]], *, hashes: bool
) -> list[str]:
    where = f"{channel.name}/{name}"
    try:
        project = channel.project(name)
    except ChannelError as exc:
        return [exc.message]
    if project is None:
        return [f"{where}: listed but has no index.json"]
    problems = []
    anchors = {
        urllib.parse.unquote((a["href"] or "").split("#")[0].rsplit("/", 1)[-1]): a
        for a in pages.links(_text(channel.storage.get(channel.page_key(name, "html"))))
    }
    if sorted(anchors) != sorted(f.filename for f in project.files):
        problems.append(f"{where}: index.html and index.json list different files")
    listing = channel.listing(name)
    shown = {f.filename for f in project.files}
    unlisted = sorted(n for n, listed in listing.items() if listed.kind is not None and n not in shown)
    built_here = any(f.built for f in project.files)
    unlisted = [n for n in unlisted if listing[n].kind == BUILT or not built_here]
    waiting = uncommitted(channel, name, listing, {f.filename: f for f in project.files})  # the unlisted alone
    problems += [
        f"{channel.name}/{n}: staged by {waiting[n]}, not committed: that publish or promotion run again lists it"
        if n in waiting
        else f"{channel.name}/{n}: not listed (an interrupted publish): `wheelmill index render` lists it"
        for n in unlisted
    ]
    for entry in project.files:
        problems += list(agreement(f"{channel.name}/{entry.filename}", entry, anchors.get(entry.filename)))
    with ThreadPoolExecutor(READERS) as pool:
        for found in pool.map(lambda e: _stored_problems(channel, e, hashes=hashes), project.files):
            problems += found
    return problems


def verify_file(channel: ObjectChannel, entry: FileEntry, *, hashes: bool = False) -> list[str]:
    """A listed file's blob and sidecar are stored, the sidecar with the listed hash (the
    blob's key is its sha256); with ``hashes``, its bytes read and hashed too."""
    return _stored_problems(channel, entry, hashes=hashes)


def _stored_problems(channel: ObjectChannel, entry: FileEntry, *, hashes: bool) -> list[str]:
    where = f"{channel.name}/{entry.filename}"
    blob = blob_key(entry.sha256, entry.filename)
    there = set(channel.storage.keys_under(blob.rpartition("/")[0] + "/"))
    if blob not in there or f"{blob}.metadata" not in there:
        return [f"{where}: listed but the file or its .metadata is missing"]
    sidecar = channel.storage.get(f"{blob}.metadata")
    if sidecar is None or hashlib.sha256(sidecar.data).hexdigest() != entry.metadata_sha256:
        return [f"{where}: .metadata sha256 differs from the page"]
    if not hashes:
        return []
    local = channel.storage.local(blob)
    if local is not None:  # a tree's file, read where it lies
        return _bytes_problems(where, local, entry)
    with tempfile.TemporaryDirectory(prefix="wheelmill-verify-") as scratch:
        copy = Path(scratch) / "file"
        if not channel.storage.fetch(blob, copy):
            return [f"{where}: listed but the file is missing"]
        return _bytes_problems(where, copy, entry)


def _bytes_problems(where: str, path: Path, entry: FileEntry) -> list[str]:
    if sha256_of(path) != entry.sha256:
        return [f"{where}: sha256 differs from the page"]
    if path.stat().st_size != entry.size:
        return [f"{where}: size {path.stat().st_size}, the page says {entry.size}"]
    return []


def promote_file(
    source: ObjectChannel,
    target: ObjectChannel,
    project: str,
    filename: str,
    *,
    provenance: bytes | None = None,
    staging: Staging | None = None,
) -> Published:
    """A file of ``source`` listed in ``target`` too, as the same bytes: its entry copied
    server-side (the blob is the same object; no byte passes through this machine), then the
    target's pages; with ``provenance`` (the source's, and a promotion's statement after it),
    its entry written anew to name it. A mirrored file is not added where the target has the
    project built."""
    kind = source.listing(project).get(filename, Listed()).kind
    if kind is None:
        raise ChannelError(
            f"{source.name}: {filename} has no entry to promote", fix="publish it again, or `wheelmill index render`"
        )
    found = source.storage.get(f"{source.entries(project, filename)}{kind}")
    sha256 = entry_of(found.data).sha256 if found is not None else ""
    listing = target.listing(project)
    there = listing.get(filename, Listed())

    def done(outcome: PublishOutcome) -> Published:
        return Published(channel=target.name, project=project, filename=filename, outcome=outcome)

    if there.kind is not None:
        _same_bytes(target, project, filename, there.kind, sha256)
    if kind == MIRRORED and any(listed.kind == BUILT for listed in listing.values()):
        return done(PublishOutcome.BUILT_HERE)
    if provenance is None and source.listing(project, filename)[filename].learnt:
        provenance = _learnt_provenance(source, project, filename)  # the entry copied alone would not name it
    if staging is not None:
        staging.stage(target, project, filename, new=kind not in there.kinds)
    made = kind not in there.kinds and _copy_entry(source, target, project, filename, kind=kind, provenance=provenance)
    _listed(target, project)
    return done(PublishOutcome.ADDED if made else PublishOutcome.UNCHANGED)


def _copy_entry(
    source: ObjectChannel, target: ObjectChannel, project: str, filename: str, *, kind: str, provenance: bytes | None
) -> bool:
    at, to = f"{source.entries(project, filename)}{kind}", f"{target.entries(project, filename)}{kind}"
    if provenance is None:
        return target.storage.copy(at, to)
    found = source.storage.get(at)
    if found is None:
        return False
    sha256 = _put_provenance(target, filename, provenance)
    return target.storage.create(to, entry_bytes(project, entry_of(found.data), provenance=sha256))


def _learnt_provenance(channel: ObjectChannel, project: str, filename: str) -> bytes | None:
    """The provenance a file learnt after its entry was made, as bytes."""
    found = channel.storage.get(f"{channel.entries(project, filename)}{LEARNT}")
    if found is None:
        return None
    stored = channel.storage.get(blob_key(found.data.decode().strip(), f"{filename}{PROVENANCE}"))
    return None if stored is None else stored.data


@dataclass
class Staging:
    """One transaction: files of several projects and channels of one index, listed together
    once it commits. ``name`` is the same on every run of the same work (a cell's release
    publish, a promotion), so a retry stages what a killed run staged, and commits it."""

    name: str
    touched: dict[tuple[str, str], ObjectChannel] = field(default_factory=dict)  # (channel, project)

    def stage(self, channel: ObjectChannel, project: str, filename: str, *, new: bool) -> None:
        """Before a file's entry is made (``new``): the entry named as this transaction's. An
        entry made already is listed as it is (by its own transaction, or by none)."""
        self.touched[(channel.name, str(canonicalize_name(project)))] = channel
        if not new:
            return
        key, name = f"{channel.entries(project, filename)}{STAGED}", self.name.encode()
        if channel.storage.create(key, name):
            return
        found = channel.storage.get(key)  # a transaction killed before it made the entry, or this one's
        if found is not None and found.data != name:
            channel.storage.swap(key, name, version=found.version)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        """Committed where the block ended, else rolled back (a refusal, Ctrl-C). A roll-back
        that fails itself (the storage gone) leaves the staged entries unlisted, and the
        block's error stands."""
        if kind is None:
            self.commit()
            return
        with contextlib.suppress(WheelmillError, OSError):
            self.roll_back()

    @property
    def commit_key(self) -> str:
        return f"{COMMITS}{self.name}"

    def commit(self) -> None:
        """The commit point, then the pages of every project the transaction touched."""
        channels = list(self.touched.values())
        if channels:
            channels[0].storage.create(self.commit_key, json.dumps({"committed": now_rfc3339()}).encode())
        for (_name, project), channel in sorted(self.touched.items(), key=lambda item: item[0]):
            _listed(channel, project)

    def roll_back(self) -> list[str]:
        """A transaction that will not commit: each entry it staged removed (its name free
        for other bytes again), the pages rendered; the files removed, as channel/filename.
        A committed one is left as it is."""
        channels = list(self.touched.values())
        if not channels or channels[0].storage.get(self.commit_key) is not None:
            return []
        removed = []
        for (_name, project), channel in sorted(self.touched.items(), key=lambda item: item[0]):
            mine = [f for f, t in uncommitted(channel, project, channel.listing(project), {}).items() if t == self.name]
            removed += [f"{channel.name}/{filename}" for filename in remove_files(channel, project, mine)]
        return removed
