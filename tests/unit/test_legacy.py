"""An index tree an earlier wheelmill wrote, read where it is, refused for writing, and
migrated once into objects by ``wheelmill index migrate``.

``tests/data/legacy-index.tar.gz`` was written by the tree channel code of commit 252b705
(the last before every channel was objects): channel ``cpu`` with ``wm-demo 1.0`` (built,
published for two build keys, with a provenance; it requires ``wm-dep``), ``wm-demo 0.9``
(built, yanked) and ``wm-dep 2.0`` (mirrored); ``test/cpu`` with ``wm-demo 1.1rc1`` (built,
with a provenance) and the same ``wm-dep`` bytes.
"""

from __future__ import annotations

import dataclasses
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.channels import pages_dir, tree_channel
from tests.conftest import CliRunner
from tests.wheels import make_wheel
from wheelmill.errors import ChannelError
from wheelmill.index import channels
from wheelmill.index.legacy import is_legacy
from wheelmill.index.roots import problems, provenance_of

FIXTURE = Path(__file__).resolve().parent.parent / "data" / "legacy-index.tar.gz"
CHANNELS = ("cpu", "test/cpu")
STATEMENT = b'{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": []}\n'


@pytest.fixture
def legacy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "index"
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(root))
    return root


def listing(projects: Any) -> dict[str, dict[str, Any]]:
    """Every file of a channel by name, as its pages say it, but where its bytes are."""
    return {
        f.filename: dataclasses.asdict(dataclasses.replace(f, href=None, provenance=f.provenance is not None))
        for project in projects
        for f in project.files
    }


def snapshot(root: Path) -> dict[str, bytes | str]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


def test_an_old_layout_channel_is_refused_for_writing_with_the_command_that_migrates_it(
    legacy: Path, cli: CliRunner, tmp_path: Path
) -> None:
    before = snapshot(legacy)
    wheel = make_wheel(tmp_path / "new", "wm-new", "1.0", tag="py3-none-any")
    for args in (
        ("publish", "--channel", "cpu", str(wheel)),
        ("yank", "--channel", "cpu", "--reason", "x", "wm-demo", "1.0"),
        ("index", "verify", "--channel", "cpu"),
    ):
        result = cli(*args)
        assert result.code == ChannelError.exit_code, (args, result.err)
        (line,) = result.err.strip().splitlines()
        assert "channel cpu is in the layout of an earlier wheelmill" in line and "wheelmill index migrate" in line
    assert snapshot(legacy) == before, "nothing written"


def test_a_migration_keeps_every_file_key_yank_and_provenance_and_a_second_changes_nothing(
    legacy: Path, cli: CliRunner
) -> None:
    before = {name: listing(channels.Channel(legacy, name).projects()) for name in CHANNELS}
    assert sum(len(files) for files in before.values()) == 5
    result = cli("index", "migrate")
    assert result.code == 0, result.err
    assert "cpu: 3 files of 2 projects are objects now" in result.out, result.out
    assert "test/cpu: 2 files of 2 projects are objects now" in result.out, result.out
    assert f"{legacy}: migrated 2 channel(s)" in result.out
    for name in CHANNELS:
        channel = tree_channel(legacy, name)
        assert listing(channel.projects()) == before[name], name
        assert problems(channel, hashes=True) == [], name
        assert not is_legacy(legacy, name) and not (legacy / name / "files").exists()
        assert sorted(p.name for p in (legacy / name).iterdir() if p.name.startswith(".")) == [
            (legacy / name / "simple").readlink().name
        ], "the old code's work and generations gone but the pages' own"
        up = "../" * (name.count("/") + 3)
        for project in channel.projects():
            assert all(f.url.startswith(f"{up}blobs/sha256/{f.sha256}/") for f in project.files), project
    demo = {f.filename: f for f in tree_channel(legacy, "cpu").project("wm-demo").files}  # type: ignore[union-attr]
    current = demo["wm_demo-1.0-py3-none-any.whl"]
    assert current.build_keys == ("b" * 64, "c" * 64) and current.gpu_archs == "cpu"
    assert provenance_of(tree_channel(legacy, "cpu"), current) == STATEMENT
    assert demo["wm_demo-0.9-py3-none-any.whl"].yanked == "broken kernels"
    (dep,) = tree_channel(legacy, "cpu").project("wm-dep").files  # type: ignore[union-attr]
    assert dep.mirrored_from == "https://upstream.example/packages/wm_dep-2.0-py3-none-any.whl"
    done = snapshot(legacy)
    again = cli("index", "migrate")
    assert again.code == 0 and f"{legacy}: nothing to migrate" in again.out, again.out + again.err
    assert snapshot(legacy) == done


def test_a_migrated_channel_takes_the_next_publish_and_its_pages_list_both(
    legacy: Path, cli: CliRunner, tmp_path: Path
) -> None:
    assert cli("index", "migrate").code == 0
    wheel = make_wheel(tmp_path / "new", "wm-demo", "1.2", tag="py3-none-any")
    result = cli("--recipes", str(tmp_path / "no-recipes"), "publish", "--channel", "cpu", str(wheel))
    assert result.code == 0, result.err
    channel = tree_channel(legacy, "cpu")
    versions = [f.version for f in channel.project("wm-demo").files]  # type: ignore[union-attr]
    assert sorted(versions) == ["0.9", "1.0", "1.2"] and problems(channel, hashes=True) == []
    assert "wm_demo-1.2-py3-none-any.whl" in (pages_dir(channel) / "wm-demo" / "index.html").read_text()
