"""docs/matrix.md's table of the matrix, read back: what the docs promise of each variant,
for the tests that hold the builds to it."""

from __future__ import annotations

from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "matrix.md"
REGISTRY, BOOTSTRAP = "glibc, registry base", "glibc, bootstrapped"


def table_block(page: Path = PAGE) -> str:
    """The generated table, between its markers."""
    text = page.read_text()
    start = text.index("<!-- matrix:start")
    return text[text.index("\n", start) + 1 : text.index("<!-- matrix:end -->")].strip()


def table_rows(page: Path = PAGE) -> dict[str, dict[str, str]]:
    """Each variant's row of the toolchains' table (the first of the two), by its name, as
    column -> cell."""
    head, _rule, *rows = table_block(page).split("\n\n")[0].splitlines()
    columns = [cell.strip() for cell in head.strip("|").split("|")]
    parsed = [dict(zip(columns, (cell.strip() for cell in row.strip("|").split("|")), strict=True)) for row in rows]
    return {row["variant"]: row for row in parsed}
