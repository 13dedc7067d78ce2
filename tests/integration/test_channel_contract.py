"""The channel's contract: one table of scenarios, each run on both storages (a directory
tree, and a real S3 server: SeaweedFS with conditional writes), by the one channel
implementation (``wheelmill.index.objects``). A rule written for one storage only fails
here on the other. Where the two earlier implementations disagreed, the decision is in
docs/design/storage.md ("One channel, two storages") and its scenario says it:

- the same bytes published again with a provenance, where the file is listed without one,
  list that provenance (a build that signs later is not stuck unsigned); one listed keeps
  its own;
- a project whose last file is removed leaves the project list, and its pages go;
- verify checks every page, entry, listed blob and sidecar on either storage, and hashes
  every file's bytes on either with ``hashes``;
- files published in one ``Staging`` (a cell's release publish, a promotion) are listed
  together at its commit point, or not at all: a refused one removes what it staged, and a
  killed one is committed by its retry.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.storages import Watched
from tests.wheels import make_wheel
from wheelmill.errors import IndexConflict
from wheelmill.index.channels import PublishOutcome, built_by_key
from wheelmill.index.objects import (
    COMMITS,
    ObjectChannel,
    Staging,
    blob_key,
    provenance_of,
    publish,
    remove_files,
    render,
    set_yanked,
)
from wheelmill.index.objects import verify as verify_channel
from wheelmill.index.pages import FileEntry
from wheelmill.index.storage import Storage

pytestmark = pytest.mark.integration
UPSTREAM = "https://pypi.example/packages/demo-1.0-py3-none-any.whl"
# What a writer killed midway may leave, each listing only files that are there.
HEALED_BY_A_RENDER = ("`wheelmill index render` lists it", "index.html and index.json list different files")
SIGNED = b'{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": []}\n'


def wheel(tmp_path: Path, name: str = "demo", version: str = "1.0", body: bytes = b"x = 1\n") -> Path:
    return make_wheel(tmp_path / "dist" / body.hex(), name, version, files={f"{name}/__init__.py": body})


def listed(channel: ObjectChannel, project: str = "demo") -> list[str]:
    found = channel.project(project)
    return [] if found is None else [f.filename for f in found.files]


def only(channel: ObjectChannel, project: str) -> FileEntry:
    found = channel.project(project)
    assert found is not None and len(found.files) == 1, found
    return found.files[0]


def publish_lists_the_file_on_both_pages_and_stores_its_bytes(channel: ObjectChannel, tmp_path: Path) -> None:
    one = wheel(tmp_path)
    assert publish(channel, one, build_key="k1").outcome is PublishOutcome.ADDED
    assert listed(channel) == [one.name] and channel.project_names() == ["demo"]
    entry = next(iter(channel.projects())).files[0]
    copy = tmp_path / "fetched.whl"
    assert channel.fetch(entry, copy) and copy.read_bytes() == one.read_bytes()
    assert channel.storage.get(f"{blob_key(entry.sha256, one.name)}.metadata") is not None
    assert verify_channel(channel, hashes=True) == []


def the_same_bytes_again_change_nothing(channel: ObjectChannel, tmp_path: Path) -> None:
    one = wheel(tmp_path)
    publish(channel, one)
    before = channel.project("demo")
    assert publish(channel, one).outcome is PublishOutcome.UNCHANGED
    assert channel.project("demo") == before


def a_provenance_is_learnt_by_a_file_listed_without_one_and_kept_by_one_listed_with_one(
    channel: ObjectChannel, tmp_path: Path
) -> None:
    one, other = wheel(tmp_path), wheel(tmp_path, "other")
    publish(channel, one, provenance=None)
    assert publish(channel, one, provenance=SIGNED).outcome is PublishOutcome.UNCHANGED
    entry = only(channel, "demo")
    assert entry.provenance is not None and provenance_of(channel, entry) == SIGNED
    publish(channel, other, provenance=SIGNED)
    publish(channel, other, provenance=SIGNED.replace(b"e30=", b"e31="))
    kept = only(channel, "other")
    assert provenance_of(channel, kept) == SIGNED
    assert verify_channel(channel, hashes=True) == []


def other_bytes_under_a_published_name_are_refused_with_exit_14(channel: ObjectChannel, tmp_path: Path) -> None:
    one, changed = wheel(tmp_path), wheel(tmp_path, body=b"x = 2\n")
    assert one.name == changed.name
    publish(channel, one)
    with pytest.raises(IndexConflict) as refused:
        publish(channel, changed)
    assert refused.value.exit_code == 14 and "build it again" in str(refused.value.fix)
    assert listed(channel) == [one.name]


def build_keys_are_learnt_and_answer_for_the_file(channel: ObjectChannel, tmp_path: Path) -> None:
    one = wheel(tmp_path)
    publish(channel, one, build_key="k1")
    publish(channel, one, build_key="k2")
    assert set(built_by_key(channel)) == {"k1", "k2"}
    assert next(iter(channel.projects())).files[0].build_keys == ("k1", "k2")


def a_built_file_beats_a_mirrored_one_in_either_order(channel: ObjectChannel, tmp_path: Path) -> None:
    mirrored, built = wheel(tmp_path, version="0.9"), wheel(tmp_path, version="1.0")
    publish(channel, mirrored, mirrored_from=UPSTREAM)
    done = publish(channel, built)
    assert done.replaced == (mirrored.name,) and listed(channel) == [built.name]
    assert publish(channel, mirrored, mirrored_from=UPSTREAM).outcome is PublishOutcome.BUILT_HERE
    assert listed(channel) == [built.name]
    assert verify_channel(channel, hashes=True) == []


def a_yank_shows_and_an_unyank_clears_it(channel: ObjectChannel, tmp_path: Path) -> None:
    one = wheel(tmp_path)
    publish(channel, one, build_key="k1")
    assert set_yanked(channel, "demo", "1.0", "broken") == [one.name]
    assert next(iter(channel.projects())).files[0].yanked == "broken"
    assert built_by_key(channel) == {}, "a yanked wheel answers for no key"
    set_yanked(channel, "demo", "1.0", None)
    assert next(iter(channel.projects())).files[0].yanked is None
    assert verify_channel(channel) == []


def a_project_whose_last_file_is_removed_leaves_the_list(channel: ObjectChannel, tmp_path: Path) -> None:
    one, two, kept = wheel(tmp_path, version="1.0"), wheel(tmp_path, version="2.0"), wheel(tmp_path, "kept")
    for path in (one, two, kept):
        publish(channel, path)
    assert remove_files(channel, "demo", [one.name]) == [one.name] and listed(channel) == [two.name]
    assert remove_files(channel, "demo", [two.name]) == [two.name]
    assert channel.project_names() == ["kept"] and channel.project("demo") is None
    assert verify_channel(channel, hashes=True) == []


def prune_keeps_the_newest_and_removes_the_rest(channel: ObjectChannel, tmp_path: Path) -> None:
    versions = [wheel(tmp_path, version=f"1.0.dev{n}") for n in range(4)]
    for path in versions:
        publish(channel, path)
    old = [p.name for p in versions[:2]]
    assert remove_files(channel, "demo", old) == sorted(old)
    assert listed(channel) == [p.name for p in versions[2:]]
    assert verify_channel(channel, hashes=True) == []


def verify_finds_a_missing_blob_always_and_other_bytes_with_hashes(channel: ObjectChannel, tmp_path: Path) -> None:
    one, two = wheel(tmp_path), wheel(tmp_path, "other")
    publish(channel, one)
    publish(channel, two)
    entries = {p.name: p.files[0] for p in channel.projects()}
    gone = blob_key(entries["demo"].sha256, one.name)
    channel.storage.delete(gone)
    tampered = blob_key(entries["other"].sha256, two.name)
    channel.storage.delete(tampered)
    channel.storage.create(tampered, b"not the wheel")
    quick, thorough = verify_channel(channel, hashes=False), verify_channel(channel, hashes=True)
    assert any(one.name in p and "missing" in p for p in quick) and not any(two.name in p for p in quick), quick
    assert any(one.name in p for p in thorough) and any(two.name in p and "sha256" in p for p in thorough)


def every_file(channel: ObjectChannel) -> list[str]:
    """What the channel's pages list, every project's."""
    return sorted(f.filename for project in channel.projects() for f in project.files) if channel.exists() else []


def files_of_one_staging_are_listed_at_its_commit_or_not_at_all(channel: ObjectChannel, tmp_path: Path) -> None:
    other = ObjectChannel(channel.storage, f"{channel.name}-sm90")
    one, two, three = wheel(tmp_path), wheel(tmp_path, "other"), wheel(tmp_path, "third")
    publish(channel, three)  # listed already: a staging that names it again leaves it as it is
    with Staging("release/test/1.0/cpu-py311") as staging:
        for target, path in ((channel, one), (other, two), (channel, three)):
            publish(target, path, staging=staging)
        assert (every_file(channel), every_file(other)) == ([three.name], []), "nothing new before the commit"
        render(channel)
        assert every_file(channel) == [three.name], "a render lists no staged file either"
        assert any("staged by release/test/1.0/cpu-py311, not committed" in p for p in verify_channel(channel))
    assert (every_file(channel), every_file(other)) == (sorted([one.name, three.name]), [two.name])
    assert verify_channel(channel, hashes=True) == [] and verify_channel(other, hashes=True) == []
    # Refused midway (other bytes under a listed name): what it staged is removed, the names free again.
    four, clash = wheel(tmp_path, "fourth"), wheel(tmp_path, "other", body=b"x = 2\n")

    def refused() -> None:
        with Staging("release/test/1.1/cpu-py311") as staging:
            publish(channel, four, staging=staging)
            publish(other, clash, staging=staging)

    with pytest.raises(IndexConflict):
        refused()
    assert every_file(channel) == sorted([one.name, three.name]) and channel.listing("fourth") == {}
    assert verify_channel(channel, hashes=True) == []
    assert publish(channel, wheel(tmp_path, "fourth", body=b"y = 4\n")).outcome is PublishOutcome.ADDED


SCENARIOS: dict[str, Callable[[ObjectChannel, Path], None]] = {
    f.__name__: f
    for f in (
        publish_lists_the_file_on_both_pages_and_stores_its_bytes,
        the_same_bytes_again_change_nothing,
        a_provenance_is_learnt_by_a_file_listed_without_one_and_kept_by_one_listed_with_one,
        other_bytes_under_a_published_name_are_refused_with_exit_14,
        build_keys_are_learnt_and_answer_for_the_file,
        a_built_file_beats_a_mirrored_one_in_either_order,
        a_yank_shows_and_an_unyank_clears_it,
        a_project_whose_last_file_is_removed_leaves_the_list,
        prune_keeps_the_newest_and_removes_the_rest,
        verify_finds_a_missing_blob_always_and_other_bytes_with_hashes,
        files_of_one_staging_are_listed_at_its_commit_or_not_at_all,
    )
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_channel_contract(scenario: str, storage: Storage, tmp_path: Path) -> None:
    SCENARIOS[scenario](ObjectChannel(storage, "test/cpu"), tmp_path)


class Killed(Exception):
    """The writer's process ended here: nothing after this request happened."""


class Dying(Watched):
    """``storage``, but every write after the first ``writes`` raises ``Killed``."""

    def __init__(self, storage: Storage, writes: int) -> None:
        super().__init__(storage)
        self.left, self.made = writes, 0

    def before_write(self, key: str) -> None:
        if self.left == 0:
            raise Killed
        self.left -= 1
        self.made += 1


def test_a_publisher_killed_between_any_two_writes_leaves_a_valid_channel_that_a_render_heals(
    storage: Storage, tmp_path: Path
) -> None:
    """A built wheel replacing a mirrored one (the most writes a publish makes), killed after
    each of its writes in turn: no page lists a missing file at once (verify finds at most
    an entry no page lists yet, or the JSON page a render ahead of the HTML one), and after a
    render the channel verifies; the job's retry
    then lists the built file alone, with its key and provenance."""

    def trio(n: int) -> tuple[Path, Path, bytes]:  # bytes of their own each time: every blob is written again
        body = f"x = {n}\n".encode()
        signed = SIGNED.replace(b'"signatures": []', f'"signatures": [], "n": {n}'.encode())
        return wheel(tmp_path, version="0.9", body=body), wheel(tmp_path, version="1.0", body=body), signed

    counter = Dying(storage, writes=10_000)
    mirrored, built, signed = trio(-1)
    publish(ObjectChannel(storage, "test/count"), mirrored, mirrored_from=UPSTREAM)
    publish(ObjectChannel(counter, "test/count"), built, build_key="k1", provenance=signed)
    assert counter.made > 5
    for writes in range(counter.made):
        name, (mirrored, built, signed) = f"test/k{writes}", trio(writes)
        publish(ObjectChannel(storage, name), mirrored, mirrored_from=UPSTREAM)
        with pytest.raises(Killed):
            publish(ObjectChannel(Dying(storage, writes), name), built, build_key="k1", provenance=signed)
        channel = ObjectChannel(storage, name)
        problems = verify_channel(channel, hashes=True)
        assert [p for p in problems if not p.endswith(HEALED_BY_A_RENDER)] == [], (writes, problems)
        render(channel)
        assert verify_channel(channel, hashes=True) == [], f"killed after {writes} writes, then rendered"
        now = listed(channel)
        assert now in ([mirrored.name], [built.name]), (writes, now)
        publish(channel, built, build_key="k1", provenance=signed)  # the job's retry
        assert listed(channel) == [built.name] and set(built_by_key(channel)) == {"k1"}, writes
        entry = next(iter(channel.projects())).files[0]
        assert provenance_of(channel, entry) == signed, writes
        assert verify_channel(channel, hashes=True) == [], writes


def test_a_remover_killed_between_any_two_writes_is_healed_by_the_same_remove_again(
    storage: Storage, tmp_path: Path
) -> None:
    """Two of a project's three files removed (a nightly's retention), killed after each of
    its writes in turn: no page lists a missing file at once, and the same remove again, as
    a prune run again does, leaves both pages listing the one file kept, whether or not the
    killed one had got to its pages."""
    versions = ("1.0", "1.1", "1.2")

    def filled(name: str) -> tuple[ObjectChannel, list[Path]]:
        channel = ObjectChannel(storage, name)
        wheels = [wheel(tmp_path, version=v, body=f"v = '{name}{v}'\n".encode()) for v in versions]
        for one in wheels:
            publish(channel, one)
        return channel, wheels

    channel, wheels = filled("nightly/count")
    counter = Dying(storage, writes=10_000)
    remove_files(ObjectChannel(counter, channel.name), "demo", [w.name for w in wheels[:2]])
    assert counter.made > 3
    for writes in range(counter.made):
        channel, wheels = filled(f"nightly/k{writes}")
        dropped = [w.name for w in wheels[:2]]
        with pytest.raises(Killed):
            remove_files(ObjectChannel(Dying(storage, writes), channel.name), "demo", dropped)
        problems = verify_channel(channel, hashes=True)
        assert [p for p in problems if not p.endswith(HEALED_BY_A_RENDER)] == [], (writes, problems)
        remove_files(channel, "demo", dropped)
        assert listed(channel) == [wheels[2].name] and verify_channel(channel, hashes=True) == [], writes


def test_a_staging_killed_between_any_two_writes_lists_all_or_nothing_and_its_retry_commits(
    storage: Storage, tmp_path: Path
) -> None:
    """Two files of two projects in one staging (a promotion's), killed after each of its
    writes in turn: the pages list neither, or the commit point exists (and then a render
    lists both); the same staging run again lists both, and the channel verifies."""

    def staged(store: Storage, name: str, wheels: list[Path]) -> None:
        with Staging(f"promote/release/{name}") as staging:
            for path in wheels:
                publish(ObjectChannel(store, name), path, staging=staging)

    def pair(n: int) -> list[Path]:
        body = f"x = {n}\n".encode()
        return [wheel(tmp_path, body=body), wheel(tmp_path, "other", body=body)]

    counter = Dying(storage, writes=10_000)
    staged(counter, "test/count", pair(-1))
    assert counter.made > 8
    for writes in range(counter.made):
        name, wheels = f"test/s{writes}", pair(writes)
        with pytest.raises(Killed):
            staged(Dying(storage, writes), name, wheels)
        channel, both = ObjectChannel(storage, name), sorted(w.name for w in wheels)
        committed = storage.get(f"{COMMITS}promote/release/{name}") is not None
        assert every_file(channel) == [] or committed, (writes, every_file(channel))
        render(channel)
        assert every_file(channel) == (both if committed else []), (writes, committed, every_file(channel))
        staged(storage, name, wheels)  # the job's retry
        assert every_file(channel) == both and verify_channel(channel, hashes=True) == [], writes
