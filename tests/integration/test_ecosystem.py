"""The ecosystem recipes that can be built on a 2-core machine without a GPU, built for real:
deepspeed with its CPU Adam op prebuilt, and xformers with its operator library, in the cpu
cell; and a git source fetched from a mirror that a setting redirects it to, submodule
included, end to end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.integration.test_cells import ROOT, all_checks, assert_cell_built, nox, report

pytestmark = pytest.mark.integration


def test_deepspeed_and_xformers_build_in_the_cpu_cell(tmp_path: Path) -> None:
    result = nox("build-cpu-py311", tmp_path, "--recipe", "deepspeed", "--recipe", "xformers", "--no-mirror")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    print(result.stdout)  # the summary tables, with times: what docs/benchmarks.md quotes
    data = assert_cell_built(tmp_path, "cpu-py311", {"deepspeed", "xformers"}, "cpu", "2.13.0+cpu")
    checks = {(step["recipe"], c["name"]): c for step in data["steps"] for c in step["checks"]}
    # xformers' CPU build reaches torch through the stable C shims alone (xFormers ships stable-ABI builds)
    assert checks[("xformers", "abi")]["detail"] == "python none; torch stable>=2.13.0"
    assert checks[("deepspeed", "abi")]["detail"] == "python full; torch unstable"
    assert (
        checks[("deepspeed", "smoke")]["verdict"] == "pass"
        and "cpu_adam step" in checks[("deepspeed", "smoke")]["detail"]
    )
    assert (
        checks[("xformers", "smoke")]["verdict"] == "pass"
        and "with its C++ library" in checks[("xformers", "smoke")]["detail"]
    )
    assert "patched with deepspeed-cpu-target.patch" in checks[("deepspeed", "source")]["detail"]
    wheels = {r["name"]: Path(r["wheel"]["path"]) for r in data["recipes"]}
    with zipfile.ZipFile(wheels["deepspeed"]) as zf:
        installed = next(n for n in zf.namelist() if n.endswith("git_version_info_installed.py"))
        assert "'cpu_adam': 1" in zf.read(installed).decode(), "the op is prebuilt, not left to JIT"
        op = next(n for n in zf.namelist() if "cpu_adam_op" in n and n.endswith(".so"))
        library = tmp_path / "cpu_adam_op.so"
        library.write_bytes(zf.read(op))
    # Built for the named CPU target, not the build machine's: no AVX-512 register in it.
    # objdump (binutils) is a prerequisite scripts/setup --system installs: never a silent pass.
    assert shutil.which("objdump"), "objdump is needed to read the op's instructions (scripts/setup --system)"
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True, check=True
    ).stdout
    assert "%zmm" not in listing and "ymm" in listing


def _git(*args: str, cwd: Path) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    done = subprocess.run(
        ["git", "-c", "protocol.file.allow=always", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _bare_mirror(mirror: Path, name: str, tree: Path) -> Path:
    """``tree`` committed into a bare repository ``<mirror>/<name>.git``."""
    work = mirror.parent / "work" / name
    shutil.copytree(tree, work)
    _git("init", "-q", "-b", "main", cwd=work)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "import", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(mirror / f"{name}.git"), cwd=mirror.parent)
    return work


def test_git_source_is_fetched_from_its_mirror(tmp_path: Path) -> None:
    """A recipe names its upstream (a host that does not exist); one setting sends git, and
    the submodule the source declares, to local bare repositories instead."""
    mirror = tmp_path / "mirror" / "example"
    mirror.mkdir(parents=True)
    # The submodule: a file that only its own (mirrored) repository holds.
    vendor = tmp_path / "vendor-src"
    vendor.mkdir()
    (vendor / "scale.h").write_text("#pragma once\nconstexpr double kVendorScale = 1.0;\n")
    _bare_mirror(mirror, "vendor", vendor)
    work = _bare_mirror(mirror, "cpp-ops", ROOT / "extensions" / "cpp-ops")
    # Added from the mirror, then declared with its upstream URL, as a real .gitmodules says.
    _git("submodule", "add", "-q", f"file://{mirror / 'vendor.git'}", "third_party/vendor", cwd=work)
    _git(
        "config",
        "-f",
        ".gitmodules",
        "submodule.third_party/vendor.url",
        "https://git.example.invalid/example/vendor.git",
        cwd=work,
    )
    _git("commit", "-q", "-am", "vendor submodule", cwd=work)
    _git("push", "-q", str(mirror / "cpp-ops.git"), "main", cwd=work)
    rev = _git("rev-parse", "HEAD", cwd=work)
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes, ignore=shutil.ignore_patterns("*.toml"))
    shutil.copy(ROOT / "recipes" / "matrix.toml", recipes)
    recipe = (ROOT / "recipes" / "example-cpp-ops.toml").read_text()
    recipe = recipe.replace(
        'path = "../extensions/cpp-ops"',
        f'git = "https://git.example.invalid/example/cpp-ops.git"\nrev = "{rev}"\nsubmodules = true',
    )
    # The smoke tests came with the source tree; the source is now the checkout.
    (recipes / "example-cpp-ops.toml").write_text(recipe)
    output = tmp_path / "out"
    env = {
        **os.environ,
        "WHEELMILL_OUTPUT": str(output),
        "WHEELMILL_RECIPES": str(recipes),
        "WHEELMILL_ENGINE": "none",
        "WHEELMILL_GIT_MIRRORS": f"https://git.example.invalid/=file://{tmp_path / 'mirror'}/",
    }
    command = [
        sys.executable,
        "-m",
        "wheelmill",
        "build",
        "--cell",
        "cpu-py311",
        "--recipe",
        "example-cpp-ops",
        "--no-publish",
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    data = report(output, "cpu-py311")
    source = next(c for c in all_checks(data) if c["name"] == "source")
    assert f"https://git.example.invalid/example/cpp-ops.git at {rev} (from file://" in source["detail"]
    checkout = output / "cpu-py311" / "src" / "example-cpp-ops"
    assert (checkout / "third_party" / "vendor" / "scale.h").is_file(), "the submodule came from its mirror too"
    # Without the setting the upstream is unreachable: one line, the fetch step, exit 6.
    del env["WHEELMILL_GIT_MIRRORS"]
    env["WHEELMILL_RETRIES"] = "1"
    failed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in failed.stderr.splitlines() if line.strip()]
    assert failed.returncode == 6, failed.stdout[-2000:] + failed.stderr
    assert len(lines) == 1 and "git.example.invalid" in lines[0] and "fix:" in lines[0], lines
    assert "Traceback" not in failed.stdout + failed.stderr


@pytest.mark.cuda
def test_deepspeed_builds_for_one_arch_into_its_slim_channel(tmp_path: Path) -> None:
    """A CUDA recipe of the list, for a single arch: the slim cell cuda130-sm90 compiles
    DeepSpeed's fused optimizers for sm_90 only and publishes them apart, in cu130-sm90."""
    if shutil.which("nvcc", path="/usr/local/cuda-13.0/bin:" + os.environ.get("CUDA_HOME", "") + "/bin") is None:
        pytest.skip("no CUDA 13.0 toolkit")
    result = nox("build-cuda130-sm90-py311", tmp_path, "--recipe", "deepspeed")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    print(result.stdout)
    data = assert_cell_built(
        tmp_path, "cuda130-sm90-py311", {"deepspeed"}, "cu130.sm90", "2.14.1", channel_name="cu130-sm90"
    )
    checks = {(step["recipe"], c["name"]): c for step in data["steps"] for c in step["checks"]}
    assert checks[("deepspeed", "device-code")]["detail"] == "2 libraries carry exactly 9.0"
    assert "'fused_adam', 'fused_lamb'" in checks[("deepspeed", "smoke")]["detail"]
