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

import importlib.metadata
import os
from pathlib import Path, PurePosixPath


def recorded_sources(site: Path) -> dict[PurePosixPath, str]:
    """``path -> hash`` of every Python source that a RECORD of ``site`` lists with its
    hash (read by ``importlib.metadata``), the path relative to ``site``; what lies outside
    it (scripts) is left out."""
    found: dict[PurePosixPath, str] = {}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        try:
            files = dist.files or []
        except (UnicodeDecodeError, ValueError):
            continue  # an unreadable RECORD shares nothing
        for file in files:
            if file.suffix == ".py" and file.hash is not None and ".." not in file.parts:
                found[PurePosixPath(file)] = f"{file.hash.mode}={file.hash.value}"
    return found


def share_bytecode(source: Path, target: Path) -> int:
    """Hard-link the compiled modules of site-packages ``source`` into ``target`` where
    ``target`` holds the same source (same path, same hash); how many were linked. A file
    that cannot be linked is left to the interpreter to compile."""
    theirs = recorded_sources(source)
    same = {path for path, digest in recorded_sources(target).items() if theirs.get(path) == digest}
    linked = 0
    for directory in {path.parent for path in same}:
        for compiled in _compiled_in(source / directory / "__pycache__"):
            module = compiled.name.split(".", 1)[0]  # ops.cpython-311.pyc, ops.cpython-311.opt-1.pyc
            if directory / f"{module}.py" in same and _link(compiled, target / directory / "__pycache__" / compiled.name):
                linked += 1
    return linked


def _compiled_in(cache: Path) -> list[Path]:
    try:
        return [entry for entry in cache.iterdir() if entry.name.endswith(".pyc")]
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
