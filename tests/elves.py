"""Tiny real ELF files for tests: a 64-bit shared object with the named sections and
nothing else, written byte by byte (no compiler), so checks that read ELF sections can be
fed exactly the bytes a test needs."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

from wheelmill.wheel.elf import DynamicInfo, ElfSummary

_PROGBITS, _STRTAB = 1, 3


EM_X86_64, EM_AARCH64, EM_CUDA = 62, 183, 190


def make_elf(path: Path, sections: Mapping[str, bytes], *, machine: int = EM_X86_64) -> Path:
    """A 64-bit little-endian ET_DYN file of ``machine`` (x86-64 unless told) whose sections
    are ``sections`` (name -> contents)."""
    names = [".shstrtab", *sections]
    shstrtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    offsets = {name: shstrtab.index(b"\0" + name.encode() + b"\0") + 1 for name in names}
    contents = [shstrtab, *sections.values()]
    body, placed, cursor = b"", [], 64
    for data in contents:
        placed.append(cursor)
        body += data
        cursor += len(data)
    shoff = (cursor + 7) // 8 * 8
    body += b"\0" * (shoff - cursor)
    headers = b"\0" * 64  # SHN_UNDEF
    for index, name in enumerate(names):
        kind = _STRTAB if index == 0 else _PROGBITS
        headers += struct.pack(
            "<IIQQQQIIQQ", offsets[name], kind, 0, 0, placed[index], len(contents[index]), 0, 0, 1, 0
        )
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, shoff, 0, 64, 56, 0, 64, len(names) + 1, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + body + headers)
    return path


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
