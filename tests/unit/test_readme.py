"""What the README says of the code, kept true: its module map names every module of the
package and nothing else, and its exit-code table is the error family's."""

from __future__ import annotations

import re
from pathlib import Path

from wheelmill import errors

ROOT = Path(__file__).resolve().parent.parent.parent
README = (ROOT / "README.md").read_text()


def section(start: str, end: str) -> str:
    return README[README.index(start) : README.index(end)]


def test_the_module_map_matches_the_tree() -> None:
    mapped = re.findall(r"^\| `([^`]+\.py)` \| \S.* \|$", section("<!-- modules:start", "<!-- modules:end"), flags=re.MULTILINE)
    package = ROOT / "src" / "wheelmill"
    tree = sorted(str(p.relative_to(package)) for p in package.rglob("*.py"))
    assert sorted(mapped) == tree
    assert len(mapped) == len(set(mapped)), "each module once"


def test_the_exit_code_table_is_the_error_family() -> None:
    table = section("## Exit codes", "## Development")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}
    family = {
        cls.exit_code for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.WheelmillError) and cls is not errors.WheelmillError
    }
    assert documented == family
