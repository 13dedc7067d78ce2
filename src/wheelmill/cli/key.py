"""``wheelmill key``: the keys that sign provenance. ``key new`` makes a key pair, ``key id``
names a key by the id its envelopes carry."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from wheelmill.cli.basics import Commands
from wheelmill.errors import UsageError
from wheelmill.settings import Settings

# What a command does loads when it runs, never to parse a command line or print its help.
if TYPE_CHECKING:
    from wheelmill.provenance.signing import SigningKey


def register(commands: Commands) -> None:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.provenance.signing import ALGORITHMS  # noqa: PLC0415

    key = commands.add_parser("key", help="the keys that sign the provenance beside published files")
    actions = key.add_subparsers(dest="action", required=True, parser_class=type(key))
    new = actions.add_parser(
        "new",
        help="make a signing key: PATH, the private key (PKCS#8 PEM, mode 0600), and PATH.pub, its public half",
    )
    new.add_argument(
        "--out", type=Path, required=True, metavar="PATH", help="the private key's file; never overwritten"
    )
    new.add_argument(
        "--type",
        dest="algorithm",
        choices=ALGORITHMS,
        default=ALGORITHMS[0],
        help=f"the key's algorithm (default {ALGORITHMS[0]})",
    )
    new.set_defaults(func=cmd_key_new)
    ids = actions.add_parser("id", help="print the key id of a public or private key file (the id envelopes carry)")
    ids.add_argument("file", type=Path, metavar="FILE", help="a PEM private key, or a PEM file of public keys")
    ids.set_defaults(func=cmd_key_id)


def cmd_key_new(args: argparse.Namespace, _settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.provenance.signing import new_signing_key  # noqa: PLC0415

    private_path: Path = args.out
    public_path = private_path.with_name(private_path.name + ".pub")
    key = new_signing_key(args.algorithm, source=str(private_path))
    _write_pair(key, private_path, public_path)
    _say(console, f"private key: {private_path} (a secret: CI gives it as WHEELMILL_SIGNING_KEY)")
    _say(console, f"public key:  {public_path} (trusted through WHEELMILL_TRUSTED_KEYS)")
    _say(console, f"key id:      {key.key_id}")
    return 0


def cmd_key_id(args: argparse.Namespace, _settings: Settings, console: Console) -> int:
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.provenance.signing import key_ids_in  # noqa: PLC0415

    for found in key_ids_in(args.file):
        _say(console, found)
    return 0


def _write_pair(key: SigningKey, private_path: Path, public_path: Path) -> None:
    """Both files or neither; an existing file is never replaced (a lost private key cannot be
    made again, and files its public half verifies may still be served); the private key never
    where a commit would take it."""
    # what it runs loads here, not to parse a command line (wheelmill.cli)
    from wheelmill.machine.git import would_be_committed  # noqa: PLC0415

    repository = would_be_committed(private_path)
    if repository is not None:
        raise UsageError(
            f"key new: {private_path} is inside the git repository {repository} and not ignored by it: "
            "a commit would publish the private key",
            fix="write it outside the repository, or add its path to the repository's .gitignore first",
        )
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise UsageError(
                f"key new: {path} exists; a key file is never overwritten",
                fix="choose another --out, or move the old key away first",
            )
    try:
        private_path.parent.mkdir(parents=True, exist_ok=True)  # keys/ of the docs' example, made on first use
        _write_private(private_path, key.private_pem())
    except OSError as exc:
        raise UsageError(
            f"key new: cannot write {private_path}: {exc.strerror or exc}", fix="choose another --out"
        ) from None
    try:
        with public_path.open("xb") as file:
            file.write(key.public_pem())
    except OSError as exc:
        private_path.unlink()
        raise UsageError(
            f"key new: cannot write {public_path}: {exc.strerror or exc}", fix="choose another --out"
        ) from None


def _write_private(path: Path, data: bytes) -> None:
    """A new file (O_EXCL: it did not exist even a moment before) of mode 0600 from its
    creation: the key is never readable by others, not even while it is being written."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), 0o600)  # exactly 0600, whatever the umask
        file.write(data)


def _say(console: Console, line: str) -> None:
    console.print(line, highlight=False, markup=False, soft_wrap=True)
