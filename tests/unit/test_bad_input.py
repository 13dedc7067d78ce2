"""Bad input gets one line naming the file, the key or the step and the fix, and its own
exit code; never a traceback, and nothing written."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from tests.unit.test_report import written
from tests.wheels import make_wheel
from wheelmill.errors import ChannelError, ConfigError, FetchError, PrecheckError, SelectionError, UsageError
from wheelmill.index.roots import Index

GOOD_RECIPE = """
name = "broken"
[source]
path = "../extensions/cpp-ops"
"""

# (case id, recipe text for recipes/broken.toml, substrings the one line must contain)
RECIPE_CASES = [
    ("toml-syntax", 'name = "broken"\n[source\npath = "x"\n', ["broken.toml", "invalid TOML", "line 2"]),
    (
        "unknown-key-typo",
        GOOD_RECIPE + '[build]\ncomand = ["make"]\n',
        ["build", "unknown key 'comand'", "perhaps you meant 'command'"],
    ),
    ("missing-source", 'name = "broken"\n', ["missing required key 'source'"]),
    (
        "two-source-kinds",
        GOOD_RECIPE + 'sdist = "x==1"\nsha256 = "' + "a" * 64 + '"\n',
        ["exactly one of path, sdist, url, git", "found: path, sdist"],
    ),
    (
        "sdist-without-sha256",
        'name = "broken"\n[source]\nsdist = "torchsort==0.1.10"\n',
        ["source.sha256", "needs its sha256"],
    ),
    (
        "sha256-not-hex",
        'name = "broken"\n[source]\nsdist = "torchsort==0.1.10"\nsha256 = "abc"\n',
        ["source.sha256", "64 lower-case hex"],
    ),
    (
        "sdist-not-pinned",
        'name = "broken"\n[source]\nsdist = "torchsort>=0.1"\nsha256 = "' + "a" * 64 + '"\n',
        ["source.sdist", "project==version"],
    ),
    (
        "git-branch-not-commit",
        'name = "broken"\n[source]\ngit = "https://example.invalid/x.git"\nrev = "main"\n',
        ["source.rev", "40-hex commit"],
    ),
    (
        "git-without-rev",
        'name = "broken"\n[source]\ngit = "https://example.invalid/x.git"\n',
        ["source.rev", "pinned commit"],
    ),
    (
        "name-differs-from-file",
        GOOD_RECIPE.replace('"broken"', '"other"'),
        ["name: 'other' differs from the file name", "rename the file"],
    ),
    (
        "unknown-dependency",
        GOOD_RECIPE.replace('name = "broken"', 'name = "broken"\ndepends-on = ["example-cpp-op"]'),
        ["depends-on", "unknown recipe 'example-cpp-op'", "perhaps you meant 'example-cpp-ops'"],
    ),
    (
        "self-dependency",
        GOOD_RECIPE.replace('name = "broken"', 'name = "broken"\ndepends-on = ["broken"]'),
        ["cannot depend on itself"],
    ),
    (
        "bad-arch-list",
        GOOD_RECIPE + '[build]\narch-list = "8.0;ampere"\n',
        ["build.arch-list", "'ampere' is not a CUDA arch"],
    ),
    ("bad-torch-op", GOOD_RECIPE + '[checks]\ntorch-ops = ["rms_norm"]\n', ["checks.torch-ops[0]", "namespace::op"]),
    ("bad-size", GOOD_RECIPE + '[checks]\nmax-wheel-size = "big"\n', ["checks.max-wheel-size", "64MiB"]),
    ("path-missing", 'name = "broken"\n[source]\npath = "../nowhere"\n', ["source.path", "is not a directory"]),
    ("env-not-string", GOOD_RECIPE + "[build]\nenv = { MAX_JOBS = 4 }\n", ["build.env.MAX_JOBS", "as strings"]),
    (
        "override-without-cells",
        GOOD_RECIPE + '[[override]]\n[override.build]\narch-list = "8.0"\n',
        ["override[0]", "missing required key 'cells'"],
    ),
    (
        "override-unknown-table",
        GOOD_RECIPE + '[[override]]\ncells = ["cuda*"]\n[override.sources]\npath = "."\n',
        ["override[0]", "unknown key 'sources'"],
    ),
    (
        "override-source-two-kinds",
        GOOD_RECIPE + '[[override]]\ncells = ["cuda*"]\n[override.source]\npath = "."\nsdist = "x==1"\n',
        ["override[0].source", "exactly one of"],
    ),
    (
        "patch-missing",
        'name = "broken"\n[source]\npath = "."\npatches = ["fix.patch"]\n',
        ["source.patches", "fix.patch", "is not a file"],
    ),
    (
        "submodules-not-git",
        'name = "broken"\n[source]\npath = "."\nsubmodules = true\n',
        ["source.submodules", "only a git source"],
    ),
    (
        "after-unknown",
        GOOD_RECIPE.replace('name = "broken"', 'name = "broken"\nafter = ["torhc"]'),
        ["after: unknown recipe 'torhc'", "perhaps you meant 'torch'"],
    ),
    (
        "system-ucc-without-ucc",
        GOOD_RECIPE + '[build]\nenv = { USE_SYSTEM_UCC = "1" }\n',
        ["build.env.USE_SYSTEM_UCC", "does nothing without USE_UCC=1", 'set USE_UCC = "1"'],
    ),
    ("torch-pin-policy", GOOD_RECIPE + '[requirements]\ntorch = "latest"\n', ["requirements.torch", '"exact"']),
    # What only a cell can tell: `validate` plans every cell.
    (
        "cuda-archs-for-rocm-cells",
        GOOD_RECIPE + '[build]\narch-list = "8.0;9.0"\n',
        ["build.arch-list", "'8.0;9.0' is no ROCm arch list", "builds for ROCm", 'cells = ["rocm*"]'],
    ),
    (
        "unknown-placeholder-in-env",
        GOOD_RECIPE + '[build]\nenv = { OUT = "{unknown}/x" }\n',
        ["build.env.OUT", "unknown placeholder {unknown}", "{cell}, {dist}"],
    ),
    (
        "dist-placeholder-in-smoke",
        GOOD_RECIPE + '[checks]\nsmoke = ["ls", "{dist}"]\n',
        ["checks.smoke", "unknown placeholder {dist}"],
    ),
    (
        "unbalanced-brace",
        GOOD_RECIPE + '[build]\ncommand = ["{python", "-c", "pass"]\n',
        ["build.command", "is not a template", "{{"],
    ),
    (
        "cells-match-no-cell",
        GOOD_RECIPE.replace('name = "broken"', 'name = "broken"\ncells = ["cuda999*"]'),
        ["cells: cuda999* match no cell"],
    ),
    (
        "override-matches-no-cell",
        GOOD_RECIPE + '[[override]]\ncells = ["cuda13-*"]\n[override.build]\narch-list = "8.0"\n',
        ["override[0].cells: cuda13-* match no cell"],
    ),
    (
        "duplicated-arch",
        GOOD_RECIPE + '[[override]]\ncells = ["cuda*"]\n[override.build]\narch-list = "8.0;9.0;8.0"\n',
        ["arch-list", "8.0 listed more than once"],
    ),
    (
        "override-for-a-slim-cell-alone",
        GOOD_RECIPE + '[[override]]\ncells = ["cuda130-sm90-*"]\n[override.build]\narch-list = "8.0"\n',
        ["override[0].cells: cuda130-sm90-* match no cell", "a slim cell takes its parent's recipes"],
    ),
]


@pytest.mark.parametrize(("case", "text", "expected"), RECIPE_CASES, ids=[c[0] for c in RECIPE_CASES])
def test_malformed_recipe_is_one_line_with_a_fix(
    cli: CliRunner, recipes_copy: Path, case: str, text: str, expected: list[str]
) -> None:
    (recipes_copy / "broken.toml").write_text(text)
    result = cli("--recipes", str(recipes_copy), "validate")
    assert_one_line_error(
        result.err, code=result.code, expected_code=ConfigError.exit_code, expected=["broken.toml", *expected]
    )


def test_dependency_cycle_names_the_cycle(cli: CliRunner, recipes_copy: Path) -> None:
    (recipes_copy / "a.toml").write_text(
        GOOD_RECIPE.replace('"broken"', '"a"').replace('name = "a"', 'name = "a"\ndepends-on = ["b"]')
    )
    (recipes_copy / "b.toml").write_text(
        GOOD_RECIPE.replace('"broken"', '"b"').replace('name = "b"', 'name = "b"\ndepends-on = ["a"]')
    )
    result = cli("--recipes", str(recipes_copy), "validate")
    assert_one_line_error(
        result.err, code=result.code, expected_code=ConfigError.exit_code, expected=["depends-on: cycle", "DAG"]
    )


MATRIX_CASES = [
    (
        "variant-python-not-listed",
        ('pythons = ["3.9", "3.10", "3.11", "3.12", "3.13"]', 'pythons = ["3.10", "3.11", "3.12", "3.13"]'),
        ["variants.cuda118.pythons", "3.9 is not in the top-level pythons"],
    ),
    (
        "label-mismatch",
        ('label = "cu118"', 'label = "cu117"'),
        ["variants.cuda118.label", "does not match toolkit 11.8.0", 'set label = "cu118"'],
    ),
    ("toolkit-mismatch", ('toolkit = "11.8.0"', 'toolkit = "12.1.0"'), ["variants.cuda118"]),
    (
        "toolkit-not-a-cuda-release",
        ('toolkit = "11.8.0"', 'toolkit = "1.18.0"'),
        ["variants.cuda118.toolkit", "1.18.0 is no CUDA release", "11.8.0"],
    ),
    (
        "bad-family",
        ('family = "rocm"\ntoolkit = "6.2.4"', 'family = "metal"\ntoolkit = "6.2.4"'),
        ["variants.rocm62.family", "cpu, cuda or rocm"],
    ),
    ("bad-variant-name", ("[variants.cuda118]", "[variants.cuda-11.8]"), ["variants", "cudaXYZ"]),
    (
        "bad-matrix-arch",
        ('arch-list = "3.7;5.0;6.0;7.0;7.5;8.0;8.6;9.0"', 'arch-list = "3.7;sm_50"'),
        ["variants.cuda118.arch-list", "'sm_50' is not a CUDA arch"],
    ),
    (
        "missing-torch-pin",
        ('label = "cu118"\ntorch = "2.7.1"', 'label = "cu118"'),
        ["variants.cuda118", "missing required key 'torch'"],
    ),
    ("bad-glibc", ('glibc = "manylinux_2_17"', 'glibc = "centos7"'), ["variants.cuda121.glibc", "manylinux_2_28"]),
    (
        "absurd-glibc",
        ('glibc = "manylinux_2_17"', 'glibc = "manylinux_2_99"'),
        ["variants.cuda121.glibc", "'manylinux_2_99' is no manylinux policy"],
    ),
    (
        "duplicated-arch",
        ('arch-list = "3.7;5.0;6.0;7.0;7.5;8.0;8.6;9.0"', 'arch-list = "3.7;5.0;5.0"'),
        ["variants.cuda118.arch-list", "5.0 listed more than once"],
    ),
    (
        "slim-arch-not-in-the-list",
        ('slim = ["9.0"]', 'slim = ["9.0a"]'),
        [
            "variants.cuda130.slim",
            "9.0a is not in its arch-list",
            "perhaps you meant '9.0'",
            "slim one of: 7.5, 8.0, 8.6, 9.0, 10.0, 12.0",
        ],
    ),
    (
        "slim-cuda-arch-in-rocm",
        ('slim = ["gfx942"]', 'slim = ["9.0"]'),
        ["variants.rocm64.slim", "'9.0' is no ROCm arch", 'e.g. slim = ["gfx1201"]'],
    ),
    (
        "slim-rocm-target-in-cuda",
        ('slim = ["9.0"]', 'slim = ["gfx942"]'),
        ["variants.cuda130.slim", "'gfx942' is no CUDA arch"],
    ),
    (
        "slim-duplicated",
        ('slim = ["9.0"]', 'slim = ["9.0", "10.0", "9.0"]'),
        ["variants.cuda130.slim", "9.0 listed more than once", "each arch once"],
    ),
    (
        "slim-on-cpu",
        ('[variants.cpu]\nfamily = "cpu"', '[variants.cpu]\nslim = ["9.0"]\nfamily = "cpu"'),
        ["variants.cpu.slim", "a cpu variant", "remove slim"],
    ),
    (
        "slim-with-ptx",
        ('slim = ["9.0"]', 'slim = ["12.0+PTX"]'),
        ["variants.cuda130.slim[0]", "'12.0+PTX' does not have the expected form", "without +PTX"],
    ),
    (
        "other-torch-of-the-same-minor",
        ('other-torch = ["2.12.0"]', 'other-torch = ["2.12.0", "2.14.0"]'),
        ["variants.cuda130.other-torch", "2.14.0 is the same minor release as 2.14.1", "one release per torch minor"],
    ),
    (
        "other-torch-not-a-release",
        ('other-torch = ["2.12.0"]', 'other-torch = ["2.12"]'),
        ["variants.cuda130.other-torch[0]", "'2.12' does not have the expected form", "list exact torch releases"],
    ),
    (
        "toolkit-wheels-of-another-toolkit",
        ('"nvidia-cuda-nvcc==13.0.88"', '"nvidia-cuda-nvcc==12.8.93"'),
        ["variants.cuda130.toolkit-wheels", "'nvidia-cuda-nvcc==12.8.93' is not of toolkit 13.0"],
    ),
    (
        "gpu-runner-of-two-platforms",
        ('"cuda130*-aarch64" = "linux-gpu-gh200", ', ""),
        ["ci.gpu-runners", "'cuda130*' sends aarch64 and x86_64 cells to one runner", '"cuda130*-aarch64" = '],
    ),
    (
        "platforms-not-x86-first",
        (
            'platforms = ["x86_64", "aarch64"]\n\n[variants.cpu.aarch64]',
            'platforms = ["aarch64"]\n\n[variants.cpu.aarch64]',
        ),
        ["variants.cpu.platforms", "does not start with x86_64", 'platforms = ["x86_64", "aarch64"]'],
    ),
    ("unknown-platform", ('platforms = ["x86_64", "aarch64"]', 'platforms = ["x86_64", "arm64"]'), ["platforms"]),
    (
        "platform-arch-list-bad",
        ('arch-list = "8.0;9.0;10.0;11.0;12.0+PTX"', 'arch-list = "8.0;sm_90"'),
        ["variants.cuda130.aarch64.arch-list", "'sm_90' is not a CUDA arch"],
    ),
    (
        "platform-glibc-unknown",
        ('torch = "2.10.0"\ntorch-on-pypi = true', 'torch = "2.10.0"\ntorch-on-pypi = true\nglibc = "manylinux_2_3"'),
        ["variants.cpu.aarch64.glibc", "'manylinux_2_3' is no manylinux policy of aarch64"],
    ),
    (
        "platform-table-unknown-key",
        ('torch = "2.10.0"\ntorch-on-pypi = true', 'torch = "2.10.0"\ntorch-on-pypi = true\ntoolkit = "13.0.2"'),
        ["variants.cpu.aarch64", "unknown key 'toolkit'", "arch-list, glibc, torch, torch-on-pypi"],
    ),
]


@pytest.mark.parametrize(("case", "edit", "expected"), MATRIX_CASES, ids=[c[0] for c in MATRIX_CASES])
def test_malformed_matrix_is_one_line_with_a_fix(
    cli: CliRunner, recipes_copy: Path, case: str, edit: tuple[str, str], expected: list[str]
) -> None:
    matrix = recipes_copy / "matrix.toml"
    text = matrix.read_text()
    assert edit[0] in text, "the fixture edit must apply"
    matrix.write_text(text.replace(edit[0], edit[1], 1))
    result = cli("--recipes", str(recipes_copy), "validate")
    assert_one_line_error(
        result.err, code=result.code, expected_code=ConfigError.exit_code, expected=["matrix.toml", *expected]
    )


CLI_CASES = [
    (
        "unknown-variant",
        ["plan", "--cell", "cuda999-py311"],
        SelectionError.exit_code,
        ["unknown variant 'cuda999'", "cuda118", "cuda130"],
    ),
    (
        "typo-variant",
        ["plan", "--cell", "cuda13-py311"],
        SelectionError.exit_code,
        ["unknown variant 'cuda13'", "perhaps you meant 'cuda130'"],
    ),
    ("unknown-python", ["plan", "--cell", "cpu-py38"], SelectionError.exit_code, ["unknown Python 3.8", "3.9, 3.10"]),
    (
        "typo-slim-variant",
        ["plan", "--cell", "cuda130-sm9-py311"],
        SelectionError.exit_code,
        ["variant cuda130 has no slim variant 'cuda130-sm9'", "perhaps you meant 'cuda130-sm90'"],
    ),
    (
        "undeclared-torch",
        ["plan", "--cell", "cuda130-sm90-torch2.9-py311"],
        SelectionError.exit_code,
        [
            "variant cuda130-sm90 builds no torch 2.9 (it builds 2.14.1, 2.12.0)",
            "add the torch release to variants.cuda130.other-torch",
        ],
    ),
    (
        "undeclared-slim-variant",
        ["plan", "--cell", "cuda130-sm80-py311"],
        SelectionError.exit_code,
        [
            "no slim variant 'cuda130-sm80'",
            "use one of its slim variants (cuda130-sm90)",
            "add the arch to variants.cuda130.slim",
        ],
    ),
    (
        "slim-of-a-typo",
        ["plan", "--cell", "cuda13-sm90-py311"],
        SelectionError.exit_code,
        ["unknown variant 'cuda13-sm90'", "perhaps you meant 'cuda130-sm90'"],
    ),
    (
        "unsupported-combination",
        ["plan", "--cell", "cuda130-py39"],
        SelectionError.exit_code,
        ["cuda130 does not support Python 3.9", "3.10, 3.11"],
    ),
    (
        "not-a-cell-id",
        ["plan", "--cell", "py311-cuda118"],
        SelectionError.exit_code,
        ["not a cell id", "<variant>-py<XY>"],
    ),
    ("glob-matches-nothing", ["plan", "--cell", "cuda1*-py39?"], SelectionError.exit_code, ["no cell matches"]),
    (
        "unknown-recipe",
        ["plan", "--cell", "cpu-py311", "--recipe", "torchsrot"],
        SelectionError.exit_code,
        ["unknown recipe 'torchsrot'", "perhaps you meant 'torchsort'"],
    ),
    (
        "recipe-not-for-cell",
        ["build", "--cell", "cpu-py311", "--recipe", "example-cuda-ops"],
        SelectionError.exit_code,
        ["not built for cell cpu-py311", "cuda*"],
    ),
    ("missing-cell", ["plan"], UsageError.exit_code, ["the following arguments are required: --cell", "--help"]),
    ("unknown-command", ["publish-all"], UsageError.exit_code, ["invalid choice"]),
]


@pytest.mark.parametrize(("case", "args", "code", "expected"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_command_line_is_one_line_with_a_fix(
    cli: CliRunner, repo_root: Path, case: str, args: list[str], code: int, expected: list[str]
) -> None:
    result = cli("--recipes", str(repo_root / "recipes"), *args)
    assert_one_line_error(result.err, code=result.code, expected_code=code, expected=expected)


def test_missing_recipes_directory(cli: CliRunner, tmp_path: Path) -> None:
    result = cli("--recipes", str(tmp_path / "nothing"), "matrix")
    assert_one_line_error(
        result.err, code=result.code, expected_code=UsageError.exit_code, expected=["no matrix.toml", "--recipes"]
    )


def test_bad_setting_is_one_line(cli: CliRunner, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHEELMILL_RETRIES", "many")
    result = cli("--recipes", str(repo_root / "recipes"), "plan", "--cell", "cpu-py311")
    assert_one_line_error(
        result.err,
        code=result.code,
        expected_code=ConfigError.exit_code,
        expected=["WHEELMILL_RETRIES", "not a number"],
    )


def test_bad_input_writes_nothing(cli: CliRunner, repo_root: Path, tmp_path: Path) -> None:
    result = cli("--recipes", str(repo_root / "recipes"), "build", "--cell", "cuda999-py311")
    assert result.code == SelectionError.exit_code
    assert not (tmp_path / "wheels").exists()


def assert_one_line_error(err: str, *, code: int, expected_code: int, expected: list[str]) -> None:
    lines = err.strip().splitlines()
    assert code == expected_code, err
    assert len(lines) == 1, err
    assert lines[0].startswith("wheelmill: error: ")
    assert "Traceback" not in err
    assert "; fix: " in lines[0], lines[0]
    for text in expected:
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"


@pytest.mark.parametrize(
    ("cell", "text", "expected"),
    [
        (
            "rocm62-py311",
            GOOD_RECIPE + '[build]\narch-list = "8.0;9.0"\n',
            ["'8.0;9.0' is no ROCm arch list", "rocm62-py311"],
        ),
        (
            "cpu-py311",
            GOOD_RECIPE + '[build]\nenv = { OUT = "{unknown}/x" }\n',
            ["build.env.OUT", "unknown placeholder {unknown}"],
        ),
    ],
)
def test_plan_stops_on_what_only_a_cell_can_tell(
    cli: CliRunner, recipes_copy: Path, cell: str, text: str, expected: list[str]
) -> None:
    (recipes_copy / "broken.toml").write_text(text)
    result = cli("--recipes", str(recipes_copy), "plan", "--cell", cell, "--recipe", "broken", "--engine", "none")
    assert_one_line_error(
        result.err, code=result.code, expected_code=ConfigError.exit_code, expected=["broken.toml", *expected]
    )


def test_publish_never_makes_up_a_channel(cli: CliRunner, repo_root: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "lib", "1.0", tag="py3-none-any")
    result = cli("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cu1300", str(wheel))
    assert_one_line_error(
        result.err,
        code=result.code,
        expected_code=SelectionError.exit_code,
        expected=["channel 'cu1300'", "perhaps you meant 'cu130'"],
    )
    assert not (tmp_path / "wheels").exists(), "nothing written"


SERVE_CASES = [
    ("port-out-of-range", ["--port", "70000"], ["--port: 70000 is not a port (0 to 65535"]),
    ("port-not-a-number", ["--port", "http"], ["--port: 'http' is not a port number"]),
    ("host-not-an-address", ["--host", "999.1.1.1", "--port", "0"], ["--host 999.1.1.1 --port 0: cannot listen there"]),
    ("idle-timeout-negative", ["--idle-timeout", "-5"], ["--idle-timeout: -5 is not a duration above 0 seconds"]),
    ("idle-timeout-nan", ["--idle-timeout", "nan"], ["--idle-timeout: nan is not a duration above 0 seconds"]),
]


@pytest.mark.parametrize(("case", "args", "expected"), SERVE_CASES, ids=[c[0] for c in SERVE_CASES])
def test_index_serve_refuses_what_it_cannot_listen_with(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, args: list[str], expected: list[str]
) -> None:
    """An address or timeout the server cannot work with is the user's to fix (exit 2), said
    before anything listens: never a server that starts and then drops every request."""
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    result = cli("index", "serve", *args)
    assert_one_line_error(result.err, code=result.code, expected_code=UsageError.exit_code, expected=expected)


def test_index_serve_names_a_port_in_use_and_an_access_log_it_cannot_open(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = cli("index", "serve", "--port", port)
    assert_one_line_error(
        result.err, code=result.code, expected_code=UsageError.exit_code, expected=[f"--port {port}: in use", "another"]
    )
    log = tmp_path / "missing" / "access.log"
    result = cli("index", "serve", "--port", "0", "--access-log", str(log))
    assert_one_line_error(
        result.err, code=result.code, expected_code=UsageError.exit_code, expected=[f"--access-log {log}", "directory"]
    )
    assert not (tmp_path / "missing").exists()


CONDA_CASES = [
    ("solve-cuda-not-a-version", ["conda", "solve", "--cuda", "abc", "torch"], ["--cuda: 'abc' is not a CUDA version"]),
    (
        "create-cuda-with-a-command",
        ["conda", "create", "{tmp}/env", "--cuda", "12.0;rm", "torch"],
        ["--cuda: '12.0;rm' is not a CUDA version"],
    ),
    ("create-into-a-file", ["conda", "create", "{tmp}/a-file", "torch"], ["{tmp}/a-file is a file, not a directory"]),
]


@pytest.mark.parametrize(("case", "args", "expected"), CONDA_CASES, ids=[c[0] for c in CONDA_CASES])
def test_conda_commands_refuse_what_is_no_cuda_version_or_no_prefix(
    cli: CliRunner, tmp_path: Path, case: str, args: list[str], expected: list[str]
) -> None:
    (tmp_path / "a-file").write_text("not an env\n")
    result = cli(*(arg.replace("{tmp}", str(tmp_path)) for arg in args))
    wanted = [text.replace("{tmp}", str(tmp_path)) for text in expected]
    assert_one_line_error(result.err, code=result.code, expected_code=UsageError.exit_code, expected=wanted)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "no env made"
    assert (tmp_path / "a-file").read_text() == "not an env\n"


def test_a_recipes_directory_of_a_teams_own_needs_no_schemas(cli: CliRunner, repo_root: Path, tmp_path: Path) -> None:
    """The schemas belong to wheelmill: a team keeping its matrix and recipes in a repository
    of its own validates and plans them without a schema/ directory beside them."""
    recipes = tmp_path / "team" / "recipes"
    recipes.mkdir(parents=True)
    shutil.copy(repo_root / "recipes" / "matrix.toml", recipes)
    shutil.copytree(repo_root / "extensions" / "cpp-ops", tmp_path / "team" / "extensions" / "cpp-ops")
    shutil.copy(repo_root / "recipes" / "example-cpp-ops.toml", recipes)
    result = cli("--recipes", str(recipes), "validate")
    assert result.code == 0 and "1 recipes (example-cpp-ops)" in result.out, result.err
    (recipes / "example-cpp-ops.toml").write_text(GOOD_RECIPE.replace("broken", "example-cpp-ops") + "colour = 1\n")
    result = cli("--recipes", str(recipes), "validate")
    assert_one_line_error(
        result.err, code=result.code, expected_code=ConfigError.exit_code, expected=["unknown key 'colour'"]
    )


@pytest.mark.parametrize("version", ["../../../x", "1.0/../../y", ".hidden", "latest"])
def test_a_release_version_never_becomes_a_path_outside_the_records(
    cli: CliRunner, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """A release version names a record under the index's records and nothing else: a JSON
    file outside (here one beside the index) is neither read nor printed."""
    index = tmp_path / "index"
    (tmp_path / "x.json").write_text('{"secret": "outside the index"}\n')
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(index))
    args = ("image", "build", "--cell", "cpu-py311", "--edition", "runtime", "--release", version)
    result = cli("--recipes", str(repo_root / "recipes"), *args)
    assert_one_line_error(
        result.err, code=result.code, expected_code=UsageError.exit_code, expected=[f"'{version}' is not a release"]
    )
    assert "secret" not in result.out + result.err


def test_mirror_refuses_another_cells_report_in_a_cells_directory(
    cli: CliRunner, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cpu-py311's report copied into cpu-py312's directory: mirroring cpu-py312 would put
    cpu-py311's closure into its channel. One line; the index is not touched."""
    layout, _report, _wheel = written(tmp_path / "wheels")
    other = tmp_path / "wheels" / "cpu-py312"
    other.mkdir()
    shutil.copy(layout.report, other / "report.json")
    monkeypatch.setenv("WHEELMILL_OUTPUT", str(tmp_path / "wheels"))
    result = cli("--recipes", str(repo_root / "recipes"), "mirror", "--cell", "cpu-py312")
    assert_one_line_error(
        result.err,
        code=result.code,
        expected_code=PrecheckError.exit_code,
        expected=["the report of cell cpu-py311, not of cpu-py312"],
    )
    assert not (tmp_path / "wheels" / "index").exists()


@pytest.mark.parametrize(
    ("tag", "why"),
    [
        ("cp312-cp312-manylinux_2_28_x86_64", "another Python"),
        ("cp311-cp311-win_amd64", "Windows"),
        ("cp311-cp311-macosx_11_0_arm64", "macOS"),
        ("cp311-cp311-manylinux_2_28_aarch64", "another machine"),
        ("cp312-abi3-manylinux_2_28_x86_64", "abi3 from a newer Python"),
    ],
)
def test_conda_package_refuses_a_wheel_of_another_python_or_platform(
    cli: CliRunner, repo_root: Path, tmp_path: Path, tag: str, why: str
) -> None:
    """A conda package in cpu-py311's channel installs into CPython 3.11 on linux-64: a wheel
    for anything else is refused before any package is made, the channel untouched."""
    good = make_wheel(tmp_path / "dist", "ops", "0.1.0+cpu", tag="cp311-cp311-manylinux_2_28_x86_64")
    bad = make_wheel(tmp_path / "dist", "other", "0.1.0+cpu", tag=tag)
    channel = tmp_path / "conda"
    args = ("conda", "package", "--cell", "cpu-py311", "--channel", str(channel), str(good), str(bad))
    result = cli("--recipes", str(repo_root / "recipes"), *args)
    expected = [f"conda package: {bad.name} is for {tag}, not for cell cpu-py311 (CPython 3.11, linux-64)"]
    assert_one_line_error(result.err, code=result.code, expected_code=UsageError.exit_code, expected=expected)
    assert not channel.exists(), why


def test_conda_seed_refuses_an_interpreter_of_another_python(cli: CliRunner, repo_root: Path, tmp_path: Path) -> None:
    """cpu-py312 seeded with this CPython 3.11: its channel's python package would be 3.11."""
    channel = tmp_path / "conda"
    make_wheel(tmp_path / "dist", "ops", "0.1.0+cpu", tag="cp312-cp312-manylinux_2_28_x86_64")
    args = ("conda", "seed", "--cell", "cpu-py312", "--channel", str(channel), "--python", sys.executable)
    result = cli("--recipes", str(repo_root / "recipes"), *args, "--wheels", str(tmp_path / "dist"))
    assert_one_line_error(
        result.err, code=result.code, expected_code=UsageError.exit_code, expected=["not the 3.12 of cell cpu-py312"]
    )
    assert not channel.exists()


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("requires_python", "its Requires-Python is 2000006 characters, more than a page lists (1024)"),
        ("gpu_archs", "gpu-archs.json unpacks to 2000048 bytes"),
    ],
)
def test_publish_refuses_metadata_that_would_fill_every_page(
    cli: CliRunner, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, expected: str
) -> None:
    """A Requires-Python or an arch record of megabytes would be in the pages every client
    downloads: refused with one line, the channel as it was."""
    huge = ",".join(["!=1.0"] * 333_334)
    if field == "requires_python":
        wheel = make_wheel(tmp_path / "dist", "lib", "1.0", tag="py3-none-any", requires_python=">=3" + huge)
    else:
        record = b'{"family": "cuda", "cell": "x", "arch_list": "' + b"8.0;" * 500_000 + b'"}'
        wheel = make_wheel(tmp_path / "dist", "lib", "1.0+cu130", tag="py3-none-any", gpu_archs=record)
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    result = cli("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cu130", str(wheel))
    assert_one_line_error(result.err, code=result.code, expected_code=ChannelError.exit_code, expected=[expected])
    assert not [p for p in (tmp_path / "index").rglob("*") if p.is_file()], "nothing published: no blob, entry or page"


def test_an_index_host_without_the_repository_publishes_into_channels_the_index_has(
    cli: CliRunner, repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No matrix.toml here (an index host): an existing channel takes the wheel; one the index
    lacks is refused with one line naming those it has, nothing made up."""
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    wheel = make_wheel(tmp_path / "dist", "lib", "1.0", tag="py3-none-any")
    assert cli("--recipes", str(repo_root / "recipes"), "publish", "--channel", "cu130", str(wheel)).code == 0
    host = tmp_path / "host"
    host.mkdir()
    other = make_wheel(tmp_path / "dist", "lib", "1.1", tag="py3-none-any")
    result = cli("--recipes", str(host), "publish", "--channel", "cu130", str(other))
    assert result.code == 0 and "added: cu130/lib-1.1-py3-none-any.whl" in result.out, result.err
    result = cli("--recipes", str(host), "publish", "--channel", "cu131", str(other))
    assert_one_line_error(
        result.err,
        code=result.code,
        expected_code=UsageError.exit_code,
        expected=["no matrix.toml in", "has no such channel", "perhaps you meant 'cu130'", "(cu130)"],
    )
    # The channels beside the blobs they share: cu130, and no cu131 made up.
    assert sorted(p.name for p in (tmp_path / "index").iterdir() if not p.name.startswith(".")) == ["blobs", "cu130"]
    assert Index(tree=tmp_path / "index").channel_names() == ["cu130"]


def test_a_damaged_conda_package_is_named_not_blamed_on_the_disk(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .conda that is no archive in a channel: one line naming it and the real fix, the
    invalid-package exit code, no indexer backtrace; the channel's repodata not rewritten."""
    channel = tmp_path / "index" / "conda" / "cpu"
    for subdir in ("linux-64", "noarch"):
        (channel / subdir).mkdir(parents=True)
    (channel / "linux-64" / "ops-0.1.0-cpu_py311_0.conda").write_bytes(b"not a zip archive\n")
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    result = cli("conda", "index")
    assert_one_line_error(
        result.err,
        code=result.code,
        expected_code=ChannelError.exit_code,
        expected=["linux-64/ops-0.1.0-cpu_py311_0.conda is not a .conda archive", "publish its wheel again"],
    )
    assert not (channel / "linux-64" / "repodata.json").exists()


BUCKET_ROOT_CASES = [
    (["index", "serve", "--port", "0"], ["it serves an index tree", "deploy/nginx-bucket.conf"]),
]


@pytest.mark.parametrize(("args", "expected"), BUCKET_ROOT_CASES, ids=[c[0][0] for c in BUCKET_ROOT_CASES])
def test_a_command_of_the_tree_refuses_a_bucket_root_before_any_work(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, args: list[str], expected: list[str]
) -> None:
    """With WHEELMILL_INDEX_ROOT an s3:// location, what works on a tree only says so in one
    line (exit 3) before it builds, binds or reaches anything: no server, no compiler run."""
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", "s3://wheels/index")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # nothing listens: reaching it would fail
    result = cli("--recipes", str(Path(__file__).resolve().parents[2] / "recipes"), *args)
    assert_one_line_error(result.err, code=result.code, expected_code=ConfigError.exit_code, expected=expected)


def test_mirror_takes_a_bucket_root_as_it_takes_a_tree(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mirror publishes through the one channel code, into a bucket's channel as into a
    tree's (its downloads under the output root): with an s3:// root it is not refused, and
    a cell built nowhere stops at its first own check, in one line, before the bucket is
    reached."""
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", "s3://wheels/index")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # nothing listens: reaching it would fail
    result = cli("--recipes", str(Path(__file__).resolve().parents[2] / "recipes"), "mirror", "--cell", "cpu-py311")
    assert_one_line_error(
        result.err,
        code=result.code,
        expected_code=PrecheckError.exit_code,
        expected=["cpu-py311/report.json: no report: the cell was not built here", "wheelmill build --cell"],
    )
    assert "works on an index tree only" not in result.err


@pytest.mark.parametrize(
    "args", [["conda", "seed", "--cell", "cpu-py311"], ["conda", "index"]], ids=["conda-seed", "conda-index"]
)
def test_the_conda_commands_take_a_bucket_root_as_they_take_a_tree(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """Not refused: a seed reads the cell's wheels from the bucket's channel, an index lists
    the bucket's conda channels; here a bucket that does not answer: one line naming it, the
    network's exit code."""
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", "s3://wheels/index")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    result = cli("--recipes", str(Path(__file__).resolve().parents[2] / "recipes"), *args)
    assert_one_line_error(
        result.err,
        code=result.code,
        expected_code=FetchError.exit_code,
        expected=["s3://wheels/index/: cannot ", "the object store did not answer", "AWS_ENDPOINT_URL_S3"],
    )


def test_an_index_root_that_is_no_s3_location_is_one_line(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", "s3://")
    result = cli("index", "verify")
    assert_one_line_error(
        result.err, code=result.code, expected_code=ConfigError.exit_code, expected=["is not an S3 location"]
    )
