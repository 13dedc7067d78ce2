"""Reading and rewriting wheels: a new version label, exact pins, a valid RECORD; and a RECORD held
true of every file (a wheel edited after its build is neither published nor reused)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from tests.attest import RECORD, signed_wheel
from tests.wheels import make_wheel
from wheelmill.building.steps.keys import Listed, refusal
from wheelmill.checks import Verdict
from wheelmill.checks.contents import judge_label, judge_pins
from wheelmill.errors import InvalidWheel
from wheelmill.index.objects import ObjectChannel, publish
from wheelmill.index.pages import FileEntry
from wheelmill.index.storage import TreeStorage
from wheelmill.provenance.signing import new_signing_key
from wheelmill.settings import Settings
from wheelmill.wheel.wheelfile import check_record, read_wheel, rewrite_metadata


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


def edited(wheel: Path, where: Path, *, replace: dict[str, bytes] | None = None, drop: str = "") -> Path:
    """A copy of ``wheel`` in ``where`` with members replaced, added or dropped after its build,
    its RECORD as the build wrote it."""
    changes: dict[str, bytes] = dict(replace or {})
    out = where / wheel.name
    where.mkdir()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w") as target:
        for name in source.namelist():
            if name != drop:
                target.writestr(name, changes.pop(name) if name in changes else source.read(name))
        for name, data in changes.items():
            target.writestr(name, data)
    return out


def test_a_record_true_of_every_file_passes_and_a_lying_one_is_named(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "demo", "1.0", files={"demo/__init__.py": b"A = 1\n", "demo/data.txt": b"d"})
    check_record(wheel)
    lies = {
        "has other bytes than its RECORD says": edited(wheel, tmp_path / "a", replace={"demo/__init__.py": b"B\n"}),
        "demo/extra.py is not in its RECORD": edited(wheel, tmp_path / "b", replace={"demo/extra.py": b"x = 1\n"}),
        "its RECORD lists demo/data.txt, which it does not hold": edited(wheel, tmp_path / "c", drop="demo/data.txt"),
    }
    for said, lying in lies.items():
        with pytest.raises(InvalidWheel, match=said):
            check_record(lying)
    stamped = rewrite_metadata(wheel, tmp_path / "e", version="1.0+cpu", pins={})
    with zipfile.ZipFile(wheel) as zf:
        directory = {"demo/": b"", "demo-1.0.dist-info/RECORD": zf.read("demo-1.0.dist-info/RECORD") + b"demo/,,0\n"}
    check_record(edited(wheel, tmp_path / "d", replace=directory))  # a directory member, and its row
    check_record(stamped)  # as a stamp or a promotion writes it: a row for every member it copies


def test_a_lying_wheel_is_neither_published_nor_reused_from_a_served_index(tmp_path: Path) -> None:
    """Built and served files alike: a publish refuses it and lists nothing; the build-keys
    step does not take it from a served index (and so builds the recipe here)."""
    honest = make_wheel(tmp_path, "demo", "1.0", files={"demo/__init__.py": b"A = 1\n"})
    lying = edited(honest, tmp_path / "lying", replace={"demo/__init__.py": b"import os\n"})
    channel = ObjectChannel(TreeStorage(tmp_path / "index"), "cpu")
    with pytest.raises(InvalidWheel, match="has other bytes than its RECORD says") as refused:
        publish(channel, lying, build_key="k")
    assert refused.value.exit_code == InvalidWheel.exit_code and channel.project("demo") is None
    entry = FileEntry(
        filename=lying.name, version="1.0", sha256="0" * 64, size=1, upload_time="", requires_python=None,
        metadata_sha256="", build_keys=("k",),
    )  # fmt: skip
    served = Listed(channel="cpu", project="demo", entry=entry, url="http://127.0.0.1:9/cpu/", served_from="x")
    assert "has other bytes than its RECORD says" in (refusal(Settings(), (), served, lying) or "")
    assert refusal(Settings(), (), served, honest) is None


def test_a_served_wheel_listed_in_a_channel_it_was_not_built_for_is_not_reused(tmp_path: Path) -> None:
    """A signed build for cu118, listed by a served index in cu130 (or a dirty build in a
    track's channel): the build-keys step does not take it, and says why; the same file in
    its own channel is taken."""
    key = new_signing_key("ed25519")
    trusted = (key.trusted(),)
    wheel, provenance = signed_wheel(tmp_path, "demo", "1.0+cu118", key=key, channels=["cu118"])
    held = ObjectChannel(TreeStorage(tmp_path / "served"), "cu118")  # as the served index keeps it
    publish(held, wheel, provenance=provenance, build_key=RECORD.build_key)
    listed = held.project("demo")
    assert listed is not None

    def served_in(channel: str) -> Listed:
        return Listed(channel=channel, project="demo", entry=listed.files[0], held=held, served_from="x")

    why = refusal(Settings(), trusted, served_in("cu130"), wheel)
    assert why is not None and "listed in channel cu130, but built for cu118" in why, why
    assert refusal(Settings(), trusted, served_in("cu118"), wheel) is None
