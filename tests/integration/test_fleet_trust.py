"""Fleet reuse that takes nothing on a server's word: a served index under the test's control
lists a wheel of its own making under the cell's build key, with no provenance or with junk
beside it. With the team's key trusted, the build does not take it, says why, builds the
recipe itself and publishes its own signed build; the same index with the team's real build
is taken, so the gate is no wall, served by `index serve` and by nginx alike. In the sandbox
(tests/sandbox.py): the build is seconds, the index is real, served over loopback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.channels import tree_channel
from tests.conftest import CliRunner
from tests.integration.test_build_keys import serving
from tests.integration.test_index import serving_nginx
from tests.sandbox import TAG, Sandbox, build, dist_info, repair_as_auditwheel_tags
from tests.wheels import make_wheel
from wheelmill.index.pages import FileEntry
from wheelmill.index.roots import provenance_of, publish
from wheelmill.index.serve import parse_access_log
from wheelmill.machine.net import sha256_of
from wheelmill.provenance.signing import new_signing_key
from wheelmill.provenance.statement import beside

pytestmark = pytest.mark.integration


def _listed(index: Path) -> tuple[FileEntry, ...]:
    project = tree_channel(index, "cpu").project("a")
    assert project is not None
    return project.files


def report(sandbox: Sandbox) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((sandbox.output / sandbox.cell("cpu") / "report.json").read_text())
    return data


def test_a_served_wheel_that_does_not_verify_is_built_here_and_a_verified_one_is_taken(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repair_as_auditwheel_tags(monkeypatch)
    sandbox = Sandbox(tmp_path / "repo")
    sandbox.recipe("a", dist_info("a", "1.0"), wheel=f"a-1.0-{TAG}.whl")
    team = new_signing_key("ed25519")
    (tmp_path / "team.pem.pub").write_bytes(team.public_pem())
    monkeypatch.setenv("WHEELMILL_SIGNING_KEY", team.private_pem().decode())
    monkeypatch.setenv("WHEELMILL_TRUSTED_KEYS", str(tmp_path / "team.pem.pub"))

    # The team's runner builds and publishes the cell, signed.
    first = build(cli, monkeypatch, sandbox, "cpu")
    assert first.code == 0, first.out[-3000:] + first.err
    key = report(sandbox)["facts"]["build_keys"]["a"]
    team_index = sandbox.output / "index"
    (built,) = _listed(team_index)
    sandbox.output = tmp_path / "runner-b"  # the next runner: an empty output root of its own

    # The attacker's index: a wheel of its making under the cell's key, named as the team's.
    for case, provenance in (("none", None), ("junk", b'{"not": "an envelope"}\n')):
        forged = make_wheel(tmp_path / f"forged-{case}", "a", "1.0+cpu", tag=TAG.replace("linux_", "manylinux_2_17_"))
        assert forged.name == built.filename
        attacker = tree_channel(tmp_path / f"attacker-{case}", "cpu")
        publish(attacker, forged, build_key=key, provenance=provenance)
        with serving(tmp_path / f"attacker-{case}") as url:
            monkeypatch.setenv("WHEELMILL_SERVED_INDEX", url)
            result = build(cli, monkeypatch, sandbox, "cpu")
        assert result.code == 0, result.out[-3000:] + result.err
        data = report(sandbox)
        (recipe,) = data["recipes"]
        assert recipe["status"] == "ok", "built here, not reused"
        warned = [c for s in data["steps"] if s["step"] == "build-keys" for c in s["checks"] if c["verdict"] == "warn"]
        (warning,) = warned
        why = "no provenance was published with it" if case == "none" else "is not a DSSE envelope"
        assert f"{built.filename} of {url}/cpu/simple/ not taken: " in warning["detail"] and why in warning["detail"]
        assert "built here instead" in warning["detail"]
        (published,) = _listed(sandbox.output / "index")
        assert published.sha256 != sha256_of(forged), "its own build published, not the forgery"
        assert published.provenance is not None, "signed, as every build here is"
        for leftover in sandbox.output.glob("cpu-py*/build/a/reused/*"):
            pytest.fail(f"the refused file was left in the cell's tree: {leftover}")
        shutil.rmtree(sandbox.output)  # the next case's runner starts empty again

    # The team's own index, served by `index serve`, then by nginx with deploy/nginx-index.conf
    # (as a team deploys it): its signed build verifies and is taken, with the provenance it
    # was verified against, read once (a second read could be other bytes).
    with (tmp_path / "access.log").open("a") as log, serving(team_index, log) as url:
        _taken(cli, monkeypatch, sandbox, url)
    _read_once(tmp_path / "access.log", sandbox, team_index, built)
    sandbox.output = tmp_path / "runner-c"
    with serving_nginx(team_index, tmp_path / "nginx") as url:
        _taken(cli, monkeypatch, sandbox, url)
    _read_once(tmp_path / "nginx" / "wheelmill-wants.log", sandbox, team_index, built)  # its JSON lines


def _taken(cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, url: str) -> None:
    monkeypatch.setenv("WHEELMILL_SERVED_INDEX", url)
    result = build(cli, monkeypatch, sandbox, "cpu")
    assert result.code == 0, result.out[-3000:] + result.err
    data = report(sandbox)
    (recipe,) = data["recipes"]
    assert recipe["status"] == "reused", recipe
    tested = [s["status"] for s in data["steps"] if s["step"] == "install-test"]
    assert tested == ["ok"], "taken, then install-tested here before it is delivered"


def _read_once(log: Path, sandbox: Sandbox, team_index: Path, built: FileEntry) -> None:
    requests = parse_access_log(log.read_text().splitlines())
    read = [path for path, _status, _size in requests if path.endswith(".intoto.jsonl")]
    assert len(read) == 1, read
    (recipe,) = report(sandbox)["recipes"]
    delivered = beside(Path(recipe["wheel"]["path"]))
    assert delivered.read_bytes() == provenance_of(tree_channel(team_index, "cpu"), built), "the bytes verified"
