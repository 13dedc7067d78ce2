"""A name of its own for every distinct build of one version.

A third-party recipe's version is its upstream's, and an in-house one's stays put between
commits, so a build whose inputs changed (the compiler's patch version, the env's lock,
CPython's patch version, wheelmill itself: each is part of the build key) makes other
bytes under a name its channel may already list, and a listed file never changes. Such a
build gets a wheel build tag (the optional number between the version and the tags of a
wheel's name, written in its WHEEL file too): one more than the highest its channel lists
for the same project, version, Python, ABI and machine. pip and uv both rank the files of
one version and equally good tags by build tag, none below any, so the channel serves the
newest build, and the older stays installable by its file name.

A label segment (``+cpu.b2``) was the other choice: it changes the version, so
``torchsort==0.1.10+cpu`` would no longer pin the build users install, and every record
that names the version would name another. A build tag leaves the version as it was.

A build whose key a listed file already carries keeps that file's name: a reproducible
rebuild publishes as the no-op it is, and bytes that differ under it still fail as a
reproducibility problem, not a new name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, NormalizedName, parse_wheel_filename
from packaging.version import Version

# manylinux_2_31_x86_64, manylinux2014_x86_64, musllinux_1_2_aarch64, linux_x86_64: the machine
# after the prefix, so a wheel before repair and its repaired file are of one family.
_LINUX = re.compile(r"^(?:many|musl)?linux(?:_\d+_\d+|\d+)?_(?P<machine>.+)$")

Family = tuple[NormalizedName, Version, frozenset[tuple[str, str, str]]]


def build_tag(filename: str, *, key: str, taken: Mapping[str, frozenset[str]]) -> str | None:
    """The build tag of a wheel about to be named ``filename`` (with none) by a build of
    ``key``, given the file names its channel lists (each with its build keys); None where
    the plain name is right.

    >>> build_tag("t-1.0-cp311-cp311-linux_x86_64.whl", key="k2", taken={}) is None
    True
    >>> taken = {"t-1.0-cp311-cp311-manylinux_2_31_x86_64.whl": frozenset({"k1"})}
    >>> build_tag("t-1.0-cp311-cp311-linux_x86_64.whl", key="k2", taken=taken)
    '1'
    >>> build_tag("t-1.0-cp311-cp311-linux_x86_64.whl", key="k1", taken=taken) is None
    True
    >>> build_tag("t-1.0-cp310-cp310-linux_x86_64.whl", key="k2", taken=taken) is None
    True
    """
    family = _family(filename)
    if family is None:
        return None
    numbers: list[int] = []
    for name, keys in taken.items():
        if _family(name) != family:
            continue
        tag = _tag_of(name)
        if key in keys:
            return tag
        numbers.append(int(tag) if tag else 0)
    return str(max(numbers) + 1) if numbers else None


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
