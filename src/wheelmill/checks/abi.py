"""The ABI check, after repair: what each library's symbols say (``wheelmill.wheel.abi``)
against what the wheel's tag and its recipe promise.

- A wheel tagged ``abi3`` promises every Python from its tag's on: each library must use
  CPython's limited API alone, and nothing added after that Python.
- A recipe with ``abi = "stable"`` promises every torch from its minimum on: no library may
  use libtorch's C++ API (``c10::``, ``at::``, ``torch::``), only the stable C shims.

Either broken promise fails the check (so nothing is published), naming the library and its
first offending symbols. Kept, the check says what the libraries are, for the report.
"""

from __future__ import annotations

from packaging.tags import Tag

from wheelmill.checks import CheckResult
from wheelmill.inputs.recipes import AbiPromise
from wheelmill.wheel.abi import LibraryAbi, PythonUse, TorchUse, WheelAbi

NAME = "abi"
_SHOWN = 3  # offending symbols named in a failure


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
    if lib.python_minimum and _release(lib.python_minimum) > _release(oldest):
        return f"tagged abi3 for Python {oldest} but needs the limited API of Python {lib.python_minimum}", fix
    return None


def _torch_problem(lib: LibraryAbi, promise: AbiPromise | None, recipe_file: str) -> tuple[str, str] | None:
    if promise is not AbiPromise.STABLE or lib.torch is not TorchUse.UNSTABLE:
        return None
    fix = (
        "call torch only through torch/csrc/stable (set TORCH_TARGET_VERSION to the oldest torch it serves), "
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


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def describe(promise: AbiPromise | None) -> str:
    """The check as the plan prints it."""
    torch = '; torch stable ABI alone (abi = "stable")' if promise is AbiPromise.STABLE else ""
    return f"ABI of each library recorded (abi3 wheels: the limited API of their Python){torch}"
