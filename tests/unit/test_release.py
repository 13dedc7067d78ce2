"""Versions from git, PR cell selection, release records, promotion and retention, on values
and small real wheels (no build runs)."""

from __future__ import annotations

import fnmatch
import functools
import json
import re
import shutil
import subprocess
import zipfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.attest import signed, signed_wheel, statement_for
from tests.channels import pages_dir, stored_file, tree_channel
from tests.conftest import CliResult, CliRunner
from tests.storages import Watched
from tests.wheels import make_wheel
from wheelmill.building.plan import Options, plan
from wheelmill.checks.gpu import GpuOutcome
from wheelmill.cli import main
from wheelmill.cli.release import one_build_channels, release_json
from wheelmill.errors import ChannelError, IndexConflict, IntegrityError, ReleaseError, SignatureError
from wheelmill.gpu.report import GpuReport, WheelResult
from wheelmill.index.roots import Index, problems, publish
from wheelmill.index.storage import Storage, Stored, TreeStorage
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.inputs.selection import affected_cells
from wheelmill.inputs.versions import Action, GitState, Release, Track, VersionRule, for_nightly, for_tag, stamp_version
from wheelmill.machine.git import read_state
from wheelmill.machine.net import sha256_of
from wheelmill.output.layout import CellLayout
from wheelmill.output.report import BuiltCell, RecipeRecord, ReleaseRecord, Status, WheelRecord
from wheelmill.provenance.signing import new_signing_key
from wheelmill.releases.gpu_attestation import sign_gpu_record, write_signed
from wheelmill.releases.promotion import promote, same_payload
from wheelmill.releases.publish import (
    BuiltWheel,
    collect_built,
    one_build_lookup,
    prune,
    publish_release,
    refuse_unattested,
)
from wheelmill.releases.records import (
    GpuRecord,
    Manifest,
    ReleasedFile,
    load_manifest,
    manifests,
    record,
    record_gpu,
)
from wheelmill.settings import Settings
from wheelmill.wheel.wheelfile import read_wheel, rewrite_metadata

ROOT = Path(__file__).resolve().parent.parent.parent
HEAD, OTHER = "a" * 40, "b" * 40
DAY = datetime(2026, 11, 22, 9, 30, 15, tzinfo=UTC)  # HEAD's commit time


def state(tags: dict[str, str] | None = None, *, dirty: bool = False) -> GitState:
    return GitState(commit=HEAD, committed=DAY, dirty=dirty, tags=tags or {})


# (case, tags, dirty, what: a tag name or "nightly", expected version, track, action, promote-from,
# or the error's words)
VERSION_CASES = [
    # A release reaches the release channels from its tested rc only, never built straight there.
    ("final tag, no rc", {"v2.4.0": HEAD}, False, "v2.4.0", "no release candidate of 2.4.0", None, None, None),
    ("rc tag", {"v2.4.0-rc1": HEAD}, False, "v2.4.0-rc1", "2.4.0rc1", Track.TEST, Action.BUILD, None),
    (
        "second rc",
        {"v2.4.0-rc1": OTHER, "v2.4.0-rc2": HEAD},
        False,
        "v2.4.0-rc2",
        "2.4.0rc2",
        Track.TEST,
        Action.BUILD,
        None,
    ),
    (
        "final on its rc's commit: promote the newest rc",
        {"v2.4.0-rc1": OTHER, "v2.4.0-rc2": HEAD, "v2.4.0": HEAD},
        False,
        "v2.4.0",
        "2.4.0",
        Track.RELEASE,
        Action.PROMOTE,
        "2.4.0rc2",
    ),
    (
        "final, its rc on another commit",
        {"v2.4.0-rc1": OTHER, "v2.4.0": HEAD},
        False,
        "v2.4.0",
        "(v2.4.0-rc1 on other commits)",
        None,
        None,
        None,
    ),
    (
        "final, another version's rc at HEAD",
        {"v2.3.0-rc1": HEAD, "v2.4.0": HEAD},
        False,
        "v2.4.0",
        "no release candidate of 2.4.0 is tagged on this commit",
        None,
        None,
        None,
    ),
    ("two-digit parts", {"v10.12.3-rc11": HEAD}, False, "v10.12.3-rc11", "10.12.3rc11", Track.TEST, Action.BUILD, None),
    (
        "nightly after a release",
        {"v2.4.0": OTHER},
        False,
        "nightly",
        "2.4.1.dev20261122093015",
        Track.NIGHTLY,
        Action.BUILD,
        None,
    ),
    (
        "nightly during an rc",
        {"v2.4.0": OTHER, "v2.5.0-rc1": OTHER},
        False,
        "nightly",
        "2.5.0.dev20261122093015",
        Track.NIGHTLY,
        Action.BUILD,
        None,
    ),
    ("nightly, no tag yet", {}, False, "nightly", "0.1.0.dev20261122093015", Track.NIGHTLY, Action.BUILD, None),
    (
        "nightly ignores other tags",
        {"deploy-2026": OTHER, "v1": OTHER},
        False,
        "nightly",
        "0.1.0.dev20261122093015",
        Track.NIGHTLY,
        Action.BUILD,
        None,
    ),
    (
        "nightly orders versions, not names",
        {"v9.9.9": OTHER, "v10.0.0": OTHER},
        False,
        "nightly",
        "10.0.1.dev20261122093015",
        Track.NIGHTLY,
        Action.BUILD,
        None,
    ),
    (
        "nightly on a tagged commit",
        {"v2.4.0": HEAD},
        False,
        "nightly",
        "2.4.1.dev20261122093015",
        Track.NIGHTLY,
        Action.BUILD,
        None,
    ),
    ("not on the tag", {"v2.4.0": OTHER}, False, "v2.4.0", "is not on tag v2.4.0", None, None, None),
    ("no such tag", {}, False, "v2.4.0", "not in this repository", None, None, None),
    ("two-part tag", {"v2.4": HEAD}, False, "v2.4", "not a release tag", None, None, None),
    ("no v", {"2.4.0": HEAD}, False, "2.4.0", "not a release tag", None, None, None),
    ("beta", {"v2.4.0-beta1": HEAD}, False, "v2.4.0-beta1", "not a release tag", None, None, None),
    ("dirty rc", {"v2.4.0-rc1": HEAD}, True, "v2.4.0-rc1", "uncommitted changes", None, None, None),
    ("dirty final", {"v2.4.0": HEAD}, True, "v2.4.0", "uncommitted changes", None, None, None),
    ("dirty nightly", {}, True, "nightly", "uncommitted changes", None, None, None),
]


@pytest.mark.parametrize(
    ("case", "tags", "dirty", "what", "expected", "track", "action", "promote_from"),
    VERSION_CASES,
    ids=[c[0] for c in VERSION_CASES],
)
def test_versions_from_git(
    case: str,
    tags: dict[str, str],
    dirty: bool,
    what: str,
    expected: str,
    track: Track | None,
    action: Action | None,
    promote_from: str | None,
) -> None:
    git = state(tags, dirty=dirty)
    if track is None:
        with pytest.raises(ReleaseError) as failed:
            for_nightly(git) if what == "nightly" else for_tag(git, what)
        assert expected in failed.value.one_line() and "fix:" in failed.value.one_line()
        return
    release = for_nightly(git) if what == "nightly" else for_tag(git, what)
    assert (release.version, release.track, release.action, release.promote_from) == (
        expected,
        track,
        action,
        promote_from,
    )


def test_a_preview_of_a_final_tag_without_its_rc_says_a_real_run_stops() -> None:
    release = for_tag(state({"v2.4.0": HEAD}), "v2.4.0", preview=True)
    assert release.action is Action.PROMOTE and release.promote_from is None
    assert len(release.notes) == 1 and "no release candidate of 2.4.0" in release.notes[0]


def test_a_preview_takes_a_missing_tag_as_made_on_head_and_says_so() -> None:
    release = for_tag(state({}, dirty=True), "v0.1.0-rc1", preview=True)
    assert release.version == "0.1.0rc1" and release.track is Track.TEST
    assert (
        len(release.notes) == 2 and "not in this repository" in release.notes[0] and "uncommitted" in release.notes[1]
    )


RC = Release(version="2.4.0rc1", track=Track.TEST, action=Action.BUILD, commit=HEAD, tag="v2.4.0-rc1")


def test_two_commits_of_one_day_are_two_nightlies_and_a_run_publishes_one_version() -> None:
    """A nightly is numbered by its commit's time to the second: a commit at 01:00 and one at
    12:00 of one day are two versions. A job given the plan job's version (``--version``)
    takes it, where it is this commit's nightly of the tags at HEAD with or without those on
    HEAD itself (a final tag pushed between the plan job's clone and its own); any other is
    refused in one line."""
    early, late = (replace(state({"v2.4.0": OTHER}), committed=DAY.replace(hour=h)) for h in (1, 12))
    assert (for_nightly(early).version, for_nightly(late).version) == (
        "2.4.1.dev20261122013015",
        "2.4.1.dev20261122123015",
    )
    tagged_since = state({"v2.4.0": OTHER, "v2.4.1": HEAD})  # the final tag, pushed after the plan job cloned
    assert for_nightly(tagged_since).version == "2.4.2.dev20261122093015"
    planned = for_nightly(state({"v2.4.0": OTHER})).version
    assert for_nightly(tagged_since, given=planned).version == planned == "2.4.1.dev20261122093015"
    for wrong in ("2.4.1.dev20261122093016", "9.9.9.dev20261122093015", "2.4.1"):
        with pytest.raises(
            ReleaseError, match=rf"--version {re.escape(wrong)} is not a nightly of commit aaaaaaaaaaaa"
        ):
            for_nightly(tagged_since, given=wrong)


def test_a_nightlys_version_is_given_with_nightly_alone(cli: CliRunner, project: tuple[Path, str]) -> None:
    repo, _head = project
    refused = cli("--recipes", str(repo / "recipes"), "release", "--tag", "v2.4.0-rc1", "--version", "2.4.0")
    one_line(refused, 2, "--version is for a nightly")


NIGHTLY = Release(version="2.4.1.dev20261122093015", track=Track.NIGHTLY, action=Action.BUILD, commit=HEAD)

# (rule, version as built, release, label, stamped version or None for unchanged)
STAMP_CASES = [
    (VersionRule.REPO, "0.1.0", RC, "cu118", "2.4.0rc1+cu118"),
    (VersionRule.REPO, "0.1.0", NIGHTLY, "rocm6.2", "2.4.1.dev20261122093015+rocm6.2"),
    (VersionRule.REPO, "0.1.0", RC, None, "2.4.0rc1"),
    (VersionRule.REPO, "0.1.0", None, "cpu", "0.1.0+cpu"),
    (VersionRule.SOURCE, "0.1.10", RC, "cu118", "0.1.10+cu118"),
    (VersionRule.SOURCE, "0.1.10", None, "cu130", "0.1.10+cu130"),
    (VersionRule.SOURCE, "0.1.10", RC, None, None),
    (VersionRule.SOURCE, "1.0+upstream", RC, "cu118", None),
    (VersionRule.REPO, "1.0+upstream", RC, "cu118", "2.4.0rc1+cu118"),
    (VersionRule.SOURCE, "0.18.0.post1", None, "cpu", "0.18.0.post1+cpu"),
    # A slim variant's wheels: the arch as one more local segment, never the parent's file name.
    (VersionRule.REPO, "0.1.0", RC, "cu130.sm90", "2.4.0rc1+cu130.sm90"),
    (VersionRule.SOURCE, "0.1.10", None, "rocm6.4.gfx942", "0.1.10+rocm6.4.gfx942"),
]


@pytest.mark.parametrize(("rule", "built", "release", "label", "expected"), STAMP_CASES)
def test_stamped_versions(
    rule: VersionRule, built: str, release: Release | None, label: str | None, expected: str | None
) -> None:
    assert stamp_version(rule, built, release=release, label=label) == expected


def git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def test_read_state_sees_lightweight_and_annotated_tags_and_a_dirty_tree(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-q", "-m", "one", "--date", "2026-11-20T10:00:00Z")
    git(tmp_path, "tag", "v1.0.0-rc1")
    git(tmp_path, "tag", "-a", "v1.0.0", "-m", "release")
    head = git(tmp_path, "rev-parse", "HEAD")
    found = read_state(tmp_path)
    assert found.tags == {"v1.0.0-rc1": head, "v1.0.0": head} and found.commit == head and not found.dirty
    assert for_tag(found, "v1.0.0").action is Action.PROMOTE
    (tmp_path / "new.txt").write_text("untracked")
    assert read_state(tmp_path).dirty


# --- which cells a pull request builds ---------------------------------------------------


SELECTION_CASES = [
    (["recipes/matrix.toml"], "all"),
    (["containers/pins.toml"], "all"),
    (["containers/builder/Containerfile"], "all"),
    (["recipes/example-cuda-ops.toml"], "cuda*"),
    (["extensions/cuda-ops/csrc/rms_norm.cu"], "cuda*"),
    (["extensions/cpp-ops/setup.py"], "all"),
    (["locks/cpu-py311.txt"], ["cpu-py311"]),
    (["containers/rocm/Containerfile"], "rocm*"),
    (["containers/manylinux/Containerfile"], "cpu* cuda*"),
    (["src/wheelmill/building/plan.py", "README.md"], ["cpu-py311", "cuda130-py311"]),
    ([], ["cpu-py311", "cuda130-py311"]),
    (["locks/cpu-py311.txt", "locks/rocm63-py312.txt"], ["cpu-py311", "rocm63-py312"]),
]


@pytest.mark.parametrize(("changed", "expected"), SELECTION_CASES)
def test_cells_a_change_affects(changed: list[str], expected: str | list[str]) -> None:
    matrix, recipes = load_matrix(ROOT / "recipes" / "matrix.toml"), load_recipes(ROOT / "recipes")
    chosen = [c.id for c in affected_cells(matrix, recipes, changed, root=ROOT)]
    if isinstance(expected, list):
        assert chosen == expected
        return
    globs = expected.split()
    every = [c.id for c in matrix.cells if not c.variant.slim_of]  # a slim cell only where named
    wanted = every if expected == "all" else [c for c in every if any(fnmatch.fnmatchcase(c, g) for g in globs)]
    assert chosen == wanted and chosen


def test_matrix_json_is_golden(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--recipes", str(ROOT / "recipes"), "matrix", "--json"]) == 0
    produced = json.loads(capsys.readouterr().out)
    golden = json.loads((ROOT / "tests" / "golden" / "matrix.json").read_text())
    assert produced == golden
    assert len(produced["include"]) == 79 and set(produced["include"][0]) == {
        "cell",
        "variant",
        "python",
        "family",
        "label",
        "channel",
        "platform",
        "runner",
    }
    slim = next(entry for entry in produced["include"] if entry["cell"] == "cuda130-sm90-py311")
    assert slim == {
        "cell": "cuda130-sm90-py311",
        "variant": "cuda130-sm90",
        "python": "3.11",
        "family": "cuda",
        "label": "cu130",
        "channel": "cu130-sm90",
        "platform": "x86_64",
        "runner": "ubuntu-24.04",
        "slim-of": "cuda130",
    }
    other = next(entry for entry in produced["include"] if entry["cell"] == "cuda130-sm90-torch2.12-py311")
    assert other == {
        "cell": "cuda130-sm90-torch2.12-py311",
        "variant": "cuda130-sm90-torch2.12",
        "python": "3.11",
        "family": "cuda",
        "label": "cu130",
        "channel": "cu130-sm90-torch2.12",
        "platform": "x86_64",
        "runner": "ubuntu-24.04",
        "slim-of": "cuda130",
        "torch": "2.12.0",
        "torch-of": "cuda130-sm90",
    }
    arm = next(entry for entry in produced["include"] if entry["cell"] == "cuda130-sm90-aarch64-py311")
    assert (arm["channel"], arm["platform"], arm["runner"]) == ("cu130-sm90", "aarch64", "ubuntu-24.04-arm")


def test_a_change_picks_slim_cells_only_where_named(tmp_path: Path) -> None:
    """A pull request builds a slim cell only where the canary names it; its parent's cell
    covers every arch the slim one has. A release builds them all (its default glob, '*')."""
    matrix, recipes = load_matrix(ROOT / "recipes" / "matrix.toml"), load_recipes(ROOT / "recipes")
    slim = {c.id for c in matrix.cells if c.variant.slim_of}
    assert slim and not slim & {
        c.id for c in affected_cells(matrix, recipes, ["recipes/matrix.toml", "recipes/torchsort.toml"], root=ROOT)
    }
    named = replace(matrix, canary=("cuda130-sm90-py311",))
    assert [c.id for c in affected_cells(named, recipes, ["README.md"], root=ROOT)] == ["cuda130-sm90-py311"]
    assert slim <= {c.id for c in matrix.select(["*"])}


def test_a_release_builds_slim_cells_into_their_channels_in_its_track() -> None:
    matrix, recipes = load_matrix(ROOT / "recipes" / "matrix.toml"), load_recipes(ROOT / "recipes")
    plans = plan(
        matrix, recipes, matrix.select(["*"]), [], Settings.from_environ({}), Options(publish=False, release=RC)
    )
    by_cell = {p.cell.id: p for p in plans}
    assert (
        by_cell["cuda130-sm90-py311"].channel == "test/cu130-sm90"
        and by_cell["rocm64-gfx942-py311"].channel == "test/rocm6.4-gfx942"
    )
    ops = by_cell["cuda130-sm90-py311"].recipe("example-cpp-ops")
    assert ops.version.expected(ops.source) == "2.4.0rc1+cu130.sm90"
    built = release_json(RC, plans, matrix)
    assert "cuda130-sm90-py311" in {e["cell"] for e in built["matrix"]["include"]}
    # The GPU stage's jobs: each GPU cell a runner covers (matrix.toml's ci.gpu-runners), on it.
    gpu_jobs = {e["cell"]: e["runner"] for e in built["gpu-matrix"]["include"]}
    assert gpu_jobs["cuda130-py311"] == gpu_jobs["cuda130-torch2.12-py313"] == "linux-gpu-h100"
    assert "cpu-py311" not in gpu_jobs and "cuda126-py311" not in gpu_jobs and "rocm64-py311" not in gpu_jobs
    kinds = replace(matrix, gpu_runners={"cuda130-sm90*": ("linux-gpu-h100", "linux-gpu-b200")})
    jobs = [(e["cell"], e["runner"]) for e in release_json(RC, plans, kinds)["gpu-matrix"]["include"]]
    assert ("cuda130-sm90-py311", "linux-gpu-h100") in jobs and ("cuda130-sm90-py311", "linux-gpu-b200") in jobs
    assert Track.NIGHTLY.channel(matrix.variants["cuda130-sm90"].channel) == "nightly/cu130-sm90"


def test_matrix_json_without_slim_cells(capsys: pytest.CaptureFixture[str]) -> None:
    """build.yml's fallback when no diff can be computed: every cell but the slim ones."""
    assert main(["--recipes", str(ROOT / "recipes"), "matrix", "--json", "--no-slim"]) == 0
    entries = {c["cell"]: c for c in json.loads(capsys.readouterr().out)["include"]}
    cells = list(entries)
    assert len(cells) == 59 and "cuda130-py311" in cells and not [c for c in cells if "-sm" in c or "-gfx" in c]
    assert "cuda130-torch2.12-py311" in cells, "a cell of another torch is built like its parent's"
    # each platform's cells run on a runner of that platform: natively, no emulation in CI
    assert {(e["platform"], e["runner"]) for e in entries.values()} == {
        ("x86_64", "ubuntu-24.04"),
        ("aarch64", "ubuntu-24.04-arm"),
    }
    assert entries["cpu-aarch64-py311"]["channel"] == entries["cpu-py311"]["channel"] == "cpu"


def test_matrix_json_for_changed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    changed = tmp_path / "changed.txt"
    changed.write_text("recipes/example-cuda-ops.toml\n")
    assert main(["--recipes", str(ROOT / "recipes"), "matrix", "--json", "--changed-files", str(changed)]) == 0
    cells = [c["cell"] for c in json.loads(capsys.readouterr().out)["include"]]
    assert cells and all(c.startswith("cuda") for c in cells)


# --- release records, promotion, retention ------------------------------------------------


def _release_rc(
    root: Path,
    tmp_path: Path,
    *,
    runners: tuple[str, ...] = (),
    version: str = "2.4.0rc1",
    commit: str = HEAD,
) -> Manifest:
    """An rc in the test track as a release build leaves it: two in-house wheels (one pins
    the other) and a third-party one, in test/cu118, recorded, with ``runners`` as the GPU
    runners of its cell."""
    built = tmp_path / f"built-{version}"
    so = b"\x7fELF" + version.encode() + bytes(range(256)) * 64
    ops = make_wheel(built, "wm-ops", f"{version}+cu118", files={"wm_ops/_C.so": so}, requires=["torch==2.7.1+cu118"])
    kernels = make_wheel(
        built,
        "wm-kernels",
        f"{version}+cu118",
        files={"wm_kernels/_C.so": so[::-1]},
        requires=[f"wm-ops=={version}+cu118"],
    )
    # One third-party file for every rc (a zip's bytes carry the time it was made).
    third = next((tmp_path / "third").glob("*.whl"), None) or make_wheel(
        tmp_path / "third", "thirdparty", "0.1.10+cu118", files={"thirdparty/_C.so": bytes(range(100))}
    )
    channel = tree_channel(root, "test/cu118")
    files = []
    for wheel, rule in ((ops, VersionRule.REPO), (kernels, VersionRule.REPO), (third, VersionRule.SOURCE)):
        publish(channel, wheel)
        files.append(
            ReleasedFile(
                channel="test/cu118",
                cell="cuda118-py311",
                recipe=wheel.name.split("-")[0],
                filename=wheel.name,
                sha256=sha256_of(wheel),
                rule=rule,
            )
        )
    manifest = Manifest(
        version=version,
        track=Track.TEST,
        commit=commit,
        tag=f"v{version.replace('rc', '-rc')}",
        files=tuple(files),
        gpu_runners={"cuda118-py311": runners},
    )
    record(TreeStorage(root), manifest)
    return manifest


def test_promotion_copies_the_tested_files_with_the_final_version(tmp_path: Path) -> None:
    root = tmp_path / "index"
    _release_rc(root, tmp_path)
    done = promote(Index(tree=root), Track.TEST, Track.RELEASE, "2.4.0", commit=HEAD, on_file=lambda _p: None)
    release, tested = tree_channel(root, "cu118"), tree_channel(root, "test/cu118")
    names = sorted(f.filename for f in done.files)
    assert names == [
        "thirdparty-0.1.10+cu118-cp311-cp311-linux_x86_64.whl",
        "wm_kernels-2.4.0+cu118-cp311-cp311-linux_x86_64.whl",
        "wm_ops-2.4.0+cu118-cp311-cp311-linux_x86_64.whl",
    ]
    assert done.promoted_from == "test/2.4.0rc1" and problems(release) == [] and problems(tested) == []
    kernels = read_wheel(stored_file(release, names[1]))
    assert "wm-ops==2.4.0+cu118" in kernels.requires_dist, "the pin on the re-versioned sibling follows it"
    ops = read_wheel(stored_file(release, names[2]))
    assert "torch==2.7.1+cu118" in ops.requires_dist
    assert same_payload(
        stored_file(tested, "wm_ops-2.4.0rc1+cu118-cp311-cp311-linux_x86_64.whl"), stored_file(release, names[2])
    )
    assert stored_file(release, names[0]).read_bytes() == stored_file(tested, names[0]).read_bytes(), (
        "third-party: byte for byte"
    )
    for name in names:  # the PEP 658 sidecar lies beside each blob
        assert stored_file(release, name).with_name(f"{name}.metadata").is_file()
    again = promote(Index(tree=root), Track.TEST, Track.RELEASE, "2.4.0", commit=HEAD, on_file=lambda _p: None)
    assert again.files == done.files, "promoting again is a no-op"
    assert [m.version for m in manifests(TreeStorage(root), Track.RELEASE)] == ["2.4.0"]


A100, H100 = "linux-gpu-a100", "linux-gpu-h100"


def stage(rc: Manifest, runner: str, status: GpuOutcome = GpuOutcome.PASSED, *, files: int = 3) -> GpuRecord:
    """A GPU stage of the rc's cell on ``runner`` that gave each of its first ``files`` files
    ``status``."""
    tested = {f.sha256: status for f in rc.files[:files]}
    return GpuRecord(cell="cuda118-py311", status=status, runner=runner, gpus=("GPU 0 (NVIDIA, 8.0)",), tested=tested)


def promote_rc(root: Path, *, commit: str = HEAD) -> Manifest:
    return promote(Index(tree=root), Track.TEST, Track.RELEASE, "2.4.0", commit=commit, on_file=lambda _p: None)


def test_promotion_waits_for_a_passed_gpu_stage_on_every_runner_of_each_cell(tmp_path: Path) -> None:
    """The rc's own record names each GPU cell's runners (a GPU kind each): promotion asks
    for a passed stage on each, recorded there, that passed every file of the cell."""
    root = tmp_path / "index"
    rc = _release_rc(root, tmp_path, runners=(A100, H100))
    with pytest.raises(
        ReleaseError,
        match="cuda118-py311 on runner linux-gpu-a100: no GPU stage recorded; "
        "cuda118-py311 on runner linux-gpu-h100: no GPU stage recorded",
    ):
        promote_rc(root)
    assert not tree_channel(root, "cu118").exists(), "nothing promoted"
    record_gpu(TreeStorage(root), Track.TEST, "2.4.0rc1", [stage(rc, A100, GpuOutcome.MISMATCH)])
    with pytest.raises(ReleaseError, match=r"cuda118-py311: mismatch on runner linux-gpu-a100"):
        promote_rc(root)
    with pytest.raises(ReleaseError, match=r"tested other files than test 2\.4\.0rc1 names"):
        record_gpu(TreeStorage(root), Track.TEST, "2.4.0rc1", [stage(rc, A100, files=1)])
    with pytest.raises(ReleaseError, match=r"runner linux-gpu-b200, which the record of test 2\.4\.0rc1 does not name"):
        record_gpu(TreeStorage(root), Track.TEST, "2.4.0rc1", [stage(rc, "linux-gpu-b200")])
    record_gpu(TreeStorage(root), Track.TEST, "2.4.0rc1", [stage(rc, A100)])
    with pytest.raises(ReleaseError, match=r"on runner linux-gpu-h100: no GPU stage recorded") as one_kind:
        promote_rc(root)
    assert "linux-gpu-a100" not in one_kind.value.message, "the A100's pass counts; the H100 has none"
    record_gpu(TreeStorage(root), Track.TEST, "2.4.0rc1", [stage(rc, H100)])
    done = promote_rc(root)
    assert done.gpu == (stage(rc, A100), stage(rc, H100))
    assert load_manifest(TreeStorage(root), Track.RELEASE, "2.4.0").gpu == done.gpu


def test_a_file_published_after_the_gpu_stage_ran_is_not_promoted_untested(tmp_path: Path) -> None:
    """A cell published in two parts (--recipe A, then --recipe B into the same rc): the
    stage that passed A says nothing of B."""
    root = tmp_path / "index"
    rc = _release_rc(root, tmp_path, runners=(A100,))
    record_gpu(TreeStorage(root), Track.TEST, "2.4.0rc1", [stage(rc, A100)])
    later = make_wheel(tmp_path / "later", "wm-extra", "2.4.0rc1+cu118", files={"wm_extra/_C.so": b"\x7fELF"})
    publish(tree_channel(root, "test/cu118"), later)
    extra = replace(rc.files[0], recipe="wm-extra", filename=later.name, sha256=sha256_of(later))
    record(TreeStorage(root), replace(rc, files=(extra,)))
    with pytest.raises(ReleaseError, match=rf"not every file passed: {re.escape(later.name)} \(untested\)"):
        promote_rc(root)


def test_a_pass_stamped_in_the_far_future_does_not_outvote_a_later_failure(tmp_path: Path) -> None:
    """A writer of the bucket puts a pass under a number far past any clock; the runner's
    real failure, recorded after it, is numbered past it and counts: promotion stops."""
    root = tmp_path / "index"
    rc = _release_rc(root, tmp_path, runners=(A100,))
    forged = TreeStorage(root)
    key = f"releases/test/2.4.0rc1/gpu/cuda118-py311/{A100}/{'9' * 20}-1-forged.json"
    assert forged.create(key, (json.dumps(stage(rc, A100).as_dict()) + "\n").encode())
    record_gpu(TreeStorage(root), Track.TEST, "2.4.0rc1", [stage(rc, A100, GpuOutcome.MISMATCH)])
    (kept,) = load_manifest(TreeStorage(root), Track.TEST, "2.4.0rc1").gpu
    assert kept.status is GpuOutcome.MISMATCH, "the result recorded last counts"
    with pytest.raises(ReleaseError, match=r"cuda118-py311: mismatch on runner linux-gpu-a100"):
        promote_rc(root)


def test_a_later_part_that_names_no_runner_does_not_lift_the_gate(tmp_path: Path) -> None:
    """The cell published again into the same rc by a part with ``gpu-runners: []``: the
    runners the first part named are still asked for."""
    root = tmp_path / "index"
    rc = _release_rc(root, tmp_path, runners=(A100,))
    record(TreeStorage(root), replace(rc, gpu_runners={"cuda118-py311": ()}))
    assert load_manifest(TreeStorage(root), Track.TEST, "2.4.0rc1").gpu_runners == {"cuda118-py311": (A100,)}
    with pytest.raises(ReleaseError, match=r"on runner linux-gpu-a100: no GPU stage recorded"):
        promote_rc(root)


def test_an_import_only_stage_is_recorded_as_such_and_promotes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "index"
    rc = _release_rc(root, tmp_path, runners=(A100,))
    record_gpu(TreeStorage(root), Track.TEST, "2.4.0rc1", [stage(rc, A100, GpuOutcome.IMPORT_ONLY)])
    (kept,) = load_manifest(TreeStorage(root), Track.TEST, "2.4.0rc1").gpu
    assert kept.status is GpuOutcome.IMPORT_ONLY and set(kept.tested.values()) == {GpuOutcome.IMPORT_ONLY}
    with pytest.raises(ReleaseError, match=r"cuda118-py311: import-only on runner linux-gpu-a100"):
        promote_rc(root)


def test_a_cell_no_runner_covers_is_promoted_and_recorded_as_not_covered(tmp_path: Path) -> None:
    root = tmp_path / "index"
    _release_rc(root, tmp_path, runners=())
    (said,) = promote_rc(root).gpu
    assert said.status is GpuOutcome.NOT_COVERED
    assert said.describe() == "cuda118-py311: not-covered: no GPU runner covers its variant"


def test_a_final_tag_promotes_the_rc_of_its_own_commit_not_a_newer_one(tmp_path: Path) -> None:
    root = tmp_path / "index"
    _release_rc(root, tmp_path, version="2.4.0rc1", commit=HEAD)
    _release_rc(root, tmp_path, version="2.4.0rc2", commit=OTHER)
    assert promote_rc(root, commit=HEAD).promoted_from == "test/2.4.0rc1"
    with pytest.raises(ReleaseError, match=r"no test release of 2\.4\.0 from commit cccccccccccc"):
        promote_rc(root, commit="c" * 40)


def test_a_record_an_older_wheelmill_wrote_whole_is_read_and_promotes_nothing_without_runners(
    tmp_path: Path,
) -> None:
    """Records were one JSON file per release (releases/<track>/<version>.json): read still,
    as the release's objects are; one of schema 1 says no GPU runners, and no gate lets it
    through. Nor does a promotion into the release track that names no commit."""
    root = tmp_path / "index"
    rc = _release_rc(root, tmp_path)
    shutil.rmtree(root / "releases" / "test" / "2.4.0rc1")  # only the whole file of before is left
    old = {**rc.as_dict(), "schema": 1}
    del old["gpu-runners"]
    (root / "releases" / "test" / "2.4.0rc1.json").write_text(json.dumps(old))
    read = load_manifest(TreeStorage(root), Track.TEST, "2.4.0rc1")
    assert read.files == rc.files and read.gpu_runners is None
    assert [m.version for m in manifests(TreeStorage(root), Track.TEST)] == ["2.4.0rc1"]
    with pytest.raises(ReleaseError, match="says no GPU runners"):
        promote_rc(root)
    with pytest.raises(ReleaseError, match="from no named commit"):
        promote(Index(tree=root), Track.TEST, Track.RELEASE, "2.4.0", on_file=lambda _p: None)
    assert not tree_channel(root, "cu118").exists()


def test_publishers_of_one_release_at_once_lose_nothing_and_another_commit_is_refused(tmp_path: Path) -> None:
    """A release's record is objects made once each, never read and rewritten: parts of it
    recorded at once all count, and a version recorded from another commit is refused."""
    root = tmp_path / "index"
    rc = _release_rc(root, tmp_path, runners=(A100,))
    storage = TreeStorage(root)
    for n in range(3):  # three more jobs' parts, of another cell each
        part = replace(rc.files[0], cell=f"cuda118-py31{n + 2}", filename=f"part{n}.whl")
        record(storage, replace(rc, files=(part,), gpu_runners={part.cell: (A100,)}))
    read = load_manifest(storage, Track.TEST, "2.4.0rc1")
    assert len(read.files) == 6 and read.gpu_runners == {f"cuda118-py31{n}": (A100,) for n in range(1, 5)}
    with pytest.raises(ReleaseError, match="was released from commit aaaaaaaaaaaa, not bbbbbbbbbbbb"):
        record(storage, replace(rc, commit=OTHER))
    assert len(load_manifest(storage, Track.TEST, "2.4.0rc1").files) == 6, "nothing of the refused one"


def test_a_tampered_file_promotes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "index"
    manifest = _release_rc(root, tmp_path)
    victim = stored_file(tree_channel(root, "test/cu118"), manifest.files[2].filename)
    with zipfile.ZipFile(victim, "a") as zf:
        zf.writestr("extra.txt", "sneaked in")
    with pytest.raises(IntegrityError, match="sha256 differs"):
        promote(Index(tree=root), Track.TEST, Track.RELEASE, "2.4.0", commit=HEAD, on_file=lambda _p: None)
    assert not tree_channel(root, "cu118").exists()


def test_nothing_to_promote_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ReleaseError, match=r"no test release of 3\.0\.0"):
        promote(Index(tree=tmp_path), Track.TEST, Track.RELEASE, "3.0.0", commit=HEAD, on_file=lambda _p: None)


def test_prune_keeps_the_newest_nightlies_and_what_they_share(tmp_path: Path) -> None:
    root = tmp_path / "index"
    channel = tree_channel(root, "nightly/cpu")
    shared = make_wheel(tmp_path / "w", "thirdparty", "0.1.10+cpu")
    publish(channel, shared)
    for day in ("20261120", "20261121", "20261122"):
        wheel = make_wheel(tmp_path / "w", "wm-ops", f"2.4.1.dev{day}+cpu")
        publish(channel, wheel)
        files = tuple(
            ReleasedFile(
                channel="nightly/cpu",
                cell="cpu-py311",
                recipe=w.name,
                filename=w.name,
                sha256=sha256_of(w),
                rule=VersionRule.REPO,
            )
            for w in (wheel, shared)
        )
        record(
            TreeStorage(root),
            Manifest(version=f"2.4.1.dev{day}", track=Track.NIGHTLY, commit=HEAD, tag=None, files=files),
        )
    removed = prune(Index(tree=root), Track.NIGHTLY, 2)
    assert removed == ["nightly/cpu/wm_ops-2.4.1.dev20261120+cpu-cp311-cp311-linux_x86_64.whl"]
    assert [m.version for m in manifests(TreeStorage(root), Track.NIGHTLY)] == [
        "2.4.1.dev20261122",
        "2.4.1.dev20261121",
    ]
    assert problems(channel) == [] and stored_file(channel, shared.name).is_file()
    project = channel.project("wm-ops")
    assert project is not None and project.versions == ["2.4.1.dev20261121+cpu", "2.4.1.dev20261122+cpu"]
    with pytest.raises(ReleaseError, match="never pruned"):
        prune(Index(tree=root), Track.RELEASE, 1)


def test_channels_of_the_test_and_nightly_tracks(tmp_path: Path) -> None:
    for good in ("cu118", "test/cu118", "nightly/rocm6.2"):
        assert pages_dir(tree_channel(tmp_path, good)) == tmp_path / good / "simple"
    for bad in ("test", "nightly", "releases", "stable/cu118", "test/test", "../cu118"):
        with pytest.raises(ChannelError, match="not a channel name"):
            tree_channel(tmp_path, bad)
    for name in ("cpu", "test/cpu", "nightly/cu130"):
        publish(tree_channel(tmp_path, name), make_wheel(tmp_path / "w", "wm-x", "1.0"))
    assert Index(tree=tmp_path).channel_names() == ["cpu", "nightly/cu130", "test/cpu"]


# --- the release paths through the command line: one line each, and its exit code --------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """The project's recipes in a git repository of their own, committed (``release`` reads
    its HEAD), and the index beside it; the repository and its HEAD."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "recipes", repo / "recipes")
    shutil.copytree(ROOT / "extensions", repo / "extensions", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "the project")
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    return repo, git(repo, "rev-parse", "HEAD")


def one_line(result: CliResult, code: int, *words: str) -> None:
    assert result.code == code, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wheelmill: error: ") and "; fix: " in lines[0], result.err
    for word in words:
        assert word in lines[0], lines[0]


def test_a_release_reads_its_recipes_from_its_commit_alone(
    cli: CliRunner, project: tuple[Path, str], tmp_path: Path
) -> None:
    """Recipes from a folder git ignores (the tree reads clean), or with an ignored recipe
    inside the committed folder: what would be released is not the commit, so nothing is."""
    repo, _head = project
    git(repo, "tag", "v2.4.0-rc1")
    (repo / ".gitignore").write_text("/elsewhere/\n/recipes/extra.toml\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore")
    git(repo, "tag", "-f", "v2.4.0-rc1")
    shutil.copytree(repo / "recipes", repo / "elsewhere" / "recipes")
    for command in (["release", "--tag", "v2.4.0-rc1"], ["release", "publish", "--tag", "v2.4.0-rc1"]):
        one_line(cli("--recipes", str(repo / "elsewhere" / "recipes"), *command), 17, "is not tracked by git")
    (repo / "recipes" / "extra.toml").write_text('name = "extra"\n')
    one_line(
        cli("--recipes", str(repo / "recipes"), "release", "--tag", "v2.4.0-rc1"),
        17,
        "holds files git ignores",
        "extra",
    )
    assert not (tmp_path / "index").exists(), "nothing built or published"


def test_a_final_tag_without_an_rc_on_its_commit_builds_nothing(cli: CliRunner, project: tuple[Path, str]) -> None:
    repo, _head = project
    git(repo, "tag", "v2.4.0")
    recipes = str(repo / "recipes")
    for command in (
        ["release", "--tag", "v2.4.0", "--json"],
        ["release", "--tag", "v2.4.0"],
        ["release", "publish", "--tag", "v2.4.0"],
    ):
        one_line(cli("--recipes", recipes, *command), 17, "no release candidate of 2.4.0", "never built")
    assert not (repo.parent / "index").exists()


def test_promotion_from_the_cli_is_gated_by_the_rcs_own_record(
    cli: CliRunner, project: tuple[Path, str], tmp_path: Path
) -> None:
    """No caller passes the runners: `release promote` reads them from the rc's record, for
    the rc of the checked-out commit; every way short of a pass on each runner is one line."""
    repo, head = project
    index = tmp_path / "index"
    promote_cli = [
        "--recipes",
        str(repo / "recipes"),
        "release",
        "promote",
        "--from",
        "test",
        "--to",
        "release",
        "2.4.0",
    ]
    rc = _release_rc(index, tmp_path, runners=(A100, H100), commit=head)
    _release_rc(index, tmp_path, version="2.4.0rc2", commit=OTHER)  # newer, from another commit: never promoted
    one_line(cli(*promote_cli), 17, "on runner linux-gpu-a100: no GPU stage recorded", "wheelmill test-gpu")
    record_gpu(TreeStorage(index), Track.TEST, "2.4.0rc1", [stage(rc, A100)])
    one_line(cli(*promote_cli), 17, "on runner linux-gpu-h100: no GPU stage recorded")
    report = GpuReport(
        cell="cuda118-py311", channel="test/cu118", index=str(index), env="fresh", python="3.11", runner=H100,
        torch="2.7.1+cu118", gpus=("GPU 0 (NVIDIA H100, 9.0)",), torch_gpus=("GPU 0 (NVIDIA H100, 9.0)",), notes=(),
        wheels=tuple(
            WheelResult(recipe=f.recipe, filename=f.filename, sha256=f.sha256, doctor="ok", doctor_detail="sm_90",
                        runs=(), outcome=GpuOutcome.IMPORT_ONLY, why="no GPU check")
            for f in rc.files
        ),
        missing=(), status=GpuOutcome.IMPORT_ONLY, exit_code=25, error="proved nothing", seconds=1.0,
    )  # fmt: skip
    written = report.write(tmp_path / "h100")
    recorded = cli(
        "--recipes", str(repo / "recipes"), "release", "record-gpu", "--track", "test", "2.4.0rc1", str(written)
    )
    assert recorded.code == 0, recorded.err
    assert "cuda118-py311: import-only on runner linux-gpu-h100" in recorded.out
    one_line(cli(*promote_cli), 17, "cuda118-py311: import-only on runner linux-gpu-h100")
    record_gpu(TreeStorage(index), Track.TEST, "2.4.0rc1", [stage(rc, H100)])
    promoted = cli(*promote_cli)
    assert promoted.code == 0, promoted.err
    assert "test/2.4.0rc1 -> release/2.4.0" in promoted.out, "rc1, its commit's, not the newer rc2"
    git(repo, "commit", "-q", "--allow-empty", "-m", "later")
    one_line(cli(*promote_cli), 17, "no test release of 2.4.0 from commit")


def _passed_report(rc: Manifest, runner: str) -> GpuReport:
    """The GPU stage of the rc's cell on ``runner``, every file passed, as test-gpu reports it."""
    return GpuReport(
        cell="cuda118-py311", channel="test/cu118", index="https://wheels.internal", env="fresh", python="3.11",
        runner=runner, torch="2.7.1+cu118", gpus=("GPU 0 (NVIDIA A100, 8.0)",),
        torch_gpus=("GPU 0 (NVIDIA A100, 8.0)",), notes=(),
        wheels=tuple(
            WheelResult(recipe=f.recipe, filename=f.filename, sha256=f.sha256, doctor="ok", doctor_detail="sm_80",
                        runs=(), outcome=GpuOutcome.PASSED, why="its GPU check passed")
            for f in rc.files
        ),
        missing=(), status=GpuOutcome.PASSED, exit_code=0, error=None, seconds=1.0,
    )  # fmt: skip


def test_a_gpu_stage_opens_the_gate_only_as_its_runner_signed_it(
    cli: CliRunner, project: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU runners' keys trusted (a set of their own): record-gpu refuses a hand-written
    report, one signed by the team's build key, and a signed one edited after signing, each
    in one line (exit 26); a pass written into the record by hand, or a signed one whose
    record was edited, does not open promotion; the report its runner signed does."""
    repo, head = project
    index = tmp_path / "index"
    rc = _release_rc(index, tmp_path, runners=(A100,), commit=head)
    runner, team = new_signing_key("ed25519"), new_signing_key("ed25519")
    (tmp_path / "gpu-keys").mkdir()
    (tmp_path / "gpu-keys" / "a100.pem.pub").write_bytes(runner.public_pem())
    monkeypatch.setenv("WHEELMILL_GPU_TRUSTED_KEYS", str(tmp_path / "gpu-keys"))
    recipes = ("--recipes", str(repo / "recipes"))
    report = _passed_report(rc, A100)
    written = report.write(tmp_path / "a100")

    def record_it() -> CliResult:
        return cli(*recipes, "release", "record-gpu", "--track", "test", "2.4.0rc1", str(written))

    one_line(record_it(), 26, "not signed: no gpu-report.json.intoto.jsonl beside it")
    write_signed(written, sign_gpu_record(report.record(), report.tested_files(), team))
    one_line(record_it(), 26, f"signed by {team.key_id}, which none of the trusted keys", "WHEELMILL_GPU_TRUSTED_KEYS")
    write_signed(written, sign_gpu_record(report.record(), report.tested_files(), runner))
    data = json.loads(written.read_text())
    written.write_text(json.dumps({**data, "gpus": ["GPU 0 (NVIDIA H100, 9.0)"]}))
    one_line(record_it(), 26, "the report says otherwise than what its runner signed")
    assert load_manifest(TreeStorage(index), Track.TEST, "2.4.0rc1").gpu == (), "nothing recorded"

    promote_cli = (*recipes, "release", "promote", "--from", "test", "--to", "release", "2.4.0")
    record_gpu(TreeStorage(index), Track.TEST, "2.4.0rc1", [stage(rc, A100)])  # by hand, into the storage
    one_line(cli(*promote_cli), 26, "linux-gpu-a100: its GPU stage was recorded unsigned")
    failed = replace(report, status=GpuOutcome.FAILED, error="its GPU check failed").record()
    edited = replace(report.record(), envelope=sign_gpu_record(failed, report.tested_files(), runner))
    record_gpu(TreeStorage(index), Track.TEST, "2.4.0rc1", [edited])  # a failure's statement under a pass
    one_line(cli(*promote_cli), 26, "its record says otherwise than what its runner signed")
    assert not tree_channel(index, "cu118").exists(), "nothing promoted"

    written.write_text(json.dumps(data))
    recorded = record_it()
    assert recorded.code == 0, recorded.err
    assert f"GPU stage: cuda118-py311: passed on runner {A100}" in recorded.out
    assert f"(signed by {runner.key_id})" in recorded.out
    (kept,) = load_manifest(TreeStorage(index), Track.TEST, "2.4.0rc1").gpu
    assert kept.signed_by == runner.key_id and kept.envelope is not None
    promoted = cli(*promote_cli)
    assert promoted.code == 0, promoted.err
    assert load_manifest(TreeStorage(index), Track.RELEASE, "2.4.0").gpu[0].signed_by == runner.key_id


def test_signatures_required_and_no_gpu_runners_key_trusted_records_and_promotes_nothing(
    cli: CliRunner, project: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, head = project
    index = tmp_path / "index"
    rc = _release_rc(index, tmp_path, runners=(A100,), commit=head)
    written = _passed_report(rc, A100).write(tmp_path / "a100")
    monkeypatch.setenv("WHEELMILL_SIGNATURES", "required")
    recipes = ("--recipes", str(repo / "recipes"))
    one_line(
        cli(*recipes, "release", "record-gpu", "--track", "test", "2.4.0rc1", str(written)),
        26,
        "WHEELMILL_SIGNATURES=required, and no GPU runner's key is trusted",
        "WHEELMILL_GPU_TRUSTED_KEYS",
    )
    record_gpu(TreeStorage(index), Track.TEST, "2.4.0rc1", [stage(rc, A100)])
    with pytest.raises(SignatureError, match="no GPU runner's key is trusted"):
        promote(Index(tree=index), Track.TEST, Track.RELEASE, "2.4.0", commit=head, on_file=print, required=True)
    assert not tree_channel(index, "cu118").exists(), "nothing promoted"


def test_a_cell_published_in_two_parts_is_not_promoted_on_its_first_parts_stage(
    cli: CliRunner, project: tuple[Path, str], tmp_path: Path
) -> None:
    repo, head = project
    index = tmp_path / "index"
    rc = _release_rc(index, tmp_path, runners=(A100,), commit=head)
    record_gpu(TreeStorage(index), Track.TEST, "2.4.0rc1", [stage(rc, A100)])
    later = make_wheel(tmp_path / "later", "wm-extra", "2.4.0rc1+cu118", files={"wm_extra/_C.so": b"\x7fELF"})
    publish(tree_channel(index, "test/cu118"), later)
    record(TreeStorage(index), replace(rc, files=(replace(rc.files[0], filename=later.name, sha256=sha256_of(later)),)))
    promoted = cli(
        "--recipes", str(repo / "recipes"), "release", "promote", "--from", "test", "--to", "release", "2.4.0"
    )
    one_line(promoted, 17, "on runner linux-gpu-a100: not every file passed", f"{later.name} (untested)")
    assert not tree_channel(index, "cu118").exists()


def test_a_final_pushed_with_its_rc_waits_for_the_rcs_record_and_gpu_stage_and_never_for_a_failure(
    cli: CliRunner, project: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A final tag and its rc in one push: the final's promotion runs before the rc's record
    exists. With --wait it looks again until the rc is recorded and its GPU stage passed,
    then promotes; a stage that failed stops it at once; without --wait it stops at once."""
    repo, head = project
    index = tmp_path / "index"
    promote_cli = ("--recipes", str(repo / "recipes"), "release", "promote", "--from", "test", "--to", "release")
    one_line(cli(*promote_cli, "2.4.0"), 17, "nothing to promote: no test release of 2.4.0 from commit")
    looks: list[float] = []

    def meanwhile(seconds: float) -> None:  # what the rc's run does while the final's waits
        looks.append(seconds)
        if len(looks) == 1:
            _release_rc(index, tmp_path, runners=(A100,), commit=head)
        elif len(looks) == 2:
            rc = load_manifest(TreeStorage(index), Track.TEST, "2.4.0rc1")
            record_gpu(TreeStorage(index), Track.TEST, "2.4.0rc1", [stage(rc, A100)])

    monkeypatch.setattr("wheelmill.cli.release.sleep", meanwhile)
    waited = cli(*promote_cli, "--wait", "3600", "2.4.0")
    assert waited.code == 0, waited.err
    assert looks == [60.0, 60.0], "a look a minute, until the record holds a passed stage"
    assert "s left): nothing to promote: no test release of 2.4.0 from commit" in waited.out
    assert (
        f"s left): promote: 2.4.0rc1 has no passed GPU stage for cuda118-py311 on runner {A100}: no GPU" in waited.out
    )
    assert load_manifest(TreeStorage(index), Track.RELEASE, "2.4.0").promoted_from == "test/2.4.0rc1"

    rc = _release_rc(index, tmp_path, runners=(A100,), version="2.5.0rc1", commit=head)
    record_gpu(TreeStorage(index), Track.TEST, "2.5.0rc1", [stage(rc, A100, GpuOutcome.FAILED)])
    looks.clear()
    one_line(cli(*promote_cli, "--wait", "3600", "2.5.0"), 17, "2.5.0rc1 has no passed GPU stage")
    assert looks == [], "a failed stage is not waited on"


# --- a release's wheels, collected from its cells' reports ----------------------------------


class CountedReads(Watched):
    """A storage whose reads of objects are counted, by key."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        self.keys: list[str] = []

    def get(self, key: str) -> Stored | None:
        self.keys.append(key)
        return self.storage.get(key)


def built_cell(output: Path, cell: str, channel: str, wheel: Path, *, key: str, unpublished: bool = False) -> None:
    """``<output>/<cell>/`` as a --no-publish release build of example-stable-ops leaves it."""
    layout = CellLayout(output=output, cell=cell)
    layout.dist.mkdir(parents=True)
    shutil.copy(wheel, layout.dist / wheel.name)
    facts = {"build_keys": {"example-stable-ops": key}}
    facts |= {"unpublished": {"example-stable-ops": "built to be tested"}} if unpublished else {}
    report = BuiltCell(
        cell=cell, variant=cell.rsplit("-", 1)[0], python="3.11", engine="none", channel=channel,
        release=ReleaseRecord.of(RC), status=Status.OK, exit_code=0, started="", finished="", seconds=1.0,
        facts=facts, steps=(),
        recipes=(RecipeRecord(name="example-stable-ops", status=Status.OK, version_rule=VersionRule.REPO,
                              wheel=WheelRecord.of(layout.dist / wheel.name)),),
    )  # fmt: skip
    layout.report.write_text(json.dumps(report.as_dict()))


def test_a_newer_torchs_test_build_is_never_published_its_cell_gets_the_one_build(tmp_path: Path) -> None:
    """A cell of a newer torch built the stable recipe only to test it: the release publishes
    the one build, the oldest torch's cell's, into that cell's channel too, never its own."""
    name = "example_stable_ops-2.4.0rc1+cu130-cp310-abi3-linux_x86_64.whl"
    one = make_wheel(tmp_path / "one", "example-stable-ops", "2.4.0rc1+cu130", tag="cp310-abi3-linux_x86_64")
    test_only = make_wheel(
        tmp_path / "test", "example-stable-ops", "2.4.0rc1+cu130", tag="cp310-abi3-linux_x86_64", files={"x": b"2.14"}
    )
    assert one.name == test_only.name == name and sha256_of(one) != sha256_of(test_only)
    output = tmp_path / "out"
    built_cell(output, "cuda130-torch2.12-py311", "test/cu130-torch2.12", one, key="k" * 64)
    built_cell(output, "cuda130-py311", "test/cu130", test_only, key="k" * 64, unpublished=True)
    wheels = {(w.cell, w.channel): w.sha256 for w in collect_built(output, RC)}
    assert wheels == {
        ("cuda130-torch2.12-py311", "test/cu130-torch2.12"): sha256_of(one),
        ("cuda130-py311", "test/cu130"): sha256_of(one),
    }
    shutil.rmtree(output / "cuda130-torch2.12-py311")
    with pytest.raises(ReleaseError, match=r"built there only to be tested .* no cell of this release made its one"):
        collect_built(output, RC)


def test_a_cell_alone_on_its_runner_lists_the_one_build_another_job_published(tmp_path: Path) -> None:
    """Each job publishes its own cell: the newer torch's job finds the one build its group's
    oldest cell's job published (by build key, in a channel of the same track), lists those
    bytes in its own channel and records them as its cell's; never its own test build."""
    one = make_wheel(tmp_path / "one", "example-stable-ops", "2.4.0rc1+cu130", tag="cp310-abi3-linux_x86_64")
    test_only = make_wheel(
        tmp_path / "test", "example-stable-ops", "2.4.0rc1+cu130", tag="cp310-abi3-linux_x86_64", files={"x": b"2.14"}
    )
    index = Index(tree=tmp_path / "index")
    reads = CountedReads(index.storage)
    index.__dict__["storage"] = reads  # the cached property, counted
    oldest, newer = tmp_path / "runner-a", tmp_path / "runner-b"
    built_cell(oldest, "cuda130-torch2.12-py311", "test/cu130-torch2.12", one, key="k" * 64)
    built_cell(newer, "cuda130-py311", "test/cu130", test_only, key="k" * 64, unpublished=True)
    # A busy index: other projects in the same channel and in every other of the track.
    for channel in ("test/cu130-torch2.12", "test/cu130", "test/cpu", "test/cu118"):
        publish(index.channel(channel), make_wheel(tmp_path / channel, "other", "1.0", tag="py3-none-any"))
    said: list[str] = []
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    assert one_build_channels(matrix, RC, "cuda130-py311") == ["test/cu130-torch2.12"]
    lookup = one_build_lookup(index, functools.partial(one_build_channels, matrix, RC), 0, said.append)

    reads.keys.clear()
    with pytest.raises(ReleaseError, match="no cell of this release made its one build"):
        collect_built(newer, RC, lookup=lookup)  # the other job has not published yet
    assert reads.keys == ["test/cu130-torch2.12/simple/example-stable-ops/index.json"], "one page a look"
    publish_release(index, RC, collect_built(oldest, RC), gpu_runners={}, on_file=lambda _p: None)
    reads.keys.clear()
    wheels = collect_built(newer, RC, lookup=lookup)
    assert reads.keys == ["test/cu130-torch2.12/simple/example-stable-ops/index.json"], "one page a look"
    assert said == [f"cuda130-py311: the one build test/cu130-torch2.12/{one.name}"]
    assert [(w.path, w.listed_in, w.sha256) for w in wheels] == [(None, "test/cu130-torch2.12", sha256_of(one))]
    publish_release(index, RC, wheels, gpu_runners={}, on_file=lambda _p: None)
    listed = index.channel("test/cu130").project("example-stable-ops")
    assert listed is not None and [f.sha256 for f in listed.files] == [sha256_of(one)]
    recorded = load_manifest(index.storage, Track.TEST, "2.4.0rc1")
    assert {(f.cell, f.sha256) for f in recorded.files} == {
        ("cuda130-torch2.12-py311", sha256_of(one)),
        ("cuda130-py311", sha256_of(one)),
    }


def test_a_release_refuses_a_wheel_built_from_a_dirty_tree_or_unsigned_where_required(tmp_path: Path) -> None:
    """What a wheel's provenance says of its tree is held to before anything is published; a
    wheel without one is refused where signatures are required, and taken where optional."""
    key = new_signing_key("ed25519")
    wheel = make_wheel(tmp_path / "dist", "demo", "1.0+cpu")
    built = BuiltWheel(
        cell="cpu-py311", channel="test/cpu", recipe="demo", rule=VersionRule.REPO, path=wheel, sha256=sha256_of(wheel)
    )
    refuse_unattested([built], required=False)
    with pytest.raises(SignatureError, match="no signed provenance beside it"):
        refuse_unattested([built], required=True)

    def beside(*, dirty: bool) -> None:
        wheel.with_name(f"{wheel.name}.intoto.jsonl").write_bytes(signed(statement_for(wheel, dirty=dirty), key))

    beside(dirty=True)
    with pytest.raises(ReleaseError, match="built from a dirty tree") as refused:
        refuse_unattested([built], required=True)
    assert refused.value.exit_code == 17
    beside(dirty=False)
    refuse_unattested([built], required=True)


@pytest.mark.parametrize("given", ["another key", "junk", "empty"])
def test_a_release_refuses_a_provenance_that_does_not_verify_or_cannot_be_read(tmp_path: Path, given: str) -> None:
    """With the team's key trusted, the provenance beside each wheel is verified before anything
    is published; without keys, one that cannot be read is refused all the same (its tree
    cannot be told), never taken as clean."""
    team = new_signing_key("ed25519")
    wheel, provenance = signed_wheel(tmp_path / "dist", "demo", "1.0+cpu", key=team)
    assert provenance is not None
    built = BuiltWheel(
        cell="cpu-py311", channel="test/cpu", recipe="demo", rule=VersionRule.REPO, path=wheel, sha256=sha256_of(wheel)
    )
    kept = wheel.with_name(f"{wheel.name}.intoto.jsonl")
    kept.write_bytes(provenance)
    refuse_unattested([built], required=True, trusted=(team.trusted(),))
    bad = {
        "another key": signed(statement_for(wheel), new_signing_key("ed25519")),
        "junk": b'{"not": "an envelope"}\n',
        "empty": b"",
    }[given]
    kept.write_bytes(bad)
    with pytest.raises(SignatureError) as refused:
        refuse_unattested([built], required=True, trusted=(team.trusted(),))
    assert refused.value.exit_code == 26
    if given != "another key":
        with pytest.raises(SignatureError):
            refuse_unattested([built], required=False)


def test_a_build_that_must_sign_without_a_key_is_refused_before_anything_runs(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WHEELMILL_SIGNATURES", "required")
    monkeypatch.delenv("WHEELMILL_SIGNING_KEY", raising=False)
    monkeypatch.delenv("WHEELMILL_SIGNING_KEY_FILE", raising=False)
    result = cli("build", "--cell", "cpu-py311", "--recipe", "example-cpp-ops")
    one_line(result, 26, "WHEELMILL_SIGNATURES is required", "no signing key")
    assert not (tmp_path / "wheels").exists(), "nothing was made"
    monkeypatch.setenv("WHEELMILL_SIGNING_KEY", "not a key")
    one_line(cli("build", "--cell", "cpu-py311", "--no-publish"), 3, "WHEELMILL_SIGNING_KEY")


def test_a_cells_publish_refused_midway_lists_none_of_it_and_its_retry_lists_all(tmp_path: Path) -> None:
    """A cell's second wheel refused (another build's bytes under its name): the first,
    published before it, is no longer there (staged, never listed, removed), nor recorded;
    the cell's retry, the refused one rebuilt under a build tag, lists and records both."""
    index = Index(tree=tmp_path / "index")
    ops = make_wheel(tmp_path / "ops", "demo-ops", "2.4.0rc1+cpu")
    third = make_wheel(tmp_path / "third", "demo-third", "0.1.10+cpu", files={"demo_third/x.py": b"x = 1\n"})
    other = make_wheel(tmp_path / "other", "demo-third", "0.1.10+cpu", files={"demo_third/x.py": b"x = 2\n"})
    publish(index.channel("test/cpu"), other)  # an earlier rc's build of the same version

    def built(path: Path, rule: VersionRule) -> BuiltWheel:
        return BuiltWheel(cell="cpu-py311", channel="test/cpu", recipe=path.name.split("-")[0], rule=rule,
                          path=path, sha256=sha256_of(path))  # fmt: skip

    with pytest.raises(IndexConflict, match="already published with other bytes"):
        publish_release(
            index, RC, [built(ops, VersionRule.REPO), built(third, VersionRule.SOURCE)], gpu_runners={}, on_file=print
        )
    channel = index.channel("test/cpu")
    assert channel.project("demo-ops") is None and channel.listing("demo-ops") == {}
    assert [f.filename for f in load_manifest(index.storage, Track.TEST, "2.4.0rc1").files] == []
    assert problems(channel) == []
    tagged = rewrite_metadata(third, tmp_path / "tagged", version=None, pins={}, build_tag="1")
    wheels = [built(ops, VersionRule.REPO), built(tagged, VersionRule.SOURCE)]
    publish_release(index, RC, wheels, gpu_runners={}, on_file=print)
    listed = {p.name: sorted(f.filename for f in p.files) for p in channel.projects()}
    assert listed == {"demo-ops": [ops.name], "demo-third": sorted([other.name, tagged.name])}, listed
    recorded = load_manifest(index.storage, Track.TEST, "2.4.0rc1").files
    assert sorted(f.filename for f in recorded) == sorted([ops.name, tagged.name]) and problems(channel) == []
