"""Multi-platform manifest lists: a cell's images for x86_64 and its aarch64 twin's, pushed
each under its own tag, joined under one tag that an engine on either machine pulls its own
from. Planning is pure (``plan_lists``); ``push_list`` drives the engine.

A list is named by what its members share: ``<commit>-<edition>-<toolkit>-py<python>``.
Each member keeps its own tag, which says its torch (PyPI's CPU torch for aarch64 is older
than x86_64's, so the two may differ) and, for aarch64, ``-arm64``.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wheelmill.errors import CommandFailed, ImageError, UsageError
from wheelmill.machine.engine import Engine, insecure_registry
from wheelmill.machine.process import HostRunner, StepLog, base_environment, capture

# <commit>-<kind>-<toolkit>-torch<version>-py<python>[-arm64]: what the list keeps of it
_MEMBER_TAG = re.compile(r"^(?P<head>.+)-torch[^-]+-(?P<python>py[0-9.]+)(?:-(?P<arch>arm64))?$")


@dataclass(frozen=True, kw_only=True)
class Member:
    """One platform's image of a list: pushed, by digest."""

    cell: str
    kind: str
    platform: str  # linux/amd64, linux/arm64
    tag: str
    pushed: str  # <registry>/wheelmill@sha256:...


@dataclass(frozen=True, kw_only=True)
class ListPlan:
    kind: str
    target: str  # <registry>/wheelmill:<list tag>
    members: tuple[Member, ...]


def members_of(cell: str, images_json: Path) -> list[Member]:
    """A cell's images as ``wheelmill image build --push`` recorded them; one never pushed
    is an error that says how to push it."""
    try:
        recorded: list[Mapping[str, Any]] = json.loads(images_json.read_text(encoding="utf-8"))["images"]
    except FileNotFoundError:
        raise UsageError(
            f"image manifest: {cell} has no images here ({images_json})",
            fix=f"build and push them first: wheelmill image build --cell {cell} --edition runtime --push REGISTRY",
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"image manifest: {images_json} is not a record of images ({exc})", fix="build them again"
        ) from None
    found = []
    for entry in recorded:
        if not entry.get("pushed"):
            raise UsageError(
                f"image manifest: {cell}'s {entry['kind']} image {entry['reference']} was never pushed",
                fix=f"push it: wheelmill image build --cell {cell} --edition <edition> --push REGISTRY",
            )
        tag = str(entry["reference"]).rsplit(":", 1)[1]
        platform = str(entry.get("platform") or "linux/amd64")
        found.append(Member(cell=cell, kind=entry["kind"], platform=platform, tag=tag, pushed=entry["pushed"]))
    return found


def list_tag(members: Sequence[Member]) -> str:
    """The tag the members share once their torch and platform are left out.

    >>> m = [Member(cell="cpu-py311", kind="runtime", platform="linux/amd64",
    ...             tag="abc1234-runtime-cpu-torch2.13.0-py3.11", pushed=""),
    ...      Member(cell="cpu-aarch64-py311", kind="runtime", platform="linux/arm64",
    ...             tag="abc1234-runtime-cpu-torch2.10.0-py3.11-arm64", pushed="")]
    >>> list_tag(m)
    'abc1234-runtime-cpu-py3.11'
    """
    shared = {_shared(member.tag) for member in members}
    if len(shared) != 1 or None in shared:
        tags = ", ".join(member.tag for member in members)
        raise UsageError(
            f"image manifest: the images {tags} are not one image for several platforms",
            fix="join the images of one edition of one commit, toolkit and Python: a cell and its aarch64 twin",
        )
    return str(shared.pop())


def _shared(tag: str) -> str | None:
    match = _MEMBER_TAG.match(tag)
    return f"{match.group('head')}-{match.group('python')}" if match else None


def plan_lists(members: Sequence[Member], registry: str) -> tuple[ListPlan, ...]:
    """One list for each kind of image every cell pushed, its members of distinct platforms."""
    cells = list(dict.fromkeys(member.cell for member in members))
    kinds = [k for k in dict.fromkeys(m.kind for m in members) if all(_has(members, c, k) for c in cells)]
    if len(cells) < 2 or not kinds:
        raise UsageError(
            f"image manifest: {', '.join(cells)}: no edition pushed by two cells or more",
            fix="name a cell and its aarch64 twin, each with an image of the same edition pushed",
        )
    plans = []
    for kind in kinds:
        chosen = tuple(m for m in members if m.kind == kind)
        platforms = [m.platform for m in chosen]
        if len(set(platforms)) != len(platforms):
            raise UsageError(
                f"image manifest: {kind}: two images for one platform ({', '.join(platforms)})",
                fix="join one cell per platform: a cell and its aarch64 twin",
            )
        plans.append(ListPlan(kind=kind, target=f"{registry.rstrip('/')}/wheelmill:{list_tag(chosen)}", members=chosen))
    return tuple(plans)


def _has(members: Sequence[Member], cell: str, kind: str) -> bool:
    return any(m.cell == cell and m.kind == kind for m in members)


@dataclass(frozen=True, kw_only=True)
class PushedList:
    plan: ListPlan
    digest: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.plan.kind,
            "reference": f"{self.plan.target.rsplit(':', 1)[0]}@{self.digest}",
            "tag": self.plan.target,
            "members": [{"cell": m.cell, "platform": m.platform, "image": m.pushed} for m in self.plan.members],
        }


def push_list(engine: Engine, plan: ListPlan, *, log: StepLog) -> PushedList:
    """Make the list of the members' pushed digests and push it under its tag; the local
    list is removed again, whatever happens."""
    insecure = insecure_registry(plan.target)
    runner, env = HostRunner(), base_environment([])
    local = f"localhost/wheelmill-list:{plan.target.rsplit(':', 1)[1]}"
    with tempfile.TemporaryDirectory(prefix="wheelmill-list-") as tmp:
        digest_file = Path(tmp) / "digest"
        try:
            for argv in engine.manifest_create(local, plan.target, [m.pushed for m in plan.members], insecure=insecure):
                runner.run(argv, env=env, log=log)
            argv = engine.manifest_push(local, plan.target, digest_file=digest_file, insecure=insecure)
            said = runner.run(argv, env=env, log=log, keep_output=True).output
            # podman writes the digest to the file; docker prints it
            said = digest_file.read_text(encoding="utf-8") if digest_file.is_file() else said
        except CommandFailed as failed:
            raise ImageError(
                f"pushing the manifest list {plan.target} failed: {failed.last_line()}",
                fix=f"check the registry and that every member was pushed there; read {log.path}",
            ) from None
        finally:
            capture(engine.manifest_remove(local, plan.target), timeout=60)
    digest = next((word for word in said.split() if word.startswith("sha256:")), "")
    if not digest:
        raise ImageError(
            f"pushed the manifest list {plan.target}, but the registry gave no digest", fix=f"read {log.path}"
        )
    return PushedList(plan=plan, digest=digest)
