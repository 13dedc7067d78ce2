"""Rewriting a wheel's metadata: new version label, exact pins, a valid RECORD."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from tests.wheels import make_wheel
from wheelmill.checks import Verdict
from wheelmill.checks.contents import judge_label, judge_pins
from wheelmill.errors import InvalidWheel
from wheelmill.wheel.wheelfile import read_wheel, rewrite_metadata


def test_stamp_adds_label_and_exact_pins(tmp_path: Path) -> None:
    built = make_wheel(
        tmp_path,
        "torchsort",
        "0.1.10",
        requires=["torch", "numpy>=1.20", "pytest; extra == 'testing'"],
        files={"torchsort/__init__.py": b"x = 1\n"},
    )
    out = rewrite_metadata(built, tmp_path / "out", version="0.1.10+cu130", pins={"torch": "2.14.1"})
    assert out.name == "torchsort-0.1.10+cu130-cp311-cp311-linux_x86_64.whl"
    info = read_wheel(out)
    assert str(info.version) == "0.1.10+cu130"
    assert info.dist_info == "torchsort-0.1.10+cu130.dist-info"
    assert info.requires_dist == ("torch==2.14.1", "numpy>=1.20", "pytest; extra == 'testing'")
    assert judge_pins(info, {"torch": "2.14.1"}).verdict is Verdict.PASS
    assert judge_label(info, "cu130").verdict is Verdict.PASS


def test_stamp_adds_a_missing_pin_and_keeps_the_body(tmp_path: Path) -> None:
    built = make_wheel(tmp_path, "example-cuda-ops", "0.1.0")
    out = rewrite_metadata(
        built,
        tmp_path / "out",
        version=None,
        pins={"torch": "2.13.0+cpu", "example-cpp-ops": "0.1.0+cpu"},
        add=["numpy"],
    )
    info = read_wheel(out)
    assert info.requires_dist == ("torch==2.13.0+cpu", "example-cpp-ops==0.1.0+cpu", "numpy")
    assert info.metadata_text.endswith("\n\nA test package.\n")


def test_record_matches_every_file(tmp_path: Path) -> None:
    built = make_wheel(tmp_path, "pkg", "1.0", files={"pkg/a.py": b"a", "pkg/b.bin": bytes(range(256))})
    out = rewrite_metadata(built, tmp_path / "out", version="1.0+cpu", pins={"torch": "2.13.0+cpu"})
    with zipfile.ZipFile(out) as zf:
        rows = list(csv.reader(io.StringIO(zf.read("pkg-1.0+cpu.dist-info/RECORD").decode())))
        assert {r[0] for r in rows} == set(zf.namelist())
        for path, digest, size in rows:
            if digest:
                data = zf.read(path)
                assert (
                    digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                )
                assert int(size) == len(data)


def test_unpinned_or_ranged_torch_fails_the_pin_check(tmp_path: Path) -> None:
    for requires in (["torch"], ["torch>=2.0"], ["torch==2.13.0"], []):
        info = read_wheel(make_wheel(tmp_path, "pkg", "1.0", requires=requires))
        result = judge_pins(info, {"torch": "2.14.1"})
        assert result.verdict is Verdict.FAIL, requires
        assert "torch" in result.detail


def test_missing_or_wrong_label_fails(tmp_path: Path) -> None:
    assert judge_label(read_wheel(make_wheel(tmp_path, "pkg", "1.0")), "cu130").verdict is Verdict.FAIL
    assert judge_label(read_wheel(make_wheel(tmp_path, "pkg", "1.1+cu126")), "cu130").verdict is Verdict.FAIL
    assert judge_label(read_wheel(make_wheel(tmp_path, "pkg", "1.2")), None).verdict is Verdict.SKIP


@pytest.mark.parametrize("member", ["../../etc/cron.d/x", "/etc/passwd", "demo/../../x.py", "C:/x.py", "\\x.py"])
def test_a_member_outside_the_wheel_is_no_wheel(tmp_path: Path, member: str) -> None:
    wheel = make_wheel(tmp_path, "demo", "1.0", files={member: b"x"})
    with pytest.raises(InvalidWheel, match="is not a path inside the wheel"):
        read_wheel(wheel)


def test_a_member_that_inflates_a_hundredfold_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """64 MiB and more of zeros from some 70 KB: refused from the zip's directory alone."""
    wheel = make_wheel(tmp_path, "demo", "1.0", files={"demo/zeros.bin": bytes(65 << 20)})
    assert wheel.stat().st_size < 1 << 20
    with pytest.raises(InvalidWheel, match=r"demo/zeros.bin' unpacks to 68157440 bytes from \d+"):
        read_wheel(wheel)
    plain = make_wheel(tmp_path / "plain", "demo", "1.0", files={"demo/zeros.bin": bytes(65 << 20)}, stored=True)
    assert read_wheel(plain).name == "demo", "stored, the same bytes are no bomb"
