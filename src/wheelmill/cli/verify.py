"""``wheelmill verify``: what is published held to its signed provenance and SBOM, against the
team's public keys (``WHEELMILL_TRUSTED_KEYS``, or ``--key``). A target is a wheel file (its
provenance beside it, ``<wheel>.intoto.jsonl``, or ``--provenance``), a channel's address
(``<index>/<channel>/simple/``, or a project's page under it), or ``--channel`` of this
machine's index. Each failure is one line on stderr; the exit code is the first one's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from wheelmill.cli.basics import Commands, print_error
from wheelmill.errors import ConfigError, UsageError
from wheelmill.inputs.versions import Track
from wheelmill.settings import Settings

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.provenance.signing import TrustedKey
    from wheelmill.provenance.verification import Verdict
    from wheelmill.releases.attested import Source


def register(commands: Commands) -> None:
    verify = commands.add_parser(
        "verify",
        help="check published wheels against their signed provenance, their SBOMs and the team's public keys",
    )
    verify.add_argument(
        "target",
        nargs="?",
        help="a wheel file, or a channel's address (<index>/<channel>/simple/, or a project's page under it)",
    )
    verify.add_argument("--channel", help="a channel of this machine's index (WHEELMILL_INDEX_ROOT) instead")
    verify.add_argument("--provenance", type=Path, help="a wheel file's provenance (default: <wheel>.intoto.jsonl)")
    verify.add_argument(
        "--key",
        type=Path,
        action="append",
        default=[],
        help="a public key file (or a folder of them) to trust instead of WHEELMILL_TRUSTED_KEYS; repeatable",
    )
    verify.add_argument(
        "--mirrored",
        action="store_true",
        help="check the mirrored files too, against the statements their mirroring signed (downloads them)",
    )
    verify.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.releases.attested import verify_channel  # noqa: PLC0415

    trusted = _trusted(args, settings)
    if (args.target is None) == (args.channel is None):
        raise UsageError(
            "verify: give a wheel file or a channel's address, or --channel", fix="see wheelmill verify -h"
        )
    if args.target and args.target.endswith(".whl") and "://" not in args.target:
        verdicts = [_one_wheel(Path(args.target), args.provenance, trusted)]
        _print(console, verdicts[0])
    else:
        if args.provenance is not None:
            raise UsageError("verify: --provenance is for a wheel file", fix="leave it out for a channel")
        source, project = _source(args, settings)
        verdicts = verify_channel(
            source, trusted=trusted, mirrored=args.mirrored, project=project, on_verdict=lambda v: _print(console, v)
        )
        if not verdicts:
            raise UsageError(f"verify: {source.name} lists no file built here", fix="name a channel that has some")
    return _summary(console, verdicts, trusted)


def _trusted(args: argparse.Namespace, settings: Settings) -> tuple[TrustedKey, ...]:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.provenance.signing import trusted_keys, trusted_keys_of  # noqa: PLC0415

    found = trusted_keys(args.key) if args.key else trusted_keys_of(settings)
    if not found:
        raise ConfigError(
            "verify: no public key to verify with",
            fix="set WHEELMILL_TRUSTED_KEYS to the team's public key files (or give --key FILE)",
        )
    return found


def _one_wheel(wheel: Path, provenance: Path | None, trusted: tuple[TrustedKey, ...]) -> Verdict:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.provenance.statement import beside  # noqa: PLC0415
    from wheelmill.provenance.verification import Claims, verify_either  # noqa: PLC0415

    if not wheel.is_file():
        raise UsageError(f"verify: {wheel}: no such file", fix="give the path of a wheel")
    kept = provenance or beside(wheel)
    if provenance is not None and not provenance.is_file():
        raise UsageError(f"verify: {provenance}: no such file", fix="give the path of the wheel's .intoto.jsonl")
    claims = Claims(
        filename=wheel.name,
        provenance=kept.read_bytes() if kept.is_file() else None,
        source=str(kept),
    )
    return verify_either(wheel, claims, trusted=trusted)


def _source(args: argparse.Namespace, settings: Settings) -> tuple[Source, str | None]:
    """The channel to read, and the one project to verify (None: all)."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.index.http_channel import HttpChannel  # noqa: PLC0415
    from wheelmill.index.roots import Index  # noqa: PLC0415
    from wheelmill.releases.attested import local_source, served_source  # noqa: PLC0415

    if args.channel is not None:
        index = Index.of(settings)
        local = index.channel(args.channel)
        if not local.exists():
            raise UsageError(f"verify: no channel {args.channel} in {index.location}", fix="wheelmill index list")
        return local_source(local), None
    target: str = args.target
    if "://" not in target:
        raise UsageError(
            f"verify: {target} is neither a wheel file nor an address", fix="give a .whl path or an http(s) URL"
        )
    head, found, tail = target.rstrip("/").rpartition("/simple")
    if not found:
        raise UsageError(
            f"verify: {target} is not a channel's address", fix="give <index>/<channel>/simple/ or a project page"
        )
    base, name = _channel_in(head)
    channel = HttpChannel(base=base, name=name, retry=settings.retry)
    if not channel.exists():
        raise UsageError(f"verify: {target}: no project list there", fix="give <index>/<channel>/simple/")
    return served_source(channel), tail.strip("/") or None


def _channel_in(address: str) -> tuple[str, str]:
    """The index's address and the channel's name in it, from a channel's address: a test or
    nightly track's channel is named with its track (``test/cu130``), as its files'
    provenance names it.

    >>> _channel_in("https://wheels.internal/test/cu130")
    ('https://wheels.internal', 'test/cu130')
    >>> _channel_in("https://wheels.internal/cu130")
    ('https://wheels.internal', 'cu130')
    """
    rest, _, name = address.rpartition("/")
    base, _, track = rest.rpartition("/")
    if track in (Track.TEST.value, Track.NIGHTLY.value) and "://" in base:
        return base, f"{track}/{name}"
    return rest, name


def _print(console: Console, verdict: Verdict) -> None:
    if verdict.ok:
        signed = (
            f"; signed by {', '.join(sorted({k[:19] + '...' for k in verdict.signed_by}))}" if verdict.signed_by else ""
        )
        console.print(f"ok {verdict.filename}: {verdict.checked}{signed}", highlight=False)
    for failure in verdict.failures:
        print_error(failure.line)


def _summary(console: Console, verdicts: list[Verdict], trusted: tuple[TrustedKey, ...]) -> int:
    failed = [v for v in verdicts if not v.ok]
    lines = sum(len(v.failures) for v in verdicts)
    keys = ", ".join(k.key_id[:19] + "..." for k in trusted)
    console.print(
        f"verify: {len(verdicts)} files, {len(verdicts) - len(failed)} verified, {len(failed)} failed "
        f"({lines} failures); trusted keys {keys}",
        highlight=False,
    )
    return failed[0].failures[0].code if failed else 0
