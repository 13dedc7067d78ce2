"""A channel of an index tree as the tests read it: the one channel code
(``wheelmill.index.objects``) on a ``TreeStorage``, with the paths a test looks at."""

from __future__ import annotations

from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from wheelmill.index.objects import ObjectChannel, blob_key
from wheelmill.index.roots import Index


def tree_channel(root: Path, name: str) -> ObjectChannel:
    """Channel ``name`` of the index tree at ``root``."""
    return Index(tree=root).channel(name)


def pages_dir(channel: ObjectChannel) -> Path:
    """Where a tree channel's pages are: ``<root>/<channel>/simple``."""
    return Path(channel.storage.location) / channel.name / "simple"


def stored_file(channel: ObjectChannel, filename: str) -> Path:
    """Where a tree keeps the bytes of a listed file (its blob); the file need not be there."""
    project = channel.project(str(canonicalize_name(parse_wheel_filename(filename)[0])))
    entry = next((f for f in project.files if f.filename == filename), None) if project else None
    assert entry is not None, f"{channel.name}: {filename} is not listed"
    return Path(channel.storage.location) / blob_key(entry.sha256, filename)
