"""The record of one build's inputs: what the SBOM inside the wheel lists and what the signed
provenance beside it names, from one value, so the two cannot say different things.

Every field is known before the wheel's RECORD is final and is the same for the same inputs:
no time, no host name, no path of this machine. A record is JSON data both ways
(``as_dict`` and ``from_dict``), so a verifier reads back what the build wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Locked:
    """A package the build env's lock pins: its name (canonical), version (with its local
    label: ``2.14.1+cu130``) and the sha256 digests the lock allows (one per file it may be)."""

    name: str
    version: str
    sha256: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class SourceRecord:
    """The recipe's source as fetch checks it: an sdist's or URL's bytes (``sha256``), a git
    commit, or a path's tree (``sha256`` of wheelmill's tree hash); the bytes of each patch."""

    kind: str  # sdist | url | git | path
    url: str | None  # None for a path source (where it is says nothing of what it is)
    sha256: str | None
    commit: str | None
    patches: tuple[str, ...] = ()  # sha256 of each patch, in the order they apply


@dataclass(frozen=True, kw_only=True)
class BuilderRecord:
    """Where the build ran: a builder image (its content-derived tag and its image id, and
    the base it is made FROM), or this machine (``tag`` ``host``, no image)."""

    tag: str
    image_id: str | None
    base: str | None


@dataclass(frozen=True, kw_only=True)
class BuildRecord:
    """A wheel's build, as its SBOM and provenance say it."""

    project: str  # the wheel's distribution name, canonical
    version: str  # the wheel's version as stamped
    recipe: str
    cell: str
    build_key: str  # sha256 hex of the key's inputs (wheelmill.planning.buildkey); "" as the SBOM carries it
    python: str  # the build's CPython, x.y.z
    compiler: str | None  # the C++ compiler as it names itself: "g++ (Debian 12.2.0-14) 12.2.0"
    toolkit: str | None  # "cuda 13.0", "rocm 6.2"; None: a CPU cell
    torch: Locked | None  # the torch the build env installed, as locked
    toolkit_packages: tuple[Locked, ...]  # the locked nvidia-* / rocm wheels the build used
    builder: BuilderRecord
    source: SourceRecord
    lock_sha256: str  # the build env's lock file, by its bytes
    requires: tuple[str, ...]  # the wheel's Requires-Dist: what it needs at run time

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def carried(self) -> BuildRecord:
        """The record as the wheel's SBOM carries it: without the build key, which hashes
        inputs that change no byte a build makes (wheelmill's own code, the recipe's spec),
        and without a path source's tree hash, which changes with files the wheel does not
        carry (its tests, a comment). So a rebuild for such a change gives the same wheel,
        and the index learns its new key (``wheelmill.index.channels``); the signed provenance
        beside the wheel says both."""
        source = replace(self.source, sha256=None) if self.source.kind == "path" else self.source
        return replace(self, build_key="", source=source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildRecord:
        """The record a build wrote; KeyError or TypeError where it is not one."""

        def locked(item: Mapping[str, Any]) -> Locked:
            return Locked(**{**item, "sha256": tuple(item["sha256"])})

        return cls(
            **{
                **data,
                "torch": None if data["torch"] is None else locked(data["torch"]),
                "toolkit_packages": tuple(locked(p) for p in data["toolkit_packages"]),
                "builder": BuilderRecord(**data["builder"]),
                "source": SourceRecord(**{**data["source"], "patches": tuple(data["source"]["patches"])}),
                "requires": tuple(data["requires"]),
            }
        )
