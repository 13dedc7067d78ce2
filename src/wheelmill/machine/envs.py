"""Level-2 environments: a Python env with the cell's interpreter and the variant's torch,
created from a lock with hashes.

Backends are subclasses of ``EnvBackend`` looked up by name (``BACKENDS``), like nox's
virtualenv/uv/conda backends; ``uv`` is the default. Every command goes through the
step's ``Runner``, so the same backend works on the host and inside a container.
"""

from __future__ import annotations

import os
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from packaging.utils import canonicalize_name

from wheelmill.errors import ConfigError
from wheelmill.machine.package_sources import PackageSources
from wheelmill.machine.process import HostRunner, Runner, StepLog, base_environment, wheelmill_command
from wheelmill.machine.tools import uv_bin

_PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")


@dataclass(frozen=True, kw_only=True)
class Target:
    """What a lock is resolved for: a Python version and a platform, not a machine, so the
    same lock serves this machine and a builder image."""

    python: str  # 3.11
    platform: str  # x86_64-manylinux_2_28 (uv's --python-platform)


@dataclass(frozen=True, kw_only=True)
class Env:
    root: Path
    conda: bool = False  # a conda env (conda-meta/), not a venv

    def activation(self, stable: Callable[[Path], Path] = lambda path: path) -> dict[str, str]:
        """What activating a conda env sets beyond PATH (build scripts look for CONDA_PREFIX)."""
        return (
            {"CONDA_PREFIX": str(stable(self.root)), "CONDA_DEFAULT_ENV": str(stable(self.root))} if self.conda else {}
        )

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def site_packages(self) -> list[Path]:
        return site_packages(self.root)

    @property
    def site(self) -> Path:
        """The env's site-packages under a name without the Python's version (a link that
        ``link_site`` makes): builds import torch from there, so its headers, the nvidia-*
        wheels' toolkit and every path a compiler sees are the same for every Python."""
        return self.root / "site"


def link_site(env: Env) -> Path | None:
    """``<env>/site``, a relative link to the env's site-packages (made once); none for an
    env without one."""
    found = env.site_packages
    if not found:
        return None
    if not env.site.is_symlink():
        env.site.symlink_to(found[0].relative_to(env.root))
    return env.site


def venv_home(env_root: Path) -> Path | None:
    """Where a venv's Python comes from, as its pyvenv.cfg names it: the directory of the
    interpreter (``home = /opt/python/3.11/bin``); none for an env without one (conda)."""
    try:
        lines = (env_root / "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    homes = [line.split("=", 1)[1].strip() for line in lines if _is_home(line)]
    return Path(homes[0]) if homes else None


def set_venv_home(env_root: Path, home: Path) -> None:
    """Point a venv's ``home`` at another name of its interpreter's directory."""
    config = env_root / "pyvenv.cfg"
    lines = config.read_text(encoding="utf-8").splitlines()
    config.write_text(
        "".join(f"home = {home}\n" if _is_home(line) else f"{line}\n" for line in lines), encoding="utf-8"
    )


def _is_home(line: str) -> bool:
    return line.split("=", 1)[0].strip() == "home"


def site_packages(env_root: Path) -> list[Path]:
    """An env's site-packages (one, in a venv), found rather than named: its path holds the
    Python version (``lib/python3.11/site-packages``), which the env's root does not say."""
    return sorted(env_root.glob("lib/python3*/site-packages"))


def pinned_versions(lock_text: str) -> dict[str, str]:
    """``name -> version`` of every pinned line of a requirements lock.

    >>> pinned_versions("torch==2.14.1 \\\\\\n    --hash=sha256:ab\\nnumpy==2.1.0\\n")
    {'torch': '2.14.1', 'numpy': '2.1.0'}
    """
    out: dict[str, str] = {}
    for line in lock_text.splitlines():
        match = _PINNED.match(line.strip())
        if match:
            out[canonicalize_name(match.group(1))] = match.group(3)
    return out


def locked_hashes(lock_text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``name -> (version, sha256 digests)`` of every pinned line of a hashed requirements lock.

    >>> locked_hashes("torch==2.14.1+cu130 \\\\\\n    --hash=sha256:ab \\\\\\n    --hash=sha256:cd\\nnumpy==2.1.0\\n")
    {'torch': ('2.14.1+cu130', ('ab', 'cd')), 'numpy': ('2.1.0', ())}
    """
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    current: str | None = None
    for line in lock_text.splitlines():
        stripped = line.strip()
        match = _PINNED.match(stripped)
        if match:
            current = canonicalize_name(match.group(1))
            found[current] = (match.group(3), ())
        elif current is not None and stripped.startswith("--hash=sha256:"):
            version, digests = found[current]
            found[current] = (version, (*digests, stripped.removeprefix("--hash=sha256:").rstrip(" \\")))
        elif not line.startswith((" ", "\t")):
            current = None
    return found


class EnvBackend(ABC):
    name: ClassVar[str]

    def __init__(
        self, runner: Runner, *, cache_dir: Path | None = None, offline: bool = False, channels: Sequence[str] = ()
    ) -> None:
        self.runner = runner
        self.cache_dir = cache_dir  # None: the tool's default cache
        self.offline = offline  # where there is no network: local files and the cache only
        self.channels = tuple(channels)  # the conda backend's channels (URLs)

    @abstractmethod
    def lock(
        self,
        requirements: Path,
        lock: Path,
        *,
        target: Target,
        sources: PackageSources,
        log: StepLog,
        hashes: bool = True,
        deps: bool = True,
        fail_fast: bool = False,
        interpreter: Path | None = None,
    ) -> dict[str, str]:
        """Resolve ``requirements`` for ``target`` into ``lock``; return the pinned versions.
        ``fail_fast`` gives up on an unreachable index at once (for pre-checks)."""

    @abstractmethod
    def lock_wheels(
        self,
        requirements: Path,
        lock: Path,
        *,
        target: Target,
        sources: PackageSources,
        log: StepLog,
        interpreter: Path | None = None,
    ) -> None:
        """Resolve ``requirements`` for ``target`` to wheels only, one per package, into
        ``lock``, a PEP 751 lock (``pylock.<name>.toml``) with each wheel's URL and sha256."""

    @abstractmethod
    def create(self, root: Path, *, python: Path, log: StepLog, lock: Path | None = None) -> Env:
        """A new env at ``root`` (replacing whatever was there): empty, or holding exactly
        the packages of the backend's own ``lock`` where it has one (conda's)."""

    @abstractmethod
    def sync(self, env: Env, lock: Path, *, sources: PackageSources, log: StepLog) -> None:
        """Make ``env`` hold exactly the locked packages, hashes verified."""

    @abstractmethod
    def install(
        self,
        env: Env,
        args: Sequence[str],
        *,
        sources: PackageSources,
        log: StepLog,
        constraints: Path | None = None,
        deps: bool = True,
    ) -> None:
        """Add packages (requirements or wheel paths) to ``env``."""


def uv_environment(*, cache_dir: Path | None = None, retries: int = 3) -> dict[str, str]:
    """The environment every uv command runs with: uv reads no config file and no UV_*
    variable of the caller (sources are explicit), downloads no Python, shows no progress."""
    env = base_environment([], {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1", "UV_HTTP_RETRIES": str(retries)})
    if cache_dir is not None:
        env["UV_CACHE_DIR"] = str(cache_dir)
    elif "UV_CACHE_DIR" in os.environ:
        # Where the cache lives changes no result, so the caller's choice of it is kept.
        env["UV_CACHE_DIR"] = os.environ["UV_CACHE_DIR"]
    return env


class UvBackend(EnvBackend):
    """uv venvs, resolved with ``uv pip compile`` and made with ``uv pip sync``."""

    name = "uv"

    def _env(self, *, fail_fast: bool = False) -> dict[str, str]:
        return uv_environment(cache_dir=self.cache_dir, retries=1 if fail_fast else 3)

    def _uv(self, *args: str | Path) -> list[str]:
        return [uv_bin(), *[str(a) for a in args], "--no-config", *(["--offline"] if self.offline else [])]

    def lock(
        self,
        requirements: Path,
        lock: Path,
        *,
        target: Target,
        sources: PackageSources,
        log: StepLog,
        hashes: bool = True,
        deps: bool = True,
        fail_fast: bool = False,
        interpreter: Path | None = None,
    ) -> dict[str, str]:
        platform = ["--python-version", target.python, "--python-platform", target.platform]
        platform += ["--python", str(interpreter)] if interpreter else []  # uv wants some interpreter to run
        # --upgrade: uv takes an existing output file's pins as preferences, and one from an
        # earlier build of the cell (hashes of another index's files) can make the same inputs
        # unsolvable; a lock resolved now depends on its inputs alone.
        argv = self._uv(
            "pip", "compile", requirements, "-o", lock, "--upgrade", *platform, "--no-header", "--quiet",
            *sources.uv_args(),
        )  # fmt: skip
        argv += ["--generate-hashes"] if hashes else []
        argv += [] if deps else ["--no-deps"]
        self.runner.run(argv, env=self._env(fail_fast=fail_fast), log=log)
        return pinned_versions(lock.read_text(encoding="utf-8"))

    def lock_wheels(
        self,
        requirements: Path,
        lock: Path,
        *,
        target: Target,
        sources: PackageSources,
        log: StepLog,
        interpreter: Path | None = None,
    ) -> None:
        platform = ["--python-version", target.python, "--python-platform", target.platform]
        platform += ["--python", str(interpreter)] if interpreter else []
        argv = self._uv(
            "pip",
            "compile",
            requirements,
            "-o",
            lock,
            "--upgrade",  # as in lock: no preferences from an earlier run's file
            "--format",
            "pylock.toml",
            "--only-binary",
            ":all:",
            *platform,
            "--quiet",
        )
        self.runner.run([*argv, *sources.uv_args()], env=self._env(), log=log)

    def create(self, root: Path, *, python: Path, log: StepLog, lock: Path | None = None) -> Env:  # noqa: ARG002 - a venv has no lock of its own
        if root.exists():
            shutil.rmtree(root)
        self.runner.run(self._uv("venv", "--python", python, "--quiet", root), env=self._env(), log=log)
        return Env(root=root)

    def sync(self, env: Env, lock: Path, *, sources: PackageSources, log: StepLog) -> None:
        argv = self._uv("pip", "sync", "--python", env.python, "--require-hashes", *sources.uv_args(), lock)
        self.runner.run(argv, env=self._env(), log=log)

    def install(
        self,
        env: Env,
        args: Sequence[str],
        *,
        sources: PackageSources,
        log: StepLog,
        constraints: Path | None = None,
        deps: bool = True,
    ) -> None:
        argv = self._uv("pip", "install", "--python", env.python, *sources.uv_args())
        argv += ["--constraint", str(constraints)] if constraints else []
        argv += [] if deps else ["--no-deps"]
        self.runner.run([*argv, *args], env=self._env(), log=log)


class CondaBackend(UvBackend):
    """A conda env from the cell's conda lock (its CPython, the build tools), made by
    py-rattler from the configured channels; the cell's uv lock installed into its Python
    by uv. Without a conda lock (the install test's env) it makes a venv, as uv does."""

    name = "conda"

    def create(self, root: Path, *, python: Path, log: StepLog, lock: Path | None = None) -> Env:
        if lock is None:
            return super().create(root, python=python, log=log)
        if root.exists():
            shutil.rmtree(root)
        # Made on this machine, by wheelmill in a process of its own (py-rattler's threads may
        # outlive the call, see publish), where a container sees it at the same path (the
        # output is mounted there); its Python runs wherever it is, for uv and the builds.
        host = self.runner.host_path(root)
        channels = [arg for url in self.channels for arg in ("--channel", url)]
        argv = wheelmill_command(
            "conda",
            "create",
            host,
            "--lock",
            self.runner.host_path(lock),
            *channels,
            "--pkgs-dir",
            host.parent / "conda-pkgs",
        )
        HostRunner().run(argv, env=base_environment([]), log=log)
        return Env(root=root, conda=True)

    def sync(self, env: Env, lock: Path, *, sources: PackageSources, log: StepLog) -> None:
        if not env.conda:
            super().sync(env, lock, sources=sources, log=log)
            return
        # Not `uv pip sync`: it would remove what conda installed. The conda env's own
        # packages (ninja, cmake) are left out of the uv lock's; the rest are installed as
        # locked, with their hashes, and nothing else (the lock is complete: no resolving).
        rest = lock.with_name(lock.stem + ".conda-rest.txt")
        rest.write_text(
            without(lock.read_text(encoding="utf-8"), conda_names(self.runner.host_path(env.root))), encoding="utf-8"
        )
        argv = self._uv(
            "pip", "install", "--python", env.python, "--require-hashes", "--no-deps", *sources.uv_args(), "-r", rest
        )
        self.runner.run(argv, env=self._env(), log=log)


def package_name(path: Path) -> str:
    """The package a conda file names: ``name-version-build.conda``, or its record in an
    env's ``conda-meta/`` (``name-version-build.json``); neither version nor build has a dash.

    >>> package_name(Path("linux-64/example-cpp-ops-0.1.0-cpu_py311_0.conda"))
    'example-cpp-ops'
    """
    return path.name.rsplit("-", 2)[0]


def conda_names(prefix: Path) -> set[str]:
    """The (normalized) names of the packages in a conda env, from its conda-meta records."""
    return {canonicalize_name(package_name(p)) for p in (prefix / "conda-meta").glob("*.json")}


def without(lock_text: str, names: set[str]) -> str:
    """A requirements lock without the entries (a pin and its hash lines) of ``names``.

    >>> print(without("ninja==1.13.0 \\\\\\n    --hash=sha256:aa\\ntorch==2.13.0\\n", {"ninja"}), end="")
    torch==2.13.0
    """
    out, keep = [], True
    for line in lock_text.splitlines(keepends=True):
        if line.strip() and not line[0].isspace():
            match = _PINNED.match(line.strip())
            keep = not (match and canonicalize_name(match.group(1)) in names)
        if keep:
            out.append(line)
    return "".join(out)


BACKENDS: Mapping[str, type[EnvBackend]] = {UvBackend.name: UvBackend, CondaBackend.name: CondaBackend}


def backend(
    name: str, runner: Runner, *, cache_dir: Path | None = None, offline: bool = False, channels: Sequence[str] = ()
) -> EnvBackend:
    try:
        return BACKENDS[name](runner, cache_dir=cache_dir, offline=offline, channels=channels)
    except KeyError:
        raise ConfigError(
            f"environment: WHEELMILL_ENV_BACKEND={name!r} is not a backend", fix=f"use one of: {', '.join(BACKENDS)}"
        ) from None


def constraints_from_lock(lock: Path, out: Path) -> Path:
    """The lock's pins without hashes: a constraints file for installing a subset of it."""
    pins = pinned_versions(lock.read_text(encoding="utf-8"))
    out.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())), encoding="utf-8")
    return out
