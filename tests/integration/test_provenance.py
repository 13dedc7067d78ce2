"""Every wheel says what it is made of and who made it: a real build of cpu-py311's
example-cpp-ops, signed with a key made by `wheelmill key new`, holds a valid CycloneDX SBOM
and has a signed statement beside it in the channel (that the same build gives the same
bytes, SBOM and all, is test_reproducible's); `wheelmill verify` passes on the channel
served over HTTP (and on a bucket's), and fails, each time with one line and its own code,
on a changed byte, another key's signature, a statement for another file, a wheel without
its SBOM and a page whose sha256 was altered. pip and uv install from the channel as before."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_build_keys import serving
from tests.integration.test_cells import ROOT
from tests.objectstore import ObjectStore
from wheelmill.machine.net import sha256_of
from wheelmill.provenance.sbom import SBOM_FILE, validate_sbom
from wheelmill.provenance.signing import envelope_line, new_signing_key, sign_envelope, signing_key_from_pem

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("provenance")]  # one build for the module
CELL, RECIPE = "cpu-py311", "example-cpp-ops"


@dataclass(frozen=True)
class Built:
    project: Path
    output: Path
    key: Path
    wheel: Path  # in dist/

    @property
    def provenance(self) -> Path:
        return self.wheel.with_name(self.wheel.name + ".intoto.jsonl")

    @property
    def channel(self) -> Path:
        return self.output / "index" / "cpu"


def wheelmill(project: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "wheelmill", *args]
    return subprocess.run(
        command, cwd=project, env={**os.environ, **env}, capture_output=True, text=True, timeout=1800, check=False
    )


def build(project: Path, output: Path, key: Path, *args: str) -> Path:
    env = {"WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "none", "WHEELMILL_SIGNING_KEY_FILE": str(key)}
    done = wheelmill(project, "build", "--cell", CELL, "--recipe", RECIPE, *args, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (wheel,) = (output / CELL / "dist").glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("provenance")
    project = root / "project"
    for part in ("recipes", "extensions", "locks", "containers"):
        shutil.copytree(
            ROOT / part, project / part, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        )
    made = wheelmill(project, "key", "new", "--out", str(root / "team.pem"), env={})
    assert made.returncode == 0, made.stderr
    output = root / "wheels"
    return Built(project=project, output=output, key=root / "team.pem", wheel=build(project, output, root / "team.pem"))


def verify(built: Built, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"WHEELMILL_TRUSTED_KEYS": f"{built.key}.pub", "WHEELMILL_OUTPUT": str(built.output)}
    return wheelmill(built.project, "verify", *args, env=env)


def statements(provenance: Path) -> list[dict[str, Any]]:
    lines = provenance.read_text().splitlines()
    return [json.loads(base64.b64decode(json.loads(line)["payload"])) for line in lines]


def sbom_of(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(f".dist-info/{SBOM_FILE}")]
        return archive.read(name)


def test_the_wheel_holds_a_valid_sbom_and_a_signed_statement_names_it(built: Built) -> None:
    sbom = sbom_of(built.wheel)
    assert validate_sbom(sbom) == []
    document = json.loads(sbom)
    print(json.dumps({k: document[k] for k in ("bomFormat", "specVersion", "serialNumber", "metadata")}, indent=1))
    names = {c["name"]: c for c in document["components"]}
    assert names["torch"]["version"] == "2.13.0+cpu" and names["torch"]["hashes"], names["torch"]
    assert {"cpython", "torch", "build-env.lock"} <= set(names)
    # The provenance is published with the file, and the channel's JSON page names it.
    page_dir = built.channel / "simple" / RECIPE
    page = json.loads((page_dir / "index.json").read_text())
    (entry,) = [f for f in page["files"] if f["filename"] == built.wheel.name]
    assert entry["_provenance"].endswith(".intoto.jsonl")
    published = Path(os.path.normpath(page_dir / urllib.parse.unquote(entry["_provenance"])))
    assert published.read_bytes() == built.provenance.read_bytes()
    (statement,) = statements(built.provenance)
    print(json.dumps(statement, indent=1))
    assert statement["subject"] == [{"name": built.wheel.name, "digest": {"sha256": sha256_of(built.wheel)}}]
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["cell"] == CELL
    assert definition["internalParameters"]["buildKey"]["digest"] in entry["_build-keys"]


def test_verify_passes_on_the_served_channel_and_pip_and_uv_install_from_it(built: Built, tmp_path: Path) -> None:
    with serving(built.output / "index") as url:
        done = verify(built, f"{url}/cpu/simple/")
        print(done.stdout)
        assert done.returncode == 0, done.stderr
        assert f"ok {built.wheel.name}: sha256, signature, subject, SBOM, build key" in done.stdout
        uv = str(Path(sys.executable).with_name("uv"))
        for name in ("pip", "uv"):
            venv = tmp_path / name
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
            python = ["--python", str(venv / "bin" / "python")]  # before pip's subcommand, after uv's
            pip = [sys.executable, "-m", "pip", *python, "install"]
            argv = [*(pip if name == "pip" else [uv, "pip", "install", *python]), "--no-deps"]
            env = {
                **os.environ,
                "PIP_CONFIG_FILE": os.devnull,
                "UV_NO_CONFIG": "1",
                "UV_CACHE_DIR": str(tmp_path / "uv-cache"),  # not a venv: uv would wait for its own lock
            }
            installed = subprocess.run(
                [*argv, "--index-url", f"{url}/cpu/simple/", RECIPE],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            assert installed.returncode == 0, installed.stderr[-2000:]


def one_error(done: subprocess.CompletedProcess[str], code: int, words: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("wheelmill: error: ") and "; fix: " in lines[0], lines
    assert words in lines[0], lines[0]
    return lines[0]


def copy_of(built: Built, where: Path, wheel_bytes: bytes | None = None, provenance: bytes | None = None) -> Path:
    where.mkdir(parents=True)
    wheel = where / built.wheel.name
    wheel.write_bytes(built.wheel.read_bytes() if wheel_bytes is None else wheel_bytes)
    wheel.with_name(wheel.name + ".intoto.jsonl").write_bytes(
        built.provenance.read_bytes() if provenance is None else provenance
    )
    return wheel


def signed(statement: dict[str, Any], pem: bytes) -> bytes:
    key = signing_key_from_pem(pem, source="test")
    return envelope_line(sign_envelope(json.dumps(statement, sort_keys=True).encode(), key)).encode()


def test_verify_fails_with_one_line_and_its_own_code_on_each_fault(built: Built, tmp_path: Path) -> None:
    lines = []
    (statement,) = statements(built.provenance)
    team = built.key.read_bytes()

    # One byte of the wheel changed (in its library's bytes: the SBOM still reads).
    data = bytearray(built.wheel.read_bytes())
    with zipfile.ZipFile(built.wheel) as archive:
        member = next(i for i in archive.infolist() if i.filename.endswith(".so"))
    data[member.header_offset + 30 + len(member.filename) + len(member.extra) + member.compress_size // 2] ^= 0xFF
    changed = copy_of(built, tmp_path / "byte", wheel_bytes=bytes(data))
    lines.append(one_error(verify(built, str(changed)), 27, "not this file"))

    # The statement signed by another key.
    other = new_signing_key("ecdsa-p256").private_pem()
    resigned = copy_of(built, tmp_path / "key", provenance=signed(statement, other))
    lines.append(one_error(verify(built, str(resigned)), 26, "none of the trusted keys"))

    # A provenance for another file, signed by the team's key.
    elsewhere = {**statement, "subject": [{"name": "other-1.0-py3-none-any.whl", "digest": {"sha256": "0" * 64}}]}
    wrong = copy_of(built, tmp_path / "subject", provenance=signed(elsewhere, team))
    lines.append(one_error(verify(built, str(wrong)), 27, "other-1.0-py3-none-any.whl"))

    # The wheel without its SBOM, its statement signed anew for those bytes by the team's key.
    stripped = tmp_path / "stripped.whl"
    with zipfile.ZipFile(built.wheel) as source, zipfile.ZipFile(stripped, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            if not item.filename.endswith(SBOM_FILE):
                target.writestr(item, source.read(item.filename))
    unsbomed = {**statement, "subject": [{"name": built.wheel.name, "digest": {"sha256": sha256_of(stripped)}}]}
    without = copy_of(built, tmp_path / "sbom", wheel_bytes=stripped.read_bytes(), provenance=signed(unsbomed, team))
    lines.append(one_error(verify(built, str(without)), 28, SBOM_FILE))

    # A page whose listed sha256 was altered, served over HTTP.
    index = tmp_path / "index"
    shutil.copytree(built.output / "index", index)
    page = index / "cpu" / "simple" / RECIPE / "index.json"
    data_page = json.loads(page.read_text())
    for entry in data_page["files"]:
        if entry["filename"] == built.wheel.name:
            entry["hashes"]["sha256"] = "f" * 64
    page.write_text(json.dumps(data_page))
    with serving(index) as url:
        lines.append(one_error(verify(built, f"{url}/cpu/simple/"), 7, "its page lists ffffffffffffffff"))
    print("\n".join(lines))


def test_a_bucket_channel_keeps_the_provenance(built: Built, object_store: ObjectStore) -> None:
    prefix = f"provenance-{os.getpid()}"
    env = {**object_store.environ(), "WHEELMILL_INDEX_ROOT": object_store.url(prefix)}
    published = wheelmill(built.project, "publish", "--channel", "cpu", str(built.wheel), env=env)
    assert published.returncode == 0, published.stderr
    env |= {"WHEELMILL_TRUSTED_KEYS": f"{built.key}.pub"}
    done = wheelmill(built.project, "verify", "--channel", "cpu", env=env)
    print(done.stdout)
    assert done.returncode == 0, done.stderr
    assert "1 verified, 0 failed" in done.stdout


def test_a_wheel_reused_from_the_served_index_brings_its_provenance(built: Built, tmp_path: Path) -> None:
    """Runner B builds nothing runner A published: the wheel it fetches from A's served index
    lands in its dist/ with the provenance A published beside it, and verifies there."""
    output = tmp_path / "runner-b"
    with serving(built.output / "index") as url:
        env = {"WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "none", "WHEELMILL_SERVED_INDEX": url}
        done = wheelmill(built.project, "build", "--cell", CELL, "--recipe", RECIPE, "--no-publish", env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    fetched = output / CELL / "dist" / built.wheel.name
    assert "reused: " in done.stdout and fetched.read_bytes() == built.wheel.read_bytes()
    beside = fetched.with_name(fetched.name + ".intoto.jsonl")
    assert beside.read_bytes() == built.provenance.read_bytes()
    assert verify(built, str(fetched)).returncode == 0
