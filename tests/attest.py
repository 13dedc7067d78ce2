"""Tiny real wheels as a build publishes them with a signing key: wheelmill's SBOM in the
``.dist-info`` and a signed build statement beside it, made by wheelmill's own functions."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.wheels import make_wheel
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.roots import publish
from wheelmill.machine.net import sha256_of
from wheelmill.provenance.record import BuilderRecord, BuildRecord, Locked, SourceRecord
from wheelmill.provenance.sbom import SBOM_FILE, sbom_bytes
from wheelmill.provenance.signing import SigningKey, envelope_line, sign_envelope
from wheelmill.provenance.statement import Repository, Run, build_statement, key_digest

INPUTS = {"source": {"sha256": "c" * 64}, "recipe": {"name": "demo"}}
RUN = Run(
    builder="urn:wheelmill:host:test", invocation="1", started="2026-11-27T00:00:00Z", finished="2026-11-27T00:01:00Z"
)
RECORD = BuildRecord(
    project="demo",
    version="1.0+cpu",
    recipe="demo",
    cell="cpu-py311",
    build_key=key_digest(INPUTS),
    python="3.11.9",
    compiler="c++ 12.2.0",
    toolkit=None,
    torch=Locked(name="torch", version="2.13.0+cpu", sha256=("b" * 64,)),
    toolkit_packages=(),
    builder=BuilderRecord(tag="host", image_id=None, base=None),
    source=SourceRecord(kind="path", url=None, sha256="c" * 64, commit=None),
    lock_sha256="d" * 64,
    requires=("torch==2.13.0+cpu",),
)


def published_signed(
    channel: ObjectChannel, directory: Path, name: str, version: str, *, key: SigningKey | None
) -> Path:
    """A pure wheel with wheelmill's SBOM, published into ``channel`` with its build statement
    signed by ``key`` (None: published without provenance); the wheel. Another tag, files or
    requirements: ``signed_wheel``'s wheel and provenance, published."""
    wheel, provenance = signed_wheel(directory, name, version, key=key)
    publish(channel, wheel, provenance=provenance)
    return wheel


def signed_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    key: SigningKey | None,
    tag: str = "py3-none-any",
    files: Mapping[str, bytes] | None = None,
    requires: Sequence[str] = (),
    gpu_archs: bytes | None = None,
    channels: Sequence[str] | None = None,
) -> tuple[Path, bytes | None]:
    """A wheel with wheelmill's SBOM, and its build statement (for ``channels``) signed by
    ``key`` (None: none)."""
    pins = tuple(requires) if requires else RECORD.requires  # the record says what METADATA does
    record = replace(RECORD, project=name, version=version, recipe=name, requires=pins)
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    sbom = {f"{dist}/{SBOM_FILE}": sbom_bytes(record.carried())}
    wheel = make_wheel(
        directory, name, version, tag=tag, files={**(files or {}), **sbom}, requires=pins, gpu_archs=gpu_archs
    )
    return wheel, None if key is None else signed(statement_for(wheel, record=record, channels=channels), key)


def statement_for(
    wheel: Path,
    *,
    record: BuildRecord = RECORD,
    inputs: Mapping[str, object] = INPUTS,
    dirty: bool = False,
    channels: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The build statement of ``wheel``, as a build of ``record`` for ``channels`` makes it."""
    return build_statement(
        filename=wheel.name,
        sha256=sha256_of(wheel),
        record=record,
        key_inputs=inputs,
        repository=Repository(commit="f" * 40, dirty=dirty),
        run=RUN,
        channels=channels,
    )


def signed(statement: Mapping[str, Any], key: SigningKey) -> bytes:
    """``statement`` in a DSSE envelope signed by ``key``: a line of a ``.intoto.jsonl``."""
    return envelope_line(sign_envelope(json.dumps(statement, sort_keys=True).encode(), key)).encode()
