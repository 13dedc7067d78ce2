"""Wheels as values: read the name, tags, core metadata and GPU arch record, unpack the
binaries, and rewrite the metadata (version label, exact pins, added .dist-info files) with
a fresh RECORD.

Names and versions go through ``packaging``; nothing PEP-defined is parsed by regex.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from elftools.common.exceptions import ELFError
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from wheelmill.errors import CheckError, InvalidWheel
from wheelmill.files import atomic_path
from wheelmill.inputs.archs import ARCH_RECORD
from wheelmill.wheel.elf import ELF_MAGIC, ElfSummary, is_elf, summarize

# Core metadata is a few kilobytes; a wheel whose METADATA would unpack to more than this
# is refused before it is read (a small zip can expand to gigabytes).
MAX_METADATA = 16 * 2**20
MAX_ARCH_RECORD = 64 * 2**10  # gpu-archs.json is one short line
# A member bigger than this that inflates more than MAX_RATIO times is refused as a zip bomb.
MAX_INFLATED_PLAINLY = 64 << 20
MAX_RATIO = 100
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class WheelInfo:
    """A wheel's name, version and tags (from its file name) and its core metadata."""

    path: Path
    name: str  # canonical
    version: Version
    tags: frozenset[Tag]
    dist_info: str
    metadata: bytes  # METADATA as stored: what a PEP 658 sidecar serves
    files: tuple[str, ...]
    arch_record: bytes | None = None  # .dist-info/gpu-archs.json as stored (wheelmill.inputs.archs.ArchRecord), if any
    build_number: int = 0  # its file name's build tag's number (wheelmill.wheel.buildtags); 0 where it has none

    @cached_property
    def headers(self) -> Message:
        return HeaderParser().parsestr(self.metadata_text)

    @property
    def metadata_text(self) -> str:
        return self.metadata.decode("utf-8")

    @property
    def metadata_name(self) -> str:
        return str(self.headers.get("Name", ""))

    @property
    def metadata_version(self) -> str:
        return str(self.headers.get("Version", ""))

    @property
    def requires_python(self) -> str | None:
        value = self.headers.get("Requires-Python")
        return str(value) if value is not None else None

    @property
    def requires_dist(self) -> tuple[str, ...]:
        return tuple(str(v) for v in self.headers.get_all("Requires-Dist") or ())

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
    """The one reader of wheels: every way a file can fail to be a wheel is ``InvalidWheel``."""
    try:
        name, version, build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise InvalidWheel(
            f"{path}: not a wheel file name ({exc})", fix="give a .whl file named <name>-<version>-<tags>.whl"
        ) from None
    try:
        with zipfile.ZipFile(path) as zf:
            _check_members(zf.infolist(), path)
            files = tuple(zf.namelist())
            dist_info = _dist_info_dir(files, path)
            metadata = _read_bounded(zf, f"{dist_info}/METADATA", path, MAX_METADATA)
            record_name = f"{dist_info}/{ARCH_RECORD}"
            arch_record = _read_bounded(zf, record_name, path, MAX_ARCH_RECORD) if record_name in files else None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InvalidWheel(f"{path}: unreadable wheel ({exc})", fix="rebuild it; a wheel is a zip file") from None
    info = WheelInfo(
        path=path,
        name=canonicalize_name(name),
        version=version,
        tags=frozenset(tags),
        dist_info=dist_info,
        metadata=metadata,
        files=files,
        arch_record=arch_record,
        build_number=build[0] if build else 0,
    )
    _check_metadata(info)
    return info


def _check_members(members: list[zipfile.ZipInfo], path: Path) -> None:
    """Every member a relative path inside the wheel, and none a zip bomb: an installer
    would write ``../x`` or ``/x`` outside site-packages, and a member of tens of MB that
    inflates a hundredfold is no library (torch's libtorch_cpu.so, 434 MB, compresses under fourfold)."""
    for member in members:
        name = member.filename
        if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/") or ":" in name.split("/")[0]:
            raise InvalidWheel(
                f"{path}: member {name[:200]!r} is not a path inside the wheel",
                fix="rebuild it; an installer would write that member outside its install",
            )
        inflated = member.file_size > MAX_INFLATED_PLAINLY and member.file_size > MAX_RATIO * member.compress_size
        if inflated:
            raise InvalidWheel(
                f"{path}: member {name[:200]!r} unpacks to {member.file_size} bytes from {member.compress_size}",
                fix="rebuild it; no file of a wheel compresses a hundredfold at that size (a zip bomb?)",
            )


def _dist_info_dir(files: tuple[str, ...], path: Path) -> str:
    dirs = {
        f.split("/", 1)[0]
        for f in files
        if f.split("/", 1)[0].endswith(".dist-info") and f.count("/") == 1 and f.endswith("/METADATA")
    }
    if len(dirs) != 1:
        raise InvalidWheel(
            f"{path}: expected one .dist-info directory with METADATA, found {sorted(dirs) or 'none'}",
            fix="rebuild it with a standard build backend",
        )
    return dirs.pop()


def _read_bounded(zf: zipfile.ZipFile, member: str, path: Path, limit: int) -> bytes:
    info = zf.getinfo(member)
    if info.file_size > limit:
        raise InvalidWheel(
            f"{path}: {member} unpacks to {info.file_size} bytes", fix="metadata is kilobytes; rebuild the wheel"
        )
    with zf.open(info) as member_file:
        data = member_file.read(limit + 1)  # the declared size can lie
    if len(data) > limit:
        raise InvalidWheel(
            f"{path}: {member} unpacks to more than {limit} bytes", fix="metadata is kilobytes; rebuild the wheel"
        )
    return data


def _check_metadata(info: WheelInfo) -> None:
    try:
        info.metadata_text  # noqa: B018 - decoding is the check
    except UnicodeDecodeError:
        raise InvalidWheel(
            f"{info.path}: {info.dist_info}/METADATA is not UTF-8", fix="rebuild it; core metadata is UTF-8 (PEP 566)"
        ) from None
    if not info.metadata_name:
        raise InvalidWheel(
            f"{info.path}: {info.dist_info}/METADATA has no Name", fix="rebuild it with a standard build backend"
        )
    try:
        Version(info.metadata_version)
    except InvalidVersion:
        raise InvalidWheel(
            f"{info.path}: METADATA Version {info.metadata_version[:40]!r} is not a version (PEP 440)",
            fix="fix the version and rebuild it",
        ) from None


def elf_members(zf: zipfile.ZipFile) -> Iterator[zipfile.ZipInfo]:
    """The members of an open wheel that start like an ELF file."""
    for info in zf.infolist():
        if info.is_dir():
            continue
        with zf.open(info) as member:
            if member.read(4) == ELF_MAGIC:
                yield info


def extract_binaries(wheel: Path, dest: Path) -> list[Path]:
    """Unpack every ELF file of the wheel under ``dest``; return their paths."""
    out = []
    with zipfile.ZipFile(wheel) as zf:
        for info in elf_members(zf):
            target = dest / info.filename
            if not target.resolve().is_relative_to(dest.resolve()):
                raise InvalidWheel(
                    f"{wheel.name}: unsafe path {info.filename!r}",
                    fix="do not use this wheel: a member would land outside its tree",
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            out.append(target)
    return [p for p in out if is_elf(p)]


def inspect_wheel(wheel: Path, judge: Callable[[Path, list[ElfSummary]], T]) -> T:
    """Unpack the wheel's ELF files into a temporary directory and judge them there."""
    with tempfile.TemporaryDirectory(prefix="wheelmill-inspect-") as tmp:
        root = Path(tmp)
        return judge(root, [_summary(wheel, root, path) for path in extract_binaries(wheel, root)])


def _summary(wheel: Path, root: Path, path: Path) -> ElfSummary:
    try:
        return summarize(path)
    except ELFError as exc:
        raise CheckError(
            f"{wheel.name}: {path.relative_to(root)} starts like an ELF file but cannot be read as one ({exc})",
            fix="rebuild the wheel",
        ) from None


MAX_RECORD = 16 * 2**20  # RECORD: a line per file; a wheel of 100,000 files stays under this


def recorded_hashes(path: Path) -> dict[str, str]:
    """What a wheel's RECORD says of each file that has a hash: its path in the wheel, and its
    hash as RECORD writes it (``sha256=...``); ``InvalidWheel`` for a wheel without one."""
    info = read_wheel(path)
    try:
        with zipfile.ZipFile(path) as zf:
            rows = _record_rows(zf, info)
    except (zipfile.BadZipFile, OSError) as exc:
        raise InvalidWheel(f"{path}: unreadable wheel ({exc})", fix="rebuild it; a wheel is a zip file") from None
    return {row[0]: row[1] for row in rows if len(row) >= 2 and row[1].startswith("sha256=")}


def check_record(path: Path, info: WheelInfo | None = None) -> None:
    """Every file of the wheel listed in its RECORD with the hash of its bytes, and nothing
    listed that is not there (RECORD itself and its signatures aside, which it cannot hash):
    an installer takes RECORD's word for what it wrote, and a file that disagrees with it was
    changed after the build that wrote it. ``InvalidWheel`` names the first that does not.
    ``info``: the wheel as ``read_wheel`` read it already."""
    info = info or read_wheel(path)
    unhashed = {f"{info.dist_info}/{name}" for name in ("RECORD", "RECORD.jws", "RECORD.p7s")}
    edited = "rebuild it; a wheel is never edited after its build"
    try:
        with zipfile.ZipFile(path) as zf:
            listed = {row[0]: row[1] if len(row) >= 2 else "" for row in _record_rows(zf, info) if row}
            for member in zf.infolist():
                said = listed.pop(member.filename, None)
                if member.is_dir() or member.filename in unhashed:
                    continue
                if said is None:
                    raise InvalidWheel(f"{path.name}: {member.filename[:200]} is not in its RECORD", fix=edited)
                if said != _member_hash(zf, member):
                    raise InvalidWheel(
                        f"{path.name}: {member.filename[:200]} has other bytes than its RECORD says", fix=edited
                    )
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
        raise InvalidWheel(f"{path}: unreadable wheel ({exc})", fix="rebuild it; a wheel is a zip file") from None
    missing = sorted(name for name in listed if name not in unhashed)
    if missing:
        raise InvalidWheel(f"{path.name}: its RECORD lists {missing[0][:200]}, which it does not hold", fix=edited)


def _record_rows(zf: zipfile.ZipFile, info: WheelInfo) -> list[list[str]]:
    """The rows of the open wheel's RECORD; ``InvalidWheel`` where it has none it can read."""
    try:
        text = _read_bounded(zf, f"{info.dist_info}/RECORD", info.path, MAX_RECORD).decode("utf-8")
        return list(csv.reader(text.splitlines()))
    except (KeyError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidWheel(
            f"{info.path}: no readable RECORD ({exc})", fix="rebuild it with a standard build backend"
        ) from None


def _member_hash(zf: zipfile.ZipFile, member: zipfile.ZipInfo) -> str:
    """A member's hash as RECORD writes it, read a megabyte at a time (a library can be GBs)."""
    digest = hashlib.sha256()
    with zf.open(member) as data:
        while chunk := data.read(2**20):
            digest.update(chunk)
    return _recorded(digest.digest())


def record_hash(data: bytes) -> str:
    """Bytes' hash as a RECORD writes it: ``sha256=`` and the digest in urlsafe base64, unpadded."""
    return _recorded(hashlib.sha256(data).digest())


def _recorded(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def rewrite_metadata(
    wheel: Path,
    dest_dir: Path,
    *,
    version: str | None,
    pins: Mapping[str, str],
    add: Sequence[str] = (),
    dist_files: Mapping[str, bytes] | None = None,
    build_tag: str | None = None,
) -> Path:
    """A copy of ``wheel`` in ``dest_dir`` with a new version, exact pins, added requirements.

    ``pins`` maps a project name to the exact version every unconditional requirement on
    it must have (``torch`` -> ``2.14.1``); one is added where the wheel had none. ``add``
    requirements are appended unless already declared. ``dist_files`` (a name in the
    .dist-info directory -> its bytes) are written there, replacing any of that name. The
    .dist-info directory and the file name follow the version, and RECORD is recomputed.
    A ``build_tag`` goes into the file name and the WHEEL file's ``Build`` field
    (``wheelmill.wheel.buildtags``).
    """
    info = read_wheel(wheel)
    new_version = version or str(info.version)
    name_part = wheel.name.split("-", 1)[0]
    new_dist_info = f"{name_part}-{new_version}.dist-info"
    target = dest_dir / stamped_name(wheel.name, new_version, build_tag=build_tag)
    metadata = _rewrite_headers(info.metadata_text, version=new_version, pins=pins, add=add)
    _rewrite_zip(
        wheel,
        target,
        old_dist=info.dist_info,
        new_dist=new_dist_info,
        metadata=metadata,
        dist_files=dist_files or {},
        build_tag=build_tag,
    )
    return target


def stamped_name(filename: str, version: str, *, build_tag: str | None = None) -> str:
    """A wheel's file name with another version (and a build tag in place of any it had).

    >>> stamped_name("t-1.0-cp311-cp311-linux_x86_64.whl", "1.0+cpu", build_tag="2")
    't-1.0+cpu-2-cp311-cp311-linux_x86_64.whl'
    >>> stamped_name("t-1.0-7-py3-none-any.whl", "1.0")
    't-1.0-py3-none-any.whl'
    """
    parts = filename.split("-")
    name_part, tag_part = parts[0], "-".join(parts[-3:])
    return "-".join([name_part, version, *([build_tag] if build_tag else []), tag_part])


def stamped_requires(
    info: WheelInfo, *, version: str, pins: Mapping[str, str], add: Sequence[str] = ()
) -> tuple[str, ...]:
    """The Requires-Dist ``rewrite_metadata`` gives the wheel: known before it is written,
    for what is written with it (its SBOM's run-time needs)."""
    text = _rewrite_headers(info.metadata_text, version=version, pins=pins, add=add)
    return tuple(str(v) for v in HeaderParser().parsestr(text).get_all("Requires-Dist") or ())


def _rewrite_headers(text: str, *, version: str, pins: Mapping[str, str], add: Sequence[str] = ()) -> str:
    head, sep, body = text.partition("\n\n")
    lines = head.rstrip("\n").split("\n")  # headers only: a METADATA without a body ends in one newline
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
    return "\n".join(out) + (sep + body if sep else "\n")


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


def _rewrite_zip(
    source: Path,
    target: Path,
    *,
    old_dist: str,
    new_dist: str,
    metadata: str,
    dist_files: Mapping[str, bytes],
    build_tag: str | None = None,
) -> None:
    records: list[str] = []
    replaced = {f"{old_dist}/RECORD", *(f"{old_dist}/{name}" for name in dist_files)}
    with (
        atomic_path(target) as tmp,
        zipfile.ZipFile(source) as zin,
        zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout,
    ):
        for item in zin.infolist():
            if item.filename in replaced:
                continue
            data = metadata.encode() if item.filename == f"{old_dist}/METADATA" else zin.read(item)
            if item.filename == f"{old_dist}/WHEEL" and (build_tag or b"\nBuild:" in data):  # else byte for byte
                data = _with_build(data.decode("utf-8"), build_tag).encode()
            name = (
                new_dist + item.filename[len(old_dist) :] if item.filename.startswith(old_dist + "/") else item.filename
            )
            zout.writestr(_copy_info(item, name), data)
            records.append(f"{name},{record_hash(data)},{len(data)}")
        # Added files get RECORD's fixed timestamp and mode: the same input gives the same bytes.
        for name, data in sorted(dist_files.items()):
            member = f"{new_dist}/{name}"
            zout.writestr(_copy_info(zipfile.ZipInfo(member), member), data)
            records.append(f"{member},{record_hash(data)},{len(data)}")
        record_name = f"{new_dist}/RECORD"
        records.append(f"{record_name},,")
        zout.writestr(_copy_info(zipfile.ZipInfo(record_name), record_name), "\n".join(records) + "\n")


def _with_build(wheel_text: str, build_tag: str | None) -> str:
    """The WHEEL file with ``Build: <tag>`` (the file name's, which it must match), or none.

    >>> print(_with_build("Wheel-Version: 1.0" + chr(10) + "Build: 7" + chr(10) + "Tag: py3-none-any", "2"))
    Wheel-Version: 1.0
    Tag: py3-none-any
    Build: 2
    <BLANKLINE>
    """
    lines = [line for line in wheel_text.splitlines() if not line.startswith("Build:")]
    return "\n".join([*lines, *([f"Build: {build_tag}"] if build_tag else [])]) + "\n"


def _copy_info(item: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=item.date_time)
    info.external_attr = item.external_attr or (0o644 << 16)
    info.compress_type = zipfile.ZIP_DEFLATED
    return info
