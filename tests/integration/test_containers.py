"""Builds in the cell's container, for real: podman with runc, and docker (Debian's dockerd)
for the engine's whole life cycle (bootstrap, image build and reuse, run, exec, remove,
Ctrl-C); builder images made from a base bootstrapped from Debian packages, a locked env
inside. Slow on first use (the images are built once per engine, then reused by tag);
skipped where an engine does not answer."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.interrupt import interrupt_mid_compile
from tests.registry import loopback_registry
from wheelmill.errors import PrecheckError
from wheelmill.inputs.manylinux import glibc_of
from wheelmill.machine.engine import detect
from wheelmill.machine.registry import resolve_digest, rewrite_pin
from wheelmill.wheel.wheelfile import read_wheel

pytestmark = [pytest.mark.integration, pytest.mark.engine]
ROOT = Path(__file__).resolve().parent.parent.parent


def answering(name: str) -> str:
    """The engine's binary, where it answers (scripts/setup --system installs and starts both)."""
    try:
        engine = detect(name)
    except PrecheckError as exc:
        pytest.skip(exc.one_line())
    assert engine is not None
    return engine.binary


@pytest.fixture(scope="module")
def podman() -> str:
    return answering("podman")


@pytest.fixture(params=["podman", "docker"])
def engine(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Each engine: its name and its binary."""
    return request.param, answering(request.param)


CPP_OPS_UNPUBLISHED = ("--cell", "cpu-py311", "--recipe", "example-cpp-ops", "--no-publish")


def build(
    output: Path,
    *args: str,
    engine: str = "podman",
    recipes: Path | None = None,
    timeout: float = 3600,
    tested: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``tested=False``: no install test (WHEELMILL_INSTALL_TESTS=none), for a test of what comes before it."""
    env = {**os.environ, "WHEELMILL_OUTPUT": str(output), **({} if tested else {"WHEELMILL_INSTALL_TESTS": "none"})}
    prefix = ["--recipes", str(recipes)] if recipes else []
    command = [sys.executable, "-m", "wheelmill", *prefix, "build", "--engine", engine, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def report(output: Path, cell: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((output / cell / "report.json").read_text())
    return data


def step(data: dict[str, Any], name: str, recipe: str | None = None) -> dict[str, Any]:
    return next(s for s in data["steps"] if s["step"] == name and s["recipe"] == recipe)


def containers_of(podman: str, cell: str) -> list[str]:
    listed = subprocess.run(
        [podman, "ps", "--all", "--filter", f"label=wheelmill.cell={cell}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


@pytest.mark.own_compiler_cache  # it counts the hits of its own cache
def test_a_second_run_reuses_the_builder_image_and_the_compiler_cache_and_the_glibc_sets_the_tag(
    tmp_path: Path,
) -> None:
    """Built twice into one output root with docker: the second run finds the image by its
    tag, and every object in the cache the first run filled (local disk, mounted into the
    container); the same recipe built on this machine has another tag, the container's
    older. podman's reuse is the rootless run's (tests/integration/test_benchmarks.py)."""
    docker = answering("docker")
    for _ in range(2):
        result = build(tmp_path, *CPP_OPS_UNPUBLISHED, engine="docker", tested=False)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    data = report(tmp_path, "cpu-py311")
    image = step(data, "prepare-image")
    print(f"\ndocker: image step of the second run: {image['seconds']} s: {image['checks'][0]['detail']}")
    assert data["engine"] == "docker"
    assert image["checks"][0]["detail"].startswith("reused")
    assert containers_of(docker, "cpu-py311") == []
    stats = data["facts"]["compiler_cache"]["example-cpp-ops"]
    assert stats["hits"] > 0 and stats["misses"] == 0 and stats["hits_by_language"].get("C/C++", 0) > 0, stats
    assert stats["location"].startswith("Local disk") and (tmp_path / ".cache" / "sccache").is_dir()
    assert "\ncompiler cache: " in result.stdout  # the summary's line
    assert not (tmp_path / "cpu-py311" / "sccache.sock").exists(), "the server is stopped when the cell ends"
    # The first run's compiled bytecode (torch's, in the container's Python) serves the second's build env.
    prepare = next((tmp_path / "cpu-py311" / "logs").glob("*-prepare-env.log")).read_text()
    lent = re.search(r"^# (\d+) compiled modules from the bytecode store", prepare, re.MULTILINE)
    assert lent is not None and int(lent[1]) > 500, prepare[-2000:]
    # The container's glibc, not this machine's, sets the platform tag.
    here = build(tmp_path / "here", *CPP_OPS_UNPUBLISHED, engine="none", tested=False)
    assert here.returncode == 0, (here.stdout + here.stderr)[-3000:]
    tags = {
        where: min(read_wheel(next((root / "cpu-py311" / "dist").glob("*.whl"))).platforms)
        for where, root in (("here", tmp_path / "here"), ("container", tmp_path))
    }
    print(f"example-cpp-ops: this machine {tags['here']}, container {tags['container']}")
    glibc = {k: glibc_of(v) for k, v in tags.items()}
    assert glibc["container"] < glibc["here"]
    assert glibc["container"] <= (2, 31), "built against bullseye's glibc"


def test_two_cells_in_one_run_each_end_in_their_container_while_the_next_starts(podman: str, tmp_path: Path) -> None:
    """A CPU and a CUDA cell, two images: the first cell's last steps (its install test,
    then its container's removal) run beside the second cell's start, and the terminal still
    reads in order, each cell's lines and summary before the next cell's."""
    result = build(
        tmp_path, "--cell", "cpu-py311", "--cell", "cuda130-py311", "--recipe", "example-cpp-ops", "--no-publish"
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    first, second = report(tmp_path, "cpu-py311"), report(tmp_path, "cuda130-py311")
    assert (first["status"], second["status"]) == ("ok", "ok")
    assert first["engine"] == second["engine"] == "podman"
    assert step(first, "install-test", "example-cpp-ops")["status"] == "ok"
    assert second["started"] < first["finished"], "the next cell starts while the one before it ends"
    out = result.stdout
    assert (
        out.index("cpu-py311: ok in") < out.index("wheelmill build cuda130-py311") < out.index("cuda130-py311: ok in")
    )
    assert "2 cells in" in out and "2 ok" in out
    for cell in ("cpu-py311", "cuda130-py311"):
        assert containers_of(podman, cell) == []
        assert not (tmp_path / cell / "sccache.sock").exists(), "each cell's server is stopped when it ends"


@pytest.mark.own_compiler_cache  # a hit would leave no compile to interrupt
def test_ctrl_c_in_a_container_build_leaves_nothing(engine: tuple[str, str], tmp_path: Path) -> None:
    name, binary = engine
    # A temporary directory of its own: other tests, on the other worker, make and remove
    # theirs in the machine's meanwhile.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "WHEELMILL_OUTPUT": str(tmp_path / "out"), "TMPDIR": str(temporary)}
    command = [
        sys.executable,
        "-m",
        "wheelmill",
        "build",
        "--engine",
        name,
        "--cell",
        "cpu-py311",
        "--recipe",
        "example-cpp-ops",
    ]
    build_log = tmp_path / "out" / "cpu-py311" / "logs" / "*-example-cpp-ops-build.log"
    returncode, err = interrupt_mid_compile(command, cwd=ROOT, env=env, build_log=build_log, wait=900, stop_within=120)
    assert returncode == 130, err[-2000:]
    assert containers_of(binary, "cpu-py311") == []
    assert report(tmp_path / "out", "cpu-py311")["status"] == "interrupted"
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith((".wm-tmp-", "wheelmill-")) or p.suffix == ".part"]
    assert leftovers == [], "nothing half-written, and no temporary directory left"
    assert list(temporary.iterdir()) == [], "no temporary directories"


def test_a_lock_made_for_other_inputs_stops_the_cell_before_anything_builds(
    podman: str, recipes_copy: Path, tmp_path: Path
) -> None:
    locks = recipes_copy.parent / "locks"
    locks.mkdir()
    (locks / "cpu-py311.txt").write_text(
        "# wheelmill lock of cpu-py311; inputs sha256:" + "0" * 64 + "\ntorch==2.13.0+cpu\n"
    )
    (recipes_copy.parent / "containers").symlink_to(ROOT / "containers")
    started = time.monotonic()
    result = build(tmp_path / "out", "--cell", "cpu-py311", recipes=recipes_copy)
    assert result.returncode == 5, (result.stdout + result.stderr)[-3000:]
    assert time.monotonic() - started < 60
    line = result.stderr.strip().splitlines()[-1]
    assert "locks/cpu-py311.txt was made for other inputs" in line and "wheelmill lock --cell cpu-py311" in line
    data = report(tmp_path / "out", "cpu-py311")
    assert step(data, "pre-checks")["status"] == "failed"
    assert {s["status"] for s in data["steps"] if s["step"] != "pre-checks"} == {"skipped"}


def test_a_cpython_source_out_of_reach_is_named_with_its_fix(podman: str, recipes_copy: Path, tmp_path: Path) -> None:
    """Bullseye has no CPython 3.11 package, so the cpu-py311 image builds it from its pinned
    tarball; pointed at a URL where nothing answers (with another sha256: the tag names the
    tarball by its bytes, not where it is, so the image of the same bytes would be reused),
    the image build stops the cell with the URL and the fix, and leaves no image or container
    behind."""
    containers = recipes_copy.parent / "containers"
    shutil.copytree(ROOT / "containers", containers)
    pins = containers / "pins.toml"
    url = "http://127.0.0.1:9/Python-3.11.2.tar.gz"  # nothing listens on port 9: refused at once
    text = re.sub(r'path = "pool/main/p/python3\.11/[^"]*"', f'url = "{url}"', pins.read_text())
    pins.write_text(text.replace("2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849", "0" * 64))
    result = build(tmp_path / "out", "--cell", "cpu-py311", "--recipe", "example-cpp-ops", recipes=recipes_copy)
    assert result.returncode == 5, (result.stdout + result.stderr)[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert f"cannot download CPython 3.11 from {url}" in line, line
    assert "fix: mirror it and set its url in containers/pins.toml" in line
    data = report(tmp_path / "out", "cpu-py311")
    assert step(data, "prepare-image")["status"] == "failed"
    assert {s["status"] for s in data["steps"] if s["step"] not in {"pre-checks", "build-keys", "prepare-image"}} == {
        "skipped"
    }
    assert containers_of(podman, "cpu-py311") == []
    tag = re.search(r"building (localhost/wheelmill-builder:builder-py311-\w+) failed", line)
    assert tag, line
    images = subprocess.run(
        [podman, "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert tag.group(1) not in images


def test_pins_refresh_against_a_real_registry(podman: str, tmp_path: Path) -> None:
    """scripts/update_pins.py's resolution, against Debian's docker-registry on loopback."""
    with loopback_registry(tmp_path) as address:
        try:
            _pin_refresh(podman, f"{address}/wheelmill-test/tiny", tmp_path)
        finally:
            subprocess.run(
                [podman, "rmi", "--force", f"{address}/wheelmill-test/tiny:1.0"], capture_output=True, check=False
            )


def _pin_refresh(podman: str, image: str, tmp_path: Path) -> None:
    """Push a tiny image, resolve its digest as scripts/update_pins.py does, rewrite a pin."""
    tiny = io.BytesIO()
    with tarfile.open(fileobj=tiny, mode="w") as tf:
        info = tarfile.TarInfo("hello.txt")
        info.size = 5
        tf.addfile(info, io.BytesIO(b"hello"))
    (tmp_path / "rootfs.tar").write_bytes(tiny.getvalue())
    subprocess.run([podman, "import", str(tmp_path / "rootfs.tar"), f"{image}:1.0"], check=True, capture_output=True)
    deadline = time.monotonic() + 20
    while True:
        pushed = subprocess.run(
            [podman, "push", "--tls-verify=false", "--digestfile", str(tmp_path / "digest"), f"{image}:1.0"],
            capture_output=True,
            text=True,
            check=False,
        )
        if pushed.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert pushed.returncode == 0, pushed.stderr
    expected = (tmp_path / "digest").read_text().strip()
    assert resolve_digest(image, "1.0") == expected
    pins = tmp_path / "pins.toml"
    pins.write_text(
        f'schema = 1\n\n# the base\n[bases.tiny]\nimage = "{image}"\ntag = "0.9"\ndigest = ""\n\n'
        '[bootstrap]\nsuite = "bullseye"\nvariant = "minbase"\n\n'
        f'[pythons."3.11"]\npath = "p"\nsha256 = "{"0" * 64}"\n'
    )
    assert rewrite_pin(pins, "tiny", digest=expected, tag="1.0")
    text = pins.read_text()
    assert f'digest = "{expected}"' in text and 'tag = "1.0"' in text and "# the base" in text
    script = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "update_pins.py"), "--pins", str(pins), "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert f"tiny: {image}:1.0 -> {expected}" in script.stdout, script.stderr
