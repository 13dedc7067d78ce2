"""The manylinux policies: which glibc a PEP 600 tag promises and which versioned symbols
of which system libraries it allows, from auditwheel's own data (not a table written here).
The matrix checks a variant's baseline against them; the post-build checks judge binaries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

MANYLINUX_TAG = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_LEGACY = {"manylinux1": "manylinux_2_5", "manylinux2010": "manylinux_2_12", "manylinux2014": "manylinux_2_17"}


@dataclass(frozen=True, kw_only=True)
class Policy:
    name: str  # manylinux_2_28
    glibc: tuple[int, int]
    symbol_versions: Mapping[str, frozenset[str]]  # namespace -> allowed versions (one arch)
    libraries: frozenset[str]


@cache
def policies(arch: str) -> dict[str, Policy]:
    raw: list[dict[str, Any]] = json.loads(
        resources.files("auditwheel").joinpath("policy/manylinux-policy.json").read_text()
    )
    out = {}
    for entry in raw:
        match = re.match(r"^manylinux_(\d+)_(\d+)$", entry["name"])
        if not match or arch not in entry["symbol_versions"]:
            continue
        out[entry["name"]] = Policy(
            name=entry["name"],
            glibc=(int(match.group(1)), int(match.group(2))),
            symbol_versions={ns: frozenset(v) for ns, v in entry["symbol_versions"][arch].items()},
            libraries=frozenset(entry["lib_whitelist"]),
        )
    return out


def normalize_platform(platform: str) -> str:
    """PEP 600 form of a platform tag.

    >>> normalize_platform("manylinux2014_x86_64")
    'manylinux_2_17_x86_64'
    """
    for legacy, modern in _LEGACY.items():
        if platform.startswith(legacy + "_"):
            return modern + platform[len(legacy) :]
    return platform


def oldest_glibc(platforms: Iterable[str]) -> tuple[int, int] | None:
    """The glibc a wheel with these platform tags needs: the oldest its manylinux tags name
    (it runs on any of them); None without a manylinux tag.

    >>> oldest_glibc(["manylinux2014_x86_64", "manylinux_2_28_x86_64"]), oldest_glibc(["linux_x86_64"])
    ((2, 17), None)
    """
    glibcs = [
        (int(m.group(1)), int(m.group(2))) for p in platforms if (m := MANYLINUX_TAG.match(normalize_platform(p)))
    ]
    return min(glibcs) if glibcs else None


def manylinux_of(glibc: str) -> str:
    """The PEP 600 tag prefix a glibc gives: what a wheel built against it can promise at most.

    >>> manylinux_of("2.31")
    'manylinux_2_31'
    """
    return "manylinux_" + "_".join(glibc.split(".")[:2])


def glibc_of(tag: str) -> tuple[int, int]:
    """The glibc a PEP 600 tag prefix or tag names.

    >>> glibc_of("manylinux_2_36"), glibc_of("manylinux_2_34_aarch64")
    ((2, 36), (2, 34))
    """
    match = re.match(r"^manylinux_(\d+)_(\d+)", tag)
    if not match:
        raise ValueError(f"{tag!r} is not a PEP 600 tag")
    return int(match.group(1)), int(match.group(2))


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))
