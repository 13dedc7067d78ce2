"""What the README says of the code, kept true: its module map names every module of the
package and nothing else, its exit-code table is the error family's, and its
``wheelmill doctor`` example is what doctor prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.wheels import install
from wheelmill import errors
from wheelmill.archs import ArchRecord
from wheelmill.variants import Family

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


def test_the_doctor_example_is_what_doctor_prints(cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cu130 channel's wheels, installed: what the README shows, run."""
    monkeypatch.delenv("WHEELMILL_GPU_CAPABILITY", raising=False)
    site = tmp_path / "site"
    cell = "cuda130-py311"
    install(site, "example-cuda-ops", "0.1.0+cu130", gpu_archs=ArchRecord(family=Family.CUDA, arch_list="7.5;8.0;8.6;9.0;10.0;12.0+PTX", cell=cell).to_bytes())
    install(site, "example-cpp-ops", "0.1.0+cu130", gpu_archs=ArchRecord(family=Family.CPU, arch_list=None, cell=cell).to_bytes())
    install(site, "torchsort", "0.1.10+cu130", gpu_archs=ArchRecord(family=Family.CUDA, arch_list="8.0;9.0", cell=cell).to_bytes())
    install(site, "torch", "2.14.1+cu130")
    install(site, "filelock", "3.20.0")
    (command, *shown) = section("<!-- doctor:start", "<!-- doctor:end").split("```")[1].strip().splitlines()
    assert command == "$ wheelmill doctor --capability 12.0"
    result = cli("doctor", "--path", str(site), "--capability", "12.0")
    assert result.code == 21
    assert shown == (result.out + result.err).splitlines()
