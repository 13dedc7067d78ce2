"""The compiler cache's tiers as the settings choose them, and the files its server reads.

Local disk under the output root is the runner's own; the shared tiers (a Redis server, an
S3 bucket) are the fleet's, behind it in sccache's multi-level chain (``disk,redis,s3``:
looked up in that order, a hit copied to the faster tiers, a compile written to all). Each
shared tier keeps the keys of one toolkit under a folder of their own (``cuda130/``), so a
toolkit's entries can be expired apart. A build that may not write to them (a pull
request's, ``WHEELMILL_SHARED_WRITES``) reads them and writes nothing there.

Credentials and configuration the server reads from files (``AWS_WEB_IDENTITY_TOKEN_FILE``,
``SCCACHE_GCS_KEY_PATH``, ...) name files of this machine: where the server runs in the
cell's online container, each is mounted read-only at the same path.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from wheelmill.settings import CacheTiers, SharedWrites

DISK = "disk"
# sccache's file variables that end in neither _FILE nor _PATH.
NAMED_FILES = frozenset({"SCCACHE_CONF"})


@dataclass(frozen=True, kw_only=True)
class Tiers:
    """The cache's tiers for one cell, fastest first, and how the build may use the shared ones."""

    chain: tuple[str, ...] = (DISK,)
    redis: str | None = None  # redis://[user:password@]host:port[/db]
    s3: str | None = None  # s3://bucket[/prefix]
    toolkit: str = ""  # the folder of this cell's keys in each shared tier: its variant as declared (cuda130)
    read_only: bool = False  # the shared tiers are read, never written (the local disk stays the runner's)

    @classmethod
    def chosen(cls, tiers: CacheTiers, writes: SharedWrites, *, toolkit: str) -> Tiers:
        """The settings' tiers for a cell of ``toolkit``.

        >>> t = Tiers.chosen(CacheTiers(chain=("disk", "s3"), s3="s3://b/p"), SharedWrites.READ_ONLY, toolkit="cpu")
        >>> t.describe(), t.key_prefix("p")
        ('disk, s3 (read-only)', 'p/cpu/')
        """
        return cls(
            chain=tiers.chain,
            redis=tiers.redis,
            s3=tiers.s3,
            toolkit=toolkit,
            read_only=not writes.compiler_cache,
        )

    @property
    def shared(self) -> tuple[str, ...]:
        return tuple(tier for tier in self.chain if tier != DISK)

    def local(self) -> Tiers:
        """Local disk alone: where the shared tiers cannot be used."""
        return replace(self, chain=(DISK,))

    def describe(self) -> str:
        return ", ".join(f"{tier} (read-only)" if self.read_only and tier != DISK else tier for tier in self.chain)

    def key_prefix(self, prefix: str = "") -> str:
        """Where this toolkit's keys go in a shared tier: ``<prefix>/<toolkit>/``."""
        return "/".join(part for part in (prefix.strip("/"), self.toolkit) if part) + "/"

    def environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """sccache's variables for the chain; none for local disk alone, where the caller's
        own ``SCCACHE_*`` variables say where the cache lives, as without a tiers setting.
        Any shared tier makes it a multi-level chain (one of a single tier too): sccache then
        builds exactly these tiers, whatever other cache the caller's variables name, and
        counts hits by tier."""
        if not self.shared:
            return {}
        variables = {"SCCACHE_MULTILEVEL_CHAIN": ",".join(self.chain)}
        mode = "READ_ONLY" if self.read_only else "READ_WRITE"
        if "redis" in self.chain and self.redis:
            variables.update(redis_variables(self.redis, key_prefix=self.key_prefix(), mode=mode))
        if "s3" in self.chain and self.s3:
            bucket, _, prefix = self.s3.removeprefix("s3://").partition("/")
            variables.update(s3_variables(environ, bucket=bucket, key_prefix=self.key_prefix(prefix), mode=mode))
        return variables


def redis_variables(url: str, *, key_prefix: str, mode: str) -> dict[str, str]:
    """``redis://user:password@host:port/db`` as sccache reads it: the endpoint without
    the database and the credentials, which have variables of their own (a password in a
    variable whose name says so never reaches a log).

    >>> redis_variables("redis://me:pw@r:6379/2", key_prefix="cpu/", mode="READ_ONLY")  # doctest: +NORMALIZE_WHITESPACE
    {'SCCACHE_REDIS_ENDPOINT': 'redis://r:6379', 'SCCACHE_REDIS_KEY_PREFIX': 'cpu/',
     'SCCACHE_REDIS_RW_MODE': 'READ_ONLY', 'SCCACHE_REDIS_DB': '2', 'SCCACHE_REDIS_USERNAME': 'me',
     'SCCACHE_REDIS_PASSWORD': 'pw'}
    """
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or ""
    address = f"[{host}]" if ":" in host else host
    port = f":{parsed.port}" if parsed.port else ""
    variables = {
        "SCCACHE_REDIS_ENDPOINT": f"{parsed.scheme}://{address}{port}",
        "SCCACHE_REDIS_KEY_PREFIX": key_prefix,
        "SCCACHE_REDIS_RW_MODE": mode,
    }
    db = parsed.path.strip("/")
    variables.update({"SCCACHE_REDIS_DB": db} if db else {})
    for key, value in (("USERNAME", parsed.username), ("PASSWORD", parsed.password)):
        variables.update({f"SCCACHE_REDIS_{key}": urllib.parse.unquote(value)} if value else {})
    return variables


def s3_variables(environ: Mapping[str, str], *, bucket: str, key_prefix: str, mode: str) -> dict[str, str]:
    """The bucket as sccache reads it, reached as the AWS SDK's variables say (the index's
    too): the endpoint (``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``; TLS by its
    scheme) and the region; the caller's own ``SCCACHE_ENDPOINT`` and ``SCCACHE_REGION``
    win. Path-style requests, sccache's default, which every S3 server answers.

    >>> s3_variables({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1"},
    ...              bucket="b", key_prefix="p/cpu/", mode="READ_WRITE")  # doctest: +NORMALIZE_WHITESPACE
    {'SCCACHE_BUCKET': 'b', 'SCCACHE_S3_KEY_PREFIX': 'p/cpu/', 'SCCACHE_S3_RW_MODE': 'READ_WRITE',
     'SCCACHE_ENDPOINT': 'http://127.0.0.1:9000', 'SCCACHE_S3_USE_SSL': 'false', 'SCCACHE_REGION': 'eu-west-1'}
    """
    variables = {"SCCACHE_BUCKET": bucket, "SCCACHE_S3_KEY_PREFIX": key_prefix, "SCCACHE_S3_RW_MODE": mode}
    endpoint = environ.get("SCCACHE_ENDPOINT") or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        variables["SCCACHE_ENDPOINT"] = endpoint
        if "://" in endpoint:
            variables["SCCACHE_S3_USE_SSL"] = "true" if endpoint.startswith("https://") else "false"
    region = environ.get("SCCACHE_REGION") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    variables.update({"SCCACHE_REGION": region} if region else {})
    return variables


def credential_files(variables: Mapping[str, str]) -> dict[str, Path]:
    """The files that the server's variables name, by variable: every ``*_FILE`` and
    ``*_PATH`` (``AWS_WEB_IDENTITY_TOKEN_FILE``, ``AWS_SHARED_CREDENTIALS_FILE``,
    ``AWS_CONFIG_FILE``, ``SCCACHE_GCS_KEY_PATH``, ...) and sccache's configuration file;
    a relative path as this process finds it, which the server then gets.

    >>> credential_files({"AWS_CONFIG_FILE": "/etc/aws", "SCCACHE_CONF": "/s.toml", "SCCACHE_DIR": "/c"})
    {'AWS_CONFIG_FILE': PosixPath('/etc/aws'), 'SCCACHE_CONF': PosixPath('/s.toml')}
    """
    return {
        key: Path(value).absolute()
        for key, value in variables.items()
        if value and (key.endswith(("_FILE", "_PATH")) or key in NAMED_FILES)
    }


def missing_files(files: Mapping[str, Path]) -> list[str]:
    """Each variable whose file is not there, said in a few words."""
    return [f"{key} names {path}, which does not exist" for key, path in files.items() if not path.exists()]


def files_to_mount(files: Mapping[str, Path], *, visible: Sequence[Path] = ()) -> list[Path]:
    """The files a container must be given at the same path: those that exist, but for
    those under a directory it sees already (the output root)."""
    paths = [path for path in files.values() if path.exists()]
    return sorted({path for path in paths if not any(path.is_relative_to(seen) for seen in visible)})
