"""Reading ELF files with pyelftools: what a library needs, what it defines, and where
its dependencies resolve, the way the dynamic loader would find them.

Large providers (libtorch_cpu.so has ~75,000 dynamic symbols) are queried through their
GNU hash tables, one name at a time, instead of being read whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from elftools.elf.hash import ELFHashSection, GNUHashSection
from elftools.elf.sections import SymbolTableSection

ELF_MAGIC = b"\x7fELF"


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


@dataclass(frozen=True, kw_only=True)
class DynamicInfo:
    """The dynamic section of a shared object: cheap to read, even for libtorch."""

    path: Path
    soname: str | None
    needed: tuple[str, ...]
    rpaths: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ElfSummary:
    """What the checks need to know about one of the wheel's own shared objects."""

    dynamic: DynamicInfo
    undefined: frozenset[str]  # strong (non-weak) undefined dynamic symbols
    defined: frozenset[str]
    version_needs: tuple[tuple[str, str], ...]  # (library file, version name): ("libc.so.6", "GLIBC_2.34")
    sections: frozenset[str]
    machine: str = "EM_X86_64"  # the header's e_machine, as pyelftools names it: EM_X86_64, EM_AARCH64

    @property
    def path(self) -> Path:
        return self.dynamic.path


def read_dynamic(path: Path) -> DynamicInfo:
    with path.open("rb") as f:
        return _dynamic_info(path, ELFFile(f))


_TAG_VALUE = {"DT_NEEDED": "needed", "DT_SONAME": "soname", "DT_RPATH": "rpath", "DT_RUNPATH": "runpath"}


def _dynamic_info(path: Path, elf: ELFFile) -> DynamicInfo:
    dynamic = elf.get_section_by_name(".dynamic")
    tags = list(dynamic.iter_tags()) if isinstance(dynamic, DynamicSection) else []
    # pyelftools names each tag's string after the tag: .needed, .soname, .rpath, .runpath
    values = [
        (str(t.entry.d_tag), str(getattr(t, _TAG_VALUE[t.entry.d_tag]))) for t in tags if t.entry.d_tag in _TAG_VALUE
    ]
    return DynamicInfo(
        path=path,
        soname=next((v for tag, v in values if tag == "DT_SONAME"), None),
        needed=tuple(v for tag, v in values if tag == "DT_NEEDED"),
        rpaths=tuple(p for tag, v in values if tag in ("DT_RPATH", "DT_RUNPATH") for p in v.split(":") if p),
    )


def summarize(path: Path) -> ElfSummary:
    with path.open("rb") as f:
        return summarize_stream(path, f)


def summarize_stream(path: Path, stream: IO[bytes]) -> ElfSummary:
    """``summarize`` of the ELF file in ``stream`` (a seekable one), known as ``path``."""
    elf = ELFFile(stream)
    undefined, defined = _dynamic_symbols(elf)
    return ElfSummary(
        dynamic=_dynamic_info(path, elf),
        undefined=frozenset(undefined),
        defined=frozenset(defined),
        version_needs=tuple(_version_needs(elf)),
        sections=frozenset(s.name for s in elf.iter_sections()),
        machine=str(elf["e_machine"]),
    )


def _dynamic_symbols(elf: ELFFile) -> tuple[set[str], set[str]]:
    undefined: set[str] = set()
    defined: set[str] = set()
    dynsym = elf.get_section_by_name(".dynsym")
    if not isinstance(dynsym, SymbolTableSection):
        return undefined, defined
    for sym in dynsym.iter_symbols():
        if not sym.name:
            continue
        if sym["st_shndx"] == "SHN_UNDEF":
            if sym["st_info"]["bind"] == "STB_GLOBAL":
                undefined.add(sym.name)
        elif sym["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE"):
            defined.add(sym.name)
    return undefined, defined


def _version_needs(elf: ELFFile) -> Iterator[tuple[str, str]]:
    for section in elf.iter_sections():
        if isinstance(section, GNUVerNeedSection):
            for verneed, auxes in section.iter_versions():
                for aux in auxes:
                    if verneed.name and aux.name:
                        yield verneed.name, aux.name


class Provider:
    """A library whose defined symbols are looked up by name, through its hash table."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._table: GNUHashSection | ELFHashSection | None = None
        self._all: frozenset[str] | None = None

    def defines(self, name: str) -> bool:
        self._open()
        if self._table is not None:
            sym = self._table.get_symbol(name)
            return sym is not None and sym["st_shndx"] != "SHN_UNDEF"
        if self._all is None:
            self._all = summarize(self.path).defined
        return name in self._all

    def _open(self) -> None:
        if self._file is not None:
            return
        self._file = self.path.open("rb")
        elf = ELFFile(self._file)
        table = elf.get_section_by_name(".gnu.hash") or elf.get_section_by_name(".hash")
        self._table = table if isinstance(table, GNUHashSection | ELFHashSection) else None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """Where every DT_NEEDED of a library (transitively) was found, and what was not."""

    found: tuple[Path, ...]  # breadth-first, the loader's search order
    missing: tuple[tuple[str, str], ...]  # (needed name, needed by)


class LibraryFinder:
    """Finds sonames the way the loader would: the object's RPATH/RUNPATH (with $ORIGIN),
    then the given search directories, then the system's (``ldconfig`` cache dirs).

    All paths are where this process reads them; ``translate`` maps an absolute RPATH of a
    library (a path of the machine it runs on, a container say) to such a path."""

    def __init__(
        self, search_dirs: Sequence[Path], system_dirs: Sequence[Path], translate: Callable[[Path], Path] = lambda p: p
    ) -> None:
        self.search_dirs = [d for d in search_dirs if d.is_dir()]
        self.system_dirs = [d for d in system_dirs if d.is_dir()]
        self.translate = translate

    def find(self, name: str, *, origin: Path, rpaths: Iterable[str]) -> Path | None:
        dirs = [
            Path(r.replace("$ORIGIN", str(origin)).replace("${ORIGIN}", str(origin)))
            if "ORIGIN" in r
            else self.translate(Path(r))
            for r in rpaths
        ]
        for directory in [*dirs, *self.search_dirs, *self.system_dirs]:
            candidate = self.follow(directory / name)
            if candidate is not None and candidate.is_file() and is_elf(candidate):
                return candidate
        return None

    def follow(self, path: Path) -> Path | None:
        """Follow symlinks the way the machine the library lives on would: an absolute target
        is a path of that machine, so it is translated (``Path.resolve`` would read it as
        one of this machine's)."""
        for _hop in range(40):
            if not path.is_symlink():
                return path if path.exists() else None
            target = path.readlink()
            path = self.translate(target) if target.is_absolute() else path.parent / target
        return None

    def resolve(self, roots: Sequence[DynamicInfo]) -> Resolution:
        found: list[Path] = []
        missing: list[tuple[str, str]] = []
        seen: set[str] = set()
        queue = [(name, root) for root in roots for name in root.needed]
        while queue:
            name, needer = queue.pop(0)
            if name in seen:
                continue
            seen.add(name)
            path = self.find(name, origin=needer.path.parent, rpaths=needer.rpaths)
            if path is None:
                missing.append((name, needer.path.name))
                continue
            try:
                info = read_dynamic(path)
            except ELFError:
                missing.append((name, needer.path.name))
                continue
            found.append(path)
            queue.extend((n, info) for n in info.needed)
        return Resolution(found=tuple(found), missing=tuple(missing))


_LDCONFIG_LINE = re.compile(r"=>\s*(\S+)$")


def system_lib_dirs(ldconfig_output: str) -> list[Path]:
    """Directories of the loader cache (``ldconfig -p``), in order, plus the defaults.

    >>> system_lib_dirs("\\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6")[0]
    PosixPath('/lib/x86_64-linux-gnu')
    """
    dirs: dict[Path, None] = {}
    for line in ldconfig_output.splitlines():
        match = _LDCONFIG_LINE.search(line.strip())
        if match:
            dirs[Path(match.group(1)).parent] = None
    for default in ("/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        dirs[Path(default)] = None
    return list(dirs)
