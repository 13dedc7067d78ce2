"""A name of its own for every distinct build of one version (wheelmill.wheel.buildtags):
built again with a compiler of another patch version, a recipe whose version does not move
publishes its new bytes under a build tag, pip and uv install the newest, and a rebuild of
the same inputs keeps its name."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from tests.channels import tree_channel
from tests.conftest import CliRunner
from tests.sandbox import PY, TAG, Sandbox, build, dist_info, repair_as_auditwheel_tags, script
from wheelmill.index.serve import make_server
from wheelmill.machine.tools import uv_bin
from wheelmill.wheel.buildtags import Taken, build_tag
from wheelmill.wheel.wheelfile import check_record, read_wheel

ONE = f"t-1.0-{TAG}.whl"


PLAIN = "t-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.mark.parametrize(
    ("listed", "tag"),
    [
        ({PLAIN: ("a", "s1")}, "1"),
        ({PLAIN: ("a", "s1"), "t-1.0-1-cp311-cp311-linux_x86_64.whl": ("", "s2")}, "2"),
        ({"t-1.0-7-cp311-cp311-linux_x86_64.whl": ("b", "s3")}, "8"),
        ({"t-1.0-cp311-cp311-linux_aarch64.whl": ("a", "s1"), "t-1.0-cp310-cp310-linux_x86_64.whl": ("a", "s1")}, None),
        ({"t-1.1-cp311-cp311-linux_x86_64.whl": ("a", "s1"), "o-1.0-cp311-cp311-linux_x86_64.whl": ("a", "s1")}, None),
        ({PLAIN: ("a", "s1"), "t-1.0-3-cp311-cp311-manylinux_2_28_x86_64.whl": ("k", "s4")}, "3"),
        ({PLAIN: ("a", "mine")}, None),
        ({PLAIN: ("a", "s1"), "t-1.0-2-cp311-cp311-manylinux_2_28_x86_64.whl": ("b", "mine2")}, "2"),
    ],
    ids=["taken", "after-a-tagged-one", "after-its-highest", "other-machine-or-python", "other-version-or-project",
         "its-own-key", "the-same-bytes", "the-same-bytes-tagged"],
)  # fmt: skip
def test_a_build_is_named_apart_from_every_file_of_its_family_but_its_own_bytes_and_key(
    listed: dict[str, tuple[str, str]], tag: str | None
) -> None:
    taken = {name: Taken(frozenset(k for k in [keys] if k), sha) for name, (keys, sha) in listed.items()}
    digest = lambda tag: f"mine{tag or ''}"  # noqa: E731 - the sha256 this wheel would have with a tag
    assert build_tag("t-1.0-cp311-cp311-linux_x86_64.whl", key="k", taken=taken, digest=digest) == tag


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    repair_as_auditwheel_tags(monkeypatch)
    made = Sandbox(tmp_path / "repo")
    made.recipe("t", {**dist_info("t", "1.0"), "t/__init__.py": b"built = 1\n"}, wheel=ONE)
    return made


def rebuilt(sandbox: Sandbox, compiler: str, payload: bytes) -> None:
    """The compiler reports another version, and the build's bytes differ with it."""
    script(sandbox.bin / "c++", f'echo "c++ (stand-in) {compiler}"\n')
    (sandbox.root / "src" / "t" / "payload" / "t" / "__init__.py.payload").write_bytes(payload)


def published(tag: str | None = None) -> str:
    """The name the build publishes: its version labeled, repaired, with ``tag`` if any."""
    return "-".join(["t", "1.0+cpu", *([tag] if tag else []), TAG.replace("linux_", "manylinux_2_17_")]) + ".whl"


def listed(sandbox: Sandbox) -> list[str]:
    project = tree_channel(sandbox.output / "index", "cpu").project("t")
    return sorted(f.filename for f in project.files) if project else []


@pytest.fixture
def served(sandbox: Sandbox) -> Iterator[str]:
    (sandbox.output / "index").mkdir(parents=True, exist_ok=True)
    server = make_server(sandbox.output / "index", "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/cpu/simple"
    finally:
        server.shutdown()
        server.server_close()


def test_a_rebuild_with_another_compiler_publishes_under_a_build_tag_and_installers_take_it(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, served: str, tmp_path: Path
) -> None:
    first = build(cli, monkeypatch, sandbox, "cpu")
    assert first.code == 0, (first.out + first.err)[-3000:]
    rebuilt(sandbox, "12.2.1", b"built = 2\n")
    second = build(cli, monkeypatch, sandbox, "cpu")
    assert second.code == 0, (second.out + second.err)[-3000:]
    assert listed(sandbox) == sorted([published(), published("1")])
    report = json.loads((sandbox.output / sandbox.cell("cpu") / "report.json").read_text())
    (named,) = [c for s in report["steps"] for c in s["checks"] if c["name"] == "build-tag"]
    assert "build tag 1, as channel cpu lists this version from another build" in named["detail"]
    wheel = next((sandbox.output / sandbox.cell("cpu") / "dist").glob("t-1.0+cpu-1-*.whl"))
    check_record(wheel, read_wheel(wheel))
    with zipfile.ZipFile(wheel) as zf:
        assert "Build: 1" in zf.read("t-1.0+cpu.dist-info/WHEEL").decode().splitlines()
    assert parse_wheel_filename(wheel.name)[2] == (1, "")
    # Its conda package's build number is the build tag: conda's solvers prefer it the same way.
    packages = sorted(p.name for p in (sandbox.output / "index" / "conda" / "cpu").rglob("t-1.0-*.conda"))
    assert packages == [f"t-1.0-cpu_py{PY}_0.conda", f"t-1.0-cpu_py{PY}_1.conda"], packages

    # pip and uv, from the served channel, take the newest build of the version.
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--isolated", "--index-url", served, "-d",
         str(tmp_path / "pip"), "t==1.0+cpu"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    assert [p.name for p in (tmp_path / "pip").iterdir()] == [wheel.name]
    uv = subprocess.run(
        [uv_bin(), "pip", "install", "--no-config", "--no-deps", "--index-url", served, "--python", sys.executable,
         "--target", str(tmp_path / "uv"), "t==1.0+cpu"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert uv.returncode == 0, uv.stderr
    assert (tmp_path / "uv" / "t" / "__init__.py").read_bytes() == b"built = 2\n"

    # Once more with a third compiler: the next number. Then the same inputs again: its own name, a no-op.
    rebuilt(sandbox, "12.2.2", b"built = 3\n")
    assert build(cli, monkeypatch, sandbox, "cpu").code == 0
    assert listed(sandbox) == sorted([published(), published("1"), published("2")])
    again = cli("--recipes", str(sandbox.recipes), "build", "--cell", sandbox.cell("cpu"), "--engine", "none",
                "--rebuild", "t")  # fmt: skip
    assert again.code == 0, (again.out + again.err)[-3000:]
    assert listed(sandbox) == sorted([published(), published("1"), published("2")])
