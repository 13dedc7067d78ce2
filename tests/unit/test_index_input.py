"""Corrupt and hostile input to the index, from the command line: damaged pages, a missing
HTML page, a lost sidecar, a METADATA version that is no version, a METADATA bomb, a URL
that would add a line to a settings file, a count that is no count, a leftover of a killed
mirror. Each is one line on stderr with its exit code, never a traceback, and writes
nothing; where the tree is damaged, ``index render`` (or the next publish) makes it valid
again from the channel's entries."""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path

import pytest

from tests.channels import pages_dir, stored_file, tree_channel
from tests.conftest import CliResult, CliRunner
from tests.wheels import make_wheel
from wheelmill.errors import ChannelError, InvalidWheel, UsageError
from wheelmill.files import TMP_PREFIX, TMP_SUFFIX
from wheelmill.index.downloads import STALE_AFTER, Downloads
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.roots import problems, publish, set_yanked

ANY = "py3-none-any"


@pytest.fixture
def channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ObjectChannel:
    """The cpu channel of the index the CLI uses, with lib 1.0 (yanked) and 2.0 in it; the
    wheels stay in ``tmp_path/w``."""
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    channel = tree_channel(tmp_path / "index", "cpu")
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


def snapshot(channel: ObjectChannel) -> dict[Path, bytes]:
    """Every file of the index tree: the channel's pages and entries, the blobs, and the
    storage's own work (a refused command leaves not even a lock file behind)."""
    root = Path(channel.storage.location)
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def lib_files(channel: ObjectChannel) -> list[tuple[str, str | None]]:
    project = channel.project("lib")
    assert project is not None
    return [(f.filename, f.yanked) for f in project.files]


@pytest.mark.parametrize("page", ["simple/index.json", "simple/lib/index.json"])
def test_a_damaged_page_is_named_by_verify_and_mended_by_render_and_by_the_next_publish(
    cli: CliRunner, repo_root: Path, channel: ObjectChannel, tmp_path: Path, page: str
) -> None:
    """The pages are a function of the entries: a damaged one loses nothing (the yank is an
    object of its own), a check names it, and any render writes it again."""
    damaged = pages_dir(channel).parent / page
    damaged.write_text('{"meta": {"api-version": "1.1"}, "proj')
    before = snapshot(channel)
    where = "cpu" if page == "simple/index.json" else "cpu/lib"
    one_line(
        cli("index", "verify"), ChannelError.exit_code, f"{where}: not a valid index page", "wheelmill index render"
    )
    assert snapshot(channel) == before, "a check writes nothing"
    rendered = cli("index", "render", "--channel", "cpu")
    assert rendered.code == 0, rendered.err
    assert "cpu: rendered, ok" in rendered.out
    assert problems(channel) == []
    assert lib_files(channel) == [("lib-1.0-py3-none-any.whl", "broken"), ("lib-2.0-py3-none-any.whl", None)], (
        "the yank survives a damaged JSON page"
    )
    damaged.write_text('{"meta": {"api-version": "1.1"}, "proj')
    wheel = make_wheel(tmp_path / "w", "lib", "3.0", tag=ANY)
    published = cli("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cpu", str(wheel))
    assert published.code == 0, published.err
    assert problems(channel) == []
    assert lib_files(channel) == [
        ("lib-1.0-py3-none-any.whl", "broken"),
        ("lib-2.0-py3-none-any.whl", None),
        ("lib-3.0-py3-none-any.whl", None),
    ]


def test_a_project_with_no_readable_page_is_rendered_again_from_its_entries(
    cli: CliRunner, channel: ObjectChannel
) -> None:
    (pages_dir(channel) / "lib" / "index.json").write_text("{")
    (pages_dir(channel) / "lib" / "index.html").unlink()
    result = cli("index", "render", "--channel", "cpu")
    assert result.code == 0, result.err
    assert (
        "cpu: lib: listed lib-1.0-py3-none-any.whl (unlisted before)" in result.out
        and "cpu: lib: listed lib-2.0-py3-none-any.whl (unlisted before)" in result.out
    ), result.out
    assert problems(channel) == []
    assert lib_files(channel) == [("lib-1.0-py3-none-any.whl", "broken"), ("lib-2.0-py3-none-any.whl", None)]
    project = channel.project("lib")
    assert project is not None and {f.requires_python for f in project.files} == {">=3.9"}


def test_a_lost_sidecar_is_named_by_render_and_publishing_the_file_again_stores_it(
    cli: CliRunner, repo_root: Path, channel: ObjectChannel, tmp_path: Path
) -> None:
    """A render writes pages, not bytes: what the storage lost is named with the fix, and
    the same file published again (a job's retry) stores what is missing."""
    sidecar = Path(f"{stored_file(channel, 'lib-2.0-py3-none-any.whl')}.metadata")
    sidecar.unlink()
    one_line(
        cli("index", "render", "--channel", "cpu"),
        ChannelError.exit_code,
        "cpu/lib-2.0-py3-none-any.whl: listed but the file or its .metadata is missing",
        "publish again what it names",
    )
    wheel = tmp_path / "w" / "lib-2.0-py3-none-any.whl"
    again = cli("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cpu", str(wheel))
    assert again.code == 0 and "unchanged: cpu/lib-2.0-py3-none-any.whl" in again.out, again.err
    assert sidecar.is_file()
    assert problems(channel) == []
    assert cli("index", "verify", "--hashes").code == 0


def test_a_missing_html_page_is_a_problem_verify_names_and_render_mends(cli: CliRunner, channel: ObjectChannel) -> None:
    (pages_dir(channel) / "lib" / "index.html").unlink()
    one_line(
        cli("index", "verify"),
        ChannelError.exit_code,
        "cpu/lib: index.html and index.json list different files",
        "wheelmill index render",
    )
    assert cli("index", "render").code == 0
    assert (pages_dir(channel) / "lib" / "index.html").is_file()
    assert cli("index", "verify").code == 0


def test_verify_reads_every_files_bytes_with_hashes_on_a_tree_as_on_a_bucket(
    cli: CliRunner, channel: ObjectChannel, tmp_path: Path
) -> None:
    """One check on either storage (docs/design/storage.md): without --hashes every page,
    file and sidecar is there with its size; with it, every file is read back and hashed."""
    wheel = stored_file(channel, "lib-1.0-py3-none-any.whl")
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 0xFF  # the same size, other bytes
    damaged = tmp_path / "damaged.whl"
    damaged.write_bytes(bytes(data))
    damaged.replace(wheel)
    assert cli("index", "verify").code == 0
    one_line(cli("index", "verify", "--hashes"), ChannelError.exit_code, f"cpu/{wheel.name}: sha256 differs")


def test_a_wheel_whose_metadata_version_is_no_version(
    cli: CliRunner, repo_root: Path, channel: ObjectChannel, tmp_path: Path
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
    cli: CliRunner, repo_root: Path, channel: ObjectChannel, tmp_path: Path
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
        "METADATA' unpacks to 268435",
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


def test_a_stale_download_is_a_note_of_verify_and_sweep_removes_it(cli: CliRunner, channel: ObjectChannel) -> None:
    """A mirror killed midway leaves a partial download in the tree's download area: verify
    notes it (no problem of any channel) and names the command that removes it; one written
    to a moment ago is a download in progress, and both commands leave it alone."""
    incoming = Downloads(Path(channel.storage.location)).incoming
    incoming.mkdir(parents=True)
    leftover = incoming / f"{TMP_PREFIX}lib-3.0-py3-none-any.whl.x1y2z3{TMP_SUFFIX}"
    leftover.write_bytes(b"half")
    an_hour_ago = time.time() - STALE_AFTER - 3600
    os.utime(leftover, (an_hour_ago, an_hour_ago))
    running = incoming / f"{TMP_PREFIX}lib-4.0-py3-none-any.whl.a1b2c3{TMP_SUFFIX}"
    running.write_bytes(b"still coming")
    result = cli("index", "verify")
    assert result.code == 0 and result.err == ""
    assert (
        f"note: downloads: {leftover.name}, left by an interrupted mirror (`wheelmill index sweep` removes it)"
        in result.out
    ), result.out
    assert running.name not in result.out
    swept = cli("index", "sweep")
    assert swept.code == 0, swept.err
    assert "downloads: removed 1 files" in swept.out, swept.out
    assert not leftover.exists() and running.is_file()
    assert json.loads((pages_dir(channel) / "lib" / "index.json").read_text())["name"] == "lib"
    assert problems(channel) == []
