"""Edits of ``recipes/matrix.toml`` as text, made where they change it: a release added to a
variant's ``other-torch``, a variant table inserted after another's, and the result as a
unified diff that ``patch -p1`` and ``git apply`` take. The file is never written again
from its data, so its comments, order and layout stay, and a diff shows the change alone.

An edit is (first line, line past the last, the lines that replace them); one with equal
bounds inserts. Edits are found on the text as it is and applied together, last first.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence

Edit = tuple[int, int, list[str]]


def add_other_torch(lines: Sequence[str], variant: str, torches: Sequence[str], *, comment: str) -> Edit:
    """Append ``torches`` to the variant's ``other-torch`` array, or give it one (after its
    ``torch`` line, under ``comment``) where it has none."""
    start, own_end, _ = variant_block(lines, variant)
    key = _key_line(lines, start + 1, own_end, "other-torch")
    if key is None:
        at = (_key_line(lines, start + 1, own_end, "torch") or start) + 1
        return at, at, [f"# {comment}", f"other-torch = {json.dumps(list(torches))}"]
    end = _array_end(lines, key, own_end)
    return key, end + 1, _appended(list(lines[key : end + 1]), torches)


def insert_after(lines: Sequence[str], variant: str, table: Sequence[str]) -> Edit:
    """Insert ``table`` (a variant's lines) after the variant's block (its tables), before the
    comment that leads the next table: one blank line between the tables."""
    _, _, end = variant_block(lines, variant)
    point = end
    if end < len(lines):
        while point > 0 and lines[point - 1].lstrip().startswith("#"):
            point -= 1  # the next table's own comment stays above it
    before = [""] if point and lines[point - 1].strip() else []
    after = [""] if point < len(lines) else []
    return point, point, [*before, *table, *after]


def apply(lines: Sequence[str], edits: Iterable[Edit]) -> list[str]:
    """The lines with every edit made: each found on the original lines, applied last first
    (edits at one point keep their given order)."""
    result = list(lines)
    ordered = sorted(enumerate(edits), key=lambda item: (item[1][0], item[0]), reverse=True)
    for _, (start, end, replacement) in ordered:
        result[start:end] = replacement
    return result


def unified_diff(before: str, after: str, *, path: str) -> str:
    """The change from ``before`` to ``after`` as a unified diff of ``a/<path>`` and ``b/<path>``
    ("" for none), which ``patch -p1`` and ``git apply`` take from the repository's root."""
    if before == after:
        return ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    # a last line without its newline says so, as diff(1) does, or the next line runs into it
    return "".join(line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n" for line in lines)


def variant_block(lines: Sequence[str], variant: str) -> tuple[int, int, int]:
    """The line of ``[variants.<variant>]``, the line past its own keys, and the line past its
    block (its sub-tables too, ``[variants.<variant>.aarch64]``)."""
    key = ("variants", variant)
    headers = _headers(lines)
    start = next((i for i, parts in headers if parts == key), None)
    if start is None:
        raise LookupError(f"no [variants.{variant}] table")
    after = [(i, parts) for i, parts in headers if i > start]
    own_end = after[0][0] if after else len(lines)
    block_end = next((i for i, parts in after if parts[:2] != key), len(lines))
    return start, own_end, block_end


def _headers(lines: Sequence[str]) -> list[tuple[int, tuple[str, ...]]]:
    """Each table header's line and its dotted key (``[variants.cuda130.aarch64]``)."""
    found = []
    for index, line in enumerate(lines):
        code = _code(line).strip()
        if code.startswith("[") and not code.startswith("[[") and code.endswith("]"):
            found.append((index, tuple(part.strip().strip("\"'") for part in code[1:-1].split("."))))
    return found


def _key_line(lines: Sequence[str], start: int, end: int, key: str) -> int | None:
    """The line in ``[start, end)`` that sets ``key``."""
    for index in range(start, end):
        text = lines[index].strip()
        if text.startswith(key) and text[len(key) :].lstrip().startswith("="):
            return index
    return None


def _array_end(lines: Sequence[str], start: int, end: int) -> int:
    """The line that closes the array opened on line ``start``."""
    depth = 0
    for index in range(start, end):
        code = _code(lines[index])
        depth += code.count("[") - code.count("]")
        if depth <= 0:
            return index
    raise LookupError(f"the array on line {start + 1} does not close")


def _appended(span: list[str], torches: Sequence[str]) -> list[str]:
    """The array's lines with ``torches`` added at its end, in the array's own layout."""
    quoted = [json.dumps(torch) for torch in torches]
    if len(span) == 1:  # other-torch = ["2.12.0"]  # a comment
        line = span[0]
        code = _code(line)
        opening, closing = code.index("["), code.rindex("]")
        inner = code[opening + 1 : closing]
        kept = inner.rstrip()
        joined = ", ".join(quoted)
        if kept:
            joined = f"{kept} {joined}" if kept.endswith(",") else f"{kept}, {joined}"
        return [line[: opening + 1] + joined + inner[len(kept) :] + line[closing:]]
    *items, closing_line = span
    last = items[-1]
    indent = last[: len(last) - len(last.lstrip())] if len(items) > 1 else "    "
    if len(items) > 1 and not _code(last).rstrip().endswith(","):
        code = _code(last).rstrip()
        items[-1] = code + "," + last[len(code) :]
    return [*items, *(f"{indent}{q}," for q in quoted), closing_line]


def _code(line: str) -> str:
    """A line without its comment (a ``#`` outside a string), and without its newline."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#":
            return line[:index]
    return line.rstrip("\n")
