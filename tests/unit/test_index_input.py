"""Corrupt and hostile input to the index, from the command line: damaged pages, a missing
HTML page, a METADATA version that is no version, a METADATA bomb, a URL that would add a
line to a settings file, a count that is no count, a leftover of a killed writer. Each is
one line on stderr with its exit code, never a traceback, and writes nothing; where the
tree is damaged, ``index repair`` makes it valid again."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from tests.conftest import CliResult, CliRunner
from tests.wheels import make_wheel
from wheelmill.errors import IndexStoreError, InvalidWheel, UsageError
from wheelmill.files import TMP_PREFIX, TMP_SUFFIX
from wheelmill.index.store import Channel, publish, set_yanked
from wheelmill.index.verify import verify

ANY = "py3-none-any"


@pytest.fixture
def channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Channel:
    """The cpu channel of the index the CLI uses, with lib 1.0 (yanked) and 2.0 in it."""
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    channel = Channel(tmp_path / "index", "cpu")
    for version in ("1.0", "2.0"):
        publish(channel, make_wheel(tmp_path / "w", "lib", version, tag=ANY, requires_python=">=3.9"))
    set_yanked(channel, "lib", "1.0", "broken")
    return channel


def one_line(result: CliResult, code: int, *says: str) -> str:
    assert result.code == code, result.err
    (line,) = result.err.strip().splitlines()
    assert line.startswith("wheelmill: error: ") and "; fix: " in line and "Traceback" not in result.out + result.err, (
        line
    )
    assert all(s in line for s in says), line
    return line


def snapshot(channel: Channel) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in channel.path.rglob("*") if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("page", ["simple/index.json", "simple/lib/index.json"])
def test_a_damaged_page_stops_a_publish_and_repair_mends_it(
    cli: CliRunner, repo_root: Path, channel: Channel, tmp_path: Path, page: str
) -> None:
    (channel.path / page).write_text('{"meta": {"api-version": "1.1"}, "proj')
    before = snapshot(channel)
    wheel = make_wheel(tmp_path / "w", "lib", "3.0", tag=ANY)
    result = cli("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cpu", str(wheel))
    one_line(
        result, IndexStoreError.exit_code, f"{page}: not a valid index page", "wheelmill index repair --channel cpu"
    )
    assert snapshot(channel) == before, "nothing written"
    repaired = cli("--recipes", str(repo_root / "recipes"), "index", "repair")
    assert repaired.code == 0, repaired.err
    assert verify(channel) == []
    project = channel.project("lib")
    assert project is not None and [f.yanked for f in project.files] == ["broken", None], (
        "the yank survives a damaged JSON page"
    )
    assert cli("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cpu", str(wheel)).code == 0


def test_a_project_with_no_readable_page_is_rebuilt_from_its_files(cli: CliRunner, channel: Channel) -> None:
    (channel.simple / "lib" / "index.json").write_text("{")
    (channel.simple / "lib" / "index.html").unlink()
    (channel.files / "lib-2.0-py3-none-any.whl.metadata").unlink()
    result = cli("index", "repair", "--channel", "cpu")
    assert result.code == 0, result.err
    assert (
        "lib: rebuilt from its files" in result.out
        and "made the .metadata of lib-2.0-py3-none-any.whl again" in result.out
    )
    assert verify(channel) == []
    project = channel.project("lib")
    assert project is not None and sorted(f.filename for f in project.files) == [
        "lib-1.0-py3-none-any.whl",
        "lib-2.0-py3-none-any.whl",
    ]
    assert {f.requires_python for f in project.files} == {">=3.9"}


def test_a_missing_html_page_is_a_problem_verify_names_and_repair_mends(cli: CliRunner, channel: Channel) -> None:
    (channel.simple / "lib" / "index.html").unlink()
    one_line(
        cli("index", "verify"), IndexStoreError.exit_code, "cpu/lib: index.html is missing", "wheelmill index repair"
    )
    assert cli("index", "repair").code == 0
    assert cli("index", "verify").code == 0


def test_verify_reads_every_files_bytes_with_hashes_on_a_tree_as_on_a_bucket(cli: CliRunner, channel: Channel) -> None:
    """One check on either storage (docs/design/storage.md): without --hashes every page,
    file and sidecar is there with its size; with it, every file is read back and hashed."""
    (wheel,) = sorted(channel.files.glob("lib-1.0-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 0xFF  # the same size, other bytes
    damaged = channel.root / "damaged.whl"
    damaged.write_bytes(bytes(data))
    damaged.replace(wheel)  # a new file: the store's hard link keeps the published bytes
    assert cli("index", "verify").code == 0
    one_line(cli("index", "verify", "--hashes"), IndexStoreError.exit_code, f"cpu/{wheel.name}: sha256 differs")


def test_a_wheel_whose_metadata_version_is_no_version(
    cli: CliRunner, repo_root: Path, channel: Channel, tmp_path: Path
) -> None:
    wheel = make_wheel(tmp_path / "bad", "lib", "3.0", tag=ANY)
    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["lib-3.0.dist-info/METADATA"] = members["lib-3.0.dist-info/METADATA"].replace(
        b"Version: 3.0", b"Version: three"
    )
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    before = snapshot(channel)
    one_line(
        cli("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cpu", str(wheel)),
        InvalidWheel.exit_code,
        "'three' is not a version",
    )
    assert snapshot(channel) == before


def test_a_metadata_bomb_is_refused_before_it_is_read(
    cli: CliRunner, repo_root: Path, channel: Channel, tmp_path: Path
) -> None:
    wheel = tmp_path / "bomb" / "lib-4.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(
            "lib-4.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: lib\nVersion: 4.0\n\n" + b"\0" * (256 * 2**20)
        )
        zf.writestr("lib-4.0.dist-info/WHEEL", b"Wheel-Version: 1.0\nTag: py3-none-any\n")
    assert wheel.stat().st_size < 2**20, "small on disk, 256 MiB unpacked"
    before = snapshot(channel)
    one_line(
        cli("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cpu", str(wheel)),
        InvalidWheel.exit_code,
        "METADATA unpacks to",
    )
    assert snapshot(channel) == before


def test_a_url_with_a_line_break_never_reaches_a_settings_file(cli: CliRunner) -> None:
    result = cli(
        "index",
        "config",
        "--channel",
        "cpu",
        "--url",
        "http://wheels.internal\n[global]\nextra-index-url = http://evil/simple",
    )
    one_line(result, UsageError.exit_code, "not an http(s) URL of one line")
    assert result.out == ""


@pytest.mark.parametrize("keep", ["-3", "0", "many"])
def test_a_count_that_is_no_count_is_a_usage_error(cli: CliRunner, repo_root: Path, keep: str) -> None:
    one_line(
        cli("--recipes", str(repo_root / "recipes"), "release", "prune", "--track", "nightly", "--keep", keep),
        UsageError.exit_code,
        "--keep",
    )


def test_a_leftover_is_a_note_that_names_what_was_being_written(cli: CliRunner, channel: Channel) -> None:
    leftover = channel.tmp / f"{TMP_PREFIX}lib-3.0-py3-none-any.whl.x1y2z3{TMP_SUFFIX}"
    leftover.write_bytes(b"half")
    result = cli("index", "verify")
    assert result.code == 0 and result.err == ""
    assert f"note: {leftover.name}, of an interrupted write of lib-3.0-py3-none-any.whl" in result.out
    assert json.loads((channel.simple / "lib" / "index.json").read_text())["name"] == "lib"
