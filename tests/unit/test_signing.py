"""DSSE envelopes signed and opened again: what verifies, what does not and the one line that
says why, the keys wheelmill accepts and refuses, the settings that name them, and what a build's
publish step says where nothing was signed."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from wheelmill.building.steps.publish import provenance_check
from wheelmill.checks import Verdict
from wheelmill.errors import ConfigError, SignatureError
from wheelmill.provenance.signing import (
    ALGORITHMS,
    PAYLOAD_TYPE,
    Algorithm,
    SigningKey,
    TrustedKey,
    envelope_line,
    key_id,
    new_signing_key,
    open_envelope,
    pae,
    read_envelopes,
    sign_envelope,
    signing_key_from_pem,
    signing_key_of,
    trusted_keys,
    trusted_keys_of,
)
from wheelmill.settings import Settings, Signatures

STATEMENT = json.dumps({"_type": "https://in-toto.io/Statement/v1", "subject": []}, sort_keys=True).encode()


def pem_of(private: Any, *, encryption: Any = None, form: Any = serialization.PrivateFormat.PKCS8) -> bytes:
    encryption = encryption or serialization.NoEncryption()
    data: bytes = private.private_bytes(serialization.Encoding.PEM, form, encryption)
    return data


def public_pem_of(private: Any) -> bytes:
    data: bytes = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return data


def body_lines(pem: bytes) -> list[str]:
    """The base64 lines of a PEM: the key material no message may hold."""
    return [line for line in pem.decode().splitlines() if line and not line.startswith("-----")]


@pytest.fixture(params=ALGORITHMS)
def signer(request: pytest.FixtureRequest) -> SigningKey:
    algorithm: Algorithm = request.param
    return new_signing_key(algorithm)


def test_pae_is_the_dsse_specs_test_vector() -> None:
    assert (
        pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_an_envelope_opens_with_the_key_that_signed_it(signer: SigningKey) -> None:
    envelope = sign_envelope(STATEMENT, signer)
    assert envelope["payloadType"] == PAYLOAD_TYPE
    assert base64.b64decode(envelope["payload"]) == STATEMENT
    assert [s["keyid"] for s in envelope["signatures"]] == [signer.key_id]
    other = new_signing_key("ed25519").trusted()
    payload, key = open_envelope(envelope, [other, signer.trusted()])
    assert payload == STATEMENT
    assert key.key_id == signer.key_id


def test_ecdsa_signatures_are_der_over_sha256_as_cosign_makes_them() -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    signer = signing_key_from_pem(pem_of(private), source="k.pem")
    signature = base64.b64decode(sign_envelope(STATEMENT, signer)["signatures"][0]["sig"])
    assert signature[0] == 0x30  # a DER SEQUENCE, not the raw r||s of 64 bytes
    private.public_key().verify(signature, pae(PAYLOAD_TYPE, STATEMENT), ec.ECDSA(hashes.SHA256()))


def test_a_key_id_is_the_sha256_of_the_public_halfs_der() -> None:
    private = ed25519.Ed25519PrivateKey.generate()
    der = private.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    expected = "sha256:" + hashlib.sha256(der).hexdigest()
    assert key_id(private) == key_id(private.public_key()) == expected
    assert signing_key_from_pem(pem_of(private), source="k").key_id == expected


def test_a_statement_signed_by_another_key_names_both_ids(signer: SigningKey) -> None:
    ours = new_signing_key("ecdsa-p256").trusted()
    with pytest.raises(SignatureError) as raised:
        open_envelope(sign_envelope(STATEMENT, signer), [ours])
    line = raised.value.one_line()
    assert f"signed by {signer.key_id}, which none of the trusted keys ({ours.key_id}) is" in line
    assert "\n" not in line
    assert raised.value.exit_code == 26


def test_a_changed_statement_does_not_verify(signer: SigningKey) -> None:
    envelope = sign_envelope(STATEMENT, signer)
    envelope["payload"] = base64.b64encode(STATEMENT.replace(b"[]", b'[{"name":"evil.whl"}]')).decode()
    with pytest.raises(SignatureError) as raised:
        open_envelope(envelope, [signer.trusted()])
    assert (
        f"its signature does not verify against trusted key {signer.key_id}: the statement was changed after signing"
        in raised.value.one_line()
    )


def test_a_signature_that_is_not_even_der_does_not_verify() -> None:
    signer = new_signing_key("ecdsa-p256")
    envelope = sign_envelope(STATEMENT, signer)
    envelope["signatures"][0]["sig"] = base64.b64encode(b"\x01" * 64).decode()
    with pytest.raises(SignatureError, match="changed after signing"):
        open_envelope(envelope, [signer.trusted()])


def test_another_payload_type_is_refused(signer: SigningKey) -> None:
    """Even a good signature over another type: only in-toto statements are provenance."""
    other_type = "application/json"
    envelope = sign_envelope(STATEMENT, signer) | {"payloadType": other_type}
    good = signer.sign(pae(other_type, STATEMENT))
    envelope["signatures"] = [{"keyid": signer.key_id, "sig": base64.b64encode(good).decode()}]
    with pytest.raises(
        SignatureError, match=r"payload type is 'application/json', not 'application/vnd.in-toto\+json'"
    ):
        open_envelope(envelope, [signer.trusted()])


def test_the_keyid_is_a_hint_a_wrong_or_missing_one_still_opens(signer: SigningKey) -> None:
    """DSSE's keyid is optional and unauthenticated: it orders the keys tried, nothing more."""
    decoy = new_signing_key("ed25519").trusted()
    envelope = sign_envelope(STATEMENT, signer)
    envelope["signatures"][0]["keyid"] = decoy.key_id
    assert open_envelope(envelope, [decoy, signer.trusted()])[1].key_id == signer.key_id
    del envelope["signatures"][0]["keyid"]
    assert open_envelope(envelope, [decoy, signer.trusted()])[1].key_id == signer.key_id


def test_a_second_signature_by_a_trusted_key_opens_it(signer: SigningKey) -> None:
    stranger = new_signing_key("ed25519")
    first = sign_envelope(STATEMENT, stranger)
    first["signatures"] += sign_envelope(STATEMENT, signer)["signatures"]
    assert open_envelope(first, [signer.trusted()])[1].key_id == signer.key_id


def test_an_envelope_without_signatures_is_refused(signer: SigningKey) -> None:
    envelope = sign_envelope(STATEMENT, signer) | {"signatures": []}
    with pytest.raises(SignatureError, match="no signatures"):
        open_envelope(envelope, [signer.trusted()])


def test_opening_with_no_trusted_keys_is_a_setting_to_make(signer: SigningKey) -> None:
    with pytest.raises(ConfigError) as raised:
        open_envelope(sign_envelope(STATEMENT, signer), [])
    assert "fix: set WHEELMILL_TRUSTED_KEYS" in raised.value.one_line()


def test_envelopes_are_one_sorted_compact_line_each_read_back_in_order(signer: SigningKey) -> None:
    build = sign_envelope(STATEMENT, signer)
    promotion = sign_envelope(STATEMENT + b" ", signer)
    line = envelope_line(build)
    assert line.endswith("\n")
    assert line.count("\n") == 1
    assert line == json.dumps(build, sort_keys=True, separators=(",", ":")) + "\n"
    assert list(json.loads(line)) == ["payload", "payloadType", "signatures"]
    text = line + "\n" + envelope_line(promotion)
    assert read_envelopes(text, source="x.whl.intoto.jsonl") == [build, promotion]


def test_url_safe_unpadded_base64_opens_as_dsse_allows(signer: SigningKey) -> None:
    envelope = sign_envelope(STATEMENT, signer)
    for where in (envelope, envelope["signatures"][0]):
        name = "payload" if where is envelope else "sig"
        where[name] = base64.urlsafe_b64encode(base64.b64decode(where[name])).decode().rstrip("=")
    assert open_envelope(envelope, [signer.trusted()])[0] == STATEMENT


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{not json", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"payloadType": "t", "signatures": []}', "no payload string"),
        ('{"payload": "", "payloadType": "t"}', "no signatures list"),
        ('{"payload": "", "payloadType": "t", "signatures": [{"keyid": "k"}]}', "without its sig string"),
        ('{"payload": "%%%", "payloadType": "t", "signatures": []}', "not base64"),
    ],
)
def test_a_malformed_line_names_the_file_and_the_line(signer: SigningKey, line: str, why: str) -> None:
    text = envelope_line(sign_envelope(STATEMENT, signer)) + "\n" + line + "\n"
    with pytest.raises(SignatureError) as raised:
        read_envelopes(text, source="x.whl.intoto.jsonl")
    assert raised.value.one_line().startswith("x.whl.intoto.jsonl: line 3 is not a DSSE envelope: ")
    assert why in raised.value.one_line()


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048), "an RSA key (2048 bits)"),
        (lambda: ec.generate_private_key(ec.SECP384R1()), "an ECDSA key on curve secp384r1"),
        (ed448.Ed448PrivateKey.generate, "an Ed448 key"),
    ],
)
def test_other_key_types_are_refused_by_type_and_source(tmp_path: Path, make: Any, named: str) -> None:
    private = make()
    pem = pem_of(private)
    with pytest.raises(ConfigError) as raised:
        signing_key_from_pem(pem, source="keys/ci.pem")
    line = raised.value.one_line()
    assert line.startswith(f"keys/ci.pem: {named}; ")
    assert "ed25519 or ecdsa-p256" in line
    assert raised.value.exit_code == 3
    assert not any(chunk in line for chunk in body_lines(pem))
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        trusted_keys([_written(tmp_path / "other.pub", public_pem_of(private))])


@pytest.mark.parametrize("form", [serialization.PrivateFormat.PKCS8, serialization.PrivateFormat.TraditionalOpenSSL])
def test_an_encrypted_key_is_refused(form: Any) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    pem = pem_of(private, encryption=serialization.BestAvailableEncryption(b"secret"), form=form)
    with pytest.raises(ConfigError) as raised:
        signing_key_from_pem(pem, source="WHEELMILL_SIGNING_KEY")
    assert "WHEELMILL_SIGNING_KEY: an encrypted private key; encrypted keys are not supported; fix: " in (
        raised.value.one_line()
    )


def test_a_traditional_sec1_key_loads() -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    pem = pem_of(private, form=serialization.PrivateFormat.TraditionalOpenSSL)
    assert pem.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    key = signing_key_from_pem(pem, source="k")
    assert (key.algorithm, key.key_id) == ("ecdsa-p256", key_id(private))


@pytest.mark.parametrize(
    ("pem", "why"),
    [
        (b"not a key at all", "no PEM block in it"),
        (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "it holds a PRIVATE KEY block"),
        (public_pem_of(ed25519.Ed25519PrivateKey.generate()), "it holds a PUBLIC KEY block"),
    ],
    ids=["garbage", "an empty private key", "a public key"],
)
def test_what_is_not_a_private_key_is_refused(pem: bytes, why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        signing_key_from_pem(pem, source="WHEELMILL_SIGNING_KEY")
    assert raised.value.one_line().startswith(f"WHEELMILL_SIGNING_KEY: not a PEM private key ({why}); fix: ")


def test_a_signing_keys_repr_holds_no_key_material(signer: SigningKey) -> None:
    for chunk in body_lines(signer.private_pem()):
        assert chunk not in repr(signer)
        assert chunk not in repr(signer.trusted())


def _written(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_trusted_keys_come_from_files_and_every_key_file_of_a_folder(tmp_path: Path) -> None:
    a, b, c = (new_signing_key("ed25519"), new_signing_key("ecdsa-p256"), new_signing_key("ed25519"))
    folder = tmp_path / "team"
    _written(folder / "b.pem", b.public_pem())
    _written(folder / "a.pub", a.public_pem())
    _written(folder / "README.txt", b"not read")
    single = _written(tmp_path / "c.pub", c.public_pem())
    again = _written(tmp_path / "a-again.pub", a.public_pem())
    found = trusted_keys([folder, single, again])
    assert [key.key_id for key in found] == [a.key_id, b.key_id, c.key_id]  # the folder's by name, once each
    assert [key.source for key in found] == [str(folder / "a.pub"), str(folder / "b.pem"), str(single)]
    assert [key.algorithm for key in found] == ["ed25519", "ecdsa-p256", "ed25519"]
    assert all(isinstance(key, TrustedKey) for key in found)


def test_one_file_may_hold_several_public_keys(tmp_path: Path) -> None:
    a, b = new_signing_key("ed25519"), new_signing_key("ecdsa-p256")
    bundle = _written(tmp_path / "team.pem", a.public_pem() + b"\n" + b.public_pem())
    assert [key.key_id for key in trusted_keys([bundle])] == [a.key_id, b.key_id]


def test_a_private_key_among_the_trusted_is_refused(tmp_path: Path) -> None:
    key = new_signing_key("ed25519")
    path = _written(tmp_path / "keys" / "signing.pem", key.private_pem())
    for given in (path, path.parent):
        with pytest.raises(ConfigError) as raised:
            trusted_keys([given])
        line = raised.value.one_line()
        assert line.startswith(f"{path}: a private key, where a trusted public key belongs")
        assert "a verifier needs only the public half" in line
        assert not any(chunk in line for chunk in body_lines(key.private_pem()))


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], "no trusted public keys were given"),
        (["empty"], "holds no *.pub or *.pem file"),
        (["junk.pub"], "junk.pub: no PEM public key in it (no PEM block in it)"),
        (["missing.pub"], "missing.pub: No such file or directory"),
    ],
)
def test_no_trusted_keys_is_an_error(tmp_path: Path, entries: list[str], expected: str) -> None:
    (tmp_path / "empty").mkdir()
    _written(tmp_path / "junk.pub", b"hello\n")
    with pytest.raises(ConfigError) as raised:
        trusted_keys([tmp_path / entry for entry in entries])
    assert expected in raised.value.one_line()


def test_the_settings_name_the_keys(tmp_path: Path) -> None:
    key = new_signing_key("ed25519")
    other = new_signing_key("ecdsa-p256")
    first, second = (
        _written(tmp_path / "a.pub", key.public_pem()),
        _written(tmp_path / "b" / "x.pub", other.public_pem()),
    )
    pem = key.private_pem().decode()
    settings = Settings.from_environ(
        {
            "WHEELMILL_SIGNING_KEY": pem,
            "WHEELMILL_TRUSTED_KEYS": f"{first}{os.pathsep}{second.parent}{os.pathsep}",
            "WHEELMILL_SIGNATURES": "required",
        }
    )
    assert settings.signatures is Signatures.REQUIRED
    assert settings.trusted_keys == (first, second.parent)
    assert not any(chunk in repr(settings) for chunk in body_lines(key.private_pem()))
    signing = signing_key_of(settings)
    assert signing is not None
    assert (signing.key_id, signing.source) == (key.key_id, "WHEELMILL_SIGNING_KEY")
    assert [k.key_id for k in trusted_keys_of(settings)] == [key.key_id, other.key_id]


def test_the_key_file_setting_and_the_defaults(tmp_path: Path) -> None:
    key = new_signing_key("ecdsa-p256")
    path = _written(tmp_path / "signing.pem", key.private_pem())
    settings = Settings.from_environ({"WHEELMILL_SIGNING_KEY_FILE": str(path)})
    assert settings.signatures is Signatures.OPTIONAL
    signing = signing_key_of(settings)
    assert signing is not None
    assert (signing.key_id, signing.source) == (key.key_id, str(path))
    # No trusted keys set: the signing key's own public half is trusted.
    assert [(k.key_id, k.source) for k in trusted_keys_of(settings)] == [(key.key_id, f"the public half of {path}")]
    nothing = Settings.from_environ({})
    assert (signing_key_of(nothing), trusted_keys_of(nothing)) == (None, ())


def test_both_key_settings_are_refused(tmp_path: Path) -> None:
    key = new_signing_key("ed25519")
    environ = {"WHEELMILL_SIGNING_KEY": key.private_pem().decode(), "WHEELMILL_SIGNING_KEY_FILE": "k.pem"}
    with pytest.raises(ConfigError) as raised:
        Settings.from_environ(environ)
    assert raised.value.one_line().startswith(
        "environment: both WHEELMILL_SIGNING_KEY and WHEELMILL_SIGNING_KEY_FILE are set; fix: "
    )


def test_a_missing_key_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "gone.pem"
    with pytest.raises(ConfigError) as raised:
        signing_key_of(Settings.from_environ({"WHEELMILL_SIGNING_KEY_FILE": str(missing)}))
    assert raised.value.one_line().startswith(f"WHEELMILL_SIGNING_KEY_FILE: cannot read the key file {missing}: ")


def test_a_path_in_the_pem_setting_says_which_setting_takes_a_path(tmp_path: Path) -> None:
    path = _written(tmp_path / "signing.pem", new_signing_key("ed25519").private_pem())
    with pytest.raises(ConfigError) as raised:
        signing_key_of(Settings.from_environ({"WHEELMILL_SIGNING_KEY": str(path)}))
    assert "fix: set WHEELMILL_SIGNING_KEY_FILE to the file instead" in raised.value.one_line()


def test_an_unknown_signatures_choice_is_refused() -> None:
    with pytest.raises(ConfigError, match="WHEELMILL_SIGNATURES='always' is not one of optional, required"):
        Settings.from_environ({"WHEELMILL_SIGNATURES": "always"})


def test_a_provenance_line_nested_past_reason_is_a_signature_error() -> None:
    line = '{"payload": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(SignatureError, match="line 1 is not a DSSE envelope: JSON nested deeper"):
        read_envelopes(line + "\n", source="x.whl.intoto.jsonl")


def test_the_publish_step_passes_provenance_only_where_one_was_signed(tmp_path: Path) -> None:
    """An unsigned build's publish says skip, not pass: `wheelmill verify` refuses the wheel."""
    wheel = tmp_path / "ext-1.0-py3-none-any.whl"
    signed = provenance_check(wheel, b"{}\n")
    assert (signed.verdict, signed.detail) == (Verdict.PASS, "ext-1.0-py3-none-any.whl.intoto.jsonl beside it")
    unsigned = provenance_check(wheel, None)
    assert unsigned.verdict is Verdict.SKIP and unsigned.detail.startswith("not signed: no signing key"), unsigned
    assert "wheelmill key new --out signing.pem, then WHEELMILL_SIGNING_KEY_FILE=signing.pem" in unsigned.detail
    assert "wheelmill verify refuses" in unsigned.detail
