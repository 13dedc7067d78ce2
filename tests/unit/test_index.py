"""The index as values and files: pages, negotiation, publish/yank rules, consumer settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.wheels import make_wheel
from wheelmill.errors import IndexConflict, IndexStoreError
from wheelmill.index.consumer import render
from wheelmill.index.pages import HTML_TYPE, JSON_TYPE, FileEntry, Project, project_html, project_json
from wheelmill.index.serve import negotiate
from wheelmill.index.store import Channel, PublishOutcome, publish, repair, set_yanked
from wheelmill.index.verify import leftovers, verify

ANY = "py3-none-any"


def entry(**changes: object) -> FileEntry:
    values: dict[str, object] = {
        "filename": "torch_ext-1.0+cu118-cp311-cp311-manylinux_2_28_x86_64.whl",
        "version": "1.0+cu118",
        "sha256": "a" * 64,
        "size": 10,
        "upload_time": "2026-11-22T10:00:00.000000Z",
        "requires_python": ">=3.9",
        "metadata_sha256": "b" * 64,
    }
    values.update(changes)
    return FileEntry(**values)  # type: ignore[arg-type]


def test_html_page_carries_every_pep_attribute() -> None:
    page = project_html(Project(name="torch-ext", files=(entry(yanked="broken kernel"),)))
    assert (
        'href="../../files/torch_ext-1.0%2Bcu118-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=' + "a" * 64 + '"' in page
    )
    assert 'data-requires-python="&gt;=3.9"' in page
    assert f'data-core-metadata="sha256={"b" * 64}"' in page
    assert "dist-info-metadata" not in page  # PEP 714: the old name crashes pip 22.3 to 23.0
    assert 'data-yanked="broken kernel"' in page
    assert '<meta name="pypi:repository-version" content="1.1">' in page


def test_json_page_has_pep700_fields() -> None:
    data = json.loads(
        project_json(
            Project(
                name="torch-ext",
                files=(entry(), entry(filename="torch_ext-0.9-py3-none-any.whl", version="0.9", yanked="")),
            )
        )
    )
    assert data["meta"] == {"api-version": "1.1"}
    assert data["versions"] == ["0.9", "1.0+cu118"]
    first, second = data["files"]
    assert first["size"] == 10 and first["upload-time"].endswith("Z")
    assert first["yanked"] is False and second["yanked"] is True
    assert first["core-metadata"] == {"sha256": "b" * 64}


@pytest.mark.parametrize(
    ("accept", "fmt", "chosen"),
    [
        (None, None, "text/html"),
        ("*/*", None, JSON_TYPE),
        ("application/vnd.pypi.simple.v1+json", None, JSON_TYPE),
        ("application/vnd.pypi.simple.v1+json;q=0.2, text/html", None, "text/html"),
        ("application/vnd.pypi.simple.latest+json", None, JSON_TYPE),  # PEP 691's alias of the newest version
        ("application/vnd.pypi.simple.latest+html", None, HTML_TYPE),
        (None, "application/vnd.pypi.simple.latest+json", JSON_TYPE),
        ("text/html", "application/vnd.pypi.simple.v1+json", JSON_TYPE),
        (None, "application/xml", None),
    ],
)
def test_content_negotiation(accept: str | None, fmt: str | None, chosen: str | None) -> None:
    assert negotiate(accept, fmt) == chosen


def test_publish_is_idempotent_and_refuses_other_bytes(tmp_path: Path) -> None:
    channel = Channel(tmp_path / "index", "cu118")
    wheel = make_wheel(tmp_path / "a", "lib", "1.0", tag=ANY, files={"lib/__init__.py": b"x = 1\n"})
    assert publish(channel, wheel).outcome is PublishOutcome.ADDED
    assert publish(channel, wheel).outcome is PublishOutcome.UNCHANGED
    other = make_wheel(tmp_path / "b", "lib", "1.0", tag=ANY, files={"lib/__init__.py": b"x = 2\n"})
    with pytest.raises(IndexConflict, match="already published with other bytes"):
        publish(channel, other)
    assert verify(channel) == []
    assert leftovers(channel) == []


def test_an_unlisted_file_from_a_killed_publisher_is_listed_by_the_next_publish(tmp_path: Path) -> None:
    channel = Channel(tmp_path / "index", "cpu")
    wheel = make_wheel(tmp_path, "lib", "1.0", tag=ANY)
    channel.files.mkdir(parents=True)
    (channel.files / wheel.name).write_bytes(wheel.read_bytes())  # the copy landed, the pages did not
    (channel.path / ".tmp").mkdir()
    (channel.path / ".tmp" / ".wm-tmp-abc").write_bytes(b"half")
    assert publish(channel, wheel).outcome is PublishOutcome.ADDED
    assert verify(channel) == []
    assert leftovers(channel) == []


def test_a_generation_a_killed_writer_staged_is_a_note_until_the_next_write_removes_it(tmp_path: Path) -> None:
    """A writer killed after staging its next pages, before the switch: readers still see the
    old pages, whole; `index verify` names the staged generation and the next write drops it."""
    channel = Channel(tmp_path / "index", "cpu")
    publish(channel, make_wheel(tmp_path / "a", "alpha", "1.0", tag=ANY))
    current = channel.simple.readlink().name
    staged = channel.path / ".simple-1-999999"
    shutil.copytree(channel.simple.resolve(), staged)
    assert verify(channel) == []
    assert leftovers(channel) == [".simple-1-999999, pages of an interrupted write"]
    assert channel.simple.readlink().name == current
    said = repair(channel)
    assert "removed .simple-1-999999, a generation of pages no reader saw" in said, said
    assert not staged.exists() and leftovers(channel) == [] and verify(channel) == []


def test_publish_touches_only_its_project_and_a_new_name_in_the_list(tmp_path: Path) -> None:
    channel = Channel(tmp_path / "index", "cpu")
    publish(channel, make_wheel(tmp_path, "alpha", "1.0", tag=ANY))
    publish(channel, make_wheel(tmp_path, "beta", "1.0", tag=ANY))
    alpha_page = channel.simple / "alpha" / "index.json"
    root = channel.simple / "index.json"
    before = (alpha_page.stat().st_mtime_ns, root.stat().st_mtime_ns)
    publish(channel, make_wheel(tmp_path, "beta", "1.1", tag=ANY))
    assert (alpha_page.stat().st_mtime_ns, root.stat().st_mtime_ns) == before
    assert channel.project_names() == ["alpha", "beta"]


def test_yank_and_unyank_a_version(tmp_path: Path) -> None:
    channel = Channel(tmp_path / "index", "cpu")
    publish(channel, make_wheel(tmp_path, "lib", "1.0", tag=ANY))
    assert set_yanked(channel, "lib", "1.0", "bad build") == ["lib-1.0-py3-none-any.whl"]
    project = channel.project("lib")
    assert project is not None and project.files[0].yanked == "bad build"
    set_yanked(channel, "lib", "1.0", None)
    project = channel.project("lib")
    assert project is not None and project.files[0].yanked is None
    with pytest.raises(IndexStoreError, match=r"has no version 2\.0"):
        set_yanked(channel, "lib", "2.0", "x")


def test_a_wheel_whose_metadata_disagrees_with_its_name_is_refused(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "lib", "1.0", tag=ANY)
    renamed = wheel.with_name("other-1.0-py3-none-any.whl")
    wheel.rename(renamed)
    with pytest.raises(IndexStoreError, match=r"its METADATA says lib 1\.0"):
        publish(Channel(tmp_path / "index", "cpu"), renamed)


@pytest.mark.parametrize("name", ["", "CU118", "../x", ".hidden", "a/b"])
def test_channel_names_are_checked(tmp_path: Path, name: str) -> None:
    with pytest.raises(IndexStoreError, match="not a channel name"):
        Channel(tmp_path, name)


def test_consumer_settings_name_one_index_only() -> None:
    pip = render("https://wheels.internal", "cu118", "pip")
    assert pip == "[global]\nindex-url = https://wheels.internal/cu118/simple/\nextra-index-url =\nfind-links =\n"
    uv = render("https://wheels.internal/", "rocm6.2", "uv")
    assert 'url = "https://wheels.internal/rocm6.2/simple/"' in uv and "default = true" in uv
    assert "extra" not in render("https://w", "cpu", "env").replace("PIP_EXTRA_INDEX_URL=\n", "")


def test_a_channels_pages_are_one_generation_behind_a_link_switched_as_one_step(tmp_path: Path) -> None:
    """simple is a link to the one generation of the pages; each change makes the next one
    and switches the link, leaving no other generation behind."""
    channel = Channel(tmp_path / "index", "cpu")
    publish(channel, make_wheel(tmp_path / "dist", "lib", "1.0", tag="py3-none-any"))
    first = channel.simple.resolve()
    assert channel.simple.is_symlink() and first.name.startswith(".simple-")
    publish(channel, make_wheel(tmp_path / "dist", "app", "1.0", tag="py3-none-any"))
    second = channel.simple.resolve()
    assert second != first and not first.exists()
    assert [p.name for p in channel.path.glob(".simple-*")] == [second.name]
    assert channel.project_names() == ["app", "lib"] and verify(channel) == []
    lib = second / "lib" / "index.json"
    assert lib.stat().st_nlink == 1, "the unchanged page linked from the generation before, which is gone"


def test_a_channel_an_older_wheelmill_wrote_is_moved_behind_the_link_by_its_next_writer(tmp_path: Path) -> None:
    """Pages in simple itself (an older wheelmill's tree), one pending update it left: the
    next publish moves them behind the link once, finishes that update, and adds its wheel."""
    channel = Channel(tmp_path / "index", "cpu")
    publish(channel, make_wheel(tmp_path / "dist", "lib", "1.0", tag="py3-none-any"))
    generation = channel.simple.resolve()
    channel.simple.unlink()
    generation.rename(channel.simple)  # as an older wheelmill left it: a directory
    (channel.simple / "index.html").unlink()  # its writer killed between two pages
    channel.pending.write_text("lib\n")
    publish(channel, make_wheel(tmp_path / "dist", "app", "1.0", tag="py3-none-any"))
    assert channel.simple.is_symlink() and not channel.pending.exists()
    assert channel.project_names() == ["app", "lib"] and verify(channel) == []


def test_a_channel_under_a_relative_index_root_keeps_its_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default index root is relative (wheels/index): the generation the link names is
    the one kept, however the channel's path is spelled."""
    monkeypatch.chdir(tmp_path)
    channel = Channel(Path("wheels") / "index", "cpu")
    for name in ("lib", "app"):
        publish(channel, make_wheel(tmp_path / "dist", name, "1.0", tag="py3-none-any"))
        assert channel.project_names() == sorted({"lib", name}) and verify(channel) == []
    assert len(list(channel.path.glob(".simple-*"))) == 1


def test_a_provenance_is_published_beside_its_file_named_by_both_pages_and_learnt_once(tmp_path: Path) -> None:
    """A file published with its provenance lists it as ``_provenance`` (JSON) and
    ``data-provenance`` (HTML), relative to the page like the file; the same bytes published
    again keep the first one; a file listed without one learns it; a repair keeps it."""
    channel = Channel(tmp_path / "index", "cpu")
    wheel = make_wheel(tmp_path / "dist", "demo", "1.0")
    publish(channel, wheel, build_key="a" * 64)
    assert channel.project("demo").files[0].provenance is None  # type: ignore[union-attr]
    publish(channel, wheel, build_key="a" * 64, provenance=b'{"first": 1}\n')
    publish(channel, wheel, build_key="a" * 64, provenance=b'{"second": 2}\n')
    (entry,) = channel.project("demo").files  # type: ignore[union-attr]
    assert entry.provenance == "../../files/demo-1.0-cp311-cp311-linux_x86_64.whl.intoto.jsonl"
    assert (channel.files / "demo-1.0-cp311-cp311-linux_x86_64.whl.intoto.jsonl").read_bytes() == b'{"first": 1}\n'
    page = channel.simple / "demo"
    assert json.loads((page / "index.json").read_text())["files"][0]["_provenance"] == entry.provenance
    assert f'data-provenance="{entry.provenance}"' in (page / "index.html").read_text()
    (page / "index.json").unlink()  # a damaged page: repaired from the HTML and the files
    repair(channel)
    assert channel.project("demo").files[0].provenance == entry.provenance  # type: ignore[union-attr]
    assert verify(channel) == []
