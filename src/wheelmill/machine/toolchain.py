"""Finding what a cell needs where its commands run (this machine or its container): its
Python, a C++ compiler, and the variant's CUDA or ROCm toolkit at exactly the right
major.minor, from the toolkit's usual homes or from pip's nvidia wheels in the locked env.

Each finder returns what it found or, when nothing fits, every place it looked and what
was there, so the pre-check can say what is missing and how to supply it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from wheelmill.inputs.variants import Family, Variant
from wheelmill.machine.envs import site_packages
from wheelmill.machine.process import Runner
from wheelmill.machine.tools import uv_bin

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


def _which(runner: Runner, name: str) -> Path | None:
    result = runner.capture(
        ["sh", "-c", f'command -v "{name}"'], env={"PATH": runner.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
    )
    found = result.stdout.strip()
    return Path(found) if result.returncode == 0 and found.startswith("/") else None


def find_python(version: str, runner: Runner) -> Found | NotFound:
    """CPython ``version`` (3.11): the builder images' /opt/python, pyenv's versions, PATH,
    then uv's own discovery."""
    looked: list[str] = []
    for candidate in _python_candidates(version, runner):
        reported = _python_version(candidate, runner)
        looked.append(f"{candidate}: {reported or 'does not run'}")
        if reported == version:
            return Found(path=candidate, version=version)
    result = runner.capture([uv_bin(), "python", "find", "--no-python-downloads", version], timeout=30)
    path = Path(result.stdout.strip()) if result.returncode == 0 and result.stdout.strip() else None
    if path and _python_version(path, runner) == version:
        return Found(path=path, version=version)
    looked.append(f"uv python find {version}: none")
    return NotFound(looked=tuple(looked))


def _python_candidates(version: str, runner: Runner) -> list[Path]:
    tag = version.replace(".", "")
    fixed = [
        Path(f"/opt/python/{version}/bin/python{version}"),
        Path(f"/opt/python/cp{tag}-cp{tag}/bin/python{version}"),
    ]
    pyenv_root = Path(runner.environ.get("PYENV_ROOT", f"{runner.environ.get('HOME', '/root')}/.pyenv"))
    pyenv = sorted(runner.host_path(pyenv_root / "versions").glob(f"{version}.*/bin/python{version}"), reverse=True)
    candidates = [p for p in fixed if runner.host_path(p).is_file()]
    candidates += [pyenv_root / "versions" / p.parent.parent.name / "bin" / p.name for p in pyenv]
    on_path = _which(runner, f"python{version}")
    if on_path and "shims" not in on_path.parts:  # pyenv shims answer for one version only
        candidates.append(on_path)
    return list(dict.fromkeys(candidates))


def _python_version(path: Path, runner: Runner) -> str | None:
    result = runner.capture([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout=30)
    return result.stdout.strip() if result.returncode == 0 else None


def find_compiler(runner: Runner) -> Found | NotFound:
    """The C++ compiler a build will use: $CXX, else c++/g++/clang++ on PATH."""
    names = [runner.environ["CXX"]] if runner.environ.get("CXX") else ["c++", "g++", "clang++"]
    looked = []
    for name in names:
        path = _which(runner, name)
        if path is None:
            looked.append(f"{name}: not on PATH")
            continue
        result = runner.capture([path, "--version"], timeout=30)
        match = _GCC_VERSION.search(result.stdout.splitlines()[0] if result.stdout else "")
        if result.returncode == 0 and match:
            return Found(path=path, version=match.group(1))
        looked.append(f"{path}: does not run")
    return NotFound(looked=tuple(looked))


def find_toolkit(variant: Variant, runner: Runner) -> Toolkit | NotFound | None:
    """The variant's toolkit at its major.minor in its usual homes; None for a CPU variant."""
    match variant.family:
        case Family.CPU:
            return None
        case Family.CUDA:
            return _find(variant, runner, _cuda_roots(variant, runner), "nvcc", _NVCC_RELEASE)
        case Family.ROCM:
            return _find(variant, runner, _rocm_roots(variant, runner), "hipcc", _HIP_VERSION)


def find_env_toolkit(variant: Variant, env_root: Path, runner: Runner) -> Toolkit | NotFound:
    """The toolkit pip's nvidia wheels put in an env (``site-packages/nvidia/cu13``)."""
    found = [nvcc for p in site_packages(runner.host_path(env_root)) for nvcc in sorted(p.glob("nvidia/cu*/bin/nvcc"))]
    roots = [env_root / p.relative_to(runner.host_path(env_root)).parent.parent for p in found]
    return _find(
        variant, runner, roots or [env_root / "lib/python3.X/site-packages/nvidia/cuXX"], "nvcc", _NVCC_RELEASE
    )


def _cuda_roots(variant: Variant, runner: Runner) -> list[Path]:
    short = variant.toolkit_short
    roots = [runner.environ[k] for k in ("CUDA_HOME", "CUDA_PATH") if runner.environ.get(k)]
    roots += [f"/usr/local/cuda-{short}", "/usr/local/cuda", "/opt/cuda"]
    return [Path(r) for r in dict.fromkeys(roots)]


def _rocm_roots(variant: Variant, runner: Runner) -> list[Path]:
    roots = [runner.environ[k] for k in ("ROCM_PATH", "ROCM_HOME") if runner.environ.get(k)]
    roots += [f"/opt/rocm-{variant.toolkit}", "/opt/rocm"]
    return [Path(r) for r in dict.fromkeys(roots)]


def _find(
    variant: Variant, runner: Runner, roots: Iterable[Path], compiler: str, pattern: re.Pattern[str]
) -> Toolkit | NotFound:
    looked = []
    for root in roots:
        exe = root / "bin" / compiler
        if not runner.host_path(exe).is_file():
            looked.append(f"{root}: no bin/{compiler}")
            continue
        result = runner.capture([exe, "--version"], timeout=60)
        match = pattern.search(result.stdout + result.stderr)
        if not match:
            looked.append(f"{exe}: version unreadable")
            continue
        if match.group(1) == variant.toolkit_short:
            real = _realpath(root, runner)
            return Toolkit(family=variant.family, root=real, version=match.group(1), compiler=real / "bin" / compiler)
        looked.append(f"{root}: {variant.family.value.upper()} {match.group(1)}")
    return NotFound(looked=tuple(looked))


def _realpath(path: Path, runner: Runner) -> Path:
    """``/usr/local/cuda`` -> ``/usr/local/cuda-13.0``, resolved where the runner runs."""
    result = runner.capture(["readlink", "-f", path], timeout=30)
    real = result.stdout.strip()
    return Path(real) if result.returncode == 0 and real.startswith("/") else path
