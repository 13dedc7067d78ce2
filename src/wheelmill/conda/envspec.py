"""The conda env of a cell (``WHEELMILL_ENV_BACKEND=conda``): what it takes from the conda
channels, and its committed lock.

The specs are ``recipes/conda/envs.toml``: every cell's (its CPython and the build tools the
channels carry), then its variant's. The rest of the build env (torch, pip's build
requirements) is the cell's uv lock, installed into the conda env's Python.

The lock, ``locks/conda/<cell>.txt``, is solved by py-rattler and names each package by
subdir, file name and sha256, not by URL: a local channel's URL is a path of the machine
that solved it, and the same packages are found again in whatever channels are configured
(a package whose bytes differ from the lock's is an error). Like the uv lock, its first line
holds a hash of its inputs, and a lock made for other inputs stops the cell in its
pre-checks.

Pure: no py-rattler here (``conda.solve`` does the solving).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from wheelmill.config import load_toml
from wheelmill.errors import ConfigError, did_you_mean
from wheelmill.inputs.variants import Cell
from wheelmill.planning.locks import recorded_digest

SPEC_FILE = "conda/envs.toml"
KEYS = ("schema", "specs", "variants")  # the spec file's top-level keys
SCHEMA = 1
_LINE = re.compile(r"^(linux-64|noarch)/(\S+)-([^-\s]+)-([^-\s]+)\.conda sha256:([0-9a-f]{64})$")


@dataclass(frozen=True, kw_only=True)
class CondaEnvInputs:
    cell: str  # whose lock: a slim cell's parent cell
    specs: tuple[str, ...]

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps({"platform": "linux-64", "specs": list(self.specs)}).encode()).hexdigest()

    def header(self) -> str:
        return (
            f"# wheelmill conda lock of {self.cell}; inputs sha256:{self.digest}\n"
            f"# made by `wheelmill conda lock --cell {self.cell}`; do not edit\n"
        )


@dataclass(frozen=True, kw_only=True)
class LockedPackage:
    subdir: str
    name: str
    version: str
    build: str
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}.conda"

    @property
    def spec(self) -> str:
        """A match spec that only this package meets (in a channel, name-version-build is unique)."""
        return f"{self.name} =={self.version} {self.build}"

    def line(self) -> str:
        return f"{self.subdir}/{self.filename} sha256:{self.sha256}"


def inputs(recipes_dir: Path, cell: Cell, *, known: Collection[str]) -> CondaEnvInputs:
    """The specs of ``cell``'s conda env, ``{python}`` and ``{nodot}`` filled in; ``known``:
    the matrix's variant names, which every name under ``[variants]`` must be."""
    path = recipes_dir / SPEC_FILE
    data = load_toml(path)
    _known_keys(data, path)
    every = _strings(data.get("specs"), path, "specs")
    variants = _variants(data, path, known)
    own = _strings(variants.get(cell.variant.name, []), path, f"variants.{cell.variant.name}")
    nodot = cell.python.replace(".", "")
    specs = [spec.replace("{python}", cell.python).replace("{nodot}", nodot) for spec in (*every, *own)]
    return CondaEnvInputs(cell=cell.lock_id, specs=tuple(dict.fromkeys(specs)))


def check_spec_file(recipes_dir: Path, known: Collection[str]) -> None:
    """The spec file, where the recipes have one, read as a cell's env would read it."""
    path = recipes_dir / SPEC_FILE
    if path.is_file():
        data = load_toml(path)
        _known_keys(data, path)
        _strings(data.get("specs"), path, "specs")
        for name, specs in _variants(data, path, known).items():
            _strings(specs, path, f"variants.{name}")


def _variants(data: dict[str, object], path: Path, known: Collection[str]) -> dict[str, object]:
    """``[variants]``, each of its names one of the matrix's variants: a typo (``cuda13O``)
    would otherwise leave its specs out of the env without a word."""
    variants = data.get("variants", {})
    if not isinstance(variants, dict):
        raise ConfigError(
            f"{path}: variants: not a table", fix="write [variants] with one list of specs per variant name"
        )
    unknown = sorted(set(variants) - set(known))
    if unknown:
        name = unknown[0]
        raise ConfigError(
            f"{path}: variants.{name}: the matrix has no variant {name}{did_you_mean(name, known)}",
            fix="name a variant of recipes/matrix.toml, or remove the entry",
        )
    return variants


def _known_keys(data: dict[str, object], path: Path) -> None:
    """Refuse a key the file does not define (a typo: ``spec``, ``variant``) and a schema
    this wheelmill does not read, before any channel is looked at: a misspelt key would
    otherwise be ignored, and its specs left out of the env without a word."""
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"{path}: (top level): unknown key '{unknown[0]}'{did_you_mean(unknown[0], KEYS)}",
            fix=f"remove it or use one of: {', '.join(KEYS)}",
        )
    if data.get("schema", SCHEMA) != SCHEMA:
        raise ConfigError(
            f"{path}: schema: {data['schema']!r} is not a schema this wheelmill reads",
            fix=f"write schema = {SCHEMA}, or upgrade wheelmill",
        )


def _strings(value: object, path: Path, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise ConfigError(
            f"{path}: {key}: not a list of match specs", fix=f'write {key} = ["python {{python}}.*", ...]'
        )
    return value


def lock_path(locks_dir: Path, cell: str) -> Path:
    return locks_dir / "conda" / f"{cell}.txt"


def lock_text(lock_inputs: CondaEnvInputs, packages: list[LockedPackage]) -> str:
    return lock_inputs.header() + "".join(p.line() + "\n" for p in sorted(packages, key=lambda p: p.name))


def read_lock(path: Path) -> list[LockedPackage]:
    """The packages of a conda lock (its header is read by ``locks.recorded_digest``).

    >>> scratch = __import__("tempfile").TemporaryDirectory()
    >>> p = Path(scratch.name) / "l.txt"
    >>> header = "# wheelmill conda lock of cpu-py311; inputs sha256:" + "0" * 64
    >>> _ = p.write_text(header + "\\nlinux-64/python-3.11.7-0_cpython.conda sha256:" + "a" * 64 + "\\n")
    >>> [python.spec for python in read_lock(p)]
    ['python ==3.11.7 0_cpython']
    >>> scratch.cleanup()
    """
    packages = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _LINE.match(line.strip())
        if match is None:
            raise ConfigError(
                f"{path}:{number}: not a locked package: {line.strip()[:80]!r}",
                fix="remake it: wheelmill conda lock --cell <cell>",
            )
        subdir, name, version, build, sha256 = match.groups()
        packages.append(LockedPackage(subdir=subdir, name=name, version=version, build=build, sha256=sha256))
    return packages


def mismatch(lock_inputs: CondaEnvInputs, committed: Path) -> str | None:
    """Why the committed conda lock does not fit ``lock_inputs``, or None when it does."""
    recorded = recorded_digest(committed)
    if recorded == lock_inputs.digest:
        return None
    return f"{committed} was made for other specs (recorded {str(recorded)[:12]}..., now {lock_inputs.digest[:12]}...)"
