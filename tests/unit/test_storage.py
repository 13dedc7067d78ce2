"""The tree storage's own edges (the protocol's guarantees on both storages are
tests/integration/test_storage.py's): an object that cannot be written is one error naming
it, and the tree's working files are no objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from wheelmill.errors import IndexWriteError
from wheelmill.files import write_once
from wheelmill.index.storage import TreeStorage


def test_an_object_that_cannot_be_written_is_one_error_and_nothing_changes(tmp_path: Path) -> None:
    storage = TreeStorage(tmp_path / "index")
    assert storage.create("cu130/files", b"a file where a folder must be")
    with pytest.raises(IndexWriteError, match=r"cannot write cu130/files/w\.whl: ") as failed:
        storage.create("cu130/files/w.whl", b"wheel")
    assert failed.value.fix is not None and "as it was" in failed.value.fix
    assert storage.keys_under() == ["cu130/files"]


def test_the_trees_working_files_are_no_objects(tmp_path: Path) -> None:
    storage = TreeStorage(tmp_path / "index")
    assert storage.create("a/b", b"1")
    stored = storage.get("a/b")
    assert stored is not None and storage.swap("a/b", b"2", version=stored.version)
    assert (tmp_path / "index" / ".storage" / "locks").is_dir(), "the swap's lock"
    assert storage.keys_under() == ["a/b"] and not list((tmp_path / "index" / ".storage" / "tmp").iterdir())


def test_a_file_is_written_once_whole(tmp_path: Path) -> None:
    assert write_once(tmp_path / "f", b"first")
    assert not write_once(tmp_path / "f", b"second")
    assert (tmp_path / "f").read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["f"], "no temporary left"
