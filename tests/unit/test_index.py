"""The index as values and files: pages, negotiation, publish/yank rules, consumer settings.
The rules run against a channel on a tree, written by the one channel code
(``wheelmill.index.objects``, through ``wheelmill.index.roots``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.channels import pages_dir, stored_file, tree_channel
from tests.nginx import AcceptCase, accept_cases
from tests.wheels import make_wheel
from wheelmill.errors import ChannelError, IndexConflict
from wheelmill.index import objects
from wheelmill.index.channels import PublishOutcome
from wheelmill.index.consumer import format_settings
from wheelmill.index.objects import ObjectChannel, blob_key
from wheelmill.index.pages import (
    PROVENANCE_ATTRIBUTE,
    FileEntry,
    Project,
    links,
    project_html,
    project_json,
)
from wheelmill.index.roots import problems, provenance_of, publish, set_yanked
from wheelmill.index.serve import negotiate, query_format

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


@pytest.mark.parametrize("case", accept_cases(), ids=lambda c: f"{c.accept}|{c.format}")
def test_content_negotiation(case: AcceptCase) -> None:
    """The table every server of the index is held to (nginx's configs too: integration)."""
    assert negotiate(case.accept, query_format(case.query.removeprefix("?"))) == case.chosen


def test_publish_is_idempotent_and_refuses_other_bytes(tmp_path: Path) -> None:
    channel = tree_channel(tmp_path / "index", "cu118")
    wheel = make_wheel(tmp_path / "a", "lib", "1.0", tag=ANY, files={"lib/__init__.py": b"x = 1\n"})
    assert publish(channel, wheel).outcome is PublishOutcome.ADDED
    assert publish(channel, wheel).outcome is PublishOutcome.UNCHANGED
    other = make_wheel(tmp_path / "b", "lib", "1.0", tag=ANY, files={"lib/__init__.py": b"x = 2\n"})
    with pytest.raises(IndexConflict, match="already published with other bytes") as refused:
        publish(channel, other)
    assert refused.value.exit_code == 14
    assert stored_file(channel, wheel.name).read_bytes() == wheel.read_bytes(), "the name keeps its first bytes"
    refused_blob = tmp_path / "index" / blob_key(hashlib.sha256(other.read_bytes()).hexdigest(), other.name)
    assert not refused_blob.exists(), "the refused bytes are not kept"
    assert problems(channel) == []


class Killed(BaseException):
    """A publisher killed where it raises: nothing after it runs, as after a SIGKILL."""


@pytest.mark.parametrize("healer", ["the same publish again", "a publish of another version", "render"])
def test_an_unlisted_file_from_a_killed_publisher_is_listed_by_the_next_publish_or_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, healer: str
) -> None:
    """A publisher killed after its bytes and its entry, before the pages: the file is there
    but no page lists it; `index verify` says so, and the next publish of the project (a
    retry, or another version) or a render lists it."""
    channel = tree_channel(tmp_path / "index", "cpu")
    publish(channel, make_wheel(tmp_path / "dist", "lib", "1.0", tag=ANY))
    late = make_wheel(tmp_path / "dist", "lib", "1.1", tag=ANY)

    def killed(_channel: ObjectChannel, _project: str) -> None:
        raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(objects, "_listed", killed)
        with pytest.raises(Killed):
            publish(channel, late)
    project = channel.project("lib")
    assert project is not None and [f.filename for f in project.files] == ["lib-1.0-py3-none-any.whl"]
    assert any(f"{late.name}: not listed" in p for p in problems(channel)), problems(channel)
    if healer == "the same publish again":
        assert publish(channel, late).outcome is PublishOutcome.UNCHANGED, "its entry was made before the kill"
    elif healer == "a publish of another version":
        publish(channel, make_wheel(tmp_path / "dist", "lib", "1.2", tag=ANY))
    else:
        assert objects.render(channel) == [f"lib: listed {late.name} (unlisted before)"]
    project = channel.project("lib")
    assert project is not None and late.name in [f.filename for f in project.files]
    assert stored_file(channel, late.name).read_bytes() == late.read_bytes()
    assert problems(channel) == []


def written(page: Path) -> tuple[int, int]:
    """A page as last written: a write replaces the file (a new inode), so this changes."""
    found = page.stat()
    return found.st_ino, found.st_mtime_ns


def test_publish_touches_only_its_project_and_a_new_name_in_the_list(tmp_path: Path) -> None:
    channel = tree_channel(tmp_path / "index", "cpu")
    publish(channel, make_wheel(tmp_path, "alpha", "1.0", tag=ANY))
    publish(channel, make_wheel(tmp_path, "beta", "1.0", tag=ANY))
    simple = pages_dir(channel)
    alpha = [simple / "alpha" / "index.json", simple / "alpha" / "index.html"]
    beta = [simple / "beta" / "index.json", simple / "beta" / "index.html"]
    root = [simple / "index.json", simple / "index.html"]
    before = {page: written(page) for page in alpha + beta + root}
    publish(channel, make_wheel(tmp_path, "beta", "1.1", tag=ANY))
    assert {page: written(page) for page in alpha + root} == {page: before[page] for page in alpha + root}
    assert all(written(page) != before[page] for page in beta), "beta's pages list its new file"
    assert channel.project_names() == ["alpha", "beta"]
    publish(channel, make_wheel(tmp_path, "gamma", "1.0", tag=ANY))
    assert {page: written(page) for page in alpha} == {page: before[page] for page in alpha}
    assert all(written(page) != before[page] for page in root), "the list names the new project"
    assert channel.project_names() == ["alpha", "beta", "gamma"]
    assert problems(channel) == []


def test_yank_and_unyank_a_version(tmp_path: Path) -> None:
    channel = tree_channel(tmp_path / "index", "cpu")
    publish(channel, make_wheel(tmp_path, "lib", "1.0", tag=ANY))
    assert set_yanked(channel, "lib", "1.0", "bad build") == ["lib-1.0-py3-none-any.whl"]
    project = channel.project("lib")
    assert project is not None and project.files[0].yanked == "bad build"
    assert 'data-yanked="bad build"' in (pages_dir(channel) / "lib" / "index.html").read_text()
    assert problems(channel) == []
    set_yanked(channel, "lib", "1.0", None)
    project = channel.project("lib")
    assert project is not None and project.files[0].yanked is None
    assert "data-yanked" not in (pages_dir(channel) / "lib" / "index.html").read_text()
    with pytest.raises(ChannelError, match=r"has no version 2\.0"):
        set_yanked(channel, "lib", "2.0", "x")


def test_a_wheel_whose_metadata_disagrees_with_its_name_is_refused(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "lib", "1.0", tag=ANY)
    renamed = wheel.with_name("other-1.0-py3-none-any.whl")
    wheel.rename(renamed)
    channel = tree_channel(tmp_path / "index", "cpu")
    with pytest.raises(ChannelError, match=r"its METADATA says lib 1\.0"):
        publish(channel, renamed)
    assert not channel.exists() and not (tmp_path / "index" / "blobs").exists(), "nothing of it is stored"


@pytest.mark.parametrize("name", ["", "CU118", "../x", ".hidden", "a/b"])
def test_channel_names_are_checked(tmp_path: Path, name: str) -> None:
    with pytest.raises(ChannelError, match="not a channel name"):
        tree_channel(tmp_path, name)


def test_consumer_settings_name_one_index_only() -> None:
    pip = format_settings("https://wheels.internal", "cu118", "pip")
    assert pip == "[global]\nindex-url = https://wheels.internal/cu118/simple/\nextra-index-url =\nfind-links =\n"
    uv = format_settings("https://wheels.internal/", "rocm6.2", "uv")
    assert 'url = "https://wheels.internal/rocm6.2/simple/"' in uv and "default = true" in uv
    assert "extra" not in format_settings("https://w", "cpu", "env").replace("PIP_EXTRA_INDEX_URL=\n", "")


def test_a_channel_under_a_relative_index_root_keeps_its_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default index root is relative (wheels/index): the pages are written under it,
    and each page's links reach the files from where the page is, however the root is spelled."""
    monkeypatch.chdir(tmp_path)
    channel = tree_channel(Path("wheels") / "index", "cpu")
    for name in ("lib", "app"):
        publish(channel, make_wheel(tmp_path / "dist", name, "1.0", tag=ANY))
        assert channel.project_names() == sorted({"lib", name}) and problems(channel) == []
    assert (tmp_path / "wheels" / "index" / "cpu" / "simple" / "index.json").is_file()
    for project in channel.projects():
        (entry,) = project.files
        linked = pages_dir(channel) / project.name / entry.url
        assert linked.resolve() == stored_file(channel, entry.filename).resolve()
        assert linked.read_bytes() == (tmp_path / "dist" / entry.filename).read_bytes()


def test_a_provenance_is_published_with_its_file_named_by_both_pages_and_learnt_once(tmp_path: Path) -> None:
    """A file published with its provenance lists it as ``_provenance`` (JSON) and
    ``data-wheelmill-provenance`` (HTML), relative to the page like the file; a file listed without one
    learns the first one published with the same bytes, and keeps it; a render keeps it."""
    channel = tree_channel(tmp_path / "index", "cpu")
    wheel = make_wheel(tmp_path / "dist", "demo", "1.0")
    publish(channel, wheel, build_key="a" * 64)
    assert channel.project("demo").files[0].provenance is None  # type: ignore[union-attr]
    publish(channel, wheel, build_key="a" * 64, provenance=b'{"first": 1}\n')
    publish(channel, wheel, build_key="a" * 64, provenance=b'{"second": 2}\n')
    (entry,) = channel.project("demo").files  # type: ignore[union-attr]
    first = hashlib.sha256(b'{"first": 1}\n').hexdigest()
    assert entry.provenance == f"../../../blobs/sha256/{first}/demo-1.0-cp311-cp311-linux_x86_64.whl.intoto.jsonl"
    page = pages_dir(channel) / "demo"
    assert (page / entry.provenance).read_bytes() == b'{"first": 1}\n'
    assert provenance_of(channel, entry) == b'{"first": 1}\n'
    assert json.loads((page / "index.json").read_text())["files"][0]["_provenance"] == entry.provenance
    assert f'data-wheelmill-provenance="{entry.provenance}"' in (page / "index.html").read_text()
    (page / "index.json").unlink()  # a damaged page: written again from the entries
    objects.render(channel)
    assert channel.project("demo").files[0].provenance == entry.provenance  # type: ignore[union-attr]
    assert problems(channel) == []


@pytest.mark.parametrize("name", ["cpu", "test/cpu"])
def test_a_built_wheels_provenance_beside_it_is_published_with_it(tmp_path: Path, name: str) -> None:
    """A build delivers ``<wheel>.intoto.jsonl`` beside the wheel: its publish lists it from
    the first, linked from the page like the file (one more ``../`` in a track)."""
    channel = tree_channel(tmp_path / "index", name)
    wheel = make_wheel(tmp_path / "dist", "demo", "1.0")
    statement = b'{"beside": 1}\n'
    wheel.with_name(wheel.name + ".intoto.jsonl").write_bytes(statement)
    assert publish(channel, wheel).outcome is PublishOutcome.ADDED
    (entry,) = channel.project("demo").files  # type: ignore[union-attr]
    assert entry.provenance is not None and entry.url.startswith("../" * (name.count("/") + 3))
    assert entry.provenance.startswith("../" * (name.count("/") + 3))
    page = pages_dir(channel) / "demo"
    assert (page / entry.provenance).read_bytes() == statement
    assert (page / entry.url).read_bytes() == wheel.read_bytes()
    assert problems(channel) == []


def test_an_attribute_value_cannot_add_an_attribute_to_a_link() -> None:
    """A build key or a provenance path read from another index's page holds a quote: the
    HTML link still carries exactly the attributes it was given, with those values."""
    entry = FileEntry(
        filename='demo-1.0-py3-none-any.whl"><script>x</script>',
        version="1.0",
        sha256="a" * 64,
        size=1,
        upload_time="2026-11-22T13:05:01.123456Z",
        requires_python=None,
        metadata_sha256="b" * 64,
        build_keys=('k1" onmouseover="alert(1)',),
        provenance='p.intoto.jsonl" data-yanked="x',
    )
    (anchor,) = links(project_html(Project(name="demo", files=(entry,))))
    assert set(anchor) == {"href", "data-core-metadata", "data-build-keys", PROVENANCE_ATTRIBUTE}
    assert anchor["data-build-keys"] == 'k1" onmouseover="alert(1)'
    assert anchor[PROVENANCE_ATTRIBUTE] == 'p.intoto.jsonl" data-yanked="x'
    assert "data-provenance" not in anchor, "PEP 740's name on PyPI's pages: not this"
