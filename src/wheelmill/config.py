"""Loading data files: TOML parsed, then validated against a JSON Schema in the repo.

A schema violation becomes a ``ConfigError`` that names the file, the key (as a dotted
path) and a fix. Fixes live in the schema itself, as ``x-fix`` on the property, so the
data and its advice stay together.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

from wheelmill.errors import ConfigError, did_you_mean


def load_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; syntax errors name the file, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found", fix="create it or pass the right path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}", fix="make it a readable UTF-8 file") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}", fix="correct the TOML syntax there") from None


@cache
def _schema(path: Path) -> dict[str, Any]:
    import jsonschema  # noqa: PLC0415 - a tenth of a second at start-up; only loading data needs it

    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(data)
    return data


def validate(data: Mapping[str, Any], *, schema_path: Path, file: Path) -> None:
    """Validate ``data`` read from ``file``; raise a one-line ``ConfigError`` on the first problem."""
    import jsonschema  # noqa: PLC0415 - see _schema
    from jsonschema.exceptions import best_match  # noqa: PLC0415

    schema = _schema(schema_path)
    validator = jsonschema.Draft202012Validator(schema)
    error = best_match(validator.iter_errors(data), key=_relevance)
    if error is not None:
        raise _config_error(error, file=file)


def _relevance(error: ValidationError) -> tuple[int, int]:
    # Prefer the deepest error (it names the exact key), and unknown keys over the rest.
    return (-len(error.absolute_path), 0 if error.validator == "additionalProperties" else 1)


def key_path(parts: Sequence[str | int]) -> str:
    """Dotted TOML-style key path: ``build.env.FOO``, ``override[1].cells``.

    >>> key_path(["override", 1, "cells"])
    'override[1].cells'
    >>> key_path([])
    '(top level)'
    """
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _schema_of(error: ValidationError) -> Mapping[str, Any]:
    return error.schema if isinstance(error.schema, Mapping) else {}


def _config_error(error: ValidationError, *, file: Path) -> ConfigError:
    where = key_path(list(error.absolute_path))
    if error.validator == "additionalProperties":
        return _unknown_key_error(error, file=file, where=where)
    if error.validator == "required":
        missing = re.findall(r"'([^']+)' is a required property", error.message)
        name = missing[0] if missing else error.message
        fix = _fix_for(_schema_of(error), name) or f"add the key '{name}'"
        return ConfigError(f"{file}: {where}: missing required key '{name}'", fix=fix)
    fix = str(
        _schema_of(error).get("x-fix")
        or _context_fix(error)
        or "see the reference of recipes and the matrix (docs/recipes.md, docs/matrix.md)"
    )
    return ConfigError(f"{file}: {where}: {_short(error)}", fix=fix)


def _unknown_key_error(error: ValidationError, *, file: Path, where: str) -> ConfigError:
    allowed = sorted(_schema_of(error).get("properties", {}))
    unknown = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
    name = unknown[0] if unknown else "?"
    hint = did_you_mean(name, allowed)
    fix = f"remove it or use one of: {', '.join(allowed)}" if allowed else "remove it"
    return ConfigError(f"{file}: {where}: unknown key '{name}'{hint}", fix=fix)


def _fix_for(schema: Mapping[str, Any], prop: str) -> str | None:
    sub = schema.get("properties", {}).get(prop, {})
    return sub.get("x-fix") if isinstance(sub, dict) else None


def _context_fix(error: ValidationError) -> str | None:
    # oneOf/anyOf failures carry the fix on the enclosing property.
    for sub in error.context or []:
        fix = _schema_of(sub).get("x-fix")
        if fix:
            return str(fix)
    return None


def _short(error: ValidationError) -> str:
    message = error.message
    if error.validator == "pattern":
        return f"{error.instance!r} does not have the expected form"
    if error.validator in {"oneOf", "anyOf"}:
        return f"{json.dumps(error.instance)[:80]} is not one of the allowed forms"
    return message if len(message) <= 160 else message[:157] + "..."


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KiB|MiB|GiB|TiB)?\s*$")
_UNITS = {
    None: 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


def parse_size(text: str) -> int:
    """Bytes from a human size.

    >>> parse_size("64MiB"), parse_size("1.5 GiB"), parse_size("100")
    (67108864, 1610612736, 100)
    """
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 64MiB or 2GiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def format_duration(seconds: float) -> str:
    """A duration as every terminal line shows it: seconds to the tenth under a minute, then
    minutes and seconds, then hours.

    >>> format_duration(4.25), format_duration(59.96), format_duration(1280.7), format_duration(3725)
    ('4.2s', '60.0s', '21m20s', '1h02m05s')
    """
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def format_size(n: int) -> str:
    """Human size with binary units.

    >>> format_size(3459943), format_size(512)
    ('3.3 MiB', '512 B')
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
