"""A storage that passes every call on to another, for a test or a benchmark that watches
the writes: ``before_write`` runs before each write (create, swap, copy, delete), and
``written`` sees what each conditional write (create, swap) answered."""

from __future__ import annotations

from pathlib import Path

from wheelmill.files import Linked
from wheelmill.index.storage import Headers, Storage, Stored


class Watched:
    """``storage``, every call passed on; a subclass overrides the two hooks."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def before_write(self, key: str) -> None:
        """Called before each write of ``key``."""

    def written(self, key: str, done: bool) -> bool:
        """What a conditional write of ``key`` answered; passed on as it is."""
        return done

    @property
    def location(self) -> str:
        return self.storage.location

    def get(self, key: str) -> Stored | None:
        return self.storage.get(key)

    def fetch(self, key: str, dest: Path) -> bool:
        return self.storage.fetch(key, dest)

    def create(self, key: str, source: bytes | Path | Linked, *, headers: Headers | None = None) -> bool:
        self.before_write(key)
        return self.written(key, self.storage.create(key, source, headers=headers))

    def swap(self, key: str, data: bytes, *, version: str, headers: Headers | None = None) -> bool:
        self.before_write(key)
        return self.written(key, self.storage.swap(key, data, version=version, headers=headers))

    def copy(self, source: str, key: str) -> bool:
        self.before_write(key)
        return self.storage.copy(source, key)

    def keys_under(self, prefix: str = "") -> list[str]:
        return self.storage.keys_under(prefix)

    def children(self, prefix: str) -> list[str]:
        return self.storage.children(prefix)

    def delete(self, key: str) -> None:
        self.before_write(key)
        self.storage.delete(key)

    def local(self, key: str) -> Path | None:
        return self.storage.local(key)
