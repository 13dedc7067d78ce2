"""A channel written as objects (``wheelmill.index.objects``), on the tree implementation of
the storage protocol: its rules (immutable files, built beats mirrored, build keys learnt,
yanks), pages a function of the entries, and a writer's death between any two of its
writes healed by the next render. The S3 implementation runs the same code against a real
server in tests/integration/test_object_index.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.channels import stored_file, tree_channel
from tests.wheels import make_wheel
from wheelmill.errors import ChannelError, IndexConflict
from wheelmill.index.channels import PublishOutcome, built_by_key
from wheelmill.index.objects import (
    BUILT,
    ObjectChannel,
    blob_key,
    page_cache,
    publish,
    remove_files,
    render,
    set_yanked,
    verify,
)
from wheelmill.index.roots import export
from wheelmill.index.storage import Storage, TreeStorage


@pytest.fixture
def channel(tmp_path: Path) -> ObjectChannel:
    return ObjectChannel(TreeStorage(tmp_path / "index"), "test/cu130")


def wheel(tmp_path: Path, name: str = "demo", version: str = "1.0", body: bytes = b"x = 1\n") -> Path:
    return make_wheel(tmp_path / "dist" / body.hex()[:8], name, version, files={f"{name}/__init__.py": body})


def test_a_published_wheel_is_stored_once_listed_on_both_pages_and_verifies(
    channel: ObjectChannel, tmp_path: Path
) -> None:
    one = wheel(tmp_path)
    done = publish(channel, one, build_key="k1")
    assert done.outcome is PublishOutcome.ADDED
    project = channel.project("demo")
    assert project is not None and [f.filename for f in project.files] == [one.name]
    entry = project.files[0]
    assert entry.build_keys == ("k1",)
    # the URL, from /test/cu130/simple/demo/, reaches the blob at the root's /blobs/...
    assert entry.url == f"../../../../blobs/sha256/{entry.sha256}/{one.name}"
    storage = channel.storage
    assert isinstance(storage, TreeStorage)
    assert (storage.root / blob_key(entry.sha256, one.name)).read_bytes() == one.read_bytes()
    assert channel.project_names() == ["demo"]
    html = (storage.root / "test/cu130/simple/demo/index.html").read_text()
    assert f'href="{entry.url}#sha256={entry.sha256}"' in html
    assert verify(channel) == []
    again = publish(channel, one, build_key="k1")
    assert again.outcome is PublishOutcome.UNCHANGED
    learnt = publish(channel, one, build_key="k2")
    assert learnt.outcome is PublishOutcome.UNCHANGED
    assert set(built_by_key(channel)) == {"k1", "k2"}
    assert page_cache(channel.name) == "no-cache" and page_cache("cu130") == "max-age=600, must-revalidate"


def test_other_bytes_under_a_published_name_are_refused(channel: ObjectChannel, tmp_path: Path) -> None:
    publish(channel, wheel(tmp_path, body=b"a = 1\n"))
    with pytest.raises(IndexConflict, match="already published with other bytes") as refused:
        publish(channel, wheel(tmp_path, body=b"b = 2\n"))
    assert refused.value.exit_code == 14
    assert verify(channel) == []


def test_a_built_wheel_replaces_the_mirrored_ones_and_a_mirror_does_not_return(
    channel: ObjectChannel, tmp_path: Path
) -> None:
    mirrored = wheel(tmp_path, version="0.9")
    publish(channel, mirrored, mirrored_from="https://upstream.example/demo-0.9.whl")
    built = wheel(tmp_path, body=b"y = 2\n")
    done = publish(channel, built)
    assert done.replaced == (mirrored.name,)
    project = channel.project("demo")
    assert project is not None and [f.filename for f in project.files] == [built.name]
    later = publish(channel, wheel(tmp_path, version="0.8"), mirrored_from="https://upstream.example/x.whl")
    assert later.outcome is PublishOutcome.BUILT_HERE
    assert verify(channel) == []


def test_a_yank_and_an_unyank_show_on_both_pages(channel: ObjectChannel, tmp_path: Path) -> None:
    publish(channel, wheel(tmp_path))
    assert set_yanked(channel, "demo", "1.0", "broken ABI") == [wheel(tmp_path).name]
    project = channel.project("demo")
    assert project is not None and project.files[0].yanked == "broken ABI"
    assert verify(channel) == []
    set_yanked(channel, "demo", "1.0", None)
    project = channel.project("demo")
    assert project is not None and project.files[0].yanked is None
    with pytest.raises(ChannelError, match=r"has no version 3\.0"):
        set_yanked(channel, "demo", "3.0", "x")


def test_removed_files_leave_the_pages_and_a_project_without_files_leaves_the_list(
    channel: ObjectChannel, tmp_path: Path
) -> None:
    one, other = wheel(tmp_path), wheel(tmp_path, "other")
    publish(channel, one)
    publish(channel, other)
    assert remove_files(channel, "other", [other.name, "missing.whl"]) == [other.name]
    assert channel.project_names() == ["demo"] and channel.project("other") is None, "its pages went too"
    assert render(channel) == []
    assert verify(channel) == []


def test_an_entry_written_without_its_pages_is_found_by_verify_and_listed_by_render(
    channel: ObjectChannel, tmp_path: Path
) -> None:
    """A writer killed after its entry and before the pages: verify names the file,
    ``render`` lists it, and so does the next publish of the project."""
    publish(channel, wheel(tmp_path))
    late = wheel(tmp_path, version="2.0")
    storage: Storage = channel.storage
    sha = __import__("hashlib").sha256(late.read_bytes()).hexdigest()
    storage.create(blob_key(sha, late.name), late)
    page = channel.project("demo")
    assert page is not None
    from wheelmill.index.objects import entry_bytes  # noqa: PLC0415

    listed = page.files[0]
    storage.create(
        f"{channel.entries('demo', late.name)}{BUILT}",
        entry_bytes("demo", listed.__class__(**{**listed.__dict__, "filename": late.name, "sha256": sha})),
    )
    problems = verify(channel, hashes=False)
    assert any(f"{late.name}: not listed" in p for p in problems), problems
    said = render(channel)
    assert said == [f"demo: listed {late.name} (unlisted before)"]
    assert any(f"{late.name}: listed but the file or its .metadata is missing" in p for p in verify(channel)), (
        "the blob's sidecar was never written: verify says so"
    )


def test_a_damaged_page_is_an_error_that_names_render_and_render_mends_it(
    channel: ObjectChannel, tmp_path: Path
) -> None:
    publish(channel, wheel(tmp_path))
    storage = channel.storage
    assert isinstance(storage, TreeStorage)
    (storage.root / "test/cu130/simple/demo/index.json").write_text("{not json")
    with pytest.raises(ChannelError, match="not a valid index page") as damaged:
        channel.project("demo")
    assert "wheelmill index render" in (damaged.value.fix or "")
    assert verify(channel)
    render(channel)
    assert verify(channel) == []
    data = json.loads((storage.root / "test/cu130/simple/demo/index.json").read_text())
    assert [f["filename"] for f in data["files"]] == [wheel(tmp_path).name]


def test_a_channel_name_that_is_none_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ChannelError, match="is not a channel name"):
        ObjectChannel(TreeStorage(tmp_path), "blobs")


def test_an_export_into_a_tree_holds_the_named_builds_and_the_mirrored_closure(
    channel: ObjectChannel, tmp_path: Path
) -> None:
    """What a cell's images install from an object store, as a tree served on loopback: the
    cell's own builds (not other versions) and every mirrored file, still mirrored."""
    old, new = wheel(tmp_path, version="1.0"), wheel(tmp_path, version="2.0")
    dep = wheel(tmp_path, "dep", "3.0")
    for built in (old, new):
        publish(channel, built)
    publish(channel, dep, mirrored_from="https://upstream.example/dep-3.0.whl")
    # another storage: an entry naming the source's blob would name nothing there, so the bytes must go too
    target = tree_channel(tmp_path / "tree", channel.name)
    done = export(channel, target, built={new.name}, scratch=tmp_path)
    assert sorted(d.filename for d in done) == sorted([new.name, dep.name])
    listed = {f.filename: f for p in target.projects() for f in p.files}
    assert set(listed) == {new.name, dep.name}
    assert listed[dep.name].mirrored_from == "https://upstream.example/dep-3.0.whl" and listed[new.name].built
    for name, source in ((new.name, new), (dep.name, dep)):
        assert stored_file(target, name).read_bytes() == source.read_bytes(), "the tree holds the bytes themselves"
    assert verify(target) == []


def test_an_export_given_a_closure_takes_only_its_mirrored_files(channel: ObjectChannel, tmp_path: Path) -> None:
    """The closure a cell's build locked: the mirrored files it names, not the channel's
    others (another torch's, for another cell of the channel)."""
    built = wheel(tmp_path, version="2.0")
    wanted, other = wheel(tmp_path, "dep", "3.0"), wheel(tmp_path, "dep", "4.0")
    publish(channel, built)
    for dep in (wanted, other):
        publish(channel, dep, mirrored_from=f"https://upstream.example/{dep.name}")
    target = tree_channel(tmp_path / "tree", channel.name)
    done = export(channel, target, built={built.name}, closure={wanted.name}, scratch=tmp_path)
    assert sorted(d.filename for d in done) == sorted([built.name, wanted.name])
    assert {f.filename for p in target.projects() for f in p.files} == {built.name, wanted.name}
