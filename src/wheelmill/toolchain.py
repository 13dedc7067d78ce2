"""Finding what a cell needs on this machine: its Python, a C++ compiler, and the
variant's CUDA or ROCm toolkit at exactly the right major.minor.

Each finder returns what it found or, when nothing fits, every place it looked and what
was there, so the pre-check can say what is missing and how to supply it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wheelmill.matrix import Family, Variant
from wheelmill.runner import capture
from wheelmill.tools import uv_bin

_NVCC_RELEASE = re.compile(r"release (\d+\.\d+)")
_HIP_VERSION = re.compile(r"HIP version:\s*(\d+\.\d+)")
_GCC_VERSION = re.compile(r"(\d+\.\d+\.\d+)")


@dataclass(frozen=True, kw_only=True)
class Found:
    path: Path
    version: str


@dataclass(frozen=True, kw_only=True)
class Toolkit:
    family: Family
    root: Path
    version: str  # major.minor, as the compiler reports it
    compiler: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    def environment(self) -> dict[str, str]:
        match self.family:
            case Family.CUDA:
                return {"CUDA_HOME": str(self.root), "CUDA_PATH": str(self.root)}
            case Family.ROCM:
                return {"ROCM_PATH": str(self.root), "ROCM_HOME": str(self.root)}
            case Family.CPU:
                return {}


@dataclass(frozen=True, kw_only=True)
class NotFound:
    """What was looked at, and what was there (``/usr/local/cuda: CUDA 13.0``)."""

    looked: tuple[str, ...]


def find_python(version: str, environ: Mapping[str, str] | None = None) -> Found | NotFound:
    """CPython ``version`` (3.11): pyenv's versions, then PATH, then uv's own discovery."""
    env = os.environ if environ is None else environ
    looked: list[str] = []
    for candidate in _python_candidates(version, env):
        reported = _python_version(candidate)
        looked.append(f"{candidate}: {reported or 'does not run'}")
        if reported == version:
            return Found(path=candidate, version=version)
    result = capture([uv_bin(), "python", "find", "--no-python-downloads", version], timeout=30)
    if result.returncode == 0 and result.stdout.strip():
        path = Path(result.stdout.strip())
        if _python_version(path) == version:
            return Found(path=path, version=version)
    looked.append(f"uv python find {version}: none")
    return NotFound(looked=tuple(looked))


def _python_candidates(version: str, env: Mapping[str, str]) -> list[Path]:
    pyenv_root = Path(env.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = sorted((pyenv_root / "versions").glob(f"{version}.*/bin/python{version}"), reverse=True)
    on_path = shutil.which(f"python{version}", path=env.get("PATH"))
    if on_path and "shims" not in Path(on_path).parts:  # pyenv shims answer for one version only
        candidates.append(Path(on_path))
    return candidates


def _python_version(path: Path) -> str | None:
    result = capture([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout=30)
    return result.stdout.strip() if result.returncode == 0 else None


def find_compiler(environ: Mapping[str, str] | None = None) -> Found | NotFound:
    """The C++ compiler a build will use: $CXX, else c++/g++/clang++ on the system PATH."""
    env = os.environ if environ is None else environ
    names = [env["CXX"]] if env.get("CXX") else ["c++", "g++", "clang++"]
    looked = []
    for name in names:
        path = shutil.which(name, path=os.pathsep.join(("/usr/bin", "/bin", env.get("PATH", ""))))
        if not path:
            looked.append(f"{name}: not on PATH")
            continue
        result = capture([path, "--version"], timeout=30)
        match = _GCC_VERSION.search(result.stdout.splitlines()[0] if result.stdout else "")
        if result.returncode == 0 and match:
            return Found(path=Path(path), version=match.group(1))
        looked.append(f"{path}: does not run")
    return NotFound(looked=tuple(looked))


def find_toolkit(variant: Variant, environ: Mapping[str, str] | None = None) -> Toolkit | NotFound | None:
    """The variant's toolkit at its major.minor; None for a CPU variant."""
    env = os.environ if environ is None else environ
    match variant.family:
        case Family.CPU:
            return None
        case Family.CUDA:
            return _find(variant, _cuda_roots(variant, env), "nvcc", _NVCC_RELEASE)
        case Family.ROCM:
            return _find(variant, _rocm_roots(variant, env), "hipcc", _HIP_VERSION)


def _cuda_roots(variant: Variant, env: Mapping[str, str]) -> list[Path]:
    short = variant.toolkit_short
    roots = [env[k] for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)]
    roots += [f"/usr/local/cuda-{short}", "/usr/local/cuda", "/opt/cuda"]
    return [Path(r) for r in dict.fromkeys(roots)]


def _rocm_roots(variant: Variant, env: Mapping[str, str]) -> list[Path]:
    roots = [env[k] for k in ("ROCM_PATH", "ROCM_HOME") if env.get(k)]
    roots += [f"/opt/rocm-{variant.toolkit}", "/opt/rocm"]
    return [Path(r) for r in dict.fromkeys(roots)]


def _find(variant: Variant, roots: list[Path], compiler: str, pattern: re.Pattern[str]) -> Toolkit | NotFound:
    looked = []
    for root in roots:
        exe = root / "bin" / compiler
        if not exe.is_file():
            looked.append(f"{root}: no bin/{compiler}")
            continue
        result = capture([exe, "--version"], timeout=60)
        match = pattern.search(result.stdout + result.stderr)
        if not match:
            looked.append(f"{exe}: version unreadable")
            continue
        if match.group(1) == variant.toolkit_short:
            return Toolkit(family=variant.family, root=root.resolve(), version=match.group(1), compiler=exe)
        looked.append(f"{root}: {variant.family.value.upper()} {match.group(1)}")
    return NotFound(looked=tuple(looked))
