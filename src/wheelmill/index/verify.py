"""Is a channel a valid index? Every page parses, HTML and JSON agree, every listed file
and sidecar exists with the hash and size the pages claim, and the project list names
every project. ``wheelmill index verify`` runs it; so do the tests after concurrent and
killed publishers."""

from __future__ import annotations

import hashlib
import html.parser
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from wheelmill.index import pages
from wheelmill.index.store import Channel
from wheelmill.net import sha256_of


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))


def verify(channel: Channel, *, hashes: bool = True) -> list[str]:
    """Every problem found (an empty list: the channel is valid)."""
    if not channel.exists():
        return [f"{channel.name}: no simple/index.json"]
    problems = list(_root(channel))
    for name in channel.project_names():
        problems += _project(channel, name, hashes=hashes)
    return problems


def leftovers(channel: Channel) -> list[Path]:
    """Temporary files that a finished (not killed) publisher should never leave."""
    return sorted(channel.tmp.iterdir()) if channel.tmp.is_dir() else []


def _root(channel: Channel) -> Iterator[str]:
    names = channel.project_names()
    on_disk = sorted(p.name for p in channel.simple.iterdir() if p.is_dir())
    if sorted(names) != on_disk:
        yield f"{channel.name}: the project list {sorted(names)} differs from the project pages {on_disk}"
    parser = _Anchors()
    parser.feed((channel.simple / "index.html").read_text(encoding="utf-8"))
    linked = sorted(urllib.parse.unquote(a["href"] or "").rstrip("/") for a in parser.anchors)
    if linked != sorted(names):
        yield f"{channel.name}: index.html links {linked}, index.json lists {sorted(names)}"


def _project(channel: Channel, name: str, *, hashes: bool) -> Iterator[str]:
    directory = channel.simple / name
    try:
        project = pages.parse_project_json((directory / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError) as exc:
        yield f"{channel.name}/{name}: index.json unreadable: {exc}"
        return
    parser = _Anchors()
    parser.feed((directory / "index.html").read_text(encoding="utf-8"))
    html_files = {urllib.parse.unquote((a["href"] or "").split("#")[0].rsplit("/", 1)[-1]): a for a in parser.anchors}
    if sorted(html_files) != sorted(f.filename for f in project.files):
        yield f"{channel.name}/{name}: index.html and index.json list different files"
    for entry in project.files:
        yield from _file(channel, entry, html_files.get(entry.filename), hashes=hashes)
    versions = json.loads((directory / "index.json").read_text(encoding="utf-8"))["versions"]
    if versions != project.versions:
        yield f"{channel.name}/{name}: versions {versions} do not match the files"


def _file(channel: Channel, entry: pages.FileEntry, anchor: dict[str, str | None] | None, *, hashes: bool) -> Iterator[str]:
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
    if anchor is not None and (anchor.get("href") or "").split("#sha256=")[-1] != entry.sha256:
        yield f"{where}: the HTML link carries another sha256"
