"""Resolving an image tag to its digest through the OCI distribution API, and rewriting
``containers/pins.toml`` with the result. Used by ``scripts/update_pins.py`` where a
registry is reachable.

``HEAD /v2/<repository>/manifests/<tag>`` answers with ``Docker-Content-Digest``; a registry
that wants a token first answers 401 with a ``WWW-Authenticate: Bearer`` challenge, whose
realm hands out an anonymous pull token.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from wheelmill.errors import FetchError
from wheelmill.machine.net import open_url

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
_LOCAL = ("localhost", "127.0.0.1", "[::1]")
# The distribution spec's reference grammar, in lower case: a host (DNS names or an IPv4
# address, or an IPv6 one in brackets), an optional port, then path components.
_HOST = r"(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:]+\])"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = re.compile(rf"(?P<host>{_HOST})(?P<port>:[0-9]{{1,5}})?(?:/{_PATH})*/?")


@dataclass(frozen=True, kw_only=True)
class ImageName:
    registry: str  # host[:port]
    repository: str

    @classmethod
    def parse(cls, image: str) -> ImageName:
        """Split ``quay.io/pypa/x`` or ``docker.io/rocm/dev``; Docker Hub is served elsewhere.

        >>> ImageName.parse("docker.io/rocm/dev-ubuntu-22.04")
        ImageName(registry='registry-1.docker.io', repository='rocm/dev-ubuntu-22.04')
        >>> ImageName.parse("127.0.0.1:5000/wheelmill/base").base_url
        'http://127.0.0.1:5000'
        """
        host, _, repository = image.partition("/")
        if "." not in host and ":" not in host and host != "localhost":
            host, repository = "docker.io", image
        if host == "docker.io":
            host = "registry-1.docker.io"
            repository = repository if "/" in repository else f"library/{repository}"
        return cls(registry=host, repository=repository)

    @property
    def base_url(self) -> str:
        scheme = "http" if self.registry.split(":")[0] in _LOCAL else "https"
        return f"{scheme}://{self.registry}"


def is_registry(value: str) -> bool:
    """Whether ``value`` is a registry an image can be pushed under: ``host[:port][/path]``,
    lower case, no scheme. The host must read as one to the engines (a dot, a port, or
    localhost): they take a bare first word for a Docker Hub namespace instead.

    >>> [is_registry(v) for v in ("ghcr.io/my-org/wheelmill", "127.0.0.1:5000", "localhost/team", "[::1]:5000/x/")]
    [True, True, True, True]
    >>> [is_registry(v) for v in ("http://ghcr.io/org", "not a registry!!", "ghcr.io/Org", "/x", "team", "h.io:/x")]
    [False, False, False, False, False, False]
    """
    match = _REGISTRY.fullmatch(value)
    if match is None:
        return False
    return bool(match["port"]) or "." in match["host"] or match["host"] in _LOCAL


def resolve_digest(image: str, tag: str, *, timeout: float = 30.0) -> str:
    """The ``sha256:`` digest the registry serves for ``image:tag``."""
    name = ImageName.parse(image)
    url = f"{name.base_url}/v2/{name.repository}/manifests/{urllib.parse.quote(tag)}"
    try:
        return _head(url, token=None, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code != 401:
            raise FetchError(
                f"{image}:{tag}: HTTP {exc.code} from {name.registry}", fix="check the image name and tag"
            ) from None
        token = _token(exc.headers.get("WWW-Authenticate", ""), timeout=timeout)
    try:
        return _head(url, token=token, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise FetchError(
            f"{image}:{tag}: HTTP {exc.code} from {name.registry}",
            fix="check the image name, the tag and access rights",
        ) from None


def _head(url: str, *, token: str | None, timeout: float) -> str:
    headers = {"Accept": MANIFEST_TYPES}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, method="HEAD", headers=headers)  # noqa: S310 - registry URLs by design
    try:
        with open_url(request, timeout=timeout) as response:
            digest = response.headers.get("Docker-Content-Digest", "")
    except urllib.error.URLError as exc:
        if isinstance(exc, urllib.error.HTTPError):
            raise
        raise FetchError(f"{url}: {exc.reason}", fix="run this where the registry is reachable") from None
    if not digest.startswith("sha256:"):
        raise FetchError(f"{url}: no Docker-Content-Digest in the answer", fix="check that this is an OCI registry")
    return str(digest)


def _token(challenge: str, *, timeout: float) -> str:
    params = dict(_CHALLENGE.findall(challenge))
    if not challenge.lower().startswith("bearer") or "realm" not in params:
        raise FetchError(
            f"unsupported registry authentication: {challenge!r}", fix="log in with the engine and pin by hand"
        )
    query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
    with open_url(f"{params['realm']}?{query}", timeout=timeout) as response:
        data = json.loads(response.read())
    return str(data.get("token") or data.get("access_token") or "")


def rewrite_pin(pins: Path, key: str, *, digest: str, tag: str | None = None) -> bool:
    """Set ``digest`` (and maybe ``tag``) of ``[bases.<key>]`` in place, keeping every
    comment and line around them. Returns whether anything changed."""
    lines = pins.read_text(encoding="utf-8").splitlines(keepends=True)
    inside, changed = False, False
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped == f"[bases.{key}]"
            continue
        if inside and stripped.startswith("digest") and "=" in stripped:
            new = f'digest = "{digest}"\n'
            changed |= lines[index] != new
            lines[index] = new
        elif inside and tag is not None and stripped.startswith("tag") and "=" in stripped:
            new = f'tag = "{tag}"\n'
            changed |= lines[index] != new
            lines[index] = new
    pins.write_text("".join(lines), encoding="utf-8")
    return changed
