"""Images from the index, for real: after the CPU cell's build, `nox -s image-cpu-py311-devel`
builds the runtime, devel and extras images with podman from a bucket's copy of the cell's
channel alone (the loopback index it serves them from logs every file), runs the smoke tiers
(the launch ones on the top of the chain), compiles an extension inside the devel image,
pushes them to Debian's docker-registry on loopback and pulls them back by digest; and an
image that cannot be built leaves none behind.
The build signs with a key of its own, which the image builds then trust: what the images
install is verified first, and the smoke tier finds each wheel built here carrying its SBOM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.channels import pages_dir, tree_channel
from tests.objectstore import ObjectStore
from tests.registry import loopback_registry
from wheelmill.index.objects import ObjectChannel
from wheelmill.index.roots import copy_file
from wheelmill.index.s3 import BucketPath, S3Storage
from wheelmill.index.serve import parse_access_log
from wheelmill.provenance.signing import new_signing_key

pytestmark = [pytest.mark.integration, pytest.mark.engine]
ROOT = Path(__file__).resolve().parent.parent.parent


def podman() -> str:
    found = shutil.which("podman")
    if found is None:
        pytest.skip("podman is not installed (scripts/setup --system installs it)")
    return found


def signing(output: Path) -> dict[str, str]:
    """The key the cell's build signs with, beside its output: the image builds trust its
    public half (no WHEELMILL_TRUSTED_KEYS: a machine trusts what it signs)."""
    return {"WHEELMILL_SIGNING_KEY_FILE": str(output / "signing-key.pem")}


def nox(session: str, output: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **env, **signing(output), "WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "podman"}
    command = [sys.executable, "-m", "nox", "--no-color", "-s", session, *(["--", *args] if args else [])]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000, check=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU cell, one recipe, built in its container (whose glibc is the images') and
    published with its closure."""
    podman()
    output = tmp_path_factory.mktemp("images")
    (output / "signing-key.pem").write_bytes(new_signing_key("ed25519").private_pem())
    env = {**os.environ, **signing(output), "WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "podman"}
    done = subprocess.run(
        [sys.executable, "-m", "wheelmill", "build", "--cell", "cpu-py311", "--recipe", "example-cpp-ops"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return output


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    with loopback_registry(tmp_path) as address:
        yield address


def images(output: Path) -> list[dict[str, object]]:
    data: list[dict[str, object]] = json.loads((output / "cpu-py311" / "images.json").read_text())["images"]
    return data


def remove(*references: str) -> None:
    for reference in references:  # one at a time: a name already gone fails the whole call
        subprocess.run([podman(), "rmi", "--force", reference], capture_output=True, check=False)


def remove_images(made: list[dict[str, object]]) -> None:
    """By id, with every name each got, the last built first: the extras image is built on the
    runtime one, and removing a parent before its child only untags it, left behind nameless."""
    ids = [str(image["id"]) for image in reversed(made)]
    remove(*ids)
    left = [i for i in ids if subprocess.run([podman(), "image", "exists", i], check=False).returncode == 0]
    assert not left, f"images left behind: {left}"


def tagged() -> set[str]:
    listed = subprocess.run(
        [podman(), "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True, check=True
    ).stdout
    return {line for line in listed.splitlines() if "<none>" not in line}


def test_the_images_from_a_bucket_alone_pass_every_tier_and_the_devel_one_compiles_inside_itself(
    built: Path, object_store: ObjectStore, registry: str, tmp_path: Path
) -> None:
    """`nox -s image-cpu-py311-devel -- --push`, with the cell's channel copied into a bucket
    (as its own job would have published it): the image build fetches what the images install
    from the bucket into a tree it serves on loopback (its access log shows every file),
    installs from that alone, and removes the tree afterwards. The runtime, devel and extras
    images pass their smoke tiers, the devel image builds an extension inside itself, and each
    is pushed and pulled back by digest."""
    url = object_store.url(f"{uuid.uuid4().hex}/index")
    target = ObjectChannel(S3Storage(BucketPath.parse(url), object_store.client()), "cpu")
    source = tree_channel(built / "index", "cpu")
    for entry in (f for project in source.projects() for f in project.files):
        copy_file(source, target, entry, tmp_path)
    before = {p.name for p in (built / "index").iterdir()}
    shutil.move(built / "index", tmp_path / "away")  # the tree is not what it installs from
    try:
        bucket = {**object_store.environ(), "WHEELMILL_INDEX_ROOT": url}
        done = nox("image-cpu-py311-devel", built, "--push", registry, env=bucket)
        made = images(built) if (built / "cpu-py311" / "images.json").is_file() else []
        try:
            assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
            assert f"files from {url} for the images" in done.stdout, done.stdout[-2000:]
            assert not list((built / "cpu-py311").glob(".image-index-*")), "the fetched tree is removed"
            _every_tier_passed(done.stdout, {str(i["kind"]): i for i in made})
            _installed_from_the_served_tree_alone(built / "cpu-py311" / "logs" / "image-index-access.log")
            _pushed_and_pulled_back_by_digest(made, registry)
        finally:  # every image made here, also where an assertion stopped the test midway
            remove_images(made)
    finally:
        shutil.move(tmp_path / "away", built / "index")
        for key in target.storage.keys_under():
            target.storage.delete(key)
    assert {p.name for p in (built / "index").iterdir()} == before


def _every_tier_passed(out: str, made: dict[str, dict[str, object]]) -> None:
    assert set(made) == {"runtime", "devel", "devel-extras"}
    for image in made.values():
        tag = str(image["reference"]).rsplit(":", 1)[1]
        assert len(tag) <= 128 and tag.endswith("-cpu-torch2.13.0-py3.11"), tag
        labels = image["labels"]
        assert (
            isinstance(labels, dict)
            and labels["io.wheelmill.channel"] == "cpu"
            and labels["io.wheelmill.torch"] == "2.13.0+cpu"
        )
    assert "-devel-extras-" in str(made["devel-extras"]["reference"])
    extras = made["devel-extras"]["labels"]
    assert isinstance(extras, dict)
    (wheel, sha256), *_ = json.loads(extras["io.wheelmill.wheels"]).items()
    assert wheel.startswith("example_cpp_ops-0.1.0+cpu-") and len(sha256) == 64
    # Verified against the build's key before anything was built; the SBOM where it was installed.
    assert "provenance: 1 file(s) built here verified (example_cpp_ops-0.1.0+cpu-" in out, out[-3000:]
    assert "sboms: 1 wheel(s) built here carry sboms/wheelmill.cdx.json: example-cpp-ops==0.1.0+cpu" in out
    assert "sboms: 0 wheel(s) built here carry sboms/wheelmill.cdx.json: none installed" in out  # the runtime's
    # (a) imports, pip check, gloo, the constraint; (b) torchrun; (c) PyTorchJob, v1 and Trainer v2.
    assert out.count("imports: torch 2.13.0+cpu, gloo available") == 3
    assert "imports: torch 2.13.0+cpu, gloo available, example_cpp_ops" in out
    assert out.count("pip check: no broken requirements") == 3
    assert out.count("pip install torch==2.12.0 refused by /etc/pip/constraint.txt") == 3
    assert out.count("no compiler: cc, gcc, g++, c++, clang absent") == 1, "the runtime image's alone"
    assert "extension built in the image: twice([1, 2]) = [2, 4]" in out
    # The launch tiers on the top of the chain (the extras image), which holds the others' layers.
    top = made["devel-extras"]["reference"]
    assert out.count(f"tiers b, c, d: run on {top}, which is built on this image") == 2
    assert out.count("torchrun --standalone, 2 processes: all-reduce over gloo") == 2
    assert out.count("PyTorchJob (v1 MASTER_*/PET_*)") == 2 and out.count("PyTorchJob (Trainer v2 PET_*)") == 2
    assert out.count("sum 3 (expected 3)") == 6
    # (d) NCCL on a GPU: a CPU image, and no GPU here: said, never passed.
    assert out.count("tier d (NCCL all-reduce on a GPU): not run: a CPU image") == 1


def _installed_from_the_served_tree_alone(log: Path) -> None:
    requests = parse_access_log(log.read_text().splitlines())
    wheels = [path for path, _status, _size in requests if path.endswith(".whl")]
    assert any("torch-2.13.0" in path for path in wheels) and any("example_cpp_ops" in path for path in wheels)
    # The channel's pages, and the blobs they link to: nothing else of the tree.
    channel = ("/cpu/", "/blobs/sha256/")
    assert all(path.startswith(channel) and status == 200 for path, status, _size in requests), requests


def _pushed_and_pulled_back_by_digest(made: list[dict[str, object]], registry: str) -> None:
    for image in made:
        pushed = str(image["pushed"])
        assert pushed.startswith(f"{registry}/wheelmill@sha256:"), pushed
        remove(f"{registry}/wheelmill:{str(image['reference']).rsplit(':', 1)[1]}")
        pulled = subprocess.run(
            [podman(), "pull", "--tls-verify=false", pushed], capture_output=True, text=True, check=False
        )
        assert pulled.returncode == 0, pulled.stderr
        remove(pushed)


def wheelmill_image(output: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **signing(output), "WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "podman"}
    command = [sys.executable, "-m", "wheelmill", "image", "build", "--cell", "cpu-py311", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)


def test_an_image_that_cannot_be_built_leaves_none_behind(built: Path, tmp_path: Path) -> None:
    """A channel that lacks a dependency pip needs (here: filelock, removed from the page):
    the runtime image fails with pip's line and exit 20, and no image of it is left."""
    project = pages_dir(tree_channel(built / "index", "cpu")) / "filelock"
    saved = tmp_path / "filelock"
    shutil.copytree(project, saved)
    for page in ("index.json", "index.html"):
        text = (project / page).read_text()
        (project / page).write_text(text.replace("filelock-4", "gone-filelock-4"))
    closure = built / "cpu-py311" / "pylock.closure.toml"
    closure.rename(closure.with_suffix(".hidden"))  # so the pre-check lets the build find out
    before = tagged()
    try:
        done = wheelmill_image(built, "--edition", "runtime")
    finally:
        shutil.rmtree(project)
        shutil.copytree(saved, project)
        closure.with_suffix(".hidden").rename(closure)
    assert done.returncode == 20, (done.stdout + done.stderr)[-3000:]
    (line,) = done.stderr.splitlines()
    assert "failed: ERROR:" in line and "filelock" in line, line
    assert tagged() == before, "the failed build left no image behind"


def test_a_cell_and_its_aarch64_twin_are_pushed_as_one_manifest_list(tmp_path: Path, registry: str) -> None:
    """Two pushed images of one edition, one per platform (small stand-ins imported with their
    machine, recorded as `image build --push` records them), joined by `wheelmill image
    manifest` under their shared tag; the registry serves one list with both platforms."""
    output = tmp_path / "wheels"
    rootfs = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-C", str(ROOT / "containers" / "runtime"), "-cf", str(rootfs), "."], check=True)
    cells = {"cpu-py311": ("amd64", "torch2.13.0-py3.11"), "cpu-aarch64-py311": ("arm64", "torch2.10.0-py3.11-arm64")}
    local = []
    try:
        for cell, (arch, tail) in cells.items():
            reference = f"localhost/wheelmill:0123456-runtime-cpu-{tail}"
            target = f"{registry}/wheelmill:{reference.rsplit(':', 1)[1]}"
            local += [reference, target]
            subprocess.run(
                [podman(), "import", "--arch", arch, str(rootfs), reference], capture_output=True, check=True
            )
            subprocess.run([podman(), "tag", reference, target], check=True)
            digest_file = tmp_path / f"{arch}.digest"
            subprocess.run(
                [podman(), "push", "--tls-verify=false", "--digestfile", str(digest_file), target],
                capture_output=True,
                check=True,
            )
            pushed = f"{registry}/wheelmill@{digest_file.read_text().strip()}"
            entry = {"kind": "runtime", "reference": reference, "pushed": pushed, "platform": f"linux/{arch}"}
            (output / cell).mkdir(parents=True)
            (output / cell / "images.json").write_text(json.dumps({"images": [entry]}))
        env = {**os.environ, "WHEELMILL_OUTPUT": str(output), "WHEELMILL_ENGINE": "podman"}
        command = [sys.executable, "-m", "wheelmill", "image", "manifest", "--push", registry]
        command += [arg for cell in cells for arg in ("--cell", cell)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        tag = "0123456-runtime-cpu-py3.11"
        assert f"{registry}/wheelmill:{tag}" in done.stdout
        (recorded,) = json.loads((output / "manifests.json").read_text())["lists"]
        assert [m["platform"] for m in recorded["members"]] == ["linux/amd64", "linux/arm64"]
        request = urllib.request.Request(
            f"http://{registry}/v2/wheelmill/manifests/{tag}",
            headers={"Accept": f"{OCI_INDEX}, {DOCKER_LIST}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            served = json.loads(response.read())
        platforms = {f"{m['platform']['os']}/{m['platform']['architecture']}" for m in served["manifests"]}
        assert platforms == {"linux/amd64", "linux/arm64"}
        assert recorded["reference"].endswith(response.headers["Docker-Content-Digest"])
    finally:
        remove(*local)


OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
