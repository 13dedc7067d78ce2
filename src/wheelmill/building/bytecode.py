"""Compiled bytecode kept by its source's sha256, for every env that holds the same source.

The first ``import torch`` in a fresh env compiles some 900 of torch's modules, which takes
longer than the import itself (3.8 s against 1.5 s here), and every cell makes fresh envs:
the build env, whose frontend imports torch, and a test env per recipe, whose import probe
and smoke command import it again (with pytest and sympy). The store
(``<output>/.cache/bytecode/<cache tag>/<sha256>.pyc``) keeps what an env compiled under the
sha256 its RECORD gives the source (the same locked wheel, whatever the env), and lends it to
the next env that holds a source with that sha256: the build env of the next run or cell
of the same Python, the test envs after a build.

Nothing here can change what runs. A module is kept only where its compiled file is current
for its source (the mtime and size in its header) and the source's bytes have the recorded
sha256; it is lent only to a source whose bytes have that sha256 too, with the header
rewritten to that source's mtime and size, as the interpreter would have written it. The
interpreter still checks each compiled file against its source and compiles again what does
not match (another Python's magic number). Files are written as the interpreter writes its
own: to a temporary name, then renamed.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path

from wheelmill.wheel.wheelfile import record_hash

HEADER = 16  # magic, flags, source mtime, source size (PEP 552)
DIGEST = re.compile(r"[A-Za-z0-9_-]{43}")  # a sha256 as RECORD writes it: urlsafe base64, unpadded


def recorded_sources(site: Path) -> dict[str, str]:
    """``path -> hash`` of every Python source that a RECORD of ``site`` lists with its
    sha256, the path relative to ``site`` (``torch/nn/__init__.py``); what lies outside it
    (scripts) is left out. The standard library finds the RECORDs; their rows are read here
    as plain CSV, since a ``PackagePath`` for each of torch's 15,000 files took 0.2 s a
    site, several times a recipe."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        try:
            rows = list(csv.reader((dist.read_text("RECORD") or "").splitlines()))
        except (UnicodeDecodeError, ValueError, csv.Error):
            continue  # an unreadable RECORD keeps and lends nothing
        for row in rows:
            path, digest = (row[0], row[1]) if len(row) >= 2 else ("", "")
            value = digest.removeprefix("sha256=")
            if (
                path.endswith(".py")
                and DIGEST.fullmatch(value)
                and not path.startswith("/")
                and ".." not in path.split("/")
            ):
                found[path] = value  # the store's file name: nothing else gets through
    return found


@dataclass(frozen=True)
class BytecodeStore:
    root: Path  # <output>/.cache/bytecode

    def keep(self, site: Path) -> int:
        """Store the compiled modules of site-packages ``site`` that the store lacks; how
        many were stored."""
        tag, kept = cache_tag(site), 0
        for source, compiled, digest in _modules(site, tag):
            stored = self._path(tag, digest)
            if not os.path.exists(stored) and _current(compiled, source, digest):
                kept += _link_or_write(compiled, stored)
        return kept

    def lend(self, site: Path) -> int:
        """Give site-packages ``site`` the stored bytecode of every source it holds with a
        stored sha256 and has not compiled; how many modules were given."""
        tag, lent = cache_tag(site), 0
        for source, compiled, digest in _modules(site, tag):
            stored = self._path(tag, digest)
            if os.path.exists(stored) and not os.path.exists(compiled):
                lent += _lend(stored, source, digest, compiled)
        return lent

    def _path(self, tag: str, digest: str) -> str:
        return f"{self.root}/{tag}/{digest[:2]}/{digest}.pyc"


def cache_tag(site: Path) -> str:
    """The compiled files' tag of the CPython whose site-packages ``site`` is.

    >>> cache_tag(Path("/env/lib/python3.11/site-packages"))
    'cpython-311'
    """
    return "cpython-" + site.parent.name.removeprefix("python").replace(".", "")


def _modules(site: Path, tag: str) -> list[tuple[str, str, str]]:
    """``(source, compiled file, sha256)`` of every recorded source of ``site``, as strings:
    an env has thousands, and paths as objects were a third of the time."""
    found = []
    for path, digest in recorded_sources(site).items():
        directory, _, name = path.rpartition("/")
        base = f"{site}/{directory}" if directory else str(site)
        found.append((f"{base}/{name}", f"{base}/__pycache__/{name.removesuffix('.py')}.{tag}.pyc", digest))
    return found


def _sha256(path: str) -> str | None:
    """A file's sha256 as ``recorded_sources`` gives it, or None if unreadable."""
    try:
        with open(path, "rb") as file:
            return record_hash(file.read()).removeprefix("sha256=")
    except OSError:
        return None


def _stamp(source: os.stat_result) -> bytes:
    """A timestamp header's last 8 bytes for a source, as the interpreter writes them."""
    return (int(source.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (source.st_size & 0xFFFFFFFF).to_bytes(
        4, "little"
    )


def _current(compiled: str, source: str, digest: str) -> bool:
    """Whether ``compiled`` is a timestamp file current for ``source``, whose bytes have
    sha256 ``digest``."""
    header, stat = _header(compiled), _stat(source)
    if header is None or stat is None or header[4:8] != bytes(4):  # flags: 0 is a timestamp file
        return False
    return header[8:] == _stamp(stat) and _sha256(source) == digest


def _lend(stored: str, source: str, digest: str, compiled: str) -> int:
    """``stored`` as ``source``'s compiled file, stamped with its mtime and size: another
    name of the stored file where its stamp is that already (the same install), else a copy
    with the header rewritten; 1 if done."""
    header, stat = _header(stored), _stat(source)
    if header is None or stat is None or _sha256(source) != digest:
        return 0  # changed since it was installed: compiled on import instead
    if header[8:] == _stamp(stat):
        return _link_or_write(stored, compiled)
    try:
        with open(stored, "rb") as file:
            data = file.read()
    except OSError:
        return 0
    return _write(compiled, data[:8] + _stamp(stat) + data[HEADER:])


def _header(compiled: str) -> bytes | None:
    try:
        with open(compiled, "rb") as file:
            header = file.read(HEADER)
    except OSError:
        return None
    return header if len(header) == HEADER else None


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _link_or_write(existing: str, path: str) -> int:
    """Another name for ``existing`` at ``path``, else a copy; 1 if done, 0 where ``path``
    exists already (another env was first) or cannot be written."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.link(existing, path)
    except FileExistsError:
        return 0
    except OSError:
        try:
            with open(existing, "rb") as file:
                return _write(path, file.read())  # another file system
        except OSError:
            return 0
    return 1


def _write(path: str, data: bytes) -> int:
    """``data`` at ``path`` by a rename, as the interpreter writes compiled files; 1 if
    written, 0 where the directory is not ours to write (compiled on import instead)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temporary, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return 0
    return 1
