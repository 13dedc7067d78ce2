"""The index's storage in an S3 bucket (``s3://bucket/prefix``): what many machines share.

Its guarantees are the S3 API's own, the ``Storage`` protocol's (``wheelmill.index.storage``):
a create is a PUT with ``If-None-Match: *`` (an object is made once; a 412 says it was
there), a swap a PUT with ``If-Match`` on the ETag read (a 412 says another writer came
first), a copy a CopyObject with ``If-None-Match: *`` (no byte through this machine). A 409
(a conditional write racing another on the same key) is tried again. Any S3 API server with
conditional writes serves: AWS S3 (since 2024), SeaweedFS, Cloudflare R2, ...

Where the bucket is, and as whom, is the AWS SDK's standard configuration, never a setting
of wheelmill's: ``AWS_ENDPOINT_URL_S3`` (or ``AWS_ENDPOINT_URL``) for a server other than
AWS's, ``AWS_REGION``/``AWS_DEFAULT_REGION``, and credentials from the environment, a web
identity token (CI's OIDC), a shared credentials file or an instance role.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from wheelmill.errors import ChannelError, ConfigError, FetchError, IndexWriteError, WheelmillError
from wheelmill.files import Linked, atomic_path
from wheelmill.index.storage import Headers, Stored, checked_key

if TYPE_CHECKING:
    from types_boto3_s3.client import S3Client
    from types_boto3_s3.type_defs import PutObjectRequestTypeDef

T = TypeVar("T")
SCHEME = "s3://"
CONFLICT_TRIES = 5  # a 409 (another conditional write of the key in flight) is tried again this often
# The SDK's own retries (connection errors, throttling, 5xx) before a failure is one error.
_CONFIG = Config(retries={"max_attempts": 6, "mode": "standard"}, connect_timeout=10, read_timeout=120)
_REFUSED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}


@dataclass(frozen=True, kw_only=True)
class BucketPath:
    """``s3://bucket/prefix`` taken apart.

    >>> BucketPath.parse("s3://wheels/index/").key("cu130/simple/index.json")
    'index/cu130/simple/index.json'
    >>> BucketPath.parse("s3://wheels").key("a")
    'a'
    """

    bucket: str
    prefix: str  # "" or ending in "/"

    @classmethod
    def parse(cls, url: str) -> BucketPath:
        parts = urllib.parse.urlsplit(url)
        prefix = parts.path.strip("/")
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise ConfigError(
                f"'{url}' is not an S3 location", fix="give the index root as s3://bucket or s3://bucket/prefix"
            )
        if prefix:
            checked_key(prefix)
        return cls(bucket=parts.netloc, prefix=f"{prefix}/" if prefix else "")

    def key(self, key: str) -> str:
        return self.prefix + checked_key(key)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"


class S3Storage:
    """The index's objects in a bucket, under a prefix."""

    def __init__(self, where: BucketPath, client: S3Client | None = None) -> None:
        self.where = where
        self.client = client or _client()

    @classmethod
    def of(cls, url: str) -> S3Storage:
        return cls(BucketPath.parse(url))

    @property
    def location(self) -> str:
        return str(self.where)

    def get(self, key: str) -> Stored | None:
        def read() -> Stored | None:
            try:
                answer = self.client.get_object(Bucket=self.where.bucket, Key=self.where.key(key))
            except ClientError as exc:
                if _code(exc) in ("NoSuchKey", "404"):
                    return None
                raise
            return Stored(data=answer["Body"].read(), version=answer["ETag"])

        return self._call(read, key, writing=False)

    def fetch(self, key: str, dest: Path) -> bool:
        def download() -> bool:
            with atomic_path(dest) as tmp:
                try:
                    self.client.download_file(self.where.bucket, self.where.key(key), str(tmp))
                except ClientError as exc:
                    if _code(exc) in ("NoSuchKey", "404"):
                        return False
                    raise
            return True

        return self._call(download, key, writing=False)

    def create(self, key: str, source: bytes | Path | Linked, *, headers: Headers | None = None) -> bool:
        def put() -> None:
            path = source.source if isinstance(source, Linked) else source
            if isinstance(path, Path):
                with path.open("rb") as body:  # opened for each try: a retried one sends it whole again
                    self._put(key, body, headers, None)
            else:
                self._put(key, path, headers, None)

        return self._conditional(put, key)

    def swap(self, key: str, data: bytes, *, version: str, headers: Headers | None = None) -> bool:
        return self._conditional(lambda: self._put(key, data, headers, version), key)

    def _put(self, key: str, body: bytes | BinaryIO, headers: Headers | None, version: str | None) -> None:
        """A conditional PUT: create-once where ``version`` is None, else compare-and-swap."""
        request: PutObjectRequestTypeDef = {"Bucket": self.where.bucket, "Key": self.where.key(key), "Body": body}
        if version is None:
            request["IfNoneMatch"] = "*"
        else:
            request["IfMatch"] = version
        if headers is not None and headers.cache_control:
            request["CacheControl"] = headers.cache_control
        if headers is not None and headers.content_type:
            request["ContentType"] = headers.content_type
        self.client.put_object(**request)

    def copy(self, source: str, key: str) -> bool:
        def copy_object() -> None:
            try:
                self.client.copy_object(
                    Bucket=self.where.bucket,
                    Key=self.where.key(key),
                    CopySource={"Bucket": self.where.bucket, "Key": self.where.key(source)},
                    IfNoneMatch="*",
                )
            except ClientError as exc:
                if _code(exc) in ("NoSuchKey", "404"):
                    raise ChannelError(
                        f"{self.location}: no object {source} to copy", fix="copy an object that is there"
                    ) from None
                raise

        return self._conditional(copy_object, key)

    def keys_under(self, prefix: str = "") -> list[str]:
        checked_key(prefix, prefix=True)

        def listed() -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.where.bucket, Prefix=self.where.prefix + prefix
            )
            found = [item["Key"] for page in pages for item in page.get("Contents", [])]
            # A key ending in "/" is a folder marker some tools write (the conda indexer's), no object.
            return sorted(key.removeprefix(self.where.prefix) for key in found if not key.endswith("/"))

        return self._call(listed, prefix or "(all)", writing=False)

    def children(self, prefix: str) -> list[str]:
        checked_key(prefix, prefix=True)

        def listed() -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.where.bucket, Prefix=self.where.prefix + prefix, Delimiter="/"
            )
            found = [item["Prefix"] for page in pages for item in page.get("CommonPrefixes", [])]
            return sorted(name.removeprefix(self.where.prefix + prefix).rstrip("/") for name in found)

        return self._call(listed, prefix or "(all)", writing=False)

    def local(self, key: str) -> Path | None:  # noqa: ARG002 - a bucket's objects are fetched
        return None

    def delete(self, key: str) -> None:
        """The object, then its emptied parents: a store that keeps directories (SeaweedFS's
        filer, MinIO) lists an empty one as a child otherwise, and refuses to delete one that
        still holds objects; on AWS, where no folder exists, each is a no-op."""
        self._call(
            lambda: self.client.delete_object(Bucket=self.where.bucket, Key=self.where.key(key)), key, writing=True
        )
        parts = checked_key(key).split("/")[:-1]
        for depth in range(len(parts), 0, -1):
            self._delete_folder("/".join(parts[:depth]) + "/")

    def _delete_folder(self, folder: str) -> None:
        key = self.where.prefix + folder
        self._call(lambda: self.client.delete_object(Bucket=self.where.bucket, Key=key), folder, writing=True)

    def _conditional(self, write: Callable[[], object], key: str) -> bool:
        """True where ``write`` happened; False where its condition failed (412)."""

        def attempt() -> bool:
            for tries in range(1, CONFLICT_TRIES + 1):
                try:
                    write()
                except ClientError as exc:
                    if _code(exc) in ("PreconditionFailed", "412"):
                        return False
                    if _code(exc) in ("ConditionalRequestConflict", "409") and tries < CONFLICT_TRIES:
                        time.sleep(0.05 * 2**tries)
                        continue
                    raise
                return True
            raise AssertionError("the last try returns or raises")

        return self._call(attempt, key, writing=True)

    def _call(self, operation: Callable[[], T], key: str, *, writing: bool) -> T:
        """``operation``'s result; a failure the SDK's retries did not mend as one error."""
        try:
            return operation()
        except WheelmillError:
            raise
        except NoCredentialsError:
            raise ConfigError(
                f"{self.location}: no credentials for the object store",
                fix="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a web identity token (CI's OIDC), "
                "or a shared credentials file",
            ) from None
        except ClientError as exc:
            raise _refusal(self.location, key, exc, writing=writing) from None
        except (BotoCoreError, OSError) as exc:
            raise _unreachable(self.location, key, exc, writing=writing) from None


def _client() -> S3Client:
    """An S3 client from the SDK's standard configuration; path-style addressing where an
    endpoint other than AWS's is named (a server on an address has no bucket subdomains)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    config = _CONFIG.merge(Config(s3={"addressing_style": "path"})) if endpoint else _CONFIG
    core = botocore.session.get_session()
    # Timestamps stay the text the server sent: nothing here reads one, and the SDK's parse of
    # each listed key's LastModified was two thirds of the CPU a listing of 1,000 keys took
    # (a publish lists its project's entries for the render).
    core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    client: S3Client = boto3.session.Session(botocore_session=core).client("s3", region_name=region, config=config)
    return client


def _code(exc: ClientError) -> str:
    error: dict[str, Any] = dict(exc.response.get("Error", {}))
    return str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


def _refusal(location: str, key: str, exc: ClientError, *, writing: bool) -> WheelmillError:
    code = _code(exc)
    if code == "NoSuchBucket":
        return ConfigError(
            f"{location}: the bucket does not exist", fix="create it, or give an index root whose bucket exists"
        )
    if code in _REFUSED or code == "403":
        return (IndexWriteError if writing else FetchError)(
            f"{location}: the object store refused access to {key} ({code})",
            fix="give credentials that may read and write the bucket (AWS_* variables, or CI's OIDC role)",
        )
    what = "write" if writing else "read"
    said = str(exc.response.get("Error", {}).get("Message", "")) or "no message"
    return (IndexWriteError if writing else FetchError)(
        f"{location}: cannot {what} {key}: {code} ({said})",
        fix="check the object store's endpoint (AWS_ENDPOINT_URL_S3) and its health; the object is as it was",
    )


def _unreachable(location: str, key: str, exc: Exception, *, writing: bool) -> WheelmillError:
    what = "write" if writing else "read"
    return (IndexWriteError if writing else FetchError)(
        f"{location}: cannot {what} {key}: the object store did not answer ({exc})",
        fix="check the object store's endpoint (AWS_ENDPOINT_URL_S3) and the network; retried already",
    )
