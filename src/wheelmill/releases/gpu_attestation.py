"""A GPU stage's result as its runner signed it: the only evidence the GPU gate opens on.

Promotion into the release track waits for a passed GPU stage of every GPU cell on each of
its runners (``wheelmill.releases.promotion.gpu_gate``). A report is JSON that anyone can
write, so the runner signs what the gate reads of it, its ``GpuRecord``, as the predicate of
an in-toto statement whose subjects are the files the stage tested, with a key of its own
(``WHEELMILL_SIGNING_KEY`` on the GPU runner). ``record-gpu`` records a result only from a
statement that verifies against the GPU runners' keys (``WHEELMILL_GPU_TRUSTED_KEYS``: a set
apart from the keys provenance is verified with, so that a build's key cannot vouch for a
GPU, nor a runner's key for a build), and the record keeps the envelope: promotion opens it
again, so a result written into the index's storage by hand opens nothing either. Where no
GPU runner's key is trusted and signatures are not required, results are recorded unsigned,
and promotion says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from wheelmill.errors import SignatureError
from wheelmill.files import write_atomic
from wheelmill.provenance.signing import (
    SigningKey,
    TrustedKey,
    envelope_line,
    open_envelope,
    read_envelopes,
    sign_envelope,
)
from wheelmill.provenance.statement import STATEMENT_TYPE, beside
from wheelmill.releases.records import GpuRecord, gpu_record_from

GPU_STAGE_TYPE = "urn:wheelmill:gpu-stage:v1"
_NO_KEY_FIX = "set WHEELMILL_GPU_TRUSTED_KEYS to the GPU runners' public keys (files, or a folder of them)"
_SIGN_FIX = "run the GPU stage again with the runner's key set (WHEELMILL_SIGNING_KEY) and record what it wrote"


def sign_gpu_record(record: GpuRecord, filenames: Mapping[str, str], key: SigningKey) -> dict[str, Any]:
    """The envelope of ``record``'s statement, signed by ``key``: its subjects are the files
    the stage tested (``filenames``: each one's sha256 to its name)."""
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": filenames.get(sha, sha), "digest": {"sha256": sha}} for sha in sorted(record.tested)],
        "predicateType": GPU_STAGE_TYPE,
        "predicate": record.facts(),
    }
    return sign_envelope(json.dumps(statement, sort_keys=True, separators=(",", ":")).encode(), key)


def write_signed(report: Path, envelope: Mapping[str, Any]) -> Path:
    """The envelope beside the report it signs: ``gpu-report.json.intoto.jsonl``."""
    path = beside(report)
    write_atomic(path, envelope_line(envelope).encode())
    return path


def envelope_beside(report: Path) -> dict[str, Any] | None:
    """The one envelope beside a report, or None where there is no file of them."""
    path = beside(report)
    if not path.is_file():
        return None
    if path.stat().st_size > 1 << 20:  # a record's statement is some KB; a bigger file is none of ours
        raise SignatureError(f"{path}: over 1 MiB, not a GPU stage's statement", fix=_SIGN_FIX)
    envelopes = read_envelopes(path.read_text(encoding="utf-8", errors="replace"), source=str(path))
    if len(envelopes) != 1:
        raise SignatureError(f"{path}: holds {len(envelopes)} envelopes, not one", fix=_SIGN_FIX)
    return envelopes[0]


def opened(envelope: Mapping[str, Any], trusted: Sequence[TrustedKey], *, source: str) -> GpuRecord:
    """The record a trusted GPU runner's key signed, with its envelope and the key's id."""
    try:
        payload, key = open_envelope(envelope, trusted)
    except SignatureError as error:
        other = "none of the trusted keys" in error.message  # another key signed: the fix names the GPU keys' setting
        fix = "if that key is a GPU runner's, add its public half to WHEELMILL_GPU_TRUSTED_KEYS" if other else error.fix
        raise SignatureError(f"{source}: {error.message}", fix=fix) from None
    try:
        statement = json.loads(payload)
        kinds = (statement["_type"], statement["predicateType"])
        subjects = {str(s["digest"]["sha256"]) for s in statement["subject"]}
        record = gpu_record_from(statement["predicate"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise SignatureError(
            f"{source}: its signed payload is not a GPU stage's statement ({exc})", fix=_SIGN_FIX
        ) from None
    if kinds != (STATEMENT_TYPE, GPU_STAGE_TYPE) or subjects != set(record.tested):
        raise SignatureError(f"{source}: its signed payload is not a GPU stage's statement", fix=_SIGN_FIX)
    return replace(record, envelope=dict(envelope), signed_by=key.key_id)


def admitted(
    record: GpuRecord,
    envelope: Mapping[str, Any] | None,
    *,
    trusted: Sequence[TrustedKey],
    required: bool,
    source: str,
) -> GpuRecord:
    """What ``record-gpu`` records of one report: where a GPU runner's key is trusted, or
    signatures are required, the record its runner signed, which must say what the report
    beside it says; else the report's record, unsigned."""
    return _as_signed(
        record,
        envelope,
        trusted=trusted,
        required=required,
        where=source,
        opened_as=source,
        unsigned=(f"not signed: no {beside(Path(source)).name} beside it", _SIGN_FIX),
        differs="the report says otherwise than what its runner signed",
    )


def check_signed(record: GpuRecord, *, trusted: Sequence[TrustedKey], required: bool) -> None:
    """A recorded result the gate may count: signed by a trusted GPU runner's key, saying
    what the record says (where a key is trusted or signatures are required)."""
    what = f"{record.cell} on runner {record.runner}"
    _as_signed(
        record,
        record.envelope,
        trusted=trusted,
        required=required,
        where=what,
        opened_as=f"{what}: its recorded GPU stage",
        unsigned=("its GPU stage was recorded unsigned", _SIGN_FIX + " with record-gpu"),
        differs="its record says otherwise than what its runner signed",
    )


def _as_signed(
    record: GpuRecord,
    envelope: Mapping[str, Any] | None,
    *,
    trusted: Sequence[TrustedKey],
    required: bool,
    where: str,
    opened_as: str,
    unsigned: tuple[str, str],
    differs: str,
) -> GpuRecord:
    """The one check of both doors: ``record`` as its runner signed it in ``envelope`` (the
    record itself where no GPU key is trusted and signatures are optional); ``where`` names
    it in each refusal."""
    if not trusted and not required:
        return record
    if not trusted:
        raise SignatureError(
            f"{where}: WHEELMILL_SIGNATURES=required, and no GPU runner's key is trusted", fix=_NO_KEY_FIX
        )
    if envelope is None:
        raise SignatureError(f"{where}: {unsigned[0]}", fix=unsigned[1])
    signed = opened(envelope, trusted, source=opened_as)
    if signed.facts() != record.facts():
        raise SignatureError(f"{where}: {differs}", fix=_SIGN_FIX)
    return signed
