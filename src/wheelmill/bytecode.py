"""Bytecode that one env compiled, shared with another env that holds the same sources.

The first ``import torch`` in a fresh env compiles some 700 of torch's modules, which
takes longer than the import itself, and every install test starts two such imports (the
import probe and the smoke command) in an env made for it. The build env compiled the same
modules when the build imported torch. Where both envs hold a module with the same sha256
(their RECORDs list it: the same locked wheel), the build env's compiled file is linked
into the test env's ``__pycache__``. The interpreter still checks each compiled file against
its source (mtime and size) and compiles again what does not match, and the sources are
byte-identical, so a link makes an import faster, never different.
"""

from __future__ import annotations

import csv
import importlib.metadata
import os
from pathlib import Path


def recorded_sources(site: Path) -> dict[str, str]:
    """``path -> hash`` of every Python source that a RECORD of ``site`` lists with its
    hash, the path relative to ``site`` (``torch/nn/__init__.py``); what lies outside it
    (scripts) is left out. The standard library finds the RECORDs; their rows are read here
    as plain CSV, since a ``PackagePath`` for each of torch's 15,000 files took 0.2 s a
    site, four times a recipe."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        try:
            rows = list(csv.reader((dist.read_text("RECORD") or "").splitlines()))
        except (UnicodeDecodeError, ValueError, csv.Error):
            continue  # an unreadable RECORD shares nothing
        for row in rows:
            if len(row) >= 2 and row[0].endswith(".py") and row[1] and not row[0].startswith("/") and ".." not in row[0].split("/"):
                found[row[0]] = row[1]
    return found


def share_bytecode(source: Path, target: Path) -> int:
    """Hard-link the compiled modules of site-packages ``source`` into ``target`` where
    ``target`` holds the same source (same path, same hash); how many were linked. A file
    that cannot be linked is left to the interpreter to compile."""
    theirs = recorded_sources(source)
    same = {path for path, digest in recorded_sources(target).items() if theirs.get(path) == digest}
    linked = 0
    for directory in {path.rpartition("/")[0] for path in same}:
        prefix = f"{directory}/" if directory else ""
        for name in _compiled_in(source / directory / "__pycache__"):
            module = name.split(".", 1)[0]  # ops.cpython-311.pyc, ops.cpython-311.opt-1.pyc
            if f"{prefix}{module}.py" in same and _link(source / directory / "__pycache__" / name, target / directory / "__pycache__" / name):
                linked += 1
    return linked


def _compiled_in(cache: Path) -> list[str]:
    try:
        with os.scandir(cache) as entries:
            return [entry.name for entry in entries if entry.name.endswith(".pyc")]
    except OSError:
        return []


def _link(compiled: Path, destination: Path) -> bool:
    try:
        destination.parent.mkdir(exist_ok=True)
        os.link(compiled, destination)
    except FileExistsError:
        return False  # compiled there already
    except OSError:
        return False  # another file system, or not ours to write: compiled on import instead
    return True
