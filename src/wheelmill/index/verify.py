"""Is a channel a valid index? Every page parses, HTML and JSON agree, every listed file
and sidecar exists with the hash and size the pages claim, and the project list names
every project. ``wheelmill index verify`` runs it; so do the tests after concurrent and
killed publishers. A damaged tree is a list of problems, never an exception."""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from wheelmill.errors import IndexStoreError
from wheelmill.files import target_of
from wheelmill.index import pages
from wheelmill.index.store import Channel
from wheelmill.machine.net import sha256_of


def verify(channel: Channel, *, hashes: bool = True) -> list[str]:
    """Every problem found (an empty list: the channel is valid)."""
    if not channel.exists():
        return [f"{channel.name}: no simple/index.json"]
    try:
        names = channel.project_names()
    except IndexStoreError as exc:
        return [exc.message]
    problems = list(_root(channel, names))
    for name in names:
        problems += _project(channel, name, hashes=hashes)
    return problems


def leftovers(channel: Channel) -> list[str]:
    """What temporary files say: an interrupted write of which file, and generations of pages
    a killed writer left (the next writer of the channel, or ``wheelmill index repair``,
    removes them; readers never see them)."""
    found = sorted(channel.tmp.iterdir()) if channel.tmp.is_dir() else []
    notes = [f"{path.name}, of an interrupted write of {target_of(path)}" for path in found]
    return notes + [f"{path.name}, pages of an interrupted write" for path in channel.stale_generations()]


def _anchors(page: Path) -> list[dict[str, str | None]] | None:
    try:
        return pages.links(page.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _root(channel: Channel, names: list[str]) -> Iterator[str]:
    # a project has pages, or is none
    on_disk = sorted(p.name for p in channel.simple.iterdir() if (p / "index.json").is_file())
    if sorted(names) != on_disk:
        yield f"{channel.name}: the project list {sorted(names)} differs from the project pages {on_disk}"
    anchors = _anchors(channel.simple / "index.html")
    if anchors is None:
        yield f"{channel.name}: simple/index.html is missing or unreadable"
        return
    linked = sorted(urllib.parse.unquote(a["href"] or "").rstrip("/") for a in anchors)
    if linked != sorted(names):
        yield f"{channel.name}: index.html links {linked}, index.json lists {sorted(names)}"


def _project(channel: Channel, name: str, *, hashes: bool) -> Iterator[str]:
    directory = channel.simple / name
    try:
        text = (directory / "index.json").read_text(encoding="utf-8")
        project = pages.parse_project_json(text)
        versions = json.loads(text)["versions"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        yield f"{channel.name}/{name}: index.json unreadable: {exc}"
        return
    anchors = _anchors(directory / "index.html")
    if anchors is None:
        yield f"{channel.name}/{name}: index.html is missing or unreadable"
    html_files = {urllib.parse.unquote((a["href"] or "").split("#")[0].rsplit("/", 1)[-1]): a for a in anchors or []}
    if anchors is not None and sorted(html_files) != sorted(f.filename for f in project.files):
        yield f"{channel.name}/{name}: index.html and index.json list different files"
    for entry in project.files:
        yield from _file(channel, entry, html_files.get(entry.filename), hashes=hashes)
    if versions != project.versions:
        yield f"{channel.name}/{name}: versions {versions} do not match the files"


def _file(
    channel: Channel, entry: pages.FileEntry, anchor: dict[str, str | None] | None, *, hashes: bool
) -> Iterator[str]:
    where = f"{channel.name}/{entry.filename}"
    path = channel.files / entry.filename
    sidecar = channel.files / f"{entry.filename}.metadata"
    if not path.is_file() or not sidecar.is_file():
        yield f"{where}: listed but the file or its .metadata is missing"
        return
    if path.stat().st_size != entry.size:
        yield f"{where}: size {path.stat().st_size}, the page says {entry.size}"
    if hashes and sha256_of(path) != entry.sha256:
        yield f"{where}: sha256 differs from the page"
    if hashlib.sha256(sidecar.read_bytes()).hexdigest() != entry.metadata_sha256:
        yield f"{where}: .metadata sha256 differs from the page"
    yield from agreement(where, entry, anchor)


def agreement(where: str, entry: pages.FileEntry, anchor: dict[str, str | None] | None) -> Iterator[str]:
    """What the HTML link of a file says that its JSON listing does not."""
    if anchor is None:
        return
    if (anchor.get("href") or "").split("#sha256=")[-1] != entry.sha256:
        yield f"{where}: the HTML link carries another sha256"
    if anchor.get("data-gpu-archs") != entry.gpu_archs:
        yield f"{where}: the HTML link and the JSON page show different GPU archs"
    if anchor.get("data-abi") != entry.abi:
        yield f"{where}: the HTML link and the JSON page show different ABIs"
    if pages.build_keys_of(anchor.get("data-build-keys")) != entry.build_keys:
        yield f"{where}: the HTML link and the JSON page show different build keys"
    if anchor.get("data-yanked") != entry.yanked:
        yield f"{where}: the HTML link and the JSON page show different yanks"
