"""How a base is made: debootstrap as root, mmdebstrap's unshare mode as anyone else, with
the same suite, variant and mirror; where neither can run, one line names each thing missing
and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from wheelmill.errors import PrecheckError
from wheelmill.machine.bootstrap import bootstrapper
from wheelmill.machine.builder_images import Base, BaseKind

BASE = Base(kind=BaseKind.BOOTSTRAP, reference="r", description="d", glibc="2.36", suite="bookworm")
TOOLS = {"debootstrap", "mmdebstrap", "newuidmap", "newgidmap"}


def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, tools: set[str], ids: bool = True) -> Path:
    """A machine with ``tools`` on PATH and, where ``ids``, subordinate ids for user ci."""
    monkeypatch.setattr(shutil, "which", lambda name, path=None: f"/usr/bin/{name}" if name in tools else None)
    for name in ("subuid", "subgid"):
        (tmp_path / name).write_text("ci:100000:65536\n" if ids else "other:100000:65536\n")
    return tmp_path


def test_root_bootstraps_with_debootstrap_and_tars_the_tree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    how = bootstrapper(root=True, user="root", etc=machine(monkeypatch, tmp_path, tools=TOOLS))
    assert (how.tool, how.rootless) == ("debootstrap", False)
    commands = how.commands(BASE, mirror="http://mirror/debian", tarball=tmp_path / "rootfs.tar")
    assert commands[0][1:] == [
        "--variant=minbase",
        "--arch=amd64",
        "bookworm",
        str(tmp_path / "rootfs"),
        "http://mirror/debian",
    ]
    assert commands[1][0] == "tar"


def test_a_user_bootstraps_with_mmdebstraps_unshare_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    how = bootstrapper(root=False, user="ci", etc=machine(monkeypatch, tmp_path, tools=TOOLS))
    assert (how.tool, how.rootless) == ("mmdebstrap", True)
    (command,) = how.commands(BASE, mirror="http://mirror/debian", tarball=tmp_path / "rootfs.tar")
    assert command == [
        "/usr/bin/mmdebstrap",
        "--mode=unshare",
        "--variant=minbase",
        "--architectures=amd64",
        "bookworm",
        str(tmp_path / "rootfs.tar"),
        "http://mirror/debian",
    ]


@pytest.mark.parametrize(
    ("tools", "ids", "named"),
    [
        (TOOLS - {"mmdebstrap"}, True, ["no mmdebstrap"]),
        (TOOLS - {"newuidmap", "newgidmap"}, True, ["no newuidmap (Debian's uidmap)", "no newgidmap"]),
        (TOOLS, False, ["no subordinate ids for ci in", "subuid", "subgid"]),
    ],
)
def test_what_a_user_lacks_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tools: set[str], ids: bool, named: list[str]
) -> None:
    with pytest.raises(PrecheckError) as refused:
        bootstrapper(root=False, user="ci", etc=machine(monkeypatch, tmp_path, tools=tools, ids=ids))
    line = refused.value.one_line()
    assert all(word in line for word in named), line
    assert "scripts/setup --system" in line and "WHEELMILL_IMAGE_REGISTRY" in line


def test_root_without_either_tool_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(PrecheckError, match="debootstrap"):
        bootstrapper(root=True, user="root", etc=machine(monkeypatch, tmp_path, tools=set()))
