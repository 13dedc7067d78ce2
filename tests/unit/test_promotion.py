"""Promotion keeps each built file's provenance and adds its own signed statement: the
release channel's files verify, the re-stamped one through the chain back to the rc's file;
a promotion with no signer copies the build's statement alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.attest import published_signed, signed_wheel
from tests.channels import tree_channel
from wheelmill.errors import SignatureError
from wheelmill.index.roots import Index, publish
from wheelmill.index.storage import TreeStorage
from wheelmill.inputs.versions import Track, VersionRule
from wheelmill.machine.net import sha256_of
from wheelmill.provenance.signing import SigningKey, new_signing_key
from wheelmill.provenance.verification import Verdict
from wheelmill.releases.attested import local_source, verify_channel
from wheelmill.releases.promotion import promote, signer_of
from wheelmill.releases.records import Manifest, ReleasedFile, record

HEAD = "a" * 40


def released_rc(root: Path, scratch: Path, key: SigningKey | None, *, junk: bool = False) -> None:
    """An rc in test/cpu: the repo's own wheel (re-stamped when promoted) and a source-versioned
    one (promoted byte for byte), each published with its build's signed statement (``junk``:
    with a line that is no envelope instead)."""
    channel = tree_channel(root, "test/cpu")

    def published(name: str, version: str) -> Path:
        if not junk:
            return published_signed(channel, scratch, name, version, key=key)
        wheel, _ = signed_wheel(scratch, name, version, key=None)
        publish(channel, wheel, provenance=b'{"not": "an envelope"}\n')
        return wheel

    ours, theirs = published("wm-ops", "2.4.0rc1+cpu"), published("demo", "1.0+cpu")
    files = tuple(
        ReleasedFile(
            channel="test/cpu", cell="cpu-py311", recipe=name, filename=wheel.name, sha256=sha256_of(wheel), rule=rule
        )
        for name, wheel, rule in (("wm-ops", ours, VersionRule.REPO), ("demo", theirs, VersionRule.SOURCE))
    )
    manifest = Manifest(
        version="2.4.0rc1", track=Track.TEST, commit=HEAD, tag="v2.4.0-rc1", files=files, gpu_runners={"cpu-py311": ()}
    )
    record(TreeStorage(root), manifest)


def verdicts(root: Path, channel: str, key: SigningKey) -> dict[str, Verdict]:
    source = local_source(tree_channel(root, channel))
    found = verify_channel(source, trusted=(key.trusted(),), on_verdict=lambda _v: None)
    return {v.filename: v for v in found}


def test_a_promoted_file_carries_the_builds_statement_and_the_promotions(tmp_path: Path) -> None:
    root, key = tmp_path / "index", new_signing_key("ed25519")
    released_rc(root, tmp_path / "built", key)
    done = _promote(root, key)
    assert sorted(f.filename for f in done.files) == [
        "demo-1.0+cpu-py3-none-any.whl",
        "wm_ops-2.4.0+cpu-py3-none-any.whl",
    ]
    released = verdicts(root, "cpu", key)
    assert all(v.ok for v in released.values()), [f.line for v in released.values() for f in v.failures]
    assert {name: v.statements for name, v in released.items()} == {
        "demo-1.0+cpu-py3-none-any.whl": 2,
        "wm_ops-2.4.0+cpu-py3-none-any.whl": 2,
    }
    tested = verdicts(root, "test/cpu", key)
    assert {v.statements for v in tested.values()} == {1}, "the rc's files keep the build's statement alone"


def test_without_a_signer_the_builds_statement_goes_alone_and_a_restamped_file_fails(tmp_path: Path) -> None:
    """A re-stamped wheel is other bytes: the build's statement alone names the rc's file, so
    it fails verification, and the file promoted byte for byte passes."""
    root, key = tmp_path / "index", new_signing_key("ed25519")
    released_rc(root, tmp_path / "built", key)
    promote(Index(tree=root), Track.TEST, Track.RELEASE, "2.4.0", commit=HEAD, on_file=lambda _p: None)
    released = verdicts(root, "cpu", key)
    assert released["demo-1.0+cpu-py3-none-any.whl"].ok
    restamped = released["wm_ops-2.4.0+cpu-py3-none-any.whl"]
    assert {f.code for f in restamped.failures} == {27}, "its subject, and its METADATA's version, are not the record's"


def _promote(root: Path, key: SigningKey, **trust: Any) -> Manifest:
    return promote(
        Index(tree=root),
        Track.TEST,
        Track.RELEASE,
        "2.4.0",
        commit=HEAD,
        on_file=lambda _p: None,
        signer=signer_of(key, ci_run=None),
        **trust,
    )


@pytest.mark.parametrize("given", ["another key", "junk", "none"])
def test_a_promotion_countersigns_nothing_it_did_not_verify(tmp_path: Path, given: str) -> None:
    """An rc file signed by another key, with junk beside it, or with none under ``required``:
    the promotion stops before its first file (exit 26), and the release channel stays empty."""
    root, team = tmp_path / "index", new_signing_key("ed25519")
    built = {"another key": new_signing_key("ed25519"), "junk": team, "none": None}[given]
    released_rc(root, tmp_path / "built", built, junk=given == "junk")
    with pytest.raises(SignatureError) as refused:
        _promote(root, team, trusted=(team.trusted(),), required=given == "none")
    assert refused.value.exit_code == 26
    assert not tree_channel(root, "cpu").project_names(), "nothing promoted"
    assert refused.value.one_line().startswith(("wm_ops-", "demo-")), refused.value.one_line()
