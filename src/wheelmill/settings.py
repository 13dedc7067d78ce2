"""Site settings: what differs between machines, read from ``WHEELMILL_*`` variables, with the
command line layered over them.

The repo's data (matrix, recipes) says what to build; settings say where things come from
on this machine: package sources, the torch index mirror, the engine, the retry budget.
Every ``WHEELMILL_*`` variable is read here and nowhere else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from wheelmill.errors import ConfigError
from wheelmill.retry import RetryPolicy

N = TypeVar("N", int, float)
E = TypeVar("E", bound=StrEnum)
BASE_POLICIES = ("auto", "bootstrap", "registry")
ENGINE_CHOICES = ("auto", "podman", "docker", "none")


class EnvBackendName(StrEnum):
    """What makes a cell's envs: uv venvs, or conda envs with uv's packages on top."""

    UV = "uv"
    CONDA = "conda"


class CompilerCacheMode(StrEnum):
    ON = "on"  # every build compiles through sccache
    OFF = "off"


class InstallTests(StrEnum):
    BESIDE = "beside"  # a recipe's install test runs beside the next recipe's steps
    AFTER = "after"  # every step waits for the one before


@dataclass(frozen=True, kw_only=True)
class Settings:
    output: Path = Path("wheels")
    recipes: Path = Path("recipes")
    # None: the matrix's template. "": no torch index, only the package sources.
    torch_index: str | None = None
    # Package sources; when all are None wheelmill reads pip's configuration.
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] | None = None
    find_links: tuple[str, ...] | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    env_backend: EnvBackendName = EnvBackendName.UV
    conda_channels: tuple[str, ...] = ()  # () : the local conda channels under <index>/conda
    index_root: Path | None = None  # None: <output>/index
    # s3://bucket/prefix: the index is an object store's (wheelmill.index.objects), not a tree.
    index_bucket: str | None = None
    engine: str = "auto"  # where commands run: auto | podman | docker | none
    base_policy: str = "auto"  # auto | bootstrap | registry: the builder images' base
    debian_mirror: str | None = None  # None: the mirror apt is configured with
    # (upstream prefix, mirror prefix): git sources, and their submodules, fetched from a
    # mirror, the way git's url.<mirror>.insteadOf=<upstream> says.
    git_mirrors: tuple[tuple[str, str], ...] = ()
    # on: every build compiles through sccache (where its cache lives is sccache's own
    # SCCACHE_* configuration; local disk under the output root by default); off: without.
    compiler_cache: CompilerCacheMode = CompilerCacheMode.ON
    # beside: a recipe's install test runs beside the next recipe's steps; after: every step
    # waits for the one before (one command at a time: for timing one step alone, or where a
    # test's torch beside a build leaves it too little memory).
    install_tests: InstallTests = InstallTests.BESIDE
    publish_username: str | None = field(default=None, repr=False)
    publish_password: str | None = field(default=None, repr=False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        return cls(
            output=Path(env.get("WHEELMILL_OUTPUT", "wheels")),
            recipes=Path(env.get("WHEELMILL_RECIPES", "recipes")),
            torch_index=env.get("WHEELMILL_TORCH_INDEX"),
            index_url=env.get("WHEELMILL_INDEX_URL") or None,
            extra_index_urls=_words(env, "WHEELMILL_EXTRA_INDEX_URL"),
            find_links=_words(env, "WHEELMILL_FIND_LINKS"),
            retry=RetryPolicy(
                attempts=_number(env, "WHEELMILL_RETRIES", 5, int),
                base_delay=_number(env, "WHEELMILL_RETRY_DELAY", 1.0, float),
            ),
            env_backend=_enum(env, "WHEELMILL_ENV_BACKEND", EnvBackendName),
            conda_channels=tuple(env.get("WHEELMILL_CONDA_CHANNELS", "").split()),
            index_root=Path(root) if (root := env.get("WHEELMILL_INDEX_ROOT")) and not _is_bucket(root) else None,
            index_bucket=root if root and _is_bucket(root) else None,
            engine=_choice(env, "WHEELMILL_ENGINE", ENGINE_CHOICES),
            base_policy=_choice(env, "WHEELMILL_BASE", BASE_POLICIES),
            debian_mirror=env.get("WHEELMILL_DEBIAN_MIRROR") or None,
            git_mirrors=_prefix_pairs(env, "WHEELMILL_GIT_MIRRORS"),
            compiler_cache=_enum(env, "WHEELMILL_COMPILER_CACHE", CompilerCacheMode),
            install_tests=_enum(env, "WHEELMILL_INSTALL_TESTS", InstallTests),
            publish_username=env.get("WHEELMILL_PUBLISH_USERNAME") or None,
            publish_password=env.get("WHEELMILL_PUBLISH_PASSWORD") or None,
        )

    def layered(
        self, *, output: Path | None = None, recipes: Path | None = None, engine: str | None = None
    ) -> Settings:
        """These settings with what a command line gave (None: it gave nothing)."""
        return replace(
            self, output=output or self.output, recipes=recipes or self.recipes, engine=engine or self.engine
        )

    @property
    def index(self) -> Path:
        """The local index's storage root: a tree. Where the index is an object store, a
        command that works on a tree only says so (exit 3)."""
        if self.index_bucket is not None:
            raise ConfigError(
                f"WHEELMILL_INDEX_ROOT is an object store ({self.index_bucket}), and this command works on an "
                "index tree only",
                fix="run it with WHEELMILL_INDEX_ROOT set to a directory (or unset: <output>/index); publish, "
                "yank, `index verify|render|list` and `release publish|promote|prune|record-gpu|show` work on both",
            )
        return self.index_root or self.output / "index"

    @property
    def sources_overridden(self) -> bool:
        return any(x is not None for x in (self.index_url, self.extra_index_urls, self.find_links))

    @property
    def root(self) -> Path:
        """The repository: the directory that holds the recipes directory."""
        return self.recipes.resolve().parent


def _is_bucket(root: str) -> bool:
    return root.startswith("s3://")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = env.get(name, choices[0])
    if value not in choices:
        raise ConfigError(
            f"environment: {name}={value!r} is not one of {', '.join(choices)}",
            fix=f"set {name} to one of them or unset it",
        )
    return value


def _enum(env: Mapping[str, str], name: str, kind: type[E]) -> E:
    """A closed set's member, its first the default."""
    return kind(_choice(env, name, tuple(member.value for member in kind)))


def _words(env: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    value = env.get(name)
    return None if value is None else tuple(value.split())


def _prefix_pairs(env: Mapping[str, str], name: str) -> tuple[tuple[str, str], ...]:
    """``UPSTREAM=MIRROR`` words: ``https://github.com/=file:///srv/git/``."""
    pairs = []
    for word in (env.get(name) or "").split():
        upstream, sep, mirror = word.partition("=")
        if not sep or not upstream or not mirror:
            raise ConfigError(
                f"environment: {name}: {word!r} is not UPSTREAM=MIRROR",
                fix=f"write {name}='https://github.com/=file:///srv/git/' (space-separated pairs)",
            )
        pairs.append((upstream, mirror))
    return tuple(pairs)


def _number(env: Mapping[str, str], name: str, default: N, kind: type[N]) -> N:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(
            f"environment: {name}={raw!r} is not a number", fix=f"set {name} to a number or unset it"
        ) from None
    if value < (1 if kind is int else 0):
        raise ConfigError(f"environment: {name}={raw!r} is out of range", fix=f"set {name} to a positive number")
    return value
