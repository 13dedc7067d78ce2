"""``containers/pins.toml``: the registry bases (by digest), the bootstrapped base and the
CPython sources the builder images are made from."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wheelmill.config import load_toml
from wheelmill.errors import ConfigError

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GLIBC = re.compile(r"^2\.[0-9]+$")


@dataclass(frozen=True, kw_only=True)
class RegistryBase:
    key: str
    image: str
    tag: str
    digest: str  # "" until pinned
    glibc: str = ""  # the base's glibc (2.28): the newest its wheels can need; "" where not given

    @property
    def pinned(self) -> bool:
        return bool(self.digest)

    @property
    def reference(self) -> str:
        """``image@sha256:...``: what FROM uses; the tag is for people."""
        return f"{self.image}@{self.digest}"


@dataclass(frozen=True, kw_only=True)
class PythonSource:
    """Where a builder image's CPython comes from: a tarball under the Debian mirror (the
    air-gapped way), or a URL for versions no Debian suite ships. Empty for a base image
    that brings its own CPythons (manylinux)."""

    version: str
    path: str = ""  # under the Debian mirror
    url: str = ""
    sha256: str = ""

    def location(self, mirror: str) -> str:
        return self.url or (f"{mirror}/{self.path}" if self.path else "")


@dataclass(frozen=True, kw_only=True)
class Pins:
    file: Path
    bases: Mapping[str, RegistryBase]
    suite: str
    suites: Mapping[str, str]  # variant name -> Debian suite, where not the default
    variant: str
    pythons: Mapping[str, PythonSource]
    runtime_packages: Mapping[str, tuple[str, ...]]  # Debian suite -> the runtime images' packages
    suite_glibc: Mapping[str, str]  # Debian suite -> its glibc (2.31)

    def suite_for(self, variant: str, platform_tag: str | None = None) -> str:
        """The Debian suite of a variant's bootstrapped base: its platform's entry
        (``cpu-aarch64``) where there is one, else the variant's, else the default."""
        named = f"{variant}-{platform_tag}" if platform_tag else variant
        return self.suites.get(named, self.suites.get(variant, self.suite))

    def glibc_of(self, suite: str) -> str:
        """The glibc of a Debian suite (``2.31``): what every wheel built on its base can need at most."""
        if suite not in self.suite_glibc:
            raise ConfigError(
                f"{self.file}: bootstrap.glibc: no glibc for Debian {suite}",
                fix=f'add {suite} = "<its glibc, e.g. 2.36>" under [bootstrap.glibc]',
            )
        return self.suite_glibc[suite]

    def python(self, version: str) -> PythonSource:
        if version not in self.pythons:
            raise ConfigError(
                f"{self.file}: pythons: no pinned CPython source for {version} (pinned: {', '.join(self.pythons)})",
                fix=f'add [pythons."{version}"] with its path and sha256, or build with --engine none',
            )
        return self.pythons[version]


def load_pins(file: Path) -> Pins:
    data = load_toml(file)
    try:
        bases = {key: _base(key, raw, file) for key, raw in data["bases"].items()}
        pythons = {version: _python(version, raw, file) for version, raw in data["pythons"].items()}
        bootstrap = data["bootstrap"]
        return Pins(
            file=file,
            bases=bases,
            suite=bootstrap["suite"],
            suites=dict(bootstrap.get("suites", {})),
            variant=bootstrap["variant"],
            pythons=pythons,
            runtime_packages={
                suite: tuple(map(str, names)) for suite, names in data.get("runtime", {}).get("packages", {}).items()
            },
            suite_glibc={
                suite: _glibc(f"bootstrap.glibc.{suite}", version, file)
                for suite, version in bootstrap.get("glibc", {}).items()
            },
        )
    except KeyError as exc:
        raise ConfigError(f"{file}: missing key {exc}", fix="see the keys at the top of containers/pins.toml") from None


def _base(key: str, raw: Mapping[str, Any], file: Path) -> RegistryBase:
    digest = str(raw.get("digest", ""))
    if digest and not _DIGEST.match(digest):
        raise ConfigError(
            f"{file}: bases.{key}.digest: {digest!r} is not sha256:<64 hex>",
            fix='run scripts/update_pins.py, or set it to ""',
        )
    glibc = _glibc(f"bases.{key}.glibc", raw["glibc"], file) if "glibc" in raw else ""
    return RegistryBase(key=key, image=str(raw["image"]), tag=str(raw["tag"]), digest=digest, glibc=glibc)


def _glibc(key: str, value: object, file: Path) -> str:
    """A glibc version as its suite or distribution ships it: ``2.31``."""
    if not _GLIBC.match(str(value)):
        raise ConfigError(f"{file}: {key}: {value!r} is not a glibc version", fix='write it as "2.31"')
    return str(value)


def _python(version: str, raw: Mapping[str, Any], file: Path) -> PythonSource:
    key = f'{file}: pythons."{version}"'
    if not _SHA256.match(str(raw["sha256"])):
        raise ConfigError(
            f"{key}.sha256: not 64 hex digits",
            fix="copy it from the suite's Sources index, or the release's published sha256",
        )
    path, url = str(raw.get("path", "")), str(raw.get("url", ""))
    if bool(path) == bool(url):
        raise ConfigError(
            f"{key}: give exactly one of path (under the Debian mirror) and url",
            fix="keep path for a Debian pool tarball, url otherwise",
        )
    if url and not url.startswith(("https://", "http://")):
        raise ConfigError(f"{key}.url: {url!r} is not an http(s) URL", fix="give the tarball's full URL")
    return PythonSource(version=version, path=path, url=url, sha256=str(raw["sha256"]))
