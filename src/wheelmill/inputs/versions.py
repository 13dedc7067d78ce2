"""Every version wheelmill stamps, decided from git in one place.

    tag vX.Y.Z at HEAD        X.Y.Z        the release channels (cpu, cu118, ...), promoted from
                                           the rc tagged on the same commit, never built
    tag vX.Y.Z-rcN at HEAD    X.Y.ZrcN     the test channels (test/cpu, test/cu118, ...)
    a nightly                 X.Y.Z.devYYYYMMDDHHMMSS, X.Y.Z the next release, the number
                                           HEAD's commit time (UTC): the nightly channels
                                           (nightly/...)

A recipe's version rule says whose version its wheel carries: ``repo`` (in-house code:
the version above) or ``source`` (a third-party sdist or tag: that project's own). Either
way the variant's local label (``+cu118``) is appended where the recipe wants it. A plain
build, not a release, keeps every source's own version.

A final tag is a promotion: the tested artifacts of the rc tagged on its commit (the newest,
where several are) are copied to the release channels, not rebuilt. A final tag on a commit
with no rc of its version is refused: what reaches the release channels has passed the rc's
GPU stage, and a build straight to them would have none. Reading git is
``wheelmill.machine.git.read_state``; everything here is pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from packaging.version import InvalidVersion, Version

from wheelmill.errors import ReleaseError

_TAG = re.compile(r"^v(?P<base>\d+\.\d+\.\d+)(?:-rc(?P<rc>\d+))?$")
# Before the first release tag, nightlies lead up to this one.
FIRST_VERSION = Version("0.1.0")


class Track(StrEnum):
    """Where a release's wheels go: each track has one channel per variant."""

    RELEASE = "release"
    TEST = "test"
    NIGHTLY = "nightly"

    def channel(self, variant_channel: str) -> str:
        """``cu118`` in the release track, ``test/cu118`` and ``nightly/cu118`` elsewhere."""
        return variant_channel if self is Track.RELEASE else f"{self.value}/{variant_channel}"


class Action(StrEnum):
    BUILD = "build"
    PROMOTE = "promote"


class VersionRule(StrEnum):
    REPO = "repo"
    SOURCE = "source"


@dataclass(frozen=True, kw_only=True)
class GitState:
    """What the versions depend on: HEAD, its date, whether the tree is clean, and the tags
    reachable from HEAD (name -> the commit it points at)."""

    commit: str
    committed: datetime  # HEAD's commit time, UTC
    dirty: bool
    tags: Mapping[str, str]


@dataclass(frozen=True, kw_only=True)
class ReleaseTag:
    name: str
    base: Version
    rc: int | None

    @property
    def version(self) -> Version:
        return Version(f"{self.base}rc{self.rc}") if self.rc is not None else self.base


@dataclass(frozen=True, kw_only=True)
class Release:
    """What a tag or a nightly makes: the repo's version, its track, and whether the cells
    are built or an rc's artifacts promoted (``promote_from``: that rc's version)."""

    version: str
    track: Track
    action: Action
    commit: str
    tag: str | None = None
    promote_from: str | None = None
    notes: tuple[str, ...] = ()  # a preview's reasons it could not be made as it stands


def parse_tag(name: str) -> ReleaseTag | None:
    """``v2.4.0`` and ``v2.4.0-rc1`` are release tags; anything else is not."""
    found = _TAG.match(name)
    if found is None:
        return None
    rc = found.group("rc")
    return ReleaseTag(name=name, base=Version(found.group("base")), rc=int(rc) if rc is not None else None)


def for_tag(state: GitState, name: str, *, preview: bool = False) -> Release:
    """The release a tag makes; HEAD must be that tag's commit and the tree clean. A
    ``preview`` (a dry run) takes the tag as if made on HEAD now, and says what is off."""
    tag = parse_tag(name)
    if tag is None:
        raise ReleaseError(
            f"tag {name}: not a release tag",
            fix="tag releases vX.Y.Z (a release) or vX.Y.Z-rcN (a release candidate), e.g. v2.4.0-rc1",
        )
    problems = [p for p in (_tag_problem(state, name), _dirty_problem(state, f"release {name}")) if p is not None]
    if problems and not preview:
        raise problems[0]
    notes = tuple(p.one_line() for p in problems)
    if tag.rc is not None:
        return Release(
            version=str(tag.version), track=Track.TEST, action=Action.BUILD, commit=state.commit, tag=name, notes=notes
        )
    candidates = [
        t
        for t in _release_tags(state)
        if t.base == tag.base and t.rc is not None and state.tags[t.name] == state.commit
    ]
    if not candidates:
        problem = _no_candidate(state, tag)
        if not preview:
            raise problem
        notes = (*notes, problem.one_line())
    rc = max(candidates, key=lambda t: t.rc or 0) if candidates else None
    return Release(
        version=str(tag.version),
        track=Track.RELEASE,
        action=Action.PROMOTE,
        commit=state.commit,
        tag=name,
        promote_from=str(rc.version) if rc else None,
        notes=notes,
    )


def _no_candidate(state: GitState, tag: ReleaseTag) -> ReleaseError:
    elsewhere = sorted(t.name for t in _release_tags(state) if t.base == tag.base and t.rc is not None)
    there = f" ({', '.join(elsewhere)} on other commits)" if elsewhere else ""
    return ReleaseError(
        f"tag {tag.name}: no release candidate of {tag.base} is tagged on this commit ({state.commit[:12]}){there}; "
        "a release is promoted from its tested rc, never built straight into the release channels",
        fix=f"tag v{tag.base}-rcN on this commit, let its build and GPU stage pass, then tag {tag.name} on it",
    )


def _tag_problem(state: GitState, name: str) -> ReleaseError | None:
    if name not in state.tags:
        return ReleaseError(
            f"tag {name}: not in this repository (at or before HEAD)",
            fix=f"fetch the tags (git fetch --tags) or create it on HEAD: git tag {name}",
        )
    if state.tags[name] != state.commit:
        return ReleaseError(
            f"HEAD ({state.commit[:12]}) is not on tag {name} (which is {state.tags[name][:12]})",
            fix=f"check the tag out (git checkout {name}); a release is built from the tagged commit only",
        )
    return None


def for_nightly(state: GitState, *, preview: bool = False, given: str | None = None) -> Release:
    """The next release's dev version, numbered by HEAD's commit time to the second: the same
    commit gives the same version (and the same bytes), so a nightly with nothing new is a
    no-op, and two commits of one day give two. ``given``: the version the nightly's plan
    job computed, which its other jobs take (one whose clone sees a final tag pushed since
    would otherwise compute another); it must be this commit's nightly of a version the
    tags at HEAD lead to, with or without those tagged on HEAD itself."""
    problem = _dirty_problem(state, "a nightly")
    if problem is not None and not preview:
        raise problem
    version = f"{next_version(state)}.dev{state.committed:%Y%m%d%H%M%S}"
    if given is not None and given != version:
        _check_given(state, given)
        version = given
    notes = (problem.one_line(),) if problem else ()
    return Release(version=version, track=Track.NIGHTLY, action=Action.BUILD, commit=state.commit, notes=notes)


def _check_given(state: GitState, given: str) -> None:
    earlier = GitState(
        commit=state.commit,
        committed=state.committed,
        dirty=state.dirty,
        tags={name: commit for name, commit in state.tags.items() if commit != state.commit},
    )
    dev = f".dev{state.committed:%Y%m%d%H%M%S}"
    allowed = {f"{next_version(s)}{dev}" for s in (state, earlier)}
    if given not in allowed:
        raise ReleaseError(
            f"release: --version {given} is not a nightly of commit {state.commit[:12]} "
            f"(it would be {' or '.join(sorted(allowed))})",
            fix="give the version the nightly's plan job printed for this commit, or leave --version out",
        )


def next_version(state: GitState) -> Version:
    """The release being worked towards: the open rc's version, else the last release with
    its patch number bumped, else ``FIRST_VERSION``."""
    tags = _release_tags(state)
    if not tags:
        return FIRST_VERSION
    latest = max(tags, key=lambda t: t.version)
    if latest.rc is not None:
        return latest.base
    major, minor, patch = latest.base.release[:3]
    return Version(f"{major}.{minor}.{patch + 1}")


def _release_tags(state: GitState) -> list[ReleaseTag]:
    return [t for t in map(parse_tag, state.tags) if t is not None]


def _dirty_problem(state: GitState, what: str) -> ReleaseError | None:
    if not state.dirty:
        return None
    return ReleaseError(
        f"{what}: the working tree has uncommitted changes",
        fix="commit or stash them; a published version must name exactly one commit",
    )


def stamp_version(rule: VersionRule, built: str, *, release: Release | None, label: str | None) -> str | None:
    """The version a wheel is stamped with, or None to keep ``built`` as it is: the repo's
    version (rule ``repo``, in a release) or the source's own, plus ``+label``. A source that
    already carries a local label keeps its version whole."""
    try:
        own = Version(built)
    except InvalidVersion:
        return None
    public = release.version if rule is VersionRule.REPO and release is not None else own.public
    if own.local is not None and public == own.public:
        return None
    version = f"{public}+{label}" if label else public
    return None if version == built else version
