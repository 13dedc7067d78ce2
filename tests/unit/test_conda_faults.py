"""Faults of the conda side met through the command, where no solve or install runs: a
malformed env spec file stops ``conda lock`` before any channel is looked up, and a damaged
package stops ``conda index`` before the indexer writes anything."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.unit.test_bad_input import assert_one_line_error
from wheelmill.errors import ChannelError, ConfigError

ENVS = 'schema = 1\nspecs = ["python {python}.*"]\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [(ENVS + 'spec = ["ninja"]\n', ["(top level): unknown key 'spec'", "perhaps you meant 'specs'",
                                    "use one of: schema, specs, variants"]),
     (ENVS.replace("schema = 1", "schema = 2"), ["schema: 2 is not a schema this wheelmill reads"])],
    ids=["unknown-key", "other-schema"],
)  # fmt: skip
@pytest.mark.parametrize("check", [False, True], ids=["lock", "check"])
def test_a_malformed_env_spec_file_is_exit_3_before_any_channel_is_looked_up(
    cli: CliRunner,
    recipes_copy: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    expected: list[str],
    check: bool,
) -> None:
    """No conda channel exists here: a command that reached the channels would say so (exit 2)
    instead of naming the file and its key; no lock is written."""
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    monkeypatch.delenv("WHEELMILL_CONDA_CHANNELS", raising=False)
    spec_file = recipes_copy / "conda" / "envs.toml"
    spec_file.write_text(text)
    out = tmp_path / "lock.txt"
    args = ["--recipes", str(recipes_copy), "conda", "lock", "--cell", "cpu-py311"]
    result = cli(*args, *(["--check"] if check else ["--out", str(out)]))
    assert_one_line_error(
        result.err, code=result.code, expected_code=ConfigError.exit_code, expected=[str(spec_file), *expected]
    )
    assert not out.exists() and not (recipes_copy.parent / "locks" / "conda").exists()


def _conda_archive(path: Path, payload: bytes) -> Path:
    """A .conda as conda's format v2 lays it out (members stored, uncompressed); its tarballs'
    bytes are not read before the CRC check refuses the archive."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stem = path.name.removesuffix(".conda")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("metadata.json", '{"conda_pkg_format_version": 2}')
        archive.writestr(f"pkg-{stem}.tar.zst", payload)
        archive.writestr(f"info-{stem}.tar.zst", b"info")
    return path


def test_a_package_overwritten_in_place_is_exit_15_naming_it_and_the_repodata_stays(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes overwritten in the middle keep the file's size and its zip directory (so
    ``zipfile.is_zipfile`` still says yes); the member's CRC does not."""
    channel = tmp_path / "index" / "conda" / "cpu"
    package = _conda_archive(channel / "linux-64" / "ops-0.1.0-cpu_py311_0.conda", bytes(range(256)) * 64)
    (channel / "noarch").mkdir()
    repodata = {subdir: channel / subdir / "repodata.json" for subdir in ("linux-64", "noarch")}
    for subdir, path in repodata.items():
        path.write_text(f'{{"info": {{"subdir": "{subdir}"}}, "packages": {{}}, "packages.conda": {{}}}}')
    before = {path: path.read_bytes() for path in repodata.values()}
    data = bytearray(package.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    package.write_bytes(bytes(data))
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    result = cli("conda", "index")
    assert_one_line_error(
        result.err,
        code=result.code,
        expected_code=ChannelError.exit_code,
        expected=[
            "linux-64/ops-0.1.0-cpu_py311_0.conda is not a .conda archive",
            "its member pkg-ops-0.1.0-cpu_py311_0.tar.zst is damaged",
            "fix: remove ops-0.1.0-cpu_py311_0.conda, publish its wheel again",
        ],
    )
    assert "free space" not in result.err
    assert {path: path.read_bytes() for path in repodata.values()} == before
