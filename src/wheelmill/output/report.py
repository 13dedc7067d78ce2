"""``report.json`` read back as typed values, checked against its version: the one reader of
what a build of a cell said, for the index, the images, releases and the command line.
``wheelmill.building.report`` writes it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from wheelmill.inputs.versions import Release, Track, VersionRule
from wheelmill.machine.net import sha256_of
from wheelmill.output.layout import CellLayout

REPORT_VERSION = 1


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"
    # Not run, and no need: the channel has the recipe's wheel for its build key (or, for a
    # cell step that only serves builds, every recipe's). Its record holds the wheel.
    PUBLISHED = "published"
    # Not run, and no need: the recipe is built once for every torch and Python, and another
    # channel of its ABI group has the group build; the wheel is checked, tested and published here.
    FROM_GROUP = "from-group"
    # Not run, and no need: the served index (WHEELMILL_SERVED_INDEX) has the recipe's wheel for
    # its build key, which was fetched from there (its sha256 checked) into dist/.
    REUSED = "reused"


class ReportError(ValueError):
    """A report.json that is not one this wheelmill wrote; the caller says what to do."""


@dataclass(frozen=True, kw_only=True)
class WheelRecord:
    """A wheel that passed everything and was delivered to ``dist/``."""

    name: str
    size: int
    sha256: str
    path: str
    # the ABI its libraries keep to ("python limited>=3.9; torch stable>=2.10.0"); None: no
    # library, or a report written before it was recorded
    abi: str | None = None

    @classmethod
    def of(cls, path: Path, *, abi: str | None = None) -> WheelRecord:
        return cls(name=path.name, size=path.stat().st_size, sha256=sha256_of(path), path=str(path), abi=abi)


@dataclass(frozen=True, kw_only=True)
class ReleaseRecord:
    """The release a cell was built for."""

    version: str
    track: Track
    tag: str | None
    commit: str

    @classmethod
    def of(cls, release: Release) -> ReleaseRecord:
        return cls(version=release.version, track=release.track, tag=release.tag, commit=release.commit)

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "track": self.track.value, "tag": self.tag, "commit": self.commit}


@dataclass(frozen=True, kw_only=True)
class RecipeRecord:
    name: str
    status: Status
    version_rule: VersionRule
    wheel: WheelRecord | None

    def as_dict(self) -> dict[str, Any]:
        wheel = None if self.wheel is None else vars(self.wheel)
        return {"name": self.name, "status": self.status.value, "version_rule": self.version_rule.value, "wheel": wheel}


@dataclass(frozen=True, kw_only=True)
class BuiltCell:
    """What ``report.json`` says of a cell's last build."""

    cell: str
    variant: str
    python: str
    engine: str
    channel: str
    release: ReleaseRecord | None
    status: Status
    exit_code: int
    started: str
    finished: str | None
    seconds: float
    facts: Mapping[str, Any]
    recipes: tuple[RecipeRecord, ...]
    steps: tuple[Mapping[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        """report.json's content, as ``load_report`` reads it back."""
        return {
            "report_version": REPORT_VERSION,
            "cell": self.cell,
            "variant": self.variant,
            "python": self.python,
            "engine": self.engine,
            "channel": self.channel,
            "release": None if self.release is None else self.release.as_dict(),
            "status": self.status.value,
            "exit_code": self.exit_code,
            "started": self.started,
            "finished": self.finished,
            "seconds": self.seconds,
            "facts": self.facts,
            "recipes": [r.as_dict() for r in self.recipes],
            "steps": list(self.steps),
        }

    @property
    def torch(self) -> str:
        """The torch the cell built against, as its env reported it."""
        return str(self.facts["torch"]["version"])

    @property
    def package_source_args(self) -> tuple[str, ...]:
        """Where the cell's packages came from, as uv's arguments."""
        return tuple(self.facts["package_source_args"])

    @property
    def wheels(self) -> list[WheelRecord]:
        """The wheels its report lists, in build order."""
        return [r.wheel for r in self.recipes if r.wheel is not None]

    @property
    def delivered(self) -> list[WheelRecord]:
        """The wheels in ``dist/`` of recipes built and passed here, or found published
        already, or taken from their group build, in build order."""
        delivered = (Status.OK, Status.PUBLISHED, Status.REUSED, Status.FROM_GROUP)
        return [r.wheel for r in self.recipes if r.wheel is not None and r.status in delivered]


def found_beside(layout: CellLayout, wheel: WheelRecord) -> Path | None:
    """The wheel in the cell's ``dist/``, where it still has the bytes the report lists.
    Reports travel between machines (CI artifacts): the wheel is found beside its report,
    never at the path it was written to."""
    path = layout.dist / wheel.name
    return path if path.is_file() and sha256_of(path) == wheel.sha256 else None


def load_report(path: Path, *, cell: str) -> BuiltCell:
    """``path`` read and checked; FileNotFoundError where there is none, ReportError where
    it is not a report of this version, or of another cell than ``cell`` (a report copied
    into another cell's directory would have its wheels published into that cell's channel)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ReportError(f"not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"not JSON ({exc.msg})") from None
    if not isinstance(data, dict) or data.get("report_version") != REPORT_VERSION:
        found = data.get("report_version") if isinstance(data, dict) else None
        raise ReportError(f"report version {found!r}, where this wheelmill reads {REPORT_VERSION}")
    try:
        built = _built_cell(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"{type(exc).__name__}: {exc}") from None
    if built.cell != cell:
        raise ReportError(f"the report of cell {built.cell}, not of {cell}")
    return built


def _built_cell(data: Mapping[str, Any]) -> BuiltCell:
    release = data["release"]
    return BuiltCell(
        cell=data["cell"],
        variant=data["variant"],
        python=data["python"],
        engine=data["engine"],
        channel=data["channel"],
        release=None
        if release is None
        else ReleaseRecord(
            version=release["version"], track=Track(release["track"]), tag=release["tag"], commit=release["commit"]
        ),
        status=Status(data["status"]),
        exit_code=int(data["exit_code"]),
        started=data["started"],
        finished=data["finished"],
        seconds=float(data["seconds"]),
        facts=data["facts"],
        recipes=tuple(_recipe(r) for r in data["recipes"]),
        steps=tuple(data["steps"]),
    )


def _recipe(data: Mapping[str, Any]) -> RecipeRecord:
    wheel = data["wheel"]
    return RecipeRecord(
        name=data["name"],
        status=Status(data["status"]),
        version_rule=VersionRule(data.get("version_rule", VersionRule.SOURCE.value)),
        wheel=None if wheel is None else WheelRecord(**wheel),
    )
