"""The signed statement of a mirroring: each file a cell's closure brings into a channel,
named with the upstream sha256 its closure lock pinned and its download was checked against,
and signed with the team's key. A verifier then holds a mirrored file to that pin, so a page
and its file rewritten together fail (``wheelmill.provenance.verification.verify_mirrored``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

from wheelmill.provenance.signing import envelope_line, sign_envelope, signing_key_of
from wheelmill.provenance.statement import mirror_statement, this_run
from wheelmill.settings import Settings

# (file name, sha256, upstream URL without credentials) -> the file's provenance
MirrorSigner = Callable[[str, str, str], bytes]


def mirror_signer(settings: Settings, *, channel: str, started: str | None = None) -> MirrorSigner | None:
    """What signs each file mirrored into ``channel`` by this run; None without a signing key
    (the files are mirrored unsigned, and ``verify --mirrored`` says so of each)."""
    key = signing_key_of(settings)
    if key is None:
        return None
    begun = started or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def sign(filename: str, sha256: str, upstream: str) -> bytes:
        run = this_run(ci_run=settings.ci_run, started=begun)
        statement = mirror_statement(filename=filename, sha256=sha256, upstream=upstream, channel=channel, run=run)
        return envelope_line(sign_envelope(json.dumps(statement, sort_keys=True).encode(), key)).encode()

    return sign
