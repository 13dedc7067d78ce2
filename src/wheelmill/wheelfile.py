"""Wheels as values: read the name, tags and core metadata, unpack the binaries, and
rewrite the metadata (version label, exact pins) with a fresh RECORD.

Names and versions go through ``packaging``; nothing PEP-defined is parsed by regex.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from wheelmill.checks.elf import is_elf


@dataclass(frozen=True, kw_only=True)
class WheelInfo:
    path: Path
    name: str  # canonical
    version: Version
    tags: frozenset[Tag]
    dist_info: str
    metadata_text: str
    files: tuple[str, ...]

    @property
    def requires_dist(self) -> tuple[str, ...]:
        return tuple(HeaderParser().parsestr(self.metadata_text).get_all("Requires-Dist") or ())

    def requirements(self) -> list[Requirement]:
        out = []
        for text in self.requires_dist:
            try:
                out.append(Requirement(text))
            except InvalidRequirement:
                continue
        return out

    @property
    def platforms(self) -> frozenset[str]:
        return frozenset(t.platform for t in self.tags)


def read_wheel(path: Path) -> WheelInfo:
    name, version, _build, tags = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as zf:
        files = tuple(zf.namelist())
        dist_info = _dist_info_dir(files, path)
        metadata_text = zf.read(f"{dist_info}/METADATA").decode("utf-8")
    return WheelInfo(
        path=path,
        name=canonicalize_name(name),
        version=version,
        tags=frozenset(tags),
        dist_info=dist_info,
        metadata_text=metadata_text,
        files=files,
    )


def _dist_info_dir(files: tuple[str, ...], path: Path) -> str:
    dirs = {f.split("/", 1)[0] for f in files if f.split("/", 1)[0].endswith(".dist-info") and f.endswith("/METADATA")}
    if len(dirs) != 1:
        raise ValueError(f"{path.name}: expected one .dist-info directory with METADATA, found {sorted(dirs) or 'none'}")
    return dirs.pop()


def extract_binaries(wheel: Path, dest: Path) -> list[Path]:
    """Unpack every ELF file of the wheel under ``dest``; return their paths."""
    out = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            with zf.open(info) as src:
                head = src.read(4)
            if head != b"\x7fELF":
                continue
            target = dest / info.filename
            if not target.resolve().is_relative_to(dest.resolve()):
                raise ValueError(f"{wheel.name}: unsafe path {info.filename!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            out.append(target)
    return [p for p in out if is_elf(p)]


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def rewrite_metadata(
    wheel: Path,
    dest_dir: Path,
    *,
    version: str | None,
    pins: Mapping[str, str],
    add: Sequence[str] = (),
) -> Path:
    """A copy of ``wheel`` in ``dest_dir`` with a new version, exact pins, added requirements.

    ``pins`` maps a project name to the exact version every unconditional requirement on
    it must have (``torch`` -> ``2.14.1``); one is added where the wheel had none. ``add``
    requirements are appended unless already declared. The .dist-info directory and the
    file name follow the version, and RECORD is recomputed.
    """
    info = read_wheel(wheel)
    new_version = version or str(info.version)
    name_part = wheel.name.split("-", 1)[0]
    new_dist_info = f"{name_part}-{new_version}.dist-info"
    tag_part = wheel.name[len(name_part) + 1 + len(_filename_version(wheel.name)) + 1 :]
    target = dest_dir / f"{name_part}-{new_version}-{tag_part}"
    metadata = _rewrite_headers(info.metadata_text, version=new_version, pins=pins, add=add)
    _rewrite_zip(wheel, target, old_dist=info.dist_info, new_dist=new_dist_info, metadata=metadata)
    return target


def _filename_version(filename: str) -> str:
    return filename.split("-")[1]


def _rewrite_headers(text: str, *, version: str, pins: Mapping[str, str], add: Sequence[str] = ()) -> str:
    head, sep, body = text.partition("\n\n")
    lines = head.split("\n")
    out: list[str] = []
    pinned: set[str] = set()
    for line in lines:
        key, colon, value = line.partition(":")
        if colon and key == "Version":
            out.append(f"Version: {version}")
            continue
        if colon and key == "Requires-Dist":
            replaced = _pin_requirement(value.strip(), pins)
            if replaced is not None:
                name, text_line = replaced
                if name in pinned:
                    continue
                pinned.add(name)
                out.append(f"Requires-Dist: {text_line}")
                continue
        out.append(line)
    for name, exact in pins.items():
        if canonicalize_name(name) not in pinned:
            out.append(f"Requires-Dist: {name}=={exact}")
    declared = {line.partition(":")[2].strip() for line in out if line.startswith("Requires-Dist:")}
    out += [f"Requires-Dist: {req}" for req in add if req not in declared]
    return "\n".join(out) + sep + body


def _pin_requirement(text: str, pins: Mapping[str, str]) -> tuple[str, str] | None:
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    canonical = {canonicalize_name(k): v for k, v in pins.items()}
    name = canonicalize_name(req.name)
    if name not in canonical or req.marker is not None:
        return None
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return name, f"{req.name}{extras}=={canonical[name]}"


def _rewrite_zip(source: Path, target: Path, *, old_dist: str, new_dist: str, metadata: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        records: list[str] = []
        with zipfile.ZipFile(source) as zin, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for item in zin.infolist():
                if item.filename == f"{old_dist}/RECORD":
                    continue
                data = metadata.encode() if item.filename == f"{old_dist}/METADATA" else zin.read(item)
                name = new_dist + item.filename[len(old_dist) :] if item.filename.startswith(old_dist + "/") else item.filename
                zout.writestr(_copy_info(item, name), data)
                records.append(f"{name},{_record_hash(data)},{len(data)}")
            record_name = f"{new_dist}/RECORD"
            records.append(f"{record_name},,")
            zout.writestr(_copy_info(zipfile.ZipInfo(record_name), record_name), "\n".join(records) + "\n")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def _copy_info(item: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=item.date_time)
    info.external_attr = item.external_attr or (0o644 << 16)
    info.compress_type = zipfile.ZIP_DEFLATED
    return info
