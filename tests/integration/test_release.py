"""A release for real: a git repository with the project's recipes, an rc tag built and
published to the test track, then the final tag on the same commit promoted to the release
track without a build, and the promoted wheel fetched by pip from the served index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.channels import stored_file, tree_channel
from tests.objectstore import ObjectStore
from tests.ports import free_port
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.objects import verify as object_verify
from wheelmill.index.roots import problems
from wheelmill.index.s3 import BucketPath, S3Storage
from wheelmill.index.serve import make_server
from wheelmill.machine.net import sha256_of

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
GIT_ENV = {
    "GIT_AUTHOR_NAME": "wm",
    "GIT_AUTHOR_EMAIL": "wm@example.invalid",
    "GIT_COMMITTER_NAME": "wm",
    "GIT_COMMITTER_EMAIL": "wm@example.invalid",
}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env={**os.environ, **GIT_ENV})


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The project's data in a fresh repository of its own, committed."""
    repo = tmp_path / "repo"
    for part in ("recipes", "extensions", "containers", "locks"):
        shutil.copytree(ROOT / part, repo / part, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "the project")
    return repo


def wheelmill(
    repo: Path, output: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {}), "WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "none"}
    command = [sys.executable, "-m", "wheelmill", "--recipes", str(repo / "recipes"), "release", *args]
    return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=1800, check=False)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    index = tmp_path / "out" / "index"
    index.mkdir(parents=True)
    server = make_server(index, "127.0.0.1", free_port())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield index, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def pip_download(index_url: str, dest: Path, requirement: str) -> subprocess.CompletedProcess[str]:
    """Real pip against one index only (``--isolated``: no machine configuration)."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--isolated",
        "--pre",
        "--index-url",
        index_url,
        "-d",
        str(dest),
        requirement,
    ]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def example_files(channel: ObjectChannel) -> list[str]:
    """The names of the files of example-cpp-ops a channel lists (the release's own, not its closure)."""
    project = channel.project("example-cpp-ops")
    return [] if project is None else [f.filename for f in project.files]


def payload(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist() if not n.split("/", 1)[0].endswith(".dist-info")}


def test_an_rc_is_built_to_the_test_track_and_its_final_tag_promoted_without_a_build(
    repo: Path, tmp_path: Path, served: tuple[Path, str]
) -> None:
    index, url = served
    output = tmp_path / "out"
    git(repo, "tag", "v0.1.0-rc1")
    dry = wheelmill(repo, output, "--tag", "v0.1.0-rc1", "--dry-run", "--cell", "cpu-py311")
    assert dry.returncode == 0, dry.stderr
    assert "test/cpu" in dry.stdout and "0.1.0rc1+cpu" in dry.stdout and "0.1.10+cpu" in dry.stdout

    built = wheelmill(repo, output, "--tag", "v0.1.0-rc1", "--cell", "cpu-py311", "--recipe", "example-cpp-ops")
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    report = json.loads((output / "cpu-py311" / "report.json").read_text())
    assert report["release"]["version"] == "0.1.0rc1" and report["channel"] == "test/cpu"
    test_channel = tree_channel(index, "test/cpu")
    (rc_entry,) = example_files(test_channel)  # beside it: the mirrored closure
    rc_wheel = stored_file(test_channel, rc_entry)
    assert rc_entry.startswith("example_cpp_ops-0.1.0rc1+cpu-") and problems(test_channel) == []
    (conda,) = (index / "conda" / "test" / "cpu" / "linux-64").glob("example-cpp-ops-0.1.0rc1-*.conda")
    assert conda.name in json.loads((conda.parent / "repodata.json").read_text())["packages.conda"]
    shown = wheelmill(repo, output, "show", "--track", "test", "0.1.0rc1", "--json")
    assert shown.returncode == 0, shown.stderr
    rc_record = json.loads(shown.stdout)
    assert [f["filename"] for f in rc_record["files"]] == [rc_entry]
    _a_failed_cell_is_recorded_and_the_coverage_says_so(repo, output, rc_entry)

    # The final tag on the rc's commit: a promotion. Nothing under the cell's output changes.
    git(repo, "tag", "v0.1.0")
    before = {p: p.stat().st_mtime_ns for p in (output / "cpu-py311").rglob("*")}
    plan = wheelmill(repo, output, "--tag", "v0.1.0", "--json")
    assert plan.returncode == 0, plan.stderr
    assert {k: json.loads(plan.stdout)[k] for k in ("action", "promote-from", "track")} == {
        "action": "promote",
        "promote-from": "0.1.0rc1",
        "track": "release",
    }
    promoted = wheelmill(repo, output, "--tag", "v0.1.0")
    assert promoted.returncode == 0, (promoted.stdout + promoted.stderr)[-3000:]
    print("\n" + promoted.stderr.strip())
    assert {p: p.stat().st_mtime_ns for p in (output / "cpu-py311").rglob("*")} == before, "no build step ran"
    release_channel = tree_channel(index, "cpu")
    (final_entry,) = example_files(release_channel)
    final = stored_file(release_channel, final_entry)
    torch = release_channel.project("torch")
    assert torch is not None and not torch.files[0].built, (
        "the closure was promoted with the wheels: the channel installs on its own"
    )
    assert final_entry == rc_entry.replace("0.1.0rc1+cpu", "0.1.0+cpu")
    assert problems(release_channel) == [] and final.with_name(f"{final_entry}.metadata").is_file()
    assert payload(final) == payload(rc_wheel), "the compiled files are the tested ones"
    record = json.loads(wheelmill(repo, output, "show", "--track", "release", "0.1.0", "--json").stdout)
    assert record["promoted_from"] == "test/0.1.0rc1" and record["files"][0]["sha256"] == sha256_of(final)

    # pip, from the served channels, gets exactly those files: the release's and the rc's.
    fetched = tmp_path / "fetched"
    for channel, requirement, wheel in (
        ("cpu", "example-cpp-ops==0.1.0+cpu", final),
        ("test/cpu", "example-cpp-ops", rc_wheel),
    ):
        pip = pip_download(f"{url}/{channel}/simple", fetched, requirement)
        assert pip.returncode == 0, pip.stderr
        assert sha256_of(fetched / wheel.name) == sha256_of(wheel)

    # A tampered test file (its bytes where the tree keeps them, which the test channel's
    # entry names) is refused on the next promotion, with its own exit code.
    with zipfile.ZipFile(rc_wheel, "a") as zf:
        zf.writestr("example_cpp_ops/extra.txt", "changed after testing")
    again = wheelmill(repo, output, "promote", "--from", "test", "--to", "release", "0.1.0rc1")
    assert again.returncode == 7 and "sha256 differs" in again.stderr


def _a_failed_cell_is_recorded_and_the_coverage_says_so(repo: Path, output: Path, rc_entry: str) -> None:
    """cpu-py312 has no torch in this machine's package sources: its build fails, its job
    records the failure, and coverage tells the built cell, the failed one and the planned."""
    failed = wheelmill(repo, output, "--tag", "v0.1.0-rc1", "--cell", "cpu-py312", "--recipe", "example-cpp-ops")
    assert failed.returncode != 0
    step = next(s for s in json.loads((output / "cpu-py312" / "report.json").read_text())["steps"] if s["error"])
    recorded = wheelmill(repo, output, "record-failure", "--tag", "v0.1.0-rc1", "--cell", "cpu-py312")
    assert recorded.returncode == 0, recorded.stderr
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output)}
    command = [sys.executable, "-m", "wheelmill", "--recipes", str(repo / "recipes"), "coverage", "--json"]
    shown = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, check=True)
    spots = {(s["recipe"], s["cell"]): s for s in json.loads(shown.stdout)["spots"]}
    built = spots["example-cpp-ops", "cpu-py311"]
    assert built["mark"] == "built" and [f["filename"] for f in built["files"]] == [rc_entry]
    failure = spots["example-cpp-ops", "cpu-py312"]["failure"]
    assert spots["example-cpp-ops", "cpu-py312"]["mark"] == "failed" and failure["step"] == step["step"]
    assert failure["error"] == step["error"].splitlines()[0][:500] and failure["exit_code"] == step["exit_code"]
    assert spots["example-cpp-ops", "cuda118-py39"]["mark"] == "planned"


def test_a_cell_built_alone_publishes_itself_into_a_bucket_and_its_final_is_promoted_there(
    repo: Path, tmp_path: Path, object_store: ObjectStore
) -> None:
    """As a CI build job does it: the cell built with --no-publish (no index written), then
    `release publish` into the bucket (its wheel, its closure mirrored, its part of the rc's
    record); the final tag promotes it inside the bucket: the closure's entries copied, the
    repo's wheel re-stamped."""
    url = object_store.url(f"{uuid.uuid4().hex}/index")
    bucket = {**object_store.environ(), "WHEELMILL_INDEX_ROOT": url}
    output = tmp_path / "out"
    git(repo, "tag", "v0.1.0-rc1")
    built = wheelmill(repo, output, "--tag", "v0.1.0-rc1", "--cell", "cpu-py311", "--recipe", "example-cpp-ops",
                      "--no-publish", env=bucket)  # fmt: skip
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    assert not (output / "index").exists(), "a --no-publish build writes no index"
    published = wheelmill(repo, output, "publish", "--tag", "v0.1.0-rc1", env=bucket)
    assert published.returncode == 0, (published.stdout + published.stderr)[-3000:]
    storage = S3Storage(BucketPath.parse(url), object_store.client())
    test_channel = ObjectChannel(storage, "test/cpu")
    assert object_verify(test_channel) == []
    (rc_wheel,) = test_channel.project("example-cpp-ops").files  # type: ignore[union-attr]
    assert rc_wheel.filename.startswith("example_cpp_ops-0.1.0rc1+cpu-") and rc_wheel.built
    torch = test_channel.project("torch")
    assert torch is not None and not torch.files[0].built, "the cell's closure is mirrored into the bucket"
    conda = [k for k in storage.keys_under("conda/test/cpu/linux-64/") if k.endswith(".conda")]
    assert [k.rsplit("/", 1)[1].split("-0.1.0rc1-")[0] for k in conda] == ["example-cpp-ops"], conda
    repodata = storage.get("conda/test/cpu/linux-64/repodata.json")
    assert repodata is not None and conda[0].rsplit("/", 1)[1] in json.loads(repodata.data)["packages.conda"]
    indexed = subprocess.run(
        [sys.executable, "-m", "wheelmill", "--recipes", str(repo / "recipes"), "conda", "index"],
        cwd=repo, env={**os.environ, **bucket}, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert indexed.returncode == 0 and f"{url}/conda/test/cpu: 1 packages indexed" in indexed.stdout, indexed.stderr
    git(repo, "tag", "v0.1.0")
    promoted = wheelmill(repo, output, "--tag", "v0.1.0", env=bucket)
    assert promoted.returncode == 0, (promoted.stdout + promoted.stderr)[-3000:]
    release_channel = ObjectChannel(storage, "cpu")
    assert object_verify(release_channel) == []
    (final,) = release_channel.project("example-cpp-ops").files  # type: ignore[union-attr]
    assert final.filename == rc_wheel.filename.replace("0.1.0rc1+cpu", "0.1.0+cpu")
    released_torch = release_channel.project("torch")
    assert released_torch is not None and released_torch.files[0].sha256 == torch.files[0].sha256
    assert storage.keys_under(f"blobs/sha256/{torch.files[0].sha256}/") == [
        f"blobs/sha256/{torch.files[0].sha256}/{torch.files[0].filename}",
        f"blobs/sha256/{torch.files[0].sha256}/{torch.files[0].filename}.metadata",
    ], "torch is stored once for both tracks"
    shown = wheelmill(repo, output, "show", "--track", "release", "0.1.0", "--json", env=bucket)
    record = json.loads(shown.stdout)
    assert record["promoted_from"] == "test/0.1.0rc1" and record["files"][0]["sha256"] == final.sha256
    for key in storage.keys_under():
        storage.delete(key)
