"""Conda channels beside the wheel index, through the command as a user runs it: seeded with
this machine's CPython and a channel's wheels, solved by ``__cuda``, made into envs, offline.
py-rattler runs in the command's process only (its threads may outlive a finished call)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_cells import ROOT
from tests.integration.test_containers import answering
from tests.wheels import make_wheel
from wheelmill.machine.process import VIEW_ROOT

pytestmark = pytest.mark.integration
LINUX = "cp311-cp311-manylinux_2_28_x86_64"


def wheelmill(
    *args: str | Path, output: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "WHEELMILL_OUTPUT": str(output), **(env or {})}
    environ.pop("WHEELMILL_CONDA_CHANNELS", None)
    command = [sys.executable, "-m", "wheelmill", *map(str, args)]
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout, check=False)


def _variant_wheels(where: Path, label: str, torch: str) -> Path:
    """A variant's torch and an extension pinned to it: small, but real wheels."""
    make_wheel(
        where,
        "torch",
        f"{torch}+{label}",
        tag=LINUX,
        requires=["filelock"],
        files={"torch/__init__.py": f"__version__ = '{torch}+{label}'\n".encode()},
    )
    make_wheel(
        where,
        "ops",
        f"0.1.0+{label}",
        tag=LINUX,
        requires=[f"torch=={torch}+{label}"],
        files={"ops/__init__.py": f"LABEL = '{label}'\n".encode()},
    )
    make_wheel(where, "filelock", "3.16.1", tag="py3-none-any", files={"filelock/__init__.py": b""})
    make_wheel(where, "other", "1.0", tag="cp312-cp312-manylinux_2_28_x86_64")  # another Python's: left out
    return where


@pytest.fixture(scope="module")
def channels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("conda")
    cpu, cuda = root / "conda" / "cpu", root / "conda" / "cu130"
    made = (
        ("cpu-py311", cpu, _variant_wheels(root / "w-cpu", "cpu", "2.13.0")),
        ("cuda130-py311", cuda, _variant_wheels(root / "w-cu130", "cu130", "2.14.1")),
    )
    for cell, channel, wheels in made:
        done = wheelmill("conda", "seed", "--cell", cell, "--wheels", wheels, "--channel", channel, output=root)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "5 packages added, 0 already there, 1 wheels for other Pythons left out" in done.stdout
    return cpu, cuda


def _solve(channels: tuple[Path, Path], *extra: str) -> str:
    cpu, cuda = channels
    done = wheelmill("conda", "solve", "ops", "--channel", cuda, "--channel", cpu, *extra, output=cpu.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_solve_picks_the_cuda_build_only_where_a_cuda_driver_is(channels: tuple[Path, Path]) -> None:
    """Both channels offer ops 0.1.0; the CUDA build ranks higher but needs ``__cuda``."""
    without = _solve(channels)
    assert "ops 0.1.0 cpu_py311_0" in without and "torch 2.13.0 cpu_py311_0" in without
    assert "python 3.11." in without and "python_abi 3.11 0_cp311" in without and "filelock 3.16.1 py_0" in without
    with_gpu = _solve(channels, "--cuda", "13.0")
    assert "ops 0.1.0 cuda130_py311_100" in with_gpu and "torch 2.14.1 cuda130_py311_100" in with_gpu
    assert "ops 0.1.0 cpu_py311_0" in _solve(channels, "--cuda", "12.8"), (
        "a driver older than the build's CUDA gets the CPU build"
    )


def test_an_env_made_from_the_channel_runs_its_python_and_packages(channels: tuple[Path, Path], tmp_path: Path) -> None:
    cpu, _cuda = channels
    prefix = tmp_path / "env"
    done = wheelmill("conda", "create", prefix, "ops", "--channel", cpu, output=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The stdlib's modules that need its .so files too.
    imports = "import sys, sysconfig, pydoc, sqlite3, ssl, ops, torch, filelock"
    script = (
        f"{imports}; print(json.dumps([sys.prefix, sysconfig.get_paths()['include'], ops.LABEL, torch.__version__]))"
    )
    ran = subprocess.run(
        [prefix / "bin" / "python", "-c", f"import json; {script}"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/bin"},
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == [str(prefix), str(prefix / "include" / "python3.11"), "cpu", "2.13.0+cpu"], (
        "the interpreter's prefix is the env's"
    )
    strays = sorted(p.name for p in (prefix / "bin").iterdir() if not p.name.startswith("python"))
    assert strays == [], "bin/ holds the interpreter, not the scripts pip put beside the one it was made from"


def test_seeding_again_adds_nothing_and_other_bytes_under_a_published_name_are_refused(
    channels: tuple[Path, Path], tmp_path: Path
) -> None:
    cpu, _cuda = channels
    before = {p.name: p.stat().st_mtime_ns for p in cpu.glob("*/*.conda")}
    again = wheelmill(
        "conda",
        "seed",
        "--cell",
        "cpu-py311",
        "--wheels",
        cpu.parent.parent / "w-cpu",
        "--channel",
        cpu,
        output=tmp_path,
    )
    assert again.returncode == 0 and "0 packages added, 5 already there" in again.stdout, again.stdout + again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in cpu.glob("*/*.conda")} == before
    other_bytes = {"ops/__init__.py": b"LABEL = 'other bytes'\n"}
    changed = make_wheel(
        tmp_path / "changed", "ops", "0.1.0+cpu", tag=LINUX, requires=["torch==2.13.0+cpu"], files=other_bytes
    )
    refused = wheelmill("conda", "package", "--cell", "cpu-py311", changed, "--channel", cpu, output=tmp_path)
    assert refused.returncode == 14, refused.stdout + refused.stderr
    assert (
        refused.stderr.count("\n") == 1
        and "ops-0.1.0-cpu_py311_0.conda: already published with other bytes" in refused.stderr
    )
    assert {p.name: p.stat().st_mtime_ns for p in cpu.glob("*/*.conda")} == before


def test_an_unreachable_channel_or_an_unmet_spec_is_one_line_naming_it(
    channels: tuple[Path, Path], tmp_path: Path
) -> None:
    done = wheelmill("conda", "solve", "ops", "--channel", "http://127.0.0.1:9/nowhere", output=tmp_path)
    assert done.returncode == 6, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "http://127.0.0.1:9/nowhere" in done.stderr and "fix:" in done.stderr
    missing = wheelmill("conda", "solve", "ops", "--channel", tmp_path / "none", output=tmp_path)
    assert missing.returncode == 6 and missing.stderr.count("\n") == 1 and str(tmp_path / "none") in missing.stderr, (
        missing.stderr
    )
    unmet = wheelmill("conda", "solve", "ops >=2", "--channel", channels[0], output=tmp_path)
    assert unmet.returncode == 8 and unmet.stderr.count("\n") == 1 and "ops >=2 cannot be solved" in unmet.stderr, (
        unmet.stderr
    )


def test_the_same_wheel_gives_the_same_package_bytes_anywhere(channels: tuple[Path, Path], tmp_path: Path) -> None:
    cpu, _cuda = channels
    (wheel,) = (cpu.parent.parent / "w-cpu").glob("ops-*.whl")
    elsewhere = tmp_path / "deeper" / "channel"
    done = wheelmill("conda", "package", "--cell", "cpu-py311", wheel, "--channel", elsewhere, output=tmp_path)
    assert done.returncode == 0 and "added: linux-64/ops-0.1.0-cpu_py311_0.conda" in done.stdout, (
        done.stdout + done.stderr
    )
    name = "linux-64/ops-0.1.0-cpu_py311_0.conda"
    assert (elsewhere / name).read_bytes() == (cpu / name).read_bytes()


def test_conda_index_rewrites_what_a_killed_writer_left_unlisted(channels: tuple[Path, Path], tmp_path: Path) -> None:
    """A package renamed into place by a writer killed before it indexed: the next ``conda
    index`` lists it again."""
    cpu, _cuda = channels
    output = tmp_path / "out"
    conda = output / "index" / "conda"
    for channel in ("cpu", "test/cpu"):  # a channel of the release track, and one of the test track
        shutil.copytree(cpu, conda / channel)
        (conda / channel / "linux-64" / "repodata.json").write_text(
            json.dumps({"info": {"subdir": "linux-64"}, "packages": {}, "packages.conda": {}})
        )
    done = wheelmill("conda", "index", output=output)
    assert done.returncode == 0 and done.stdout.count("5 packages indexed") == 2, done.stdout + done.stderr
    for channel in ("cpu", "test/cpu"):
        listed = json.loads((conda / channel / "linux-64" / "repodata.json").read_text())["packages.conda"]
        assert {
            "ops-0.1.0-cpu_py311_0.conda",
            "torch-2.13.0-cpu_py311_0.conda",
            "python_abi-3.11-0_cp311.conda",
        } <= set(listed)
    assert not (conda / "test" / "linux-64").exists(), "a track's directory is no channel"


def _build(recipes: Path, output: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "WHEELMILL_OUTPUT": str(output),
        "WHEELMILL_ENGINE": "none",
        "WHEELMILL_ENV_BACKEND": "conda",
        **env,
    }
    command = [
        sys.executable,
        "-m",
        "wheelmill",
        "--recipes",
        str(recipes),
        "build",
        "--cell",
        "cpu-py311",
        "--recipe",
        "example-cpp-ops",
    ]
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=900, check=False)


def test_the_cpu_example_builds_in_a_conda_env_made_from_a_locked_local_channel(
    recipes_copy: Path, tmp_path: Path
) -> None:
    """The conda backend end to end on this machine: a channel seeded with the cell's CPython
    and the build tools of recipes/conda/envs.toml, a lock of it, the build in the env made
    from the lock; then a changed spec and an unreachable channel, each stopped in the first
    step before anything builds, with one line naming the lock or the channel."""
    shutil.copytree(ROOT / "locks", tmp_path / "locks", ignore=shutil.ignore_patterns("conda"))
    out = tmp_path / "out"
    seeded = wheelmill(
        "--recipes",
        recipes_copy,
        "conda",
        "seed",
        "--cell",
        "cpu-py311",
        "--build-env",
        output=out,
        env={"WHEELMILL_ENGINE": "none"},
    )
    assert seeded.returncode == 0, seeded.stdout + seeded.stderr
    assert "4 packages added" in seeded.stdout and "builder image" not in seeded.stdout, seeded.stdout
    locked = wheelmill("--recipes", recipes_copy, "conda", "lock", "--cell", "cpu-py311", output=out)
    assert locked.returncode == 0, locked.stdout + locked.stderr
    lock = tmp_path / "locks" / "conda" / "cpu-py311.txt"
    assert {line.split("/")[1].split("-")[0] for line in lock.read_text().splitlines()[2:]} == {
        "cmake",
        "ninja",
        "python",
        "python_abi",
    }
    built = _build(recipes_copy, out)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    cell = out / "cpu-py311"
    assert {p.name.rsplit("-", 2)[0] for p in (cell / "envs" / "build" / "conda-meta").glob("*.json")} == {
        "cmake",
        "ninja",
        "python",
        "python_abi",
    }
    report = json.loads((cell / "report.json").read_text())
    pre = next(s for s in report["steps"] if s["step"] == "pre-checks")
    assert any(
        c["name"] == "conda-lock" and c["verdict"] == "pass" and "fits its specs" in c["detail"] for c in pre["checks"]
    ), pre
    env = next(s for s in report["steps"] if s["step"] == "prepare-env")
    assert any(c["name"] == "conda-env" and "4 conda packages (cmake 4." in c["detail"] for c in env["checks"]), env
    (build_log,) = (cell / "logs").glob("*-example-cpp-ops-build.log")
    text = build_log.read_text()
    viewed = any(c["name"] == "stable-paths" and c["verdict"] == "pass" for c in pre["checks"])
    seen = VIEW_ROOT if viewed else cell  # the build sees the cell where pre-checks say
    assert (
        f"# env CONDA_PREFIX={seen / 'envs' / 'build'}" in text
        and f"{seen / 'envs' / 'build' / 'bin' / 'python'} -m build --wheel" in text
    )
    assert list((cell / "dist").glob("example_cpp_ops-0.1.0+cpu-*.whl"))
    path = f"{cell / 'envs' / 'build' / 'bin'}:/usr/bin:/bin"
    tools = subprocess.run(["cmake", "--version"], env={"PATH": path}, capture_output=True, text=True, check=False)
    assert tools.returncode == 0 and "cmake version 4." in tools.stdout, (
        "the conda package's console script runs, with the env's python"
    )

    # The conda package of what it built, installed with the channel's torch and run: the CPU
    # cell's test (test_cells.py) does that for every recipe of the cell, torch seeded once.
    other = tmp_path / "other-bytes.txt"
    other.write_text(lock.read_text().replace(lock.read_text().splitlines()[2].split("sha256:")[1], "0" * 64))
    refused = wheelmill("--recipes", recipes_copy, "conda", "create", tmp_path / "refused", "--lock", other, output=out)
    assert (
        refused.returncode == 7 and refused.stderr.count("\n") == 1 and f"{other} locks {'0' * 64}" in refused.stderr
    ), refused.stderr

    envs_toml = recipes_copy / "conda" / "envs.toml"
    envs_toml.write_text(envs_toml.read_text().replace(', "cmake"]', "]"))
    stale = _build(recipes_copy, tmp_path / "stale", WHEELMILL_CONDA_CHANNELS=str(out / "index" / "conda" / "cpu"))
    assert stale.returncode == 5, stale.stdout + stale.stderr
    assert stale.stderr.count("\n") == 1 and f"conda-lock: {lock} was made for other specs" in stale.stderr, (
        stale.stderr
    )
    assert "wheelmill conda lock --cell cpu-py311" in stale.stderr
    assert not (tmp_path / "stale" / "cpu-py311" / "envs").exists(), "nothing was made"

    none = _build(recipes_copy, tmp_path / "none")
    assert (
        none.returncode == 5
        and none.stderr.count("\n") == 1
        and "conda-lock: conda: no conda channel under" in none.stderr
    ), none.stderr
    shutil.copyfile(ROOT / "recipes" / "conda" / "envs.toml", envs_toml)
    gone = _build(recipes_copy, tmp_path / "gone", WHEELMILL_CONDA_CHANNELS="http://127.0.0.1:9/conda/cpu")
    assert gone.returncode == 5, gone.stdout + gone.stderr
    assert gone.stderr.count("\n") == 1 and "cannot read a channel of http://127.0.0.1:9/conda/cpu" in gone.stderr, (
        gone.stderr
    )
    first = json.loads((tmp_path / "gone" / "cpu-py311" / "report.json").read_text())["steps"][0]
    assert first["step"] == "pre-checks" and first["status"] == "failed"


@pytest.mark.engine
def test_the_cpu_example_builds_in_a_conda_env_inside_its_container(recipes_copy: Path, tmp_path: Path) -> None:
    """The same in the cell's builder container: the seeded CPython is the image's own (it
    must run on the image's glibc), the env is made here under the output, which the
    container mounts at the same path, and every build command runs in it, activated."""
    podman = answering("podman")
    shutil.copytree(ROOT / "locks", tmp_path / "locks", ignore=shutil.ignore_patterns("conda"))
    shutil.copytree(ROOT / "containers", tmp_path / "containers")
    out, engine = tmp_path / "out", {"WHEELMILL_ENGINE": "podman"}
    seeded = wheelmill(
        "--recipes",
        recipes_copy,
        "conda",
        "seed",
        "--cell",
        "cpu-py311",
        "--build-env",
        output=out,
        env=engine,
        timeout=3600,
    )
    assert seeded.returncode == 0, seeded.stdout + seeded.stderr
    assert "the builder image of cpu-py311" in seeded.stdout and "image-python" in seeded.stdout, seeded.stdout
    locked = wheelmill("--recipes", recipes_copy, "conda", "lock", "--cell", "cpu-py311", output=out)
    assert locked.returncode == 0, locked.stdout + locked.stderr
    built = _build(recipes_copy, out, **engine)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    (build_log,) = (out / "cpu-py311" / "logs").glob("*-example-cpp-ops-build.log")
    text = build_log.read_text()
    assert (
        "# in container wheelmill-cpu-py311-" in text and " /wheelmill/envs/build/bin/python -m build --wheel " in text
    )
    assert "# env CONDA_PREFIX=/wheelmill/envs/build" in text
    assert list((out / "cpu-py311" / "dist").glob("example_cpp_ops-0.1.0+cpu-*.whl"))
    assert (
        subprocess.run(
            [podman, "ps", "-aq", "--filter", "label=wheelmill.cell=cpu-py311"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        == ""
    )


def test_two_pythons_seeded_into_one_channel_each_get_the_dependencies_of_their_python(tmp_path: Path) -> None:
    """A pure wheel that needs tomli below Python 3.11, seeded for cpu-py310 and cpu-py311
    into one channel: a package per Python (a noarch one would carry the dependencies of the
    Python seeded first, and the second seed would be other bytes under its name, refused),
    and a py310 env resolves tomli where a py311 env does not."""
    wheels, channel = tmp_path / "wheels", tmp_path / "conda" / "cpu"
    make_wheel(
        wheels,
        "tool",
        "1.0",
        tag="py3-none-any",
        requires=["tomli>=2; python_version < '3.11'"],
        files={"tool/__init__.py": b""},
    )
    make_wheel(wheels, "tomli", "2.0.1", tag="py3-none-any", files={"tomli/__init__.py": b""})
    for cell in ("cpu-py310", "cpu-py311"):
        done = wheelmill("conda", "seed", "--cell", cell, "--wheels", wheels, "--channel", channel, output=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    made = sorted(p.name for p in channel.glob("*/tool-*.conda"))
    assert made == ["tool-1.0-py310_0.conda", "tool-1.0-py311_0.conda"], made
    for python, has_tomli in (("3.10", True), ("3.11", False)):
        done = wheelmill("conda", "solve", "tool", f"python {python}.*", "--channel", channel, output=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (" tomli 2.0.1 " in done.stdout) is has_tomli, (python, done.stdout)


def test_a_create_that_fails_to_install_leaves_no_env_behind(channels: tuple[Path, Path], tmp_path: Path) -> None:
    """The channel's listing offers ops, whose archive is damaged: the solve picks it, the
    install fails, and the new env's prefix is gone with it: no empty env looks made."""
    cpu, _cuda = channels
    broken = tmp_path / "broken"
    shutil.copytree(cpu, broken)
    (package,) = broken.glob("linux-64/ops-*.conda")
    package.write_bytes(b"damaged")
    prefix = tmp_path / "env"
    done = wheelmill("conda", "create", prefix, "ops", "--channel", broken, output=tmp_path)
    assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stdout + done.stderr
    assert done.stderr.startswith("wheelmill: error: ") and "; fix: " in done.stderr, done.stderr
    assert not prefix.exists()
