"""A file held to its provenance: each way a wheel, its statement or its page can be wrong is
one line with its own exit code, and a wheel with everything right passes. The wheels are
small zips made here, their SBOMs and statements made by wheelmill's own functions."""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.attest import INPUTS, RECORD, RUN, signed, signed_wheel, statement_for
from tests.conftest import CliRunner
from wheelmill.errors import (
    BuildKeyMismatch,
    IntegrityError,
    SbomError,
    SignatureError,
    SubjectMismatch,
)
from wheelmill.machine.net import sha256_of
from wheelmill.provenance.record import Locked
from wheelmill.provenance.sbom import SBOM_FILE, sbom_bytes
from wheelmill.provenance.signing import SigningKey, new_signing_key
from wheelmill.provenance.statement import (
    beside,
    key_digest,
    promotion_statement,
    read_statement,
)
from wheelmill.provenance.verification import Claims, Verdict, verify_file

NAME = "demo-1.0+cpu-cp311-cp311-linux_x86_64.whl"


@pytest.fixture(scope="module")
def team() -> SigningKey:
    return new_signing_key("ed25519", source="the team's key")


def make_wheel(path: Path, *, sbom: bytes | None) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("demo/__init__.py", "x = 1\n")
        pins = "".join(f"Requires-Dist: {pin}\n" for pin in RECORD.requires)  # as the signed record says
        archive.writestr(
            "demo-1.0+cpu.dist-info/METADATA", f"Metadata-Version: 2.1\nName: demo\nVersion: 1.0+cpu\n{pins}"
        )
        if sbom is not None:
            archive.writestr(f"demo-1.0+cpu.dist-info/{SBOM_FILE}", sbom)
    return path


def check(wheel: Path, provenance: bytes | None, team: SigningKey, **claims: Any) -> Verdict:
    return verify_file(wheel, Claims(filename=wheel.name, provenance=provenance, **claims), trusted=(team.trusted(),))


def codes(verdict: Verdict) -> list[tuple[int, type]]:
    return [(f.code, type(f.error)) for f in verdict.failures]


def test_a_wheel_with_its_sbom_and_a_signed_statement_verifies(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    verdict = check(
        wheel, signed(statement_for(wheel), team), team, sha256=sha256_of(wheel), build_keys=(RECORD.build_key,)
    )
    assert verdict.ok, [f.line for f in verdict.failures]
    assert verdict.signed_by == (team.key_id,)


def test_one_byte_changed_is_one_line_naming_the_subject(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    provenance = signed(statement_for(wheel), team)
    data = bytearray(wheel.read_bytes())
    data[data.index(b"x = 1") + 4] ^= 1  # in a module's bytes (stored): the SBOM still reads
    wheel.write_bytes(bytes(data))
    verdict = check(wheel, provenance, team)
    assert codes(verdict) == [(27, SubjectMismatch)]
    assert "not this file" in verdict.failures[0].line


def test_another_key_is_one_line_naming_both_keys(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    other = new_signing_key("ecdsa-p256", source="another key")
    verdict = check(wheel, signed(statement_for(wheel), other), team)
    assert codes(verdict) == [(26, SignatureError)]
    assert other.key_id[:19] in verdict.failures[0].line


def test_a_statement_for_another_file(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    statement = statement_for(wheel)
    statement["subject"] = [{"name": "other-1.0-py3-none-any.whl", "digest": {"sha256": "0" * 64}}]
    verdict = check(wheel, signed(statement, team), team)
    assert codes(verdict) == [(27, SubjectMismatch)]


def test_a_wheel_without_its_sbom(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=None)
    verdict = check(wheel, signed(statement_for(wheel), team), team)
    assert codes(verdict) == [(28, SbomError)]
    assert SBOM_FILE in verdict.failures[0].line


def test_an_sbom_that_says_another_torch(tmp_path: Path, team: SigningKey) -> None:
    other = replace(RECORD, torch=Locked(name="torch", version="2.13.0+cpu", sha256=("e" * 64,)))
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(other.carried()))
    verdict = check(wheel, signed(statement_for(wheel), team), team)
    assert [c for c, _ in codes(verdict)] == [28]
    assert "torch" in verdict.failures[0].line


def test_a_page_with_another_sha256(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    verdict = check(wheel, signed(statement_for(wheel), team), team, sha256="0" * 64)
    assert codes(verdict) == [(7, IntegrityError)]


def test_recorded_inputs_that_are_not_the_key(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    changed = {**INPUTS, "recipe": {"name": "demo", "env": {"CFLAGS": "-O0"}}}
    verdict = check(wheel, signed(statement_for(wheel, inputs=changed), team), team)
    assert codes(verdict) == [(29, BuildKeyMismatch)]


def test_a_key_its_page_does_not_list(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    verdict = check(wheel, signed(statement_for(wheel), team), team, build_keys=("9" * 64,))
    assert codes(verdict) == [(29, BuildKeyMismatch)]


def test_no_provenance_at_all(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    assert codes(check(wheel, None, team)) == [(26, SignatureError)]


def test_garbage_provenance_is_one_line(tmp_path: Path, team: SigningKey) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    assert [c for c, _ in codes(check(wheel, b"{not json\n", team))] == [26]


def test_a_promotion_chain_leads_back_to_the_build(tmp_path: Path, team: SigningKey) -> None:
    """A promoted file (re-stamped: other bytes) carries the build's statement and the
    promotion's, which names the build's file; a promotion naming another file breaks it."""
    built = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    promoted = make_wheel(tmp_path / "demo-1.0.1+cpu-cp311-cp311-linux_x86_64.whl", sbom=sbom_bytes(RECORD.carried()))
    build = signed(statement_for(built), team)

    def promotion(source_sha256: str) -> bytes:
        statement = promotion_statement(
            filename=promoted.name,
            sha256=sha256_of(promoted),
            source_channel="test/cpu",
            source=built.name,
            source_sha256=source_sha256,
            target_channel="cpu",
            run=RUN,
        )
        return signed(statement, team)

    good = check(promoted, build + promotion(sha256_of(built)), team)
    assert good.ok, [f.line for f in good.failures]
    assert good.statements == 2
    broken = check(promoted, build + promotion("0" * 64), team)
    assert codes(broken) == [(27, SubjectMismatch)]
    assert "does not follow" in broken.failures[0].line


def test_a_file_is_where_its_provenance_puts_it(tmp_path: Path, team: SigningKey) -> None:
    """The channel a file is listed in against where its signed statements put it: an rc never
    promoted, copied into the release channel; a cuda118 build in cu130; a dirty build in a
    test channel, or promoted; and a served recipe's one build, in each channel of its group."""
    built = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    promoted = make_wheel(tmp_path / "demo-1.0.1+cpu-cp311-cp311-linux_x86_64.whl", sbom=sbom_bytes(RECORD.carried()))
    rc = signed(statement_for(built, channels=["test/cpu"]), team)
    assert check(built, rc, team, channel="test/cpu").ok
    never_promoted = check(built, rc, team, channel="cpu")
    assert codes(never_promoted) == [(27, SubjectMismatch)]
    assert never_promoted.failures[0].line.startswith(
        f"{NAME}: listed in channel cpu, but built for test/cpu; "
        "a release channel takes files by promotion alone; fix: "
    )
    other_variant = check(built, signed(statement_for(built, channels=["cu118"]), team), team, channel="cu130")
    assert "listed in channel cu130, but built for cu118" in other_variant.failures[0].line
    served = signed(statement_for(built, channels=["cu128", "cu130"]), team)
    assert check(built, served, team, channel="cu130").ok and check(built, served, team, channel="cu128").ok
    assert check(built, signed(statement_for(built), team), team, channel="cu130").ok, "a statement naming none"
    dirty = signed(statement_for(built, channels=["test/cpu", "cpu"], dirty=True), team)
    assert "built from a tree that was not its commit" in check(built, dirty, team, channel="test/cpu").failures[0].line
    assert check(built, dirty, team, channel="cpu").ok, "a plain build of a working tree, in its own channel"
    promotion = promotion_statement(
        filename=promoted.name,
        sha256=sha256_of(promoted),
        source_channel="test/cpu",
        source=built.name,
        source_sha256=sha256_of(built),
        target_channel="cpu",
        run=RUN,
    )
    assert check(promoted, rc + signed(promotion, team), team, channel="cpu").ok
    elsewhere = check(promoted, rc + signed(promotion, team), team, channel="nightly/cpu")
    assert "listed in channel nightly/cpu, but promoted into cpu" in elsewhere.failures[0].line
    dirty_rc = signed(statement_for(built, channels=["test/cpu"], dirty=True), team)
    assert "(dirty)" in check(promoted, dirty_rc + signed(promotion, team), team, channel="cpu").failures[0].line


def test_a_statement_reads_back_as_written(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / NAME, sbom=sbom_bytes(RECORD.carried()))
    statement = read_statement(json.dumps(statement_for(wheel)).encode(), source="test")
    assert statement.record() == RECORD
    assert statement.key == RECORD.build_key == key_digest(statement.key_inputs)
    assert not statement.dirty


@pytest.mark.parametrize("given", ["none", "junk", "another key"])
def test_publish_under_required_takes_nothing_that_does_not_verify(
    cli: CliRunner, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, team: SigningKey, given: str
) -> None:
    """``wheelmill publish`` is a door into a channel like a build's: under ``required``, with
    the team's key trusted, every wheel given is verified before any is published."""
    (tmp_path / "team.pub").write_bytes(team.public_pem())
    monkeypatch.setenv("WHEELMILL_TRUSTED_KEYS", str(tmp_path / "team.pub"))
    monkeypatch.setenv("WHEELMILL_SIGNATURES", "required")
    good, provenance = signed_wheel(tmp_path / "good", "demo", "1.0", key=team)
    assert provenance is not None
    beside(good).write_bytes(provenance)
    other = new_signing_key("ed25519")
    bad, _ = signed_wheel(tmp_path / "bad", "other", "1.0", key=None)
    if given != "none":
        junk = b'{"not": "an envelope"}\n'
        beside(bad).write_bytes(junk if given == "junk" else signed(statement_for(bad), other))
    publish = ("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cpu")
    refused = cli(*publish, str(good), str(bad))
    assert refused.code == SignatureError.exit_code, refused.out + refused.err
    (line,) = refused.err.splitlines()
    assert line.startswith(f"wheelmill: error: {bad.name}"), line
    assert not (tmp_path / "wheels" / "index" / "cpu").exists(), "nothing published: the good one waits for the bad"
    taken = cli(*publish, str(good))
    assert taken.code == 0, taken.err
    assert f"added: cpu/{good.name}" in taken.out
    # Signed by the team, but for another channel: a door that reads where the file goes.
    elsewhere, provenance = signed_wheel(tmp_path / "elsewhere", "demo", "1.1", key=team, channels=["cu130"])
    assert provenance is not None
    beside(elsewhere).write_bytes(provenance)
    refused = cli(*publish, str(elsewhere))
    assert refused.code == SubjectMismatch.exit_code, refused.err
    assert "listed in channel cpu, but built for cu130" in refused.err


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ("Name: demo\nVersion: 1.0+cpu\nRequires-Dist: torch==2.99.0\n", "torch pin is ['torch==2.99.0']"),
        ("Name: other\nVersion: 1.0+cpu\nRequires-Dist: torch==2.13.0+cpu\n", "name is other"),
        ("Name: demo\nVersion: 1.0+cpu\nRequires-Dist: torch==2.13.0+cpu\nRequires-Dist: evil\n", "Requires-Dist"),
    ],
)
def test_a_record_is_held_to_the_wheels_metadata(tmp_path: Path, team: SigningKey, metadata: str, says: str) -> None:
    """The signed record says torch 2.13; the wheel's METADATA says another torch, another
    name, or one more requirement: a line each, exit 27, whatever the signature says."""
    wheel = tmp_path / NAME
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo/__init__.py", "x = 1\n")
        archive.writestr("demo-1.0+cpu.dist-info/METADATA", "Metadata-Version: 2.1\n" + metadata)
        archive.writestr(f"demo-1.0+cpu.dist-info/{SBOM_FILE}", sbom_bytes(RECORD.carried()))
    verdict = check(wheel, signed(statement_for(wheel), team), team, sha256=sha256_of(wheel))
    lines = [f.line for f in verdict.failures]
    assert {f.code for f in verdict.failures} == {27} and any(says in line for line in lines), lines
