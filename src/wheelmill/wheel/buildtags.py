"""A name of its own for every distinct build of one version.

A third-party recipe's version is its upstream's, and an in-house one's stays put between
commits, so a build whose inputs changed (the compiler's patch version, the env's lock,
CPython's patch version, wheelmill itself: each is part of the build key) can make other
bytes under a name its channel lists already, and a listed file never changes. Such a build
gets a wheel build tag (the optional number between the version and the tags of a wheel's
name, written in its WHEEL file too): one more than the highest its channel lists for the
same project, version, Python, ABI and machine. pip and uv both rank the files of one
version and equally good tags by build tag, none below any, so the channel serves the
newest build, and the older stays installable by its file name.

Decided on the repaired wheel, the bytes that will be published: where the channel lists
those very bytes (under the plain name, or under a tag, the wheel given that tag), the
build takes that name, so new inputs that make the same bytes (an edited comment) add a
build key to the listed file, not a file; where a listed file of the family carries the
build's own key, its name (a rebuild of the same inputs: other bytes under it still fail, as
a reproducibility problem).

A label segment (``+cpu.b2``) was the other choice: it changes the version, so
``torchsort==0.1.10+cpu`` would no longer pin the build users install, and every record
that names the version would name another. A build tag leaves the version as it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, NormalizedName, parse_wheel_filename
from packaging.version import Version

# manylinux_2_31_x86_64, manylinux2014_x86_64, musllinux_1_2_aarch64, linux_x86_64: the machine
# after the prefix, so a wheel before repair and its repaired file are of one family.
_LINUX = re.compile(r"^(?:many|musl)?linux(?:_\d+_\d+|\d+)?_(?P<machine>.+)$")

Family = tuple[NormalizedName, Version, frozenset[tuple[str, str, str]]]


@dataclass(frozen=True)
class Taken:
    """A file its channel lists: the build keys it answers for, and its sha256."""

    keys: frozenset[str]
    sha256: str


def build_tag(
    filename: str, *, key: str, taken: Mapping[str, Taken], digest: Callable[[str | None], str]
) -> str | None:
    """The build tag of a repaired wheel named ``filename`` (with none) by a build of ``key``,
    given the names its channel lists; None where the plain name is right. ``digest(tag)``
    is the sha256 the wheel would have with that tag (None: as it is).

    >>> plain = {"t-1.0-cp311-cp311-linux_x86_64.whl": Taken(frozenset({"k1"}), "a")}
    >>> tagged = {**plain, "t-1.0-1-cp311-cp311-linux_x86_64.whl": Taken(frozenset({"k2"}), "b1")}
    >>> def digest(tag):
    ...     return f"b{tag or ''}"
    >>> build_tag("t-1.0-cp311-cp311-linux_x86_64.whl", key="k3", taken={}, digest=digest) is None
    True
    >>> build_tag("t-1.0-cp311-cp311-linux_x86_64.whl", key="k3", taken=plain, digest=digest)
    '1'
    >>> build_tag("t-1.0-cp311-cp311-linux_x86_64.whl", key="k3", taken=tagged, digest=digest)  # the same bytes
    '1'
    >>> build_tag("t-1.0-cp311-cp311-linux_x86_64.whl", key="k1", taken=plain, digest=digest) is None  # its key
    True
    >>> build_tag("t-1.0-cp310-cp310-linux_x86_64.whl", key="k3", taken=plain, digest=digest) is None
    True
    """
    family = _family(filename)
    members = {name: listed for name, listed in taken.items() if family is not None and _family(name) == family}
    if not members:
        return None
    for name, listed in sorted(members.items()):
        if digest(_tag_of(name)) == listed.sha256:
            return _tag_of(name)
    for name, listed in sorted(members.items()):
        if key in listed.keys:
            return _tag_of(name)
    return str(max(int(tag) if (tag := _tag_of(name)) else 0 for name in members) + 1)


def _family(filename: str) -> Family | None:
    """A wheel's project, version, Pythons and ABIs, and machines: the files of one family
    compete for the same installs."""
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    return name, version, frozenset((tag.interpreter, tag.abi, _machine(tag)) for tag in tags)


def _machine(tag: Tag) -> str:
    matched = _LINUX.match(tag.platform)
    return matched["machine"] if matched else tag.platform


def _tag_of(filename: str) -> str | None:
    """A listed wheel's build tag as written in its name (None: it has none)."""
    _name, _version, build, _tags = parse_wheel_filename(filename)
    return f"{build[0]}{build[1]}" if build else None
