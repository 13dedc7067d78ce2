"""``wheelmill key``: a new key pair on disk (the private half 0600, never overwritten), its id
as envelopes carry it, and one error line with its exit code for bad input."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.conftest import CliRunner
from tests.unit.test_bad_input import assert_one_line_error
from wheelmill.errors import ConfigError, UsageError
from wheelmill.provenance.signing import (
    ALGORITHMS,
    key_id,
    open_envelope,
    sign_envelope,
    signing_key_from_pem,
    signing_key_of,
    trusted_keys,
    trusted_keys_of,
)
from wheelmill.settings import Settings


@contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def printed_id(out: str) -> str:
    lines = dict(line.split(":", 1) for line in out.splitlines())
    return lines["key id"].strip()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_key_new_writes_a_pair_and_prints_its_id(cli: CliRunner, tmp_path: Path, algorithm: str) -> None:
    private = tmp_path / "signing.pem"
    result = cli("key", "new", "--out", str(private), "--type", algorithm)
    assert (result.code, result.err) == (0, "")
    public = tmp_path / "signing.pem.pub"
    assert result.out.splitlines()[:2] == [
        f"private key: {private} (a secret: CI gives it as WHEELMILL_SIGNING_KEY)",
        f"public key:  {public} (trusted through WHEELMILL_TRUSTED_KEYS)",
    ]
    key = signing_key_from_pem(private.read_bytes(), source=str(private))
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert key.algorithm == algorithm
    assert printed_id(result.out) == key.key_id == key_id(serialization.load_pem_public_key(public.read_bytes()))  # type: ignore[arg-type]
    assert [trusted.key_id for trusted in trusted_keys([public])] == [key.key_id]


def test_key_new_writes_the_private_key_0600_whatever_the_umask(cli: CliRunner, tmp_path: Path) -> None:
    with umask(0o000):
        assert cli("key", "new", "--out", str(tmp_path / "open.pem")).code == 0
    with umask(0o077):
        assert cli("key", "new", "--out", str(tmp_path / "closed.pem")).code == 0
    for name in ("open.pem", "closed.pem"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


def test_key_id_names_both_halves_alike(cli: CliRunner, tmp_path: Path) -> None:
    made = cli("key", "new", "--out", str(tmp_path / "k.pem"), "--type", "ecdsa-p256")
    for half in ("k.pem", "k.pem.pub"):
        result = cli("key", "id", str(tmp_path / half))
        assert (result.code, result.out, result.err) == (0, printed_id(made.out) + "\n", "")


def test_a_new_key_signs_what_its_public_half_opens(cli: CliRunner, tmp_path: Path) -> None:
    made = cli("key", "new", "--out", str(tmp_path / "k.pem"))
    signer = signing_key_of(Settings.from_environ({"WHEELMILL_SIGNING_KEY": (tmp_path / "k.pem").read_text()}))
    assert signer is not None
    trusted = trusted_keys_of(Settings.from_environ({"WHEELMILL_TRUSTED_KEYS": str(tmp_path / "k.pem.pub")}))
    payload, key = open_envelope(sign_envelope(b"{}", signer), trusted)
    assert (payload, key.key_id) == (b"{}", printed_id(made.out))


@pytest.mark.parametrize("existing", ["k.pem", "k.pem.pub"])
def test_key_new_never_overwrites(cli: CliRunner, tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_bytes(b"the old key\n")
    result = cli("key", "new", "--out", str(tmp_path / "k.pem"))
    assert_one_line_error(
        result.err,
        code=result.code,
        expected_code=UsageError.exit_code,
        expected=[f"key new: {tmp_path / existing} exists; a key file is never overwritten", "--out"],
    )
    assert result.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]
    assert (tmp_path / existing).read_bytes() == b"the old key\n"


def test_bad_input_gets_one_line_and_its_exit_code(cli: CliRunner, tmp_path: Path) -> None:
    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(
        rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (tmp_path / "junk.pub").write_text("hello\n")
    cases = [
        (["key"], UsageError, ["the following arguments are required"]),
        (["key", "new"], UsageError, ["the following arguments are required: --out"]),
        (["key", "new", "--out", str(tmp_path / "k"), "--type", "rsa"], UsageError, ["invalid choice: 'rsa'"]),
        (["key", "new", "--out", str(tmp_path / "junk.pub" / "k")], UsageError, ["cannot write", "junk.pub/k"]),
        (["key", "id", str(tmp_path / "gone.pem")], ConfigError, [f"the key file {tmp_path / 'gone.pem'}"]),
        (["key", "id", str(rsa_key)], ConfigError, [f"{rsa_key}: an RSA key (2048 bits)", "key new"]),
        (["key", "id", str(tmp_path / "junk.pub")], ConfigError, ["junk.pub: no PEM public key in it"]),
    ]
    for argv, error, expected in cases:
        result = cli(*argv)
        assert_one_line_error(result.err, code=result.code, expected_code=error.exit_code, expected=expected)
    assert not (tmp_path / "k").exists()


def test_key_help_names_both_commands(cli: CliRunner, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli("key", "--help")
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "new" in out
    assert "id" in out
    assert "print the key id of a public or private key file" in out
