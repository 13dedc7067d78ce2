"""Undefined and required symbols.

An undefined symbol is a defect when nothing at run time provides it: not the wheel's own
libraries, not what they link (torch, the CUDA runtime, libstdc++, libc, found the way the
loader finds them), and not the Python interpreter. Templated code that silently dropped an
instantiation shows up here, at build time, instead of as an ImportError on a user's GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wheelmill.checks import CheckResult
from wheelmill.wheel.elf import ElfSummary, LibraryFinder, Provider, read_dynamic

SHOW = 5


@dataclass(frozen=True, kw_only=True)
class SymbolReport:
    unresolved: dict[str, tuple[str, ...]]  # wheel-relative ELF path -> symbols nothing provides
    missing_libs: tuple[tuple[str, str], ...]  # (soname, needed by)


def unresolved_symbols(
    elves: Sequence[ElfSummary],
    *,
    root: Path,
    finder: LibraryFinder,
    interpreter: Sequence[Path],
) -> SymbolReport:
    """Resolve every strong undefined symbol of the wheel's ELF files."""
    resolution = finder.resolve([e.dynamic for e in elves])
    providers = [Provider(p) for p in (*resolution.found, *interpreter)]
    own = frozenset().union(*(e.defined for e in elves))
    unresolved: dict[str, tuple[str, ...]] = {}
    try:
        for elf in elves:
            missing = sorted(
                name for name in elf.undefined if name not in own and not any(p.defines(name) for p in providers)
            )
            if missing:
                unresolved[str(elf.path.relative_to(root))] = tuple(missing)
    finally:
        for provider in providers:
            provider.close()
    return SymbolReport(unresolved=unresolved, missing_libs=resolution.missing)


def interpreter_libraries(python: Path, finder: LibraryFinder) -> list[Path]:
    """The interpreter and what it links (libpython, for a shared build): the Python C API
    an extension module calls is defined there, not in anything the module links."""
    executable = finder.follow(python) or python  # /opt/python/X.Y may link to the suite's python
    return [executable, *finder.resolve([read_dynamic(executable)]).found]


def judge_undefined(report: SymbolReport) -> CheckResult:
    name = "undefined-symbols"
    problems: list[str] = []
    for soname, needer in report.missing_libs:
        problems.append(f"{needer} needs {soname}, which is found nowhere")
    for elf, symbols in report.unresolved.items():
        shown = ", ".join(symbols[:SHOW]) + (f" and {len(symbols) - SHOW} more" if len(symbols) > SHOW else "")
        problems.append(f"{elf}: {len(symbols)} unresolved ({shown})")
    if problems:
        return CheckResult.failed(
            name,
            "; ".join(problems),
            "link the library that defines them, or add the missing source/instantiation (c++filt names them)",
        )
    return CheckResult.passed(name, "every undefined symbol resolves in the wheel, torch, the runtime or the system")


def judge_required(elves: Sequence[ElfSummary], required: Sequence[str]) -> CheckResult:
    name = "required-symbols"
    if not required:
        return CheckResult.skipped(name, "the recipe requires no symbols")
    exported = frozenset().union(*(e.defined for e in elves))
    missing = [s for s in required if s not in exported]
    if missing:
        return CheckResult.failed(
            name,
            f"not exported by any library in the wheel: {', '.join(missing)}",
            "make sure the code defining them is compiled and not hidden",
        )
    return CheckResult.passed(name, f"all {len(required)} exported")
