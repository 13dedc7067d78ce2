"""The pages of a channel, rendered from values: PEP 503 HTML and PEP 691 JSON.

Every file link carries its sha256 (PEP 503), ``requires-python``, the hash of its
``.metadata`` sidecar under PEP 714's name only (``core-metadata``: pip 22.3 to 23.0, the pip
of Debian bookworm's and bullseye's CPythons, crashes on the older ``dist-info-metadata``
in JSON, which is why PEP 714 renamed it), its yank reason (PEP 592); the JSON adds
``versions``, ``size`` and ``upload-time`` (PEP 700). A file wheelmill mirrored rather than
built says where it came from, in a private key of the JSON (``_mirrored-from``, PEP 691
reserves leading underscores for such) and a ``data-mirrored-from`` attribute of its link.
A wheel wheelmill built shows the GPU archs it carries (its ``gpu-archs.json``:
``cuda 8.0;9.0+PTX``, ``rocm gfx90a``, ``cpu``) the same way: ``_gpu-archs`` in the JSON,
``data-gpu-archs`` on the link; the ABI its libraries keep to (``wheelmill.wheel.abi``:
``python limited>=3.9; torch stable>=2.10.0``), ``_abi`` and ``data-abi``; and the build keys it was built for
(``wheelmill.planning.buildkey``: a hash of every input of its build, so a build whose key
is listed here need not run), ``_build-keys`` in the JSON, ``data-build-keys`` on the link;
and where its signed provenance is (``wheelmill.provenance``), ``_provenance`` and
``data-wheelmill-provenance`` (not ``data-provenance``: on PyPI's pages that names a PEP 740
provenance object, which this is not): installers that know nothing of them read past them.
Every attribute value is escaped, whatever it holds (a build key read from another index's
page included).
A page written before there was such a key reads back without it. File URLs are relative
and percent-encoded, so ``+`` in a local version label reaches the file on servers that
read ``+`` as a space (S3).
"""

from __future__ import annotations

import html
import html.parser
import json
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from wheelmill.machine.net import file_name

API_VERSION = "1.1"  # PEP 700 fields need 1.1
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"


@dataclass(frozen=True, kw_only=True)
class FileEntry:
    filename: str
    version: str
    sha256: str
    size: int
    upload_time: str  # RFC 3339, UTC, microseconds: 2026-11-22T13:05:01.123456Z
    requires_python: str | None
    metadata_sha256: str
    yanked: str | None = None  # None: not yanked; "" yanked without a reason
    mirrored_from: str | None = None  # None: built here; else the upstream URL it was mirrored from
    gpu_archs: str | None = None  # what its gpu-archs.json says (ArchRecord.describe); None: no such file
    abi: str | None = None  # the ABI its libraries keep to (WheelAbi.describe); None: mirrored, or no library
    # The build keys whose build gave these bytes: more than one where inputs changed and the
    # bytes did not (a reproducible build of an edited comment); empty for a mirrored file.
    build_keys: tuple[str, ...] = ()
    # Where the file is, relative to its project page; None: the tree's channel's own files
    # (``../../files/<filename>``). An object store's channel names its content-addressed blob.
    href: str | None = None
    # Its signed provenance (DSSE envelopes, one a line: wheelmill.provenance), relative to the
    # project page like ``url``; None: none was published with it.
    provenance: str | None = None

    @property
    def built(self) -> bool:
        return self.mirrored_from is None

    @property
    def url(self) -> str:
        """Relative to a project page (``<channel>/simple/<project>/``)."""
        return self.href or self.files_url(self.filename)

    @staticmethod
    def files_url(filename: str) -> str:
        return "../../files/" + urllib.parse.quote(filename, safe="")

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "filename": self.filename,
            "url": self.url,
            "hashes": {"sha256": self.sha256},
            "requires-python": self.requires_python,
            "core-metadata": {"sha256": self.metadata_sha256},
            "yanked": self.yanked or (self.yanked is not None),
            "size": self.size,
            "upload-time": self.upload_time,
        }
        if self.mirrored_from is not None:
            data["_mirrored-from"] = self.mirrored_from
        if self.gpu_archs is not None:
            data["_gpu-archs"] = self.gpu_archs
        if self.abi is not None:
            data["_abi"] = self.abi
        if self.build_keys:
            data["_build-keys"] = list(self.build_keys)
        if self.provenance is not None:
            data["_provenance"] = self.provenance
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], version: str) -> FileEntry:
        """Read back an entry this module wrote (the inverse of ``as_json``)."""
        yanked = data.get("yanked", False)
        return cls(
            filename=data["filename"],
            version=version,
            sha256=data["hashes"]["sha256"],
            size=data["size"],
            upload_time=data["upload-time"],
            requires_python=data.get("requires-python"),
            metadata_sha256=data["core-metadata"]["sha256"],
            yanked=yanked if isinstance(yanked, str) else ("" if yanked else None),
            mirrored_from=data.get("_mirrored-from"),
            gpu_archs=data.get("_gpu-archs"),
            abi=data.get("_abi"),
            build_keys=tuple(data.get("_build-keys", ())),
            href=None if data["url"] == cls.files_url(data["filename"]) else data["url"],
            provenance=data.get("_provenance"),
        )


@dataclass(frozen=True, kw_only=True)
class Project:
    name: str  # normalized (PEP 503)
    files: tuple[FileEntry, ...]

    @property
    def versions(self) -> list[str]:
        return sorted({f.version for f in self.files}, key=Version)


def project_json(project: Project) -> str:
    data = {
        "meta": {"api-version": API_VERSION},
        "name": project.name,
        "versions": project.versions,
        "files": [f.as_json() for f in project.files],
    }
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def parse_project_json(text: str) -> Project:
    """The project's state is its own JSON page: nothing else is stored."""
    return project_of(json.loads(text))


def project_of(data: dict[str, Any], *, where: str = "a project page") -> Project:
    """A project from its parsed JSON page (``where``: the page, for messages)."""
    files = tuple(
        FileEntry.from_json(f, str(parse_wheel_filename(file_name(f["filename"], where))[1])) for f in data["files"]
    )
    return Project(name=data["name"], files=files)


def project_html(project: Project) -> str:
    links = [_link(f) for f in project.files]
    return _page(f"Links for {project.name}", links)


def build_keys_of(attribute: str | None) -> tuple[str, ...]:
    """The build keys a link's ``data-build-keys`` lists (space-separated; none if absent)."""
    return tuple((attribute or "").split())


PROVENANCE_ATTRIBUTE = "data-wheelmill-provenance"


def _link(f: FileEntry) -> str:
    attrs = [f'href="{html.escape(f.url)}#sha256={html.escape(f.sha256)}"']
    if f.requires_python:
        attrs.append(f'data-requires-python="{html.escape(f.requires_python)}"')
    attrs.append(f'data-core-metadata="sha256={html.escape(f.metadata_sha256)}"')
    if f.yanked is not None:
        attrs.append(f'data-yanked="{html.escape(f.yanked)}"')
    if f.mirrored_from is not None:
        attrs.append(f'data-mirrored-from="{html.escape(f.mirrored_from)}"')
    if f.gpu_archs is not None:
        attrs.append(f'data-gpu-archs="{html.escape(f.gpu_archs)}"')
    if f.abi is not None:
        attrs.append(f'data-abi="{html.escape(f.abi)}"')
    if f.build_keys:
        attrs.append(f'data-build-keys="{html.escape(" ".join(f.build_keys))}"')
    if f.provenance is not None:
        attrs.append(f'{PROVENANCE_ATTRIBUTE}="{html.escape(f.provenance)}"')
    return f"<a {' '.join(attrs)}>{html.escape(f.filename)}</a><br>"


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))


def links(text: str) -> list[dict[str, str | None]]:
    """The attributes of every link of an HTML page (what pip reads of it)."""
    parser = _Anchors()
    parser.feed(text)
    return parser.anchors


def root_json(names: Iterable[str]) -> str:
    data = {"meta": {"api-version": API_VERSION}, "projects": [{"name": n} for n in sorted(names)]}
    return json.dumps(data, indent=1) + "\n"


def parse_root_json(text: str) -> list[str]:
    return [p["name"] for p in json.loads(text)["projects"]]


def root_html(names: Iterable[str]) -> str:
    return _page(
        "Simple index", [f'<a href="{urllib.parse.quote(n)}/">{html.escape(n)}</a><br>' for n in sorted(names)]
    )


def _page(title: str, body: Sequence[str]) -> str:
    head = (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        f'<meta name="pypi:repository-version" content="{API_VERSION}">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n"
    )
    return head + f"<body>\n<h1>{html.escape(title)}</h1>\n" + "\n".join(body) + "\n</body>\n</html>\n"


def agreement(where: str, entry: FileEntry, anchor: dict[str, str | None] | None) -> Iterator[str]:
    """What the HTML link of a file says that its JSON listing does not."""
    if anchor is None:
        return
    if (anchor.get("href") or "").split("#sha256=")[-1] != entry.sha256:
        yield f"{where}: the HTML link carries another sha256"
    if anchor.get("data-gpu-archs") != entry.gpu_archs:
        yield f"{where}: the HTML link and the JSON page show different GPU archs"
    if anchor.get("data-abi") != entry.abi:
        yield f"{where}: the HTML link and the JSON page show different ABIs"
    if build_keys_of(anchor.get("data-build-keys")) != entry.build_keys:
        yield f"{where}: the HTML link and the JSON page show different build keys"
    if anchor.get("data-yanked") != entry.yanked:
        yield f"{where}: the HTML link and the JSON page show different yanks"
