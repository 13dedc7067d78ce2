"""Tiny real ELF files for tests: a 64-bit shared object with the named sections and
nothing else, written byte by byte (no compiler), so checks that read ELF sections can be
fed exactly the bytes a test needs."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from wheelmill.wheel.elf import DynamicInfo, ElfSummary

_PROGBITS, _STRTAB, _VERNEED = 1, 3, 0x6FFFFFFE


EM_X86_64, EM_AARCH64, EM_CUDA = 62, 183, 190


def make_elf(
    path: Path,
    sections: Mapping[str, bytes],
    *,
    machine: int = EM_X86_64,
    version_needs: Mapping[str, Sequence[str]] | None = None,
) -> Path:
    """A 64-bit little-endian ET_DYN file of ``machine`` (x86-64 unless told) whose sections
    are ``sections`` (name -> contents), and, with ``version_needs`` (library -> versions,
    ``{"libc.so.6": ["GLIBC_2.34"]}``), a ``.gnu.version_r`` that needs them, as the linker
    writes it for a library built against that glibc."""
    table = [(name, data, _PROGBITS, 0, 0) for name, data in sections.items()]
    if version_needs:
        dynstr, needs = _version_needs(version_needs)
        dynstr_index = len(table) + 2  # after SHN_UNDEF and .shstrtab
        table += [
            (".dynstr", dynstr, _STRTAB, 0, 0),
            (".gnu.version_r", needs, _VERNEED, dynstr_index, len(version_needs)),
        ]
    names = [".shstrtab", *(name for name, *_ in table)]
    shstrtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    offsets = {name: shstrtab.index(b"\0" + name.encode() + b"\0") + 1 for name in names}
    entries = [(".shstrtab", shstrtab, _STRTAB, 0, 0), *table]
    body, placed, cursor = b"", [], 64
    for _name, data, *_ in entries:
        placed.append(cursor)
        body += data
        cursor += len(data)
    shoff = (cursor + 7) // 8 * 8
    body += b"\0" * (shoff - cursor)
    headers = b"\0" * 64  # SHN_UNDEF
    for index, (name, data, kind, link, info) in enumerate(entries):
        headers += struct.pack("<IIQQQQIIQQ", offsets[name], kind, 0, 0, placed[index], len(data), link, info, 1, 0)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, shoff, 0, 64, 56, 0, 64, len(names) + 1, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + body + headers)
    return path


def _version_needs(needs: Mapping[str, Sequence[str]]) -> tuple[bytes, bytes]:
    """A string table and the Elf64_Verneed entries (each followed by its Elf64_Vernaux ones)
    that name ``needs``."""
    strings = b"\0"
    where: dict[str, int] = {}
    for name in [*needs, *(v for versions in needs.values() for v in versions)]:
        if name not in where:
            where[name] = len(strings)
            strings += name.encode() + b"\0"
    entries, other = b"", 2  # version indexes 0 and 1 are reserved
    for number, (library, versions) in enumerate(needs.items()):
        size = 16 + 16 * len(versions)
        following = size if number < len(needs) - 1 else 0
        entries += struct.pack("<HHIII", 1, len(versions), where[library], 16, following)
        for position, version in enumerate(versions):
            after = 16 if position < len(versions) - 1 else 0
            entries += struct.pack("<IHHII", _elf_hash(version), 0, other, where[version], after)
            other += 1
    return strings, entries


def _elf_hash(name: str) -> int:
    """The SysV ELF hash of a name, as vna_hash holds it."""
    value = 0
    for byte in name.encode():
        value = (value << 4) + byte
        high = value & 0xF0000000
        if high:
            value ^= high >> 24
        value &= ~high
    return value & 0xFFFFFFFF


def summary(
    path: Path,
    *,
    undefined: Iterable[str] = (),
    needed: tuple[str, ...] = (),
    soname: str | None = None,
    defined: frozenset[str] = frozenset(),
    version_needs: tuple[tuple[str, str], ...] = (),
) -> ElfSummary:
    """What the checks read of a library at ``path``, given as values (no file): for checks
    fed exactly the symbols and links a test needs."""
    return ElfSummary(
        dynamic=DynamicInfo(path=path, soname=soname, needed=needed, rpaths=()),
        undefined=frozenset(undefined),
        defined=defined,
        version_needs=version_needs,
        sections=frozenset(),
    )
