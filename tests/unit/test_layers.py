"""The package's layers, as docs/design/layers.md says them: every module imports only from
its own layer and the layers before it, and the top level holds the foundation alone."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "src" / "wheelmill"
LAYERS_DOC = ROOT / "docs" / "design" / "layers.md"


def documented_layers() -> list[str]:
    """The packages of the docs' table, in layer order (``wheelmill`` for the top level)."""
    text = LAYERS_DOC.read_text()
    table = text[text.index("<!-- layers:start") : text.index("<!-- layers:end")]
    rows = re.findall(r"^\| (\d+) \| `([a-z_]+)/?` \|", table, flags=re.MULTILINE)
    assert [int(number) for number, _ in rows] == list(range(len(rows))), "layers numbered 0, 1, 2, ..."
    return [name for _, name in rows]


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, layers: list[str]) -> int:
    """A module's layer: its package's, or the foundation's for a top-level module."""
    parts = module.split(".")
    return layers.index(parts[1]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in layers) else 0


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """Every wheelmill module ``path`` imports, at module level or inside a function."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "wheelmill":
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}" if node.module == "wheelmill" else node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "wheelmill")


def upward_imports(package: Path, layers: list[str]) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        module = module_name(path, package)
        if module == "wheelmill.__main__":
            continue  # the entry point, above every layer
        own = layer_of(module, layers)
        for line, target in imported(path):
            if layer_of(target, layers) > own:
                found.append(f"{path.relative_to(package.parent)}:{line}: {module} ({layers[own]}) imports {target}")
    return found


def test_the_docs_name_every_package_of_the_tree_in_layer_order() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    layers = documented_layers()
    assert layers[0] == "wheelmill"
    assert sorted(layers[1:]) == sorted(packages)


def test_no_import_runs_back_up_a_layer() -> None:
    assert upward_imports(PACKAGE, documented_layers()) == []


def test_the_top_level_is_the_foundation_and_at_most_eight_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, modules
    layers = documented_layers()
    for path in PACKAGE.glob("*.py"):
        if path.name != "__main__.py":
            assert all(layer_of(target, layers) == 0 for _, target in imported(path)), path.name


@pytest.mark.parametrize(
    ("where", "line", "layer"),
    [
        ("inputs/matrix.py", "from wheelmill.building.report import CellReport\n", "inputs"),
        ("machine/process.py", "    from wheelmill.cli import main\n", "machine"),
        ("settings.py", "from wheelmill.machine.engine import Engine\n", "wheelmill"),
    ],
)
def test_an_import_that_runs_back_up_is_named(tmp_path: Path, where: str, line: str, layer: str) -> None:
    """The check itself: one planted upward import (at module level or in a function) is found."""
    copy = tmp_path / "wheelmill"
    for path in PACKAGE.rglob("*.py"):
        (copy / path.relative_to(PACKAGE)).parent.mkdir(parents=True, exist_ok=True)
        (copy / path.relative_to(PACKAGE)).write_text(path.read_text())
    planted = copy / where
    body = "def planted() -> None:\n" + line if line.startswith(" ") else line
    planted.write_text(planted.read_text() + "\n" + body)
    (problem,) = upward_imports(copy, documented_layers())
    assert problem.startswith(f"wheelmill/{where}:") and f"({layer}) imports" in problem


# Suites of behaviour that crosses modules, each named for what it tests.
THEMED = {
    "bad_input",
    "boundary",
    "conda_faults",
    "containers",
    "data",
    "docs",
    "ecosystem",
    "getting_started",
    "gpu_checks",
    "index_input",
    "layers",
    "platforms",
    "plumbing",
    "secrets",
    "view",
    "workers",
    "workflows",
}


def test_a_unit_test_file_is_named_after_its_module_or_its_theme() -> None:
    """tests/unit/test_X.py tests the module or package X (of wheelmill, or of benchmarks/
    as benchmark_X), or is one of the themed suites."""
    names = {p.stem for p in PACKAGE.rglob("*.py")} | {p.parent.name for p in PACKAGE.rglob("__init__.py")}
    names |= {f"benchmark_{p.stem}" for p in (ROOT / "benchmarks").glob("*.py")}
    tests = {p.stem.removeprefix("test_") for p in (ROOT / "tests" / "unit").glob("test_*.py")}
    assert sorted(tests - names - THEMED) == []


def test_the_readme_names_the_layers_in_their_order() -> None:
    readme = (ROOT / "README.md").read_text()
    named = re.search(r"`inputs`(\s*→\s*`[a-z]+`)+", readme)
    assert named is not None
    assert re.findall(r"`([a-z]+)`", named.group(0)) == documented_layers()[1:]


def test_pytest_collects_every_module_that_holds_a_doctest() -> None:
    """No package is named so that a tool's default skips it (pytest's ``norecursedirs`` holds
    ``build`` and ``dist``): every module with an example is collected and so run."""
    with_examples = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py") if ">>> " in path.read_text()}
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(PACKAGE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    collected = {line.split("::")[0] for line in listed.splitlines() if "::" in line}
    assert with_examples, "the package has doctests"
    assert with_examples - collected == set()
