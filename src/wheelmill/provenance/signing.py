"""Signing a statement and opening it again: DSSE envelopes (the Dead Simple Signing Envelope,
github.com/secure-systems-lab/dsse, protocol v1) with the team's ed25519 or ECDSA P-256 keys.

The signature covers PAE(payloadType, payload), never the base64 text, so a verifier checks
exactly the bytes it then parses. An envelope's ``keyid`` is a hint only: DSSE leaves it
optional and unauthenticated, so it orders the trusted keys tried and never decides which
key a signature is from. Several envelopes for one file are kept one per line (JSON Lines):
the build's, then each promotion's.

Key material never reaches a message: errors name the key's source (a file, a setting), its
type and its id, which is the sha256 of the public half.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias, get_args

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from wheelmill.errors import ConfigError, SignatureError, remember
from wheelmill.settings import Settings

PAYLOAD_TYPE = "application/vnd.in-toto+json"
Algorithm: TypeAlias = Literal["ed25519", "ecdsa-p256"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
PrivateKey: TypeAlias = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
PublicKey: TypeAlias = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey

# cosign's and sigstore's ECDSA: SHA-256 over the message, the signature DER-encoded.
_ECDSA = ec.ECDSA(hashes.SHA256())
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.*?-----END \1-----", re.DOTALL)
_MAKE_ONE = "make one with `wheelmill key new --out PATH` (ed25519, or --type ecdsa-p256)"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed, so that neither the type nor the
    body can be swapped for another without the signature failing.

    >>> pae("http://example.com/HelloWorld", b"hello world")
    b'DSSEv1 29 http://example.com/HelloWorld 11 hello world'
    """
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def key_id(public_key: PublicKey | PrivateKey) -> str:
    """``sha256:`` and the hex sha256 of the public key's DER SubjectPublicKeyInfo; a private
    key's id is its public half's."""
    public = public_key.public_key() if isinstance(public_key, PrivateKey) else public_key
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


@dataclass(frozen=True, kw_only=True)
class TrustedKey:
    """A public key whose signatures the team accepts, and where it was read from."""

    key_id: str
    algorithm: Algorithm
    public_key: PublicKey = field(repr=False, compare=False)
    source: str = field(compare=False)

    def verifies(self, signature: bytes, data: bytes) -> bool:
        try:
            if isinstance(self.public_key, ed25519.Ed25519PublicKey):
                self.public_key.verify(signature, data)
            else:
                self.public_key.verify(signature, data, _ECDSA)
        except (InvalidSignature, ValueError):  # ValueError: a signature that is not even DER
            return False
        return True


@dataclass(frozen=True, kw_only=True)
class SigningKey:
    """The private key a build or promotion signs with. Its ``repr`` holds no key material."""

    key_id: str
    algorithm: Algorithm
    private_key: PrivateKey = field(repr=False, compare=False)
    source: str = field(default="a signing key", compare=False)

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.private_key, ed25519.Ed25519PrivateKey):
            return self.private_key.sign(data)
        return self.private_key.sign(data, _ECDSA)

    def trusted(self) -> TrustedKey:
        """Its public half, as a verifier holds it."""
        public = self.private_key.public_key()
        return TrustedKey(
            key_id=self.key_id, algorithm=self.algorithm, public_key=public, source=f"the public half of {self.source}"
        )

    def private_pem(self) -> bytes:
        """PKCS#8 PEM, unencrypted: a file kept at mode 0600, or a CI secret."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def public_pem(self) -> bytes:
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


def new_signing_key(algorithm: Algorithm, *, source: str = "a new key") -> SigningKey:
    private: PrivateKey
    if algorithm == "ed25519":
        private = ed25519.Ed25519PrivateKey.generate()
    else:
        private = ec.generate_private_key(ec.SECP256R1())
    return SigningKey(key_id=key_id(private), algorithm=algorithm, private_key=private, source=source)


def signing_key_from_pem(pem: bytes, *, source: str) -> SigningKey:
    """The signing key in ``pem``: PKCS#8, or the traditional formats (SEC1, PKCS#1), never
    encrypted (a CI secret is the protection; a password would be one more secret)."""
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except TypeError:  # cryptography's word for "encrypted, and no password given"
        raise ConfigError(
            f"{source}: an encrypted private key; encrypted keys are not supported",
            fix=f"decrypt it (`openssl pkey -in KEY -out PLAIN`) and keep it as a secret, or {_MAKE_ONE}",
        ) from None
    except (ValueError, binascii.Error):
        raise ConfigError(f"{source}: not a PEM private key ({_what_pem(pem)})", fix=_MAKE_ONE) from None
    algorithm = _algorithm(private, source=source)
    assert isinstance(private, PrivateKey)  # _algorithm refused every other type
    return SigningKey(key_id=key_id(private), algorithm=algorithm, private_key=private, source=source)


def trusted_keys(paths: Sequence[Path]) -> tuple[TrustedKey, ...]:
    """The public keys (PEM SubjectPublicKeyInfo) in these files, and in every ``*.pub`` and
    ``*.pem`` file of these directories (by name); one key listed twice is one key."""
    if not paths:
        raise ConfigError("no trusted public keys were given", fix="set WHEELMILL_TRUSTED_KEYS to key files or folders")
    found: dict[str, TrustedKey] = {}
    for path in paths:
        for key in _public_keys_at(path):
            found.setdefault(key.key_id, key)
    return tuple(found.values())


def key_ids_in(path: Path) -> tuple[str, ...]:
    """The id of the private key in this file, or of each public key in it."""
    data = _read(path)
    if b"PRIVATE KEY-----" in data:
        return (signing_key_from_pem(data, source=str(path)).key_id,)
    return tuple(key.key_id for key in _public_keys_in(data, source=str(path)))


def signing_key_of(settings: Settings) -> SigningKey | None:
    """The key that signs what this machine publishes: ``WHEELMILL_SIGNING_KEY`` (the PEM
    text, as CI hands a secret) or ``WHEELMILL_SIGNING_KEY_FILE``; None when neither is set."""
    if settings.signing_key is not None:
        text = settings.signing_key.strip()
        remember([text])  # no message, log or report quotes it, whatever form it has
        if "-----BEGIN" not in text and _names_a_file(text):
            raise ConfigError(
                "WHEELMILL_SIGNING_KEY names a file; it holds the key's PEM text itself",
                fix="set WHEELMILL_SIGNING_KEY_FILE to the file instead, or put the PEM text in WHEELMILL_SIGNING_KEY",
            )
        return signing_key_from_pem(text.encode() + b"\n", source="WHEELMILL_SIGNING_KEY")
    if settings.signing_key_file is not None:
        path = settings.signing_key_file
        data = _read(path, setting="WHEELMILL_SIGNING_KEY_FILE")
        remember([data.decode("utf-8", "replace")])
        return signing_key_from_pem(data, source=str(path))
    return None


def trusted_keys_of(settings: Settings) -> tuple[TrustedKey, ...]:
    """The keys a verifier accepts: ``WHEELMILL_TRUSTED_KEYS``; where that is unset, the
    signing key's own public half (a machine trusts what it signs); else none."""
    if settings.trusted_keys:
        return trusted_keys(settings.trusted_keys)
    signing = signing_key_of(settings)
    return (signing.trusted(),) if signing is not None else ()


def gpu_trusted_keys_of(settings: Settings) -> tuple[TrustedKey, ...]:
    """The keys a GPU stage's signed result is verified with: ``WHEELMILL_GPU_TRUSTED_KEYS``
    alone (no key signs for a GPU because it signs builds); none where it is unset."""
    return trusted_keys(settings.gpu_trusted_keys) if settings.gpu_trusted_keys else ()


def sign_envelope(payload: bytes, key: SigningKey) -> dict[str, Any]:
    """A DSSE envelope around ``payload`` (an in-toto statement's JSON bytes), signed by ``key``."""
    signature = key.sign(pae(PAYLOAD_TYPE, payload))
    return {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [{"keyid": key.key_id, "sig": base64.b64encode(signature).decode()}],
    }


def envelope_line(envelope: Mapping[str, Any]) -> str:
    """One line of a ``.intoto.jsonl`` file: compact JSON, keys sorted, a newline at its end."""
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"


def read_envelopes(text: str, *, source: str) -> list[dict[str, Any]]:
    """The envelopes of a ``.intoto.jsonl`` file, in order; blank lines are skipped."""
    envelopes = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            envelope = json.loads(line)
        except json.JSONDecodeError as exc:
            problem: str | None = f"not JSON ({exc.msg} at column {exc.colno})"
        except RecursionError:  # Python's parser gives up on a line nested some thousand deep
            problem = "JSON nested deeper than any envelope is"
        else:
            problem = _shape_problem(envelope)
        if problem is not None:
            raise SignatureError(
                f"{source}: line {number} is not a DSSE envelope: {problem}",
                fix="publish the file again so its provenance is written anew",
            )
        envelopes.append(envelope)
    return envelopes


def open_envelope(envelope: Mapping[str, Any], trusted: Sequence[TrustedKey]) -> tuple[bytes, TrustedKey]:
    """The payload of ``envelope`` and the trusted key whose signature over PAE verifies.

    Each signature is tried against the key its ``keyid`` names first, then against every
    other trusted key: the hint saves work and is never believed."""
    if not trusted:
        raise ConfigError(
            "no trusted public keys to verify provenance with",
            fix="set WHEELMILL_TRUSTED_KEYS to the team's public key files (or a folder of them)",
        )
    problem = _shape_problem(envelope)
    if problem is not None:
        raise SignatureError(f"not a DSSE envelope: {problem}", fix="publish the file again")
    if envelope["payloadType"] != PAYLOAD_TYPE:
        raise SignatureError(
            f"the envelope's payload type is {envelope['payloadType']!r}, not {PAYLOAD_TYPE!r}",
            fix="only in-toto statements are provenance; publish the file again",
        )
    signatures = envelope["signatures"]
    if not signatures:
        raise SignatureError("the envelope has no signatures", fix="publish the file again with a signing key set")
    payload = _unbase64(envelope["payload"])
    signed = pae(PAYLOAD_TYPE, payload)
    for signature in signatures:
        for key in _hinted_first(trusted, signature.get("keyid")):
            if key.verifies(_unbase64(signature["sig"]), signed):
                return payload, key
    raise _unverified(signatures, trusted)


def _unverified(signatures: Sequence[Mapping[str, Any]], trusted: Sequence[TrustedKey]) -> SignatureError:
    """Why no signature verified: a trusted key's id with a bad signature means the bytes
    changed; any other id means another key signed."""
    ids = {key.key_id for key in trusted}
    named = [signature["keyid"] for signature in signatures if signature.get("keyid")]
    changed = [keyid for keyid in named if keyid in ids]
    if changed:
        return SignatureError(
            f"its signature does not verify against trusted key {changed[0]}: the statement was changed after signing",
            fix="do not trust this file; build or promote it again so it is signed anew",
        )
    trusted_ids = ", ".join(key.key_id for key in trusted)
    signers = ", ".join(named) if named else "a key it does not name"
    return SignatureError(
        f"the statement is signed by {signers}, which none of the trusted keys ({trusted_ids}) is",
        fix="if that key is the team's, add its public half to WHEELMILL_TRUSTED_KEYS; else do not trust the file",
    )


def _hinted_first(trusted: Sequence[TrustedKey], hint: object) -> list[TrustedKey]:
    return sorted(trusted, key=lambda key: key.key_id != hint)  # a stable sort: the hinted key, then the rest


def _shape_problem(envelope: object) -> str | None:
    """What makes this not a DSSE envelope, or None."""
    if not isinstance(envelope, Mapping):
        return "not a JSON object"
    for name in ("payload", "payloadType"):
        if not isinstance(envelope.get(name), str):
            return f"no {name} string"
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list):
        return "no signatures list"
    for signature in signatures:
        if not isinstance(signature, Mapping) or not isinstance(signature.get("sig"), str):
            return "a signature without its sig string"
        if not isinstance(signature.get("keyid", ""), str):
            return "a signature whose keyid is not a string"
    for text in (envelope["payload"], *(signature["sig"] for signature in signatures)):
        try:
            _unbase64(text)
        except SignatureError:
            return "a payload or sig that is not base64"
    return None


def _unbase64(text: str) -> bytes:
    """DSSE allows standard or URL-safe base64; some writers drop the padding."""
    standard = text.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError("not base64", fix="publish the file again") from None


def _algorithm(key: object, *, source: str) -> Algorithm:
    """The algorithm of a key wheelmill signs with, or a ``ConfigError`` naming its type."""
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "ed25519"
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return "ecdsa-p256"
    raise ConfigError(
        f"{source}: {_key_type(key)}; wheelmill signs and verifies with ed25519 or ecdsa-p256 keys only",
        fix=_MAKE_ONE,
    )


def _key_type(key: object) -> str:
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return f"an RSA key ({key.key_size} bits)"
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        return f"an ECDSA key on curve {key.curve.name}"
    if isinstance(key, ed448.Ed448PrivateKey | ed448.Ed448PublicKey):
        return "an Ed448 key"
    return f"a key of type {type(key).__name__.lstrip('_')}"


def _public_keys_at(path: Path) -> list[TrustedKey]:
    """The public keys of one entry of the trusted keys: a file, or a folder's key files."""
    if not path.is_dir():
        return _public_keys_in(_read(path, setting="WHEELMILL_TRUSTED_KEYS"), source=str(path))
    files = sorted(p for p in path.iterdir() if p.suffix in {".pub", ".pem"} and p.is_file())
    if not files:
        raise ConfigError(
            f"WHEELMILL_TRUSTED_KEYS: the folder {path} holds no *.pub or *.pem file",
            fix="put the team's public keys there (`wheelmill key new` writes PATH.pub) or name the files",
        )
    return [key for file in files for key in _public_keys_in(_read(file), source=str(file))]


def _public_keys_in(data: bytes, *, source: str) -> list[TrustedKey]:
    """Every PEM public key block of a file; a private key is refused, never used."""
    blocks = [(match.group(1).decode(), match.group(0)) for match in _PEM_BLOCK.finditer(data)]
    if not blocks:
        raise ConfigError(
            f"{source}: no PEM public key in it ({_what_pem(data)})",
            fix="give the key's public half: the PATH.pub file `wheelmill key new` wrote",
        )
    return [_public_key(label, block, source=source) for label, block in blocks]


def _public_key(label: str, block: bytes, *, source: str) -> TrustedKey:
    if "PRIVATE KEY" in label:
        raise ConfigError(
            f"{source}: a private key, where a trusted public key belongs; a verifier needs only the public half",
            fix="trust the PATH.pub beside it (`wheelmill key id` names both) and keep the private key out of there",
        )
    try:
        public = serialization.load_pem_public_key(block)
    except (ValueError, binascii.Error):
        raise ConfigError(
            f"{source}: its {label} block is not a public key", fix="give a PEM SubjectPublicKeyInfo public key"
        ) from None
    algorithm = _algorithm(public, source=source)
    assert isinstance(public, PublicKey)  # _algorithm refused every other type
    return TrustedKey(key_id=key_id(public), algorithm=algorithm, public_key=public, source=source)


def _names_a_file(text: str) -> bool:
    """Whether ``text`` is the path of a file: a key's text in another form (DER in hex, or
    base64) is too long a name for the file system, which is no reason to stop."""
    try:
        return "\n" not in text and Path(text).is_file()
    except (OSError, ValueError):
        return False


def _what_pem(data: bytes) -> str:
    """What a file that is not the key looks like, without a byte of what it holds."""
    match = re.search(rb"-----BEGIN ([A-Z0-9 ]+)-----", data)
    return f"it holds a {match.group(1).decode()} block" if match else "no PEM block in it"


def _read(path: Path, *, setting: str | None = None) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        where = f"{setting}: " if setting else ""
        raise ConfigError(
            f"{where}cannot read the key file {path}: {exc.strerror or exc}",
            fix=f"check that {path} exists and this user can read it" + (f", or change {setting}" if setting else ""),
        ) from None
