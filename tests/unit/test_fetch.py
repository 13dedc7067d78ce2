"""An sdist unpacked the same way with or without tarfile's extraction filters (PEP 706; a
CPython before 3.11.4, Debian 12's 3.11.2, has none): a safe archive unpacks, and a member
outside the destination, a link leading outside it, or a device is refused in one line."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from wheelmill.building.steps.fetch import _unpack
from wheelmill.errors import IntegrityError


def archive(path: Path, *members: tarfile.TarInfo) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for member in members:
            data = b"x = 1\n" if member.isfile() else b""
            member.size = len(data)
            tf.addfile(member, io.BytesIO(data) if data else None)
    return path


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.fixture(params=["with filters", "without filters"])
def filters(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "without filters":
        monkeypatch.delattr(tarfile, "data_filter")
    return str(request.param)


def test_a_safe_sdist_unpacks(tmp_path: Path, filters: str) -> None:
    sdist = archive(
        tmp_path / "demo-1.0.tar.gz", entry("demo-1.0/setup.py"), entry("demo-1.0/link", tarfile.SYMTYPE, "setup.py")
    )
    assert _unpack(sdist, tmp_path / "src") == tmp_path / "src" / "demo-1.0"
    assert (tmp_path / "src" / "demo-1.0" / "setup.py").read_text() == "x = 1\n"


@pytest.mark.parametrize(
    "bad",
    [
        entry("../evil.py"),
        entry("demo-1.0/out", tarfile.SYMTYPE, "../../../etc/passwd"),
        entry("demo-1.0/dev", tarfile.CHRTYPE),
    ],
    ids=["outside", "link-outside", "device"],
)
def test_an_unsafe_member_is_refused(tmp_path: Path, filters: str, bad: tarfile.TarInfo) -> None:
    sdist = archive(tmp_path / "demo-1.0.tar.gz", entry("demo-1.0/setup.py"), bad)
    with pytest.raises(IntegrityError) as refused:
        _unpack(sdist, tmp_path / "src")
    assert refused.value.exit_code == 7 and "demo-1.0.tar.gz" in refused.value.one_line()
    assert not (tmp_path / "evil.py").exists()
