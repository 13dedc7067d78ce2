"""Engine none's view of a cell: every command in a mount namespace of its own that shows
the cell root, and the Python's installation under it, at one fixed path, so a build's
paths name neither the output root nor the cell nor the Python's location."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_containers import ROOT
from wheelmill.building.plan import plan_cell
from wheelmill.building.steps.build import build_environment
from wheelmill.building.steps.cell import home_as_seen
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.inputs.variants import Family
from wheelmill.machine.envs import Env, venv_home
from wheelmill.machine.process import VIEW_ROOT, HostRunner, StepLog, View, base_environment, make_view
from wheelmill.machine.toolchain import Toolkit
from wheelmill.settings import Settings


def test_paths_of_the_cell_and_the_python_are_named_in_the_view_and_back() -> None:
    view = View(cell=Path("/o/cuda130-py311"), python=Path("/pyenv/versions/3.11.7"))
    assert view.stable(Path("/o/cuda130-py311/src/x/a.cu")) == VIEW_ROOT / "src/x/a.cu"
    assert view.stable(Path("/pyenv/versions/3.11.7/include/python3.11")) == VIEW_ROOT / "python/include/python3.11"
    assert view.stable(Path("/o/.cache/sccache")) == Path("/o/.cache/sccache"), "what cells share is seen where it is"
    assert view.host(VIEW_ROOT / "python/bin/python3.11") == Path("/pyenv/versions/3.11.7/bin/python3.11")
    assert view.host(VIEW_ROOT / "envs/build") == Path("/o/cuda130-py311/envs/build")
    assert View(cell=Path("/o/c"), python=None).stable(Path("/usr/bin/python3.11")) == Path("/usr/bin/python3.11")


def test_no_view_over_a_cell_or_python_that_overlaps_its_fixed_path(tmp_path: Path) -> None:
    assert (
        make_view(VIEW_ROOT / "out" / "cpu-py311", None, netless=False)
        == f"{VIEW_ROOT / 'out' / 'cpu-py311'} overlaps {VIEW_ROOT}"
    )
    assert make_view(tmp_path / "cpu-py311", Path("/tmp"), netless=False) == f"/tmp overlaps {VIEW_ROOT}"


def test_a_command_in_the_view_sees_the_cell_and_python_at_the_fixed_path_and_nothing_leaks(tmp_path: Path) -> None:
    cell, python = tmp_path / "out" / "cuda130-py311", tmp_path / "python-install"
    (cell / "src" / "x").mkdir(parents=True)
    (cell / "src" / "x" / "a.cu").write_text("device code\n")
    (python / "bin").mkdir(parents=True)
    (python / "bin" / "marker").write_text("the python\n")
    view = make_view(cell, python, netless=True)
    if isinstance(view, str):
        pytest.skip(f"no view here: {view}")
    script = f"pwd; cat a.cu {VIEW_ROOT}/python/bin/marker; tail -n +3 /proc/self/net/dev | wc -l"
    with StepLog(tmp_path / "step.log") as log:
        done = HostRunner(view=view, network=False).run(
            ["sh", "-c", script], env=base_environment([]), log=log, cwd=VIEW_ROOT / "src" / "x", keep_output=True
        )
    assert done.output.splitlines() == [f"{VIEW_ROOT}/src/x", "device code", "the python", "1"], (
        "in the view, in its directory, loopback only"
    )
    assert (cell / "python").is_dir() and not any((cell / "python").iterdir()), "the mount point stays empty here"
    assert not any(VIEW_ROOT.iterdir()), "the binding is seen in the command's namespace only"
    assert f"# cwd {VIEW_ROOT}/src/x" in (tmp_path / "step.log").read_text()


def test_in_the_view_every_python_of_a_variant_gets_the_same_compiler_flags(tmp_path: Path) -> None:
    """The prefix maps name the view, and the Python's installation under it, as /wheelmill
    and /python: the same flags (which the compiler cache hashes) for every Python, where
    without the view they name the cell root and the Python's own directory."""
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    recipes = load_recipes(ROOT / "recipes")
    made = []
    for python in ("3.11", "3.13"):
        cell = matrix.cell(f"cuda130-py{python.replace('.', '')}")
        spec = plan_cell(matrix, recipes, cell, ["example-cuda-ops"], Settings()).recipe("example-cuda-ops")
        root = tmp_path / "out" / cell.id
        view = View(cell=root, python=tmp_path / "pyenv" / python)
        env = Env(root=root / "envs" / "build")
        nvcc_root = env.root / "lib" / f"python{python}" / "site-packages" / "nvidia" / "cu13"
        (nvcc_root / "include").mkdir(parents=True)
        (env.root / "pyvenv.cfg").write_text(f"home = {VIEW_ROOT}/python/bin\n")  # made from the Python in the view
        toolkit = Toolkit(family=Family.CUDA, root=nvcc_root, version="13.0", compiler=nvcc_root / "bin" / "nvcc")
        made.append(build_environment(spec, {}, env=env, cell_root=root, toolkit=toolkit, jobs=2, stable=view.stable))
    for key in ("CFLAGS", "CXXFLAGS", "NVCC_APPEND_FLAGS", "CUDA_HOME", "CPATH", "PATH", "PYTHONPATH"):
        assert made[0][key] == made[1][key], key
    flags = made[0]["CFLAGS"].split()
    assert (
        f"-ffile-prefix-map={VIEW_ROOT}/python=/python" in flags
        and flags[-1] == f"-ffile-prefix-map={VIEW_ROOT}=/wheelmill"
    ), flags
    assert str(tmp_path) not in " ".join(made[0].values())


def test_the_build_env_names_its_python_as_the_view_sees_it_and_keeps_the_rest(tmp_path: Path) -> None:
    """pyvenv.cfg's ``home`` is rewritten to the Python under the view (the headers compiled
    in are then named the same for every Python), every other line kept; without a view,
    and for a conda env, it is left as venv wrote it."""
    cell, python = tmp_path / "out" / "cuda130-py311", tmp_path / "pyenv" / "3.11.7"
    env = Env(root=cell / "envs" / "build")
    env.root.mkdir(parents=True)
    written = f"home = {python}/bin\ninclude-system-site-packages = false\nversion = 3.11.7\n"
    (env.root / "pyvenv.cfg").write_text(written)
    viewed = _Viewed(View(cell=cell, python=python))
    home_as_seen(HostRunner(), env, python / "bin" / "python3.11")
    home_as_seen(viewed, Env(root=env.root, conda=True), python / "bin" / "python3.11")
    assert (env.root / "pyvenv.cfg").read_text() == written, "no view, or a conda env: nothing to rename"
    home_as_seen(viewed, env, python / "bin" / "python3.11")
    assert venv_home(env.root) == VIEW_ROOT / "python" / "bin"
    assert (env.root / "pyvenv.cfg").read_text() == written.replace(f"{python}/bin", f"{VIEW_ROOT}/python/bin")
    assert venv_home(tmp_path) is None, "no pyvenv.cfg"


class _Viewed(HostRunner):
    """A host runner's naming of paths through a view, without the namespace (which this
    test does not run a command in, and which not every machine can make)."""

    def __init__(self, view: View) -> None:
        super().__init__()
        self.named = view

    def stable_path(self, path: Path) -> Path:
        return self.named.stable(path)
