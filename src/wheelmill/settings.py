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


class SharedWrites(StrEnum):
    """Whether a build writes to what the fleet shares (the compiler cache's remote tiers, the
    builder images' registry): a pull request's build, which may come from a fork, reads them
    and writes nothing."""

    AUTO = "auto"  # read-only on a pull request's build (GITHUB_EVENT_NAME), read-write elsewhere
    READ_WRITE = "read-write"
    READ_ONLY = "read-only"
    # One of the two: a fleet whose images only an image job pushes (its builds hold no push
    # credential) still fills the compiler cache from every build, and the reverse.
    COMPILER_CACHE = "compiler-cache"
    IMAGES = "images"

    @property
    def compiler_cache(self) -> bool:
        """The build writes to the compiler cache's shared tiers.

        >>> SharedWrites.COMPILER_CACHE.compiler_cache, SharedWrites.IMAGES.compiler_cache
        (True, False)
        """
        return self in (SharedWrites.READ_WRITE, SharedWrites.COMPILER_CACHE)

    @property
    def images(self) -> bool:
        """The build pushes the builder images and bases it makes to the registry.

        >>> SharedWrites.IMAGES.images, SharedWrites.COMPILER_CACHE.images, SharedWrites.READ_WRITE.images
        (True, False, True)
        """
        return self in (SharedWrites.READ_WRITE, SharedWrites.IMAGES)


# GitHub's events whose builds run code the repository has not reviewed.
PULL_REQUEST_EVENTS = frozenset({"pull_request", "pull_request_target"})
CACHE_TIERS = ("disk", "redis", "s3")


@dataclass(frozen=True, kw_only=True)
class CacheTiers:
    """The compiler cache's tiers, fastest first: local disk under the output root, then the
    fleet's shared ones (a Redis server, an S3 bucket), as sccache's multi-level chain."""

    chain: tuple[str, ...] = ("disk",)
    redis: str | None = None  # redis://host:port[/db]
    s3: str | None = None  # s3://bucket[/prefix]; endpoint and credentials: the AWS SDK's variables

    @property
    def shared(self) -> tuple[str, ...]:
        return tuple(tier for tier in self.chain if tier != "disk")


class Signatures(StrEnum):
    """Whether what is published must carry signed provenance."""

    OPTIONAL = "optional"  # signed where a signing key is set; a file without provenance still verifies
    REQUIRED = "required"  # a build or promotion without a signing key is refused; so is a file without provenance


class InstallTests(StrEnum):
    BESIDE = "beside"  # a recipe's install test runs beside the next recipe's steps
    AFTER = "after"  # every step waits for the one before
    NONE = "none"  # no install test: wheels delivered to dist/ untested, and never published (a build refuses to)


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
    # Where the index is, as WHEELMILL_INDEX_ROOT says it: a directory, or s3://bucket/prefix
    # (an object store's); None: <output>/index. wheelmill.index.roots reads it, and no one else.
    index_root: str | None = None
    engine: str = "auto"  # where commands run: auto | podman | docker | none
    base_policy: str = "auto"  # auto | bootstrap | registry: the builder images' base
    debian_mirror: str | None = None  # None: the mirror apt is configured with
    # (upstream prefix, mirror prefix): git sources, and their submodules, fetched from a
    # mirror, the way git's url.<mirror>.insteadOf=<upstream> says.
    git_mirrors: tuple[tuple[str, str], ...] = ()
    # on: every build compiles through sccache (where its cache lives is sccache's own
    # SCCACHE_* configuration; local disk under the output root by default); off: without.
    compiler_cache: CompilerCacheMode = CompilerCacheMode.ON
    cache_tiers: CacheTiers = field(default_factory=CacheTiers)
    # Whether this build writes to the shared tiers and the registry (resolved: auto is gone).
    shared_writes: SharedWrites = SharedWrites.READ_WRITE
    # The CI run this is (its URL), where one is: the builder a signed provenance names.
    ci_run: str | None = None
    # The index the team serves (its root URL, channels beneath): the build-keys step looks up
    # each recipe's key there, and a hit is fetched from it rather than built.
    served_index: str | None = None
    # The root of torch's upstream index, whose torch/ page `matrix upstream` reads (PEP 691
    # JSON or PEP 503 HTML); None: the matrix's torch index template without its {label}.
    upstream_index: str | None = None
    # The served index's access logs (files, directories, s3:// prefixes) `coverage` counts wants from
    access_logs: tuple[str, ...] = ()
    # host[:port]/namespace: builder images are pulled from there before they are built, and
    # pushed there after (read-write only).
    image_registry: str | None = None
    # beside: a recipe's install test runs beside the next recipe's steps; after: every step
    # waits for the one before (one command at a time: for timing one step alone, or where a
    # test's torch beside a build leaves it too little memory).
    install_tests: InstallTests = InstallTests.BESIDE
    publish_username: str | None = field(default=None, repr=False)
    publish_password: str | None = field(default=None, repr=False)
    # The private key (PEM text, as CI hands a secret) or a file holding it, at most one of
    # the two: what builds and promotions sign provenance with (wheelmill.provenance.signing).
    signing_key: str | None = field(default=None, repr=False)
    signing_key_file: Path | None = None
    # Public key files or folders of them: the keys provenance is verified with. (): the
    # signing key's own public half, where one is set.
    trusted_keys: tuple[Path, ...] = ()
    # The GPU runners' public keys: the GPU stage results a release records and promotion
    # counts are verified with these alone (wheelmill.releases.gpu_attestation). (): none.
    gpu_trusted_keys: tuple[Path, ...] = ()
    signatures: Signatures = Signatures.OPTIONAL
    # Where envs' compiled bytecode is kept (wheelmill.building.bytecode): None, under the
    # output root; a directory shared by every output root of a machine saves each new root
    # compiling torch's modules again.
    bytecode_store: Path | None = None

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
            index_root=env.get("WHEELMILL_INDEX_ROOT") or None,
            engine=_choice(env, "WHEELMILL_ENGINE", ENGINE_CHOICES),
            base_policy=_choice(env, "WHEELMILL_BASE", BASE_POLICIES),
            debian_mirror=env.get("WHEELMILL_DEBIAN_MIRROR") or None,
            git_mirrors=_prefix_pairs(env, "WHEELMILL_GIT_MIRRORS"),
            compiler_cache=_enum(env, "WHEELMILL_COMPILER_CACHE", CompilerCacheMode),
            cache_tiers=_cache_tiers(env),
            shared_writes=_shared_writes(env),
            ci_run=_ci_run(env),
            served_index=(env.get("WHEELMILL_SERVED_INDEX") or "").rstrip("/") or None,
            upstream_index=(env.get("WHEELMILL_UPSTREAM_INDEX") or "").rstrip("/") or None,
            access_logs=_words(env, "WHEELMILL_ACCESS_LOGS") or (),
            image_registry=(env.get("WHEELMILL_IMAGE_REGISTRY") or "").rstrip("/") or None,
            install_tests=_enum(env, "WHEELMILL_INSTALL_TESTS", InstallTests),
            publish_username=env.get("WHEELMILL_PUBLISH_USERNAME") or None,
            publish_password=env.get("WHEELMILL_PUBLISH_PASSWORD") or None,
            signing_key=_signing_key(env),
            signing_key_file=Path(file) if (file := env.get("WHEELMILL_SIGNING_KEY_FILE")) else None,
            trusted_keys=_paths(env, "WHEELMILL_TRUSTED_KEYS"),
            gpu_trusted_keys=_paths(env, "WHEELMILL_GPU_TRUSTED_KEYS"),
            signatures=_enum(env, "WHEELMILL_SIGNATURES", Signatures),
            bytecode_store=Path(store) if (store := env.get("WHEELMILL_BYTECODE_STORE")) else None,
        )

    def layered(
        self, *, output: Path | None = None, recipes: Path | None = None, engine: str | None = None
    ) -> Settings:
        """These settings with what a command line gave (None: it gave nothing)."""
        return replace(
            self, output=output or self.output, recipes=recipes or self.recipes, engine=engine or self.engine
        )

    @property
    def sources_overridden(self) -> bool:
        return any(x is not None for x in (self.index_url, self.extra_index_urls, self.find_links))

    @property
    def root(self) -> Path:
        """The repository: the directory that holds the recipes directory."""
        return self.recipes.resolve().parent


def _cache_tiers(env: Mapping[str, str]) -> CacheTiers:
    """``WHEELMILL_COMPILER_CACHE_TIERS=disk,redis,s3`` with each shared tier's location."""
    name = "WHEELMILL_COMPILER_CACHE_TIERS"
    chain = tuple(t.strip() for t in env.get(name, "disk").split(",") if t.strip())
    unknown = [t for t in chain if t not in CACHE_TIERS]
    if unknown or not chain or len(set(chain)) != len(chain) or list(chain) != sorted(chain, key=CACHE_TIERS.index):
        raise ConfigError(
            f"environment: {name}={env.get(name)!r} is not tiers of {', '.join(CACHE_TIERS)}, each once, fastest first",
            fix=f"set {name} to e.g. disk,redis,s3 or disk,s3 (or unset it: disk)",
        )
    tiers = CacheTiers(
        chain=chain,
        redis=env.get("WHEELMILL_COMPILER_CACHE_REDIS") or None,
        s3=(env.get("WHEELMILL_COMPILER_CACHE_S3") or "").rstrip("/") or None,
    )
    for tier, where, schemes in (("redis", tiers.redis, ("redis://", "rediss://")), ("s3", tiers.s3, ("s3://",))):
        variable = f"WHEELMILL_COMPILER_CACHE_{tier.upper()}"
        if tier in chain and not where:
            raise ConfigError(
                f"environment: {name} names {tier} and {variable} is unset", fix=f"set {variable} to {schemes[0]}..."
            )
        if where and not where.startswith(schemes):
            raise ConfigError(
                f"environment: {variable}={where!r} is not a {' or '.join(schemes)} URL",
                fix=f"set it to {schemes[0]}...",
            )
    return tiers


def _ci_run(env: Mapping[str, str]) -> str | None:
    """The CI run this is, by its URL (GitHub Actions' variables), for provenance's builder id."""
    parts = [env.get(name) for name in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")]
    if not all(parts):
        return None
    server, repository, run = parts
    return f"{server}/{repository}/actions/runs/{run}/attempts/{env.get('GITHUB_RUN_ATTEMPT', '1')}"


def _shared_writes(env: Mapping[str, str]) -> SharedWrites:
    """``WHEELMILL_SHARED_WRITES``, auto resolved: read-only for a pull request's build."""
    chosen = _enum(env, "WHEELMILL_SHARED_WRITES", SharedWrites)
    if chosen is not SharedWrites.AUTO:
        return chosen
    pull_request = env.get("GITHUB_EVENT_NAME", "") in PULL_REQUEST_EVENTS
    return SharedWrites.READ_ONLY if pull_request else SharedWrites.READ_WRITE


def _paths(env: Mapping[str, str], name: str) -> tuple[Path, ...]:
    return tuple(Path(p) for p in env.get(name, "").split(os.pathsep) if p)


def _signing_key(env: Mapping[str, str]) -> str | None:
    """``WHEELMILL_SIGNING_KEY``, where ``WHEELMILL_SIGNING_KEY_FILE`` does not say it too."""
    text = env.get("WHEELMILL_SIGNING_KEY") or None
    if text is not None and env.get("WHEELMILL_SIGNING_KEY_FILE"):
        raise ConfigError(
            "environment: both WHEELMILL_SIGNING_KEY and WHEELMILL_SIGNING_KEY_FILE are set",
            fix="set one: the key's PEM text (a CI secret) or the path of its file",
        )
    return text


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
