"""``wheelmill matrix upstream``'s logic, without a network: torch's PEP 691 page is built
here, read into facts, compared with the repository's matrix (the releases asked about are
derived from it, so a bump of the matrix keeps them new), and the change applied to a copy
of the recipes with ``git apply`` and loaded again. The docs' example is held to what the
command prints for the page it describes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliRunner
from wheelmill.cli.upstream import _loadable, report
from wheelmill.errors import FetchError, UsageError
from wheelmill.inputs.matrix import Matrix, load_matrix, torch_tag
from wheelmill.inputs.matrix_edits import add_other_torch, apply, insert_after, unified_diff
from wheelmill.inputs.upstream import (
    Finding,
    default_root,
    label_release,
    matrix_diff,
    missing,
    project_page,
    releases,
    upstream_files,
    wheel_facts,
)
from wheelmill.inputs.variants import Family
from wheelmill.settings import Settings

ROOT = Path(__file__).resolve().parent.parent.parent
MATRIX = ROOT / "recipes" / "matrix.toml"
DOCS = ROOT / "docs" / "matrix.md"
URL = "https://download.pytorch.org/whl/torch/"
MANYLINUX = {"x86_64": "manylinux_2_28_x86_64", "aarch64": "manylinux_2_28_aarch64"}


def wheels(torch: str, label: str, pythons: Iterable[str], platforms: Sequence[str] = ("x86_64",)) -> list[str]:
    """The file names of torch ``torch+label`` for each Python and machine, as PyTorch names them."""
    return [
        f"torch-{torch}+{label}-cp{p.replace('.', '')}-cp{p.replace('.', '')}-{MANYLINUX[m]}.whl"
        for p in pythons
        for m in platforms
    ]


def page(*names: str, yanked: Sequence[str] = ()) -> dict[str, Any]:
    """torch's PEP 691 project page listing these files."""
    files = [{"filename": n, "url": f"../{n}", "hashes": {"sha256": "0" * 64}, "yanked": n in yanked} for n in names]
    return {"meta": {"api-version": "1.1"}, "name": "torch", "files": files}


def next_minor(torch: str, step: int = 1) -> str:
    major, minor = torch.split(".")[:2]
    return f"{major}.{int(minor) + step}.0"


def newest_built(matrix: Matrix, name: str) -> str:
    variant = matrix.variants[name]
    return max((variant.torch, *variant.other_torch), key=lambda t: tuple(int(x) for x in t.split(".")))


def next_label(matrix: Matrix, family: Family) -> str:
    """The label of the toolkit release after the newest one a variant of ``family`` has."""
    releases = [label_release(v.label) for v in matrix.variants.values() if v.family is family]
    major, minor = max(r[1] for r in releases if r is not None and r[1] is not None)
    major, minor = (major, minor + 1) if minor < 9 else (major + 1, 0)
    return f"cu{major}{minor}" if family is Family.CUDA else f"rocm{major}.{minor}"


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return load_matrix(MATRIX)


def git_apply(diff: str, where: Path, *options: str) -> None:
    """``git apply`` as a user runs it from the repository's root: here, a directory of no
    repository (git looks no further up, so no work tree around it is ever touched)."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(where.parent)}
    subprocess.run(["git", "apply", *options, "-"], input=diff, text=True, cwd=where, env=env, check=True)


def applied(diff: str, tmp_path: Path) -> Matrix:
    """The matrix of a copy of the recipes with ``diff`` applied by ``git apply``, loaded."""
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    git_apply(diff, tmp_path, "--check")
    git_apply(diff, tmp_path)
    return load_matrix(tmp_path / "recipes" / "matrix.toml")


# --- facts ------------------------------------------------------------------------------


def test_a_page_becomes_a_fact_per_python_and_machine() -> None:
    names = [
        "torch-2.15.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.15.0+cu130-cp313-cp313t-manylinux_2_28_x86_64.whl",  # free-threaded: not a Python of the matrix
        "torch-2.15.0+rocm7.0-cp312-cp312-manylinux2014_x86_64.whl",
        "torch-2.15.0+cu130-cp311-cp311-manylinux_2_28_aarch64.whl",
        "torch-2.15.0+cpu-cp311-cp311-win_amd64.whl",  # not Linux
        "torch-2.15.0-cp311-none-macosx_11_0_arm64.whl",  # no label
        "torch-2.15.0.tar.gz",
        "torchvision-0.30.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.14.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",  # yanked
    ]
    facts = upstream_files(page(*names, yanked=[names[-1]]), url=URL)
    assert [(str(f.torch), f.label, f.python, f.platform, f.glibc) for f in facts] == [
        ("2.15.0", "cu130", "3.11", "x86_64", "manylinux_2_28"),
        ("2.15.0", "rocm7.0", "3.12", "x86_64", "manylinux_2_17"),
        ("2.15.0", "cu130", "3.11", "aarch64", "manylinux_2_28"),
    ]
    assert facts[0].as_dict()["filename"] == names[0]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param({"files": []}, "not a PEP 691 project page", id="no-meta"),
        pytest.param({"meta": {"api-version": "2.0"}, "files": []}, "not a PEP 691 project page", id="api-version-2"),
        pytest.param({"meta": {"api-version": "1.0"}, "files": "x"}, "not a PEP 691 project page", id="files-no-list"),
        pytest.param({"meta": {"api-version": "1.0"}, "files": [{"url": "x"}]}, "without a filename", id="no-filename"),
        pytest.param({"meta": {"api-version": "1.0"}, "name": "numpy", "files": []}, "not torch's", id="other-project"),
    ],
)
def test_a_page_that_is_no_pep_691_project_page_is_an_error(body: dict[str, Any], said: str) -> None:
    with pytest.raises(FetchError, match=said) as caught:
        upstream_files(body, url=URL)
    assert caught.value.exit_code == FetchError.exit_code and caught.value.fix


def test_labels_and_urls_are_read_as_the_matrix_writes_them() -> None:
    assert label_release("cu128") == (Family.CUDA, (12, 8))
    assert label_release("rocm6.4") == (Family.ROCM, (6, 4))
    assert label_release("rocm5.4.2") is None and label_release("xpu") is None and label_release("cu92") is None
    assert default_root("https://download.pytorch.org/whl/{label}") == "https://download.pytorch.org/whl"
    assert default_root("https://mirror.example/torch-wheels/") is None
    assert project_page("http://127.0.0.1:1/whl/") == "http://127.0.0.1:1/whl/torch/"
    assert wheel_facts("torch-2.15.0+cu130-cp311-cp311-linux_x86_64.whl")[0].glibc is None


# --- findings ---------------------------------------------------------------------------


def test_a_newer_torch_of_a_label_goes_into_its_variants_other_torch(matrix: Matrix, tmp_path: Path) -> None:
    cuda130 = matrix.variants["cuda130"]
    newer = next_minor(newest_built(matrix, "cuda130"))
    older = next_minor(newest_built(matrix, "cuda130"), step=-20)  # built long ago: nothing to add
    files = upstream_files(
        page(
            *wheels(newer, "cu130", ["3.10", "3.11", "3.12", "3.13", "3.14"], ["x86_64", "aarch64"]),
            *wheels(older, "cu130", ["3.11"], ["x86_64", "aarch64"]),
        ),
        url=URL,
    )
    (finding,) = missing(matrix, files)
    assert finding.as_dict() == {
        "kind": "newer-torch",
        "torch": newer,
        "label": "cu130",
        "family": "cuda",
        "variant": "cuda130",
        "pythons": ["3.10", "3.11", "3.12", "3.13", "3.14"],
        "platforms": ["x86_64", "aarch64"],
        "model": None,
        "blocked": None,
    }
    diff = matrix_diff(MATRIX.read_text(encoding="utf-8"), [finding], matrix)
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == [
        f"-other-torch = {_list(cuda130.other_torch)}",
        f"+other-torch = {_list((*cuda130.other_torch, newer))}",
    ]
    patched = applied(diff, tmp_path)
    derived = patched.variants[f"cuda130-{torch_tag(newer)}"]
    assert derived.torch == newer and derived.channel == f"cu130-{torch_tag(newer)}"
    assert f"cuda130-{torch_tag(newer)}-aarch64" in patched.variants


def test_a_variant_without_other_torch_gets_one_under_a_comment(matrix: Matrix, tmp_path: Path) -> None:
    assert not matrix.variants["cuda126"].other_torch
    newer = next_minor(newest_built(matrix, "cuda126"))
    findings = missing(
        matrix, upstream_files(page(*wheels(newer, "cu126", matrix.variants["cuda126"].pythons)), url=URL)
    )
    diff = matrix_diff(MATRIX.read_text(encoding="utf-8"), findings, matrix)
    assert f'\n+other-torch = ["{newer}"]\n' in diff and "\n+# Newer torch releases" in diff
    assert f"cuda126-{torch_tag(newer)}" in applied(diff, tmp_path).variants


def test_a_new_label_gets_a_variant_modelled_on_the_newest_of_its_family(matrix: Matrix, tmp_path: Path) -> None:
    label = next_label(matrix, Family.CUDA)
    torch = next_minor(newest_built(matrix, "cuda130"))
    pythons = ["3.11", "3.12", "3.13", "3.14"]
    files = upstream_files(page(*wheels(torch, label, pythons, ["x86_64", "aarch64"])), url=URL)
    (finding,) = missing(matrix, files)
    name = f"cuda{label.removeprefix('cu')}"
    assert (finding.kind, finding.variant, finding.model, finding.blocked) == ("new-label", name, "cuda130", None)
    assert finding.as_dict()["pythons"] == pythons
    diff = matrix_diff(MATRIX.read_text(encoding="utf-8"), [finding], matrix)
    assert f"+[variants.{name}]\n" in diff
    comment = " ".join(line[3:] for line in diff.splitlines() if line.startswith("+# "))
    assert all(words in comment for words in ("patch release", "cudnn and nccl", "arch list", "Python 3.14 too"))
    assert all(len(line) <= 93 for line in diff.splitlines() if line.startswith("+#"))  # the file's own width
    # the file was edited, not written again: every line of it is still there, comments too
    assert not [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    patched = applied(diff, tmp_path)
    new, model = patched.variants[name], matrix.variants["cuda130"]
    assert (new.label, new.torch, new.arch_list, new.cudnn) == (label, torch, model.arch_list, model.cudnn)
    assert new.pythons == ("3.11", "3.12", "3.13")  # those of the matrix
    assert patched.variants[f"{name}-aarch64"].arch_list == matrix.variants["cuda130-aarch64"].arch_list


def test_a_new_rocm_label_goes_after_the_newest_rocm_variant(matrix: Matrix, tmp_path: Path) -> None:
    label = next_label(matrix, Family.ROCM)
    findings = missing(matrix, upstream_files(page(*wheels("2.99.0", label, ["3.12"])), url=URL))
    patched = applied(matrix_diff(MATRIX.read_text(encoding="utf-8"), findings, matrix), tmp_path)
    name = "rocm" + label.removeprefix("rocm").replace(".", "")
    assert patched.variants[name].platforms == ("x86_64",) and patched.variants[name].pythons == ("3.12",)


def test_old_labels_and_unknown_families_are_not_reported(matrix: Matrix) -> None:
    files = upstream_files(page(*wheels("2.0.1", "cu117", ["3.11"]), *wheels("2.99.0", "xpu", ["3.11"])), url=URL)
    assert missing(matrix, files) == ()


def test_pre_releases_and_dev_builds_count_only_when_asked_for(matrix: Matrix, tmp_path: Path) -> None:
    newer = next_minor(newest_built(matrix, "cuda130"))
    pythons, platforms = matrix.variants["cuda130"].pythons, ["x86_64", "aarch64"]
    files = upstream_files(
        page(*wheels(f"{newer}rc1", "cu130", pythons, platforms), *wheels(f"{newer}.dev20990101", "cu126", ["3.11"])),
        url=URL,
    )
    assert missing(matrix, files) == ()
    found = {f.label: f for f in missing(matrix, files, pre=True)}
    candidate, nightly = found["cu130"], found["cu126"]
    assert (nightly.torch, nightly.blocked is not None) == (f"{newer}.dev20990101", True)  # no release to pin
    diff = matrix_diff(MATRIX.read_text(encoding="utf-8"), [candidate, nightly], matrix)
    assert applied(diff, tmp_path).variants[f"cuda130-{torch_tag(newer)}"].torch == f"{newer}rc1"


def test_a_rule_of_other_torch_keeps_a_release_out_of_the_change(matrix: Matrix) -> None:
    cuda130 = matrix.variants["cuda130"]
    major, minor, patch = cuda130.torch.split(".")
    same_minor = f"{major}.{minor}.{int(patch) + 1}"
    newer = next_minor(newest_built(matrix, "cuda130"))
    files = upstream_files(
        page(
            *wheels(same_minor, "cu130", cuda130.pythons, ["x86_64", "aarch64"]),
            *wheels(newer, "cu130", cuda130.pythons[1:], ["x86_64", "aarch64"]),  # its oldest Python dropped
        ),
        url=URL,
    )
    patch_release, short = missing(matrix, files)
    assert patch_release.blocked is not None and "same minor release" in patch_release.blocked
    assert short.blocked is not None and f"Python {cuda130.pythons[0]} on x86_64" in short.blocked
    assert matrix_diff(MATRIX.read_text(encoding="utf-8"), [patch_release, short], matrix) == ""
    text = report([patch_release, short], url=URL)
    assert "left out of the change" in text and "2 found, 0 in the change" in text


# --- the text edits ---------------------------------------------------------------------

LAYOUTS = """[variants.a]
torch = "1.0.0"
other-torch = [  # kept
    "0.8.0",
    "0.9.0"  # no comma
]

[variants.a.aarch64]
torch = "1.0.0"

# b's own comment
[variants.b]
torch = "1.0.0"
other-torch = ["0.9.0",]  # a trailing comma
"""


def test_edits_keep_the_layout_of_arrays_and_tables() -> None:
    lines = LAYOUTS.splitlines()
    edits = [
        add_other_torch(lines, "a", ["1.1.0"], comment="x"),
        add_other_torch(lines, "b", ["1.1.0", "1.2.0"], comment="x"),
        insert_after(lines, "a", ["[variants.c]", 'torch = "2.0.0"']),
        insert_after(lines, "b", ["[variants.d]", 'torch = "2.0.0"']),
    ]
    text = "\n".join(apply(lines, edits))
    assert '    "0.9.0",  # no comma\n    "1.1.0",\n]' in text
    assert 'other-torch = ["0.9.0", "1.1.0", "1.2.0"]  # a trailing comma' in text
    assert 'torch = "1.0.0"\n\n[variants.c]\ntorch = "2.0.0"\n\n# b\'s own comment\n[variants.b]' in text
    assert text.endswith('# a trailing comma\n\n[variants.d]\ntorch = "2.0.0"')


def test_a_diff_of_a_file_without_its_last_newline_applies(tmp_path: Path) -> None:
    before = '[variants.a]\ntorch = "1.0.0"'
    after = "\n".join(apply(before.splitlines(), [insert_after(before.splitlines(), "a", ["[variants.b]"])]))
    diff = unified_diff(before, after, path="m.toml")
    assert "\\ No newline at end of file" in diff
    (tmp_path / "m.toml").write_text(before)
    git_apply(diff, tmp_path)
    assert (tmp_path / "m.toml").read_text() == after
    assert unified_diff(before, before, path="m.toml") == ""


# --- the command and its docs -----------------------------------------------------------


def test_the_setting_names_the_index_root() -> None:
    settings = Settings.from_environ({"WHEELMILL_UPSTREAM_INDEX": "https://mirror.example/whl/"})
    assert settings.upstream_index == "https://mirror.example/whl"
    assert Settings.from_environ({}).upstream_index is None


def test_matrix_options_before_upstream_are_refused_and_matrix_still_runs(cli: CliRunner) -> None:
    refused = cli("--recipes", str(ROOT / "recipes"), "matrix", "--json", "upstream")
    assert refused.code == UsageError.exit_code
    assert refused.err.startswith("wheelmill: error: matrix upstream: --json is an option of `wheelmill matrix`")
    assert "; fix: " in refused.err and "Traceback" not in refused.err
    assert cli("--recipes", str(ROOT / "recipes"), "matrix", "--json").code == 0


def docs_example() -> tuple[list[Finding], str, str]:
    """The findings of the docs' example (the page it describes), and its two blocks of output."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("## New torch releases, on day one")
    terminal, diff = re.findall(r"```\n(upstream: .*?|--- a/recipes/matrix.toml\n.*?)```", text[start:], re.DOTALL)[:2]
    matrix = load_matrix(MATRIX)
    files = upstream_files(
        page(
            *wheels("2.15.0", "cu130", ["3.10", "3.11", "3.12", "3.13", "3.14"], ["x86_64", "aarch64"]),
            *wheels("2.14.2", "cu130", ["3.10", "3.11", "3.12", "3.13"], ["x86_64", "aarch64"]),
            *wheels("2.15.0", "cu132", ["3.11", "3.12", "3.13", "3.14"], ["x86_64", "aarch64"]),
        ),
        url=URL,
    )
    return list(missing(matrix, files)), terminal, diff


def test_the_docs_example_is_what_the_command_prints() -> None:
    findings, terminal, diff = docs_example()
    assert report(findings, url=URL) == terminal
    made = matrix_diff(MATRIX.read_text(encoding="utf-8"), findings, load_matrix(MATRIX))
    changes = [line for line in made.splitlines() if line[:1] in "+-"]
    assert [line for line in diff.splitlines() if line[:1] in "+-"] == changes


def _list(items: Iterable[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def test_a_change_that_would_not_load_is_left_out_of_the_diff(matrix: Matrix) -> None:
    """The command loads each change with the matrix before it offers it: here one that a rule
    of the loader refuses (a second release of a minor other-torch has), made by hand."""
    cuda130 = matrix.variants["cuda130"]
    twin = f"{cuda130.other_torch[0].rsplit('.', 1)[0]}.9"
    files = upstream_files(page(*wheels(twin, "cu130", cuda130.pythons, ["x86_64", "aarch64"])), url=URL)
    release = releases(files)["cu130"][0]
    finding = Finding(kind="newer-torch", release=release, variant="cuda130")
    (kept,) = _loadable([finding], matrix, MATRIX.read_text(encoding="utf-8"))
    assert kept.blocked is not None and kept.blocked.startswith("the change would not load: variants.cuda130")
    assert "same minor release" in kept.blocked and matrix_diff(MATRIX.read_text(), [kept], matrix) == ""
