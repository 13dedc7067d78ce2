"""Package sources: where the level-2 envs get packages, and where torch comes from.

By default wheelmill uses the sources this machine's pip is configured with (index URL,
extra index URLs, find-links), so a team's pip.conf pointing at its mirror just works, and
hands them to uv, which does not read pip's configuration. ``WHEELMILL_INDEX_URL``,
``WHEELMILL_EXTRA_INDEX_URL`` and ``WHEELMILL_FIND_LINKS`` replace them.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache

from wheelmill.inputs.variants import Variant
from wheelmill.machine.process import capture
from wheelmill.settings import Settings

# pip reads these sections for `pip install`/`pip download`; later ones win.
_PIP_SECTIONS = ("global", "install", ":env:")


@dataclass(frozen=True, kw_only=True)
class PackageSources:
    index_url: str | None  # None: the installer's own default index
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    origin: str = "installer defaults"
    # How uv picks among indexes; "unsafe-first-match" where torch lives on a second index.
    index_strategy: str | None = None

    def uv_args(self) -> list[str]:
        args: list[str] = []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        if self.index_strategy:
            args += ["--index-strategy", self.index_strategy]
        return args

    def indexes(self) -> tuple[str, ...]:
        """Index URLs in uv's priority order: extra indexes first, the default last."""
        default = self.index_url or default_index_url()
        return (*self.extra_index_urls, *([default] if default else []))

    def describe(self) -> str:
        parts = [f"index {self.index_url or 'default'}"]
        parts += [f"extra {u}" for u in self.extra_index_urls]
        parts += [f"find-links {f}" for f in self.find_links]
        return f"{self.origin}: " + ", ".join(parts)

    @classmethod
    def from_uv_args(cls, args: list[str], origin: str) -> PackageSources:
        """The sources ``uv_args`` gave (as a report records them).

        >>> s = PackageSources.from_uv_args(["--extra-index-url", "file:///a", "--find-links", "/w"], "report")
        >>> s.uv_args(), s.origin
        (['--extra-index-url', 'file:///a', '--find-links', '/w'], 'report')
        """
        values: dict[str, list[str]] = {}
        for flag, value in zip(args[::2], args[1::2], strict=True):
            values.setdefault(flag, []).append(value)
        return cls(
            index_url=values.get("--index-url", [None])[0],
            extra_index_urls=tuple(values.get("--extra-index-url", [])),
            find_links=tuple(values.get("--find-links", [])),
            origin=origin,
            index_strategy=values.get("--index-strategy", [None])[0],
        )

    def first(self, url: str, origin: str) -> PackageSources:
        """These sources with the index at ``url`` before all others: a project it has is
        taken from it alone (uv's first-index strategy)."""
        return PackageSources(
            index_url=self.index_url,
            extra_index_urls=(url, *self.extra_index_urls),
            find_links=self.find_links,
            origin=f"{origin} + {self.origin}",
            index_strategy=self.index_strategy,
        )

    def best_match(self) -> PackageSources:
        """These sources with the best version across all indexes, as pip takes it, instead
        of uv's first index that has the project."""
        return replace(self, origin=f"{self.origin}, best match across indexes", index_strategy="unsafe-best-match")

    def with_torch_index(self, url: str) -> PackageSources:
        return PackageSources(
            index_url=self.index_url,
            extra_index_urls=(*self.extra_index_urls, url),
            find_links=self.find_links,
            origin=f"{self.origin} + torch index",
            index_strategy="unsafe-first-match",
        )


def machine_sources(settings: Settings) -> PackageSources:
    """The package sources of this machine: settings if given, else pip's configuration."""
    if settings.sources_overridden:
        return PackageSources(
            index_url=settings.index_url,
            extra_index_urls=settings.extra_index_urls or (),
            find_links=settings.find_links or (),
            origin="WHEELMILL_* settings",
        )
    return sources_from_pip_config(_pip_config_list())


@cache
def _pip_config_list() -> str:
    result = capture([sys.executable, "-m", "pip", "config", "list"], timeout=30)
    return result.stdout if result.returncode == 0 else ""


def sources_from_pip_config(listing: str) -> PackageSources:
    """Parse ``pip config list`` output.

    >>> s = sources_from_pip_config("global.extra-index-url='file:///a file:///b'\\n:env:.find-links='/w'")
    >>> s.extra_index_urls, s.find_links, s.index_url
    (('file:///a', 'file:///b'), ('/w',), None)
    """
    values: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        key, sep, raw = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not sep or not dot or section not in _PIP_SECTIONS:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
        values.setdefault(name, {})[section] = str(value)
    pick = _pick(values)
    if not any(pick.get(k) for k in ("index-url", "extra-index-url", "find-links")):
        return PackageSources(index_url=None, origin="installer defaults")
    return PackageSources(
        index_url=pick.get("index-url") or None,
        extra_index_urls=tuple(pick.get("extra-index-url", "").split()),
        find_links=tuple(pick.get("find-links", "").split()),
        origin="pip configuration",
    )


def _pick(values: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, by_section in values.items():
        for section in _PIP_SECTIONS:
            if section in by_section:
                out[name] = by_section[section]
    return out


@cache
def default_index_url() -> str | None:
    """The index pip uses when none is configured, asked of pip itself (never written here)."""
    probe = "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"
    result = capture([sys.executable, "-c", probe], timeout=30)
    url = result.stdout.strip()
    return url if result.returncode == 0 and url.startswith(("http://", "https://")) else None


def torch_index_url(variant: Variant, *, settings: Settings, template: str) -> str | None:
    """The variant's torch index: a setting (a mirror, or "" for none), the variant's own,
    or the matrix template with ``{label}`` filled in."""
    chosen = settings.torch_index if settings.torch_index is not None else (variant.torch_index or template)
    return chosen.replace("{label}", variant.label) if chosen else None
