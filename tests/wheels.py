"""Tiny real wheel files for tests: a valid zip with METADATA, WHEEL and RECORD."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    requires: Sequence[str] = (),
    files: Mapping[str, bytes] | None = None,
    tag: str = "cp311-cp311-linux_x86_64",
    requires_python: str | None = None,
    stored: bool = False,
    gpu_archs: bytes | None = None,
) -> Path:
    """A valid wheel; ``stored`` skips compression (fast for big incompressible payloads);
    ``gpu_archs``: the bytes of its .dist-info/gpu-archs.json, as wheelmill's stamp writes it."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    headers = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    headers += [f"Requires-Python: {requires_python}"] if requires_python else []
    metadata = "\n".join([*headers, *(f"Requires-Dist: {r}" for r in requires)])
    entries: dict[str, bytes] = dict(files or {})
    entries[f"{dist}/METADATA"] = (metadata + "\n\nA test package.\n").encode()
    entries[f"{dist}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
    if gpu_archs is not None:
        entries[f"{dist}/gpu-archs.json"] = gpu_archs
    record = [f"{path},sha256={_b64(data)},{len(data)}" for path, data in entries.items()]
    entries[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED) as zf:
        for entry, data in entries.items():
            zf.writestr(entry, data)
    return path


def install(
    site: Path, name: str, version: str, *, requires: Sequence[str] = (), gpu_archs: bytes | None = None
) -> None:
    """A wheel of ``name`` installed into ``site`` the way pip does it: its files unpacked."""
    wheel = make_wheel(
        site.parent / "wheels", name, version, requires=requires, gpu_archs=gpu_archs, tag="py3-none-any"
    )
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
