"""A channel of the index the team serves, read over HTTP through its PEP 691 JSON pages: the
same ``Listing`` a local channel is, so a build looks up its build keys there as it does in
its own index (``wheelmill.index.channels.built_by_key``), and fetches what it finds by URL.

Every page of the channel's projects is read once per lookup, a few at a time: a channel
holds tens of projects, and a build asks once per cell.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from packaging.utils import canonicalize_name

from wheelmill.errors import FetchError
from wheelmill.index.pages import FileEntry, Project, project_of
from wheelmill.machine.net import linked, read_json_page, split_credentials
from wheelmill.retry import RetryPolicy, with_retries

PAGES_AT_ONCE = 8


@dataclass(frozen=True, kw_only=True)
class HttpChannel:
    """Channel ``name`` of the index served at ``base`` (its root: ``<base>/<name>/simple/``)."""

    base: str
    name: str
    retry: RetryPolicy

    @property
    def simple(self) -> str:
        return f"{self.base.rstrip('/')}/{self.name}/simple/"

    def project_url(self, project: str) -> str:
        return f"{self.simple}{canonicalize_name(project)}/"

    def file_url(self, project: str, entry: FileEntry) -> str:
        """Where the file is: its page's link, resolved against the page, on the index's host."""
        return linked(self.project_url(project), entry.url, what=entry.filename)

    def provenance_url(self, project: str, entry: FileEntry) -> str | None:
        """Where the file's provenance is, where its page names one, on the index's host."""
        if entry.provenance is None:
            return None
        return linked(self.project_url(project), entry.provenance, what=f"the provenance of {entry.filename}")

    def where(self) -> str:
        """The channel's address, without credentials: for messages and reports."""
        return split_credentials(self.simple)[0]

    def exists(self) -> bool:
        return self._names is not None

    def project(self, name: str) -> Project | None:
        data = self._read(self.project_url(name))
        if data is None:
            return None
        where = split_credentials(self.project_url(name))[0]
        try:
            return project_of(data, where=where)
        except (KeyError, TypeError, ValueError) as exc:  # a file name packaging refuses is a ValueError
            raise FetchError(
                f"{where}: not a project page wheelmill wrote ({exc})", fix="check WHEELMILL_SERVED_INDEX"
            ) from None

    def projects(self) -> Iterator[Project]:
        names = self._names or []
        with ThreadPoolExecutor(max_workers=PAGES_AT_ONCE) as pool:
            for found in pool.map(self.project, names):
                if found is not None:
                    yield found

    def project_names(self) -> list[str]:
        return list(self._names or [])

    @cached_property
    def _names(self) -> list[str] | None:
        data = self._read(self.simple)
        if data is None:
            return None
        listed = data.get("projects")
        if not isinstance(listed, list):
            raise FetchError(f"{self.where()}: not a PEP 691 project list", fix="check WHEELMILL_SERVED_INDEX")
        return sorted(canonicalize_name(str(p.get("name", ""))) for p in listed if isinstance(p, dict))

    def _read(self, url: str) -> dict[str, Any] | None:
        bare, username, password = split_credentials(url)
        auth = (username or "", password or "") if username or password else None
        found, _ = with_retries(lambda _n: read_json_page(bare, auth=auth), policy=self.retry, on_retry=_quiet)
        return found


def _quiet(_attempt: int, _error: Exception, _delay: float) -> None:
    """Retries of a page read say nothing: the step's verdict says what came of them."""
