"""Releases on an object store (a real S3 server): the index commands through the CLI with an
``s3://`` index root, promotion of the final tag's own rc with entries copied server-side,
and two rcs, a final and a nightly written at once by four processes, none of it lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.objectstore import ObjectStore
from tests.wheels import make_wheel
from wheelmill.checks.gpu import GpuOutcome
from wheelmill.index.objects import ObjectChannel, blob_key, verify
from wheelmill.index.roots import Index
from wheelmill.index.s3 import S3Storage
from wheelmill.inputs.versions import Track
from wheelmill.releases.records import GpuRecord, load_manifest, manifests, record_gpu

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent.parent
HEAD, OTHER = "a" * 40, "b" * 40
CELL, A100 = "cuda118-py311", "linux-gpu-a100"
# One job of a release: an rc or a nightly publishes its cell's wheels and records them; a
# final promotes its commit's rc. Waits for the start file, so the four run at once.
JOB = """
import sys, time
from pathlib import Path
from tests.wheels import make_wheel
from wheelmill.checks.gpu import GpuOutcome
from wheelmill.releases.promotion import promote
from wheelmill.releases.publish import BuiltWheel, publish_release
from wheelmill.index.roots import Index
from wheelmill.inputs.versions import Action, Release, Track, VersionRule
from wheelmill.machine.net import sha256_of
kind, url, work, version, commit, start = sys.argv[1:7]
index = Index(bucket=url)
while not Path(start).exists():
    time.sleep(0.005)
if kind == "final":
    done = promote(index, Track.TEST, Track.RELEASE, version, commit=commit, tag=f"v{version}", on_file=print)
    print("promoted", done.promoted_from)
    sys.exit(0)
track = Track.NIGHTLY if kind == "nightly" else Track.TEST
wheels = []
for name in ("wm-ops", "wm-kernels"):
    path = make_wheel(Path(work), name, f"{version}+cu118", files={name.replace("-", "_") + "/_C.so": version.encode()})
    wheels.append(BuiltWheel(cell="cuda118-py311", channel=track.channel("cu118"), recipe=name, rule=VersionRule.REPO,
                             path=path, sha256=sha256_of(path)))
third = make_wheel(Path(work), "thirdparty", f"0.1.{sum(version.encode())}+cu118", files={"thirdparty/_C.so": b"3"})
wheels.append(BuiltWheel(cell="cuda118-py311", channel=track.channel("cu118"), recipe="thirdparty",
                         rule=VersionRule.SOURCE, path=third, sha256=sha256_of(third)))
release = Release(version=version, track=track, action=Action.BUILD, commit=commit, tag=None)
print(publish_release(index, release, wheels, gpu_runners={"cuda118-py311": ("linux-gpu-a100",)}, on_file=print))
"""


@pytest.fixture
def bucket(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A prefix of the bucket of its own, as the index root of this process and its children."""
    for name, value in object_store.environ().items():
        monkeypatch.setenv(name, value)
    url = object_store.url(f"{uuid.uuid4().hex}/index")
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", url)
    yield url
    storage = S3Storage.of(url)
    for key in storage.keys_under():
        storage.delete(key)


def run_job(kind: str, url: str, work: Path, version: str, commit: str, start: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", JOB, kind, url, str(work), version, commit, str(start)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def job(kind: str, url: str, work: Path, version: str, commit: str = HEAD) -> str:
    start = work / "go"
    start.parent.mkdir(parents=True, exist_ok=True)
    start.touch()
    out, err = run_job(kind, url, work, version, commit, start).communicate(timeout=300)
    assert not err.strip() or "Traceback" not in err, err
    return out


def passed(url: str, version: str) -> None:
    """A GPU stage that passed every file of the rc's cell on its one runner."""
    storage = S3Storage.of(url)
    rc = load_manifest(storage, Track.TEST, version)
    tested = {f.sha256: GpuOutcome.PASSED for f in rc.files}
    stage = GpuRecord(cell=CELL, status=GpuOutcome.PASSED, runner=A100, gpus=("GPU 0 (NVIDIA, 8.0)",), tested=tested)
    record_gpu(storage, Track.TEST, version, [stage])


def test_the_index_commands_work_on_a_bucket(cli: CliRunner, bucket: str, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "dist", "demo", "1.0", tag="py3-none-any")
    recipes = str(ROOT / "recipes")
    published = cli("--recipes", recipes, "publish", "--channel", "test/cpu", str(wheel))
    assert published.code == 0, published.err
    assert f"added: test/cpu/{wheel.name}" in published.out
    listed = cli("--recipes", recipes, "index", "list", "--channel", "test/cpu")
    assert listed.code == 0 and "demo: 1.0  [built]" in listed.out, listed.err
    yanked = cli("--recipes", recipes, "yank", "--channel", "test/cpu", "demo", "1.0", "--reason", "broken")
    assert yanked.code == 0, yanked.err
    checked = cli("--recipes", recipes, "index", "verify", "--hashes")
    assert checked.code == 0 and "test/cpu: ok" in checked.out, checked.err
    rendered = cli("--recipes", recipes, "index", "render", "--channel", "test/cpu")
    assert rendered.code == 0 and "test/cpu: rendered, ok" in rendered.out, rendered.err
    project = ObjectChannel(S3Storage.of(bucket), "test/cpu").project("demo")
    assert project is not None and project.files[0].yanked == "broken"
    served = cli("--recipes", recipes, "index", "serve", "--port", "0")
    lines = served.err.strip().splitlines()
    assert served.code == 3 and len(lines) == 1 and "deploy/nginx-bucket.conf" in lines[0], served.err


def test_a_final_tag_promotes_its_own_rc_with_entries_copied_in_the_bucket(bucket: str, tmp_path: Path) -> None:
    """rc1 on the final tag's commit, a newer rc2 on another: rc1 is promoted; its files as
    they are keep their one blob (the entry is copied server-side)."""
    job("rc", bucket, tmp_path / "rc1", "2.4.0rc1", HEAD)
    job("rc", bucket, tmp_path / "rc2", "2.4.0rc2", OTHER)
    passed(bucket, "2.4.0rc1")
    out = job("final", bucket, tmp_path / "final", "2.4.0", HEAD)
    assert "promoted test/2.4.0rc1" in out, out
    storage = S3Storage.of(bucket)
    final, rc = load_manifest(storage, Track.RELEASE, "2.4.0"), load_manifest(storage, Track.TEST, "2.4.0rc1")
    versions = {f.recipe: f.filename.split("-")[1] for f in final.files}
    assert final.commit == HEAD and versions["wm-ops"] == versions["wm-kernels"] == "2.4.0+cu118"
    release = ObjectChannel(storage, "cu118")
    assert verify(release) == [] and verify(ObjectChannel(storage, "test/cu118")) == []
    for entry in (f for p in release.projects() for f in p.files):
        assert storage.keys_under(blob_key(entry.sha256, entry.filename)), entry.filename
    same = {f.sha256 for f in final.files} & {f.sha256 for f in rc.files}
    third = next(f for f in final.files if f.recipe == "thirdparty")
    assert same == {third.sha256}, "the third-party file is rc1's own bytes, the repo's re-stamped"
    assert storage.keys_under(f"blobs/sha256/{third.sha256}/") == [
        blob_key(third.sha256, third.filename),
        blob_key(third.sha256, third.filename) + ".metadata",
    ], "one blob for both tracks: the entry was copied, not the bytes"


def test_two_rcs_a_final_and_a_nightly_at_once_lose_nothing(bucket: str, tmp_path: Path) -> None:
    job("rc", bucket, tmp_path / "rc0", "2.4.0rc1", HEAD)
    passed(bucket, "2.4.0rc1")
    start = tmp_path / "start"
    jobs = {
        "rc1": run_job("rc", bucket, tmp_path / "a", "2.5.0rc1", HEAD, start),
        "rc2": run_job("rc", bucket, tmp_path / "b", "2.5.0rc2", OTHER, start),
        "final": run_job("final", bucket, tmp_path / "c", "2.4.0", HEAD, start),
        "nightly": run_job("nightly", bucket, tmp_path / "d", "2.5.0.dev20261127", HEAD, start),
    }
    time.sleep(2.0)  # every interpreter up and waiting
    start.touch()
    for name, process in jobs.items():
        _out, err = process.communicate(timeout=300)
        assert process.returncode == 0, f"{name}: {err}"
    storage = S3Storage.of(bucket)
    tests = {m.version: m for m in manifests(storage, Track.TEST)}
    assert set(tests) == {"2.4.0rc1", "2.5.0rc1", "2.5.0rc2"}
    assert all(len(m.files) == 3 for m in tests.values()), {v: m.files for v, m in tests.items()}
    assert [m.version for m in manifests(storage, Track.NIGHTLY)] == ["2.5.0.dev20261127"]
    assert load_manifest(storage, Track.RELEASE, "2.4.0").promoted_from == "test/2.4.0rc1"
    index = Index(bucket=bucket)
    assert index.channel_names() == ["cu118", "nightly/cu118", "test/cu118"]
    for name in index.channel_names():
        channel = ObjectChannel(storage, name)
        assert verify(channel) == [], name
    listed = {f.filename for p in ObjectChannel(storage, "test/cu118").projects() for f in p.files}
    assert {f.filename for m in tests.values() for f in m.files} == listed
    print(json.dumps({"test": len(listed), "releases": sorted(tests)}))
