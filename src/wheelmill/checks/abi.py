"""The ABI check, after repair: what each library's symbols say (``wheelmill.wheel.abi``)
against what the wheel's tag and its recipe promise.

- A wheel tagged ``abi3`` promises every Python from its tag's on: each library must use
  CPython's limited API alone, and nothing added after that Python.
- A recipe with ``abi = "stable"`` promises every torch from its minimum on: no library may
  use libtorch's C++ API (``c10::``, ``at::``, ``torch::``), only the stable C shims.

Either broken promise fails the check (so nothing is published), naming the library and its
first offending symbols. Kept, the check says what the libraries are, for the report.

And the CUDA major a library links (``libcudart.so.13``) must be the one of the torch it
meets: PyPI's torch moved from CUDA 12 runtimes (2.10) to CUDA 13 ones (2.11), and a library
linked against one major does not load beside the other's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from wheelmill.checks import CheckResult
from wheelmill.inputs.recipes import AbiPromise
from wheelmill.wheel.abi import LibraryAbi, PythonUse, TorchUse, WheelAbi
from wheelmill.wheel.elf import ElfSummary

NAME = "abi"
CUDA_RUNTIME = "cuda-runtime"
ABI_GROUP = "abi-group"
_SHOWN = 3  # offending symbols named in a failure
# The CUDA libraries whose SONAME carries the toolkit's major (cuFFT, cuSPARSE and others
# carry versions of their own).
_CUDA_MAJOR = re.compile(r"^lib(?:cudart|cublas|cublasLt|nvrtc|nvJitLink)\.so\.(\d+)$")


def judge_abi(abi: WheelAbi, tags: frozenset[Tag], promise: AbiPromise | None, *, recipe_file: str) -> CheckResult:
    for lib in abi.libraries:
        problem = _python_problem(lib, tags) or _torch_problem(lib, promise, recipe_file)
        if problem is not None:
            what, fix = problem
            return CheckResult.failed(NAME, f"{lib.name}: {what}", fix)
    return CheckResult.passed(NAME, abi.describe())


def _python_problem(lib: LibraryAbi, tags: frozenset[Tag]) -> tuple[str, str] | None:
    oldest = _abi3_python(tags)
    if oldest is None or lib.python is PythonUse.NONE:
        return None
    fix = f"build with the limited API of Python {oldest} (Py_LIMITED_API, py_limited_api), or drop the abi3 tag"
    if lib.python is PythonUse.FULL:
        return f"tagged abi3 but uses {_first(lib.outside_limited)}, outside CPython's limited API", fix
    if lib.python_minimum and Version(lib.python_minimum) > Version(oldest):
        return f"tagged abi3 for Python {oldest} but needs the limited API of Python {lib.python_minimum}", fix
    return None


def _torch_problem(lib: LibraryAbi, promise: AbiPromise | None, recipe_file: str) -> tuple[str, str] | None:
    if promise is not AbiPromise.STABLE or lib.torch is not TorchUse.UNSTABLE:
        return None
    fix = (
        "call torch only through torch/csrc/stable (set TORCH_TARGET_VERSION to the oldest torch it runs on), "
        f'or remove abi = "stable" from {recipe_file}'
    )
    return f'declared abi = "stable" but uses libtorch\'s C++ API: {_first(lib.unstable)}', fix


def _abi3_python(tags: frozenset[Tag]) -> str | None:
    """The oldest Python an abi3 tag claims (``cp39-abi3`` -> ``3.9``), or None without one."""
    versions = [tag.interpreter.removeprefix("cp") for tag in tags if tag.abi == "abi3"]
    if not versions:
        return None
    oldest = min(versions, key=lambda v: (int(v[0]), int(v[1:])))
    return f"{oldest[0]}.{oldest[1:]}"


def _first(symbols: tuple[str, ...]) -> str:
    """The first few symbols, each without its parameter list (a C++ name's can fill a line)."""
    shown = ", ".join(symbol.partition("(")[0] for symbol in symbols[:_SHOWN])
    more = len(symbols) - _SHOWN
    return shown + (f" (and {more} more)" if more > 0 else "")


def judge_cuda_runtime(libraries: Sequence[ElfSummary], root: Path, torch_cuda: str | None) -> CheckResult:
    """Each library's CUDA major, from the runtimes it links, against ``torch_cuda`` (the
    torch the wheel is for, ``13.0``; None for a torch without CUDA); ``root`` is where the
    wheel's libraries were unpacked."""
    linked = [
        (lib.path.relative_to(root), needed, int(match.group(1)))
        for lib in libraries
        for needed in lib.dynamic.needed
        if (match := _CUDA_MAJOR.match(needed))
    ]
    if not linked:
        return CheckResult.skipped(CUDA_RUNTIME, "links no CUDA runtime")
    if torch_cuda is None:
        return CheckResult.skipped(CUDA_RUNTIME, "a torch without CUDA: nothing to match")
    major = int(torch_cuda.split(".")[0])
    for name, needed, linked_major in linked:
        if linked_major != major:
            return CheckResult.failed(
                CUDA_RUNTIME,
                f"{name} links {needed} (CUDA {linked_major}) but its torch ships CUDA {major} runtimes",
                f"build it with a CUDA {major} toolkit, the major of the torch it is for",
            )
    return CheckResult.passed(CUDA_RUNTIME, f"CUDA {major}, as its torch's ({torch_cuda})")


def judge_abi_group(
    tags: frozenset[Tag], requires: Sequence[str], abi: WheelAbi, *, python: str, torch: str
) -> CheckResult:
    """A wheel built once for every torch and Python, in one cell of its range: tagged for
    every Python (``abi3``, or no Python at all), from one no newer than the cell's; its
    libraries calling no stable shim newer than the cell's torch (``abi.torch_minimum``, the
    release that added the newest one they call); and requiring a torch the cell's satisfies.
    Its floor must be known: from its libraries' shims, else its ``Requires-Dist: torch``; and
    where its libraries say it, its ``Requires-Dist`` must admit no older torch, or installers
    would pair it with one it cannot load on. A wheel that fails this is never published here."""
    every = [tag for tag in tags if tag.abi in ("abi3", "none")]
    fix = 'build it with the limited API (py_limited_api, an abi3 tag), or remove abi = "stable" from its recipe'
    if not every:
        shown = ", ".join(sorted(f"{t.interpreter}-{t.abi}" for t in tags))
        return CheckResult.failed(ABI_GROUP, f"built once for every Python, but tagged {shown}", fix)
    oldest = _abi3_python(tags)
    if oldest is not None and Version(oldest) > Version(python):
        return CheckResult.failed(
            ABI_GROUP,
            f"tagged abi3 from Python {oldest}: no wheel for this cell's Python {python}",
            "leave this cell out",
        )
    wanted = next((r for r in map(Requirement, requires) if canonicalize_name(r.name) == "torch"), None)
    problem = _torch_floor_problem(abi, wanted, torch)
    if problem is not None:
        return CheckResult.failed(ABI_GROUP, *problem)
    needs = f"Python >= {oldest}" if oldest else "any Python"
    return CheckResult.passed(ABI_GROUP, f"{needs}, {_torch_floor(abi, wanted)}: fits Python {python}, torch {torch}")


def _torch_floor_problem(abi: WheelAbi, wanted: Requirement | None, torch: str) -> tuple[str, str] | None:
    """Why the wheel does not run on the cell's ``torch``, and the fix; None where it does."""
    floor = abi.torch_minimum
    if abi.torch is TorchUse.UNSTABLE:
        what = "its libraries use libtorch's C++ API: built for one torch, it runs on no other"
        fix = 'call torch only through torch/csrc/stable, or remove abi = "stable" from its recipe'
    elif floor is not None and Version(floor) > Version(torch):
        what = f"its libraries call a stable shim of torch {floor}, which this cell's torch {torch} lacks"
        fix = (
            f"build it against the oldest torch it runs on, no newer than {torch}, with its code kept to that "
            "torch's shims (TORCH_TARGET_VERSION), or leave this cell out"
        )
    elif wanted is not None and not wanted.specifier.contains(torch, prereleases=True):
        what = f"requires {wanted}, which this cell's torch {torch} does not satisfy"
        fix = "require no newer torch than the oldest it runs on (Requires-Dist: torch>=...), or leave this cell out"
    elif floor is not None and (wanted is None or (_lower_bound(wanted) or Version("0")) < Version(floor)):
        said = "names no torch" if wanted is None else f"admits older ones ({wanted})"
        what = (
            f"its libraries need torch {floor} or newer, but its Requires-Dist {said}: an installer would put it "
            "beside a torch it cannot load on"
        )
        fix = f"require torch>={floor} (Requires-Dist), the oldest torch its libraries run on"
    elif floor is None and (wanted is None or _lower_bound(wanted) is None):
        said = "names no torch" if wanted is None else f"{wanted} has no lower bound"
        what = f"says no oldest torch it runs on: its libraries call no stable shim and its Requires-Dist {said}"
        fix = (
            'require the oldest torch it runs on (Requires-Dist: torch>=...), or remove abi = "stable" from its recipe'
        )
    else:
        return None
    return what, fix


def _torch_floor(abi: WheelAbi, wanted: Requirement | None) -> str:
    """What the wheel says of the oldest torch it runs on: ``stable shims of torch >= 2.10.0,
    requires torch>=2.10``."""
    said = [f"stable shims of torch >= {abi.torch_minimum}"] if abi.torch_minimum else []
    said += [f"requires {wanted}"] if wanted is not None else []
    return ", ".join(said)


def _lower_bound(requirement: Requirement) -> Version | None:
    """The oldest release ``requirement`` admits, where one of its clauses bounds it from below."""
    bounds = []
    for clause in requirement.specifier:
        if clause.operator in (">=", ">", "==", "~=", "==="):
            try:
                bounds.append(Version(clause.version.removesuffix(".*")))
            except InvalidVersion:  # an arbitrary string (===): no release to bound by
                continue
    return max(bounds, default=None)


def describe(promise: AbiPromise | None) -> str:
    """The check as the plan prints it."""
    torch = '; torch stable ABI alone (abi = "stable")' if promise is AbiPromise.STABLE else ""
    return f"ABI of each library recorded (abi3 wheels: the limited API of their Python){torch}"
