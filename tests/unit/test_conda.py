"""A wheel as a conda package: the metadata solvers select by, and where its files go. Pure:
nothing here loads py-rattler (that is the integration tests', through the command)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, CliRunner
from tests.wheels import make_wheel
from wheelmill.conda import envspec
from wheelmill.conda.package import GPU_BUILD_OFFSET, CondaTarget, conda_meta, stage_wheel
from wheelmill.conda.seed import fits
from wheelmill.errors import ConfigError, EnvError, InvalidWheel, SelectionError, UsageError
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.variants import Cell
from wheelmill.machine.envs import Env, conda_names, without
from wheelmill.planning.locks import recorded_digest
from wheelmill.wheel import wheelfile
from wheelmill.wheel.wheelfile import read_wheel

CPU = CondaTarget(variant="cpu", python="3.11")
CUDA = CondaTarget(variant="cuda130", python="3.11", cuda="13.0", gpu=True)


def _ops(tmp_path: Path, label: str, torch: str) -> Path:
    return make_wheel(
        tmp_path / label, "example-cpp-ops", f"0.1.0+{label}", tag="cp311-cp311-manylinux_2_28_x86_64",
        requires=[f"torch=={torch}", "numpy>=1.21,<3", "pytest; extra == 'test'", "tomli; python_version < '3.11'"],
        files={"example_cpp_ops/__init__.py": b"", "example_cpp_ops/_C.so": b"\x7fELF"},
    )  # fmt: skip


def test_a_cpu_build_names_its_variant_pins_torch_and_its_python_abi(tmp_path: Path) -> None:
    meta = conda_meta(read_wheel(_ops(tmp_path, "cpu", "2.13.0+cpu")), CPU)
    assert (meta.name, meta.version, meta.build, meta.build_number, meta.subdir) == (
        "example-cpp-ops",
        "0.1.0",
        "cpu_py311_0",
        0,
        "linux-64",
    )
    assert meta.depends == (
        "python >=3.11,<3.12.0a0",
        "python_abi 3.11.* *_cp311",
        "torch ==2.13.0 cpu_py311_*",
        "numpy <3,>=1.21",
    )
    assert meta.constrains == ()
    assert meta.filename == "example-cpp-ops-0.1.0-cpu_py311_0.conda"


def test_a_cuda_build_needs_a_cuda_driver_and_ranks_above_the_cpu_build(tmp_path: Path) -> None:
    cpu = conda_meta(read_wheel(_ops(tmp_path, "cpu", "2.13.0+cpu")), CPU)
    cuda = conda_meta(read_wheel(_ops(tmp_path, "cu130", "2.14.1+cu130")), CUDA)
    assert cuda.build == f"cuda130_py311_{GPU_BUILD_OFFSET}" and cuda.build_number > cpu.build_number
    assert "__cuda >=13.0" in cuda.depends and "torch ==2.14.1 cuda130_py311_*" in cuda.depends
    assert cuda.constrains == ("cuda-version >=13.0,<14",)


def test_a_pure_wheel_is_one_noarch_package_for_every_python(tmp_path: Path) -> None:
    pure = make_wheel(
        tmp_path, "filelock", "3.16.1", tag="py3-none-any", requires_python=">=3.9", requires=["platformdirs>=4"]
    )
    meta = conda_meta(read_wheel(pure), CUDA)
    assert (meta.subdir, meta.build, meta.depends) == ("noarch", "py_0", ("python >=3.9", "platformdirs >=4"))
    assert "__cuda >=13.0" not in meta.depends


def test_a_pure_wheel_whose_dependencies_depend_on_the_python_is_a_package_per_python(tmp_path: Path) -> None:
    """tomli below Python 3.11: one noarch package would carry the dependencies of the Python
    it was made for first, and a py310 env would lack tomli. Each Python gets its own."""
    pure = make_wheel(
        tmp_path,
        "black-ish",
        "24.1.0",
        tag="py3-none-any",
        requires_python=">=3.9",
        requires=["tomli>=1.1; python_version < '3.11'", "click>=8"],
    )
    old = conda_meta(read_wheel(pure), CondaTarget(variant="cpu", python="3.10"))
    new = conda_meta(read_wheel(pure), CondaTarget(variant="cpu", python="3.11"))
    assert (old.subdir, old.build, new.build) == ("linux-64", "py310_0", "py311_0")
    assert "tomli >=1.1" in old.depends and "click >=8" in old.depends and "python >=3.10,<3.11.0a0" in old.depends
    assert "tomli >=1.1" not in new.depends and "click >=8" in new.depends
    assert old.filename != new.filename, "two Pythons, two packages: never other bytes under one name"


def test_a_compiled_wheel_without_a_label_is_no_variant_build(tmp_path: Path) -> None:
    """numpy from PyPI, say: the same for every variant, so no __cuda and no GPU rank."""
    numpy = make_wheel(tmp_path, "numpy", "2.1.0", tag="cp311-cp311-manylinux_2_17_x86_64")
    meta = conda_meta(read_wheel(numpy), CUDA)
    assert (meta.build, meta.build_number) == ("py311_0", 0)
    assert not any(d.startswith("__cuda") for d in meta.depends)


def test_a_slim_variant_names_its_arch_in_the_build_string(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    slim = next(v for v in matrix.variants.values() if v.slim_tag)
    target = CondaTarget.of(slim, "3.11")
    assert target.build_stem == f"{slim.name.replace('-', '_')}_py311" and "-" not in target.build_stem
    assert target.gpu and target.cuda == slim.toolkit_short


def test_files_go_where_conda_puts_them(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path, "tool", "1.0+cpu", tag="cp311-cp311-manylinux_2_28_x86_64",
        files={"tool/__init__.py": b"", "tool-1.0+cpu.data/scripts/run-tool": b"#!python\n",
               "tool-1.0+cpu.data/data/share/tool/x.txt": b"x"},
    )  # fmt: skip
    info = read_wheel(wheel)
    staged = stage_wheel(info, conda_meta(info, CPU), CPU, tmp_path / "stage")
    site = staged.root / "lib/python3.11/site-packages"
    assert (site / "tool/__init__.py").is_file()
    assert (staged.root / "bin/run-tool").stat().st_mode & 0o111
    assert (staged.root / "share/tool/x.txt").read_text() == "x"
    assert (site / "tool-1.0+cpu.dist-info/INSTALLER").read_text() == "conda\n"
    assert staged.timestamp.year >= 1980  # the newest member's time: the same wheel, the same archive


def test_a_member_outside_the_package_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = make_wheel(tmp_path, "evil", "1.0", tag="py3-none-any", files={"evil/__init__.py": b""})
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("../../escape.txt", b"x")
    with pytest.raises(InvalidWheel, match="is not a path inside the wheel"):
        read_wheel(wheel)  # the one reader refuses it first
    with monkeypatch.context() as patched:  # and where a reader let it through, staging still would
        patched.setattr(wheelfile, "_check_members", lambda *_: None)
        info = read_wheel(wheel)
    with pytest.raises(InvalidWheel, match="points outside the package"):
        stage_wheel(info, conda_meta(info, CPU), CPU, tmp_path / "stage")
    assert not (tmp_path / "escape.txt").exists()


def test_which_wheels_a_python_takes(tmp_path: Path) -> None:
    def info(tag: str) -> bool:
        return fits(read_wheel(make_wheel(tmp_path / tag, "x", "1", tag=tag)), "3.11")

    assert info("cp311-cp311-manylinux_2_28_x86_64") and info("py3-none-any") and info("cp39-abi3-manylinux2014_x86_64")
    assert (
        not info("cp312-cp312-manylinux_2_28_x86_64")
        and not info("cp311-cp311-manylinux_2_28_aarch64")
        and not info("cp312-abi3-manylinux2014_x86_64")
    )


def test_bad_input_to_the_conda_commands_is_one_line_and_writes_nothing(cli: CliRunner, tmp_path: Path) -> None:
    empty, channel = tmp_path / "no-wheels", tmp_path / "channel"
    empty.mkdir()
    result = cli("conda", "seed", "--cell", "cpu-py311", "--wheels", str(empty), "--channel", str(channel))
    assert result.code == EnvError.exit_code and result.err.count("\n") == 1
    assert f"no wheels in {empty}" in result.err and "fix: build and publish the cell first" in result.err
    unknown = cli("conda", "seed", "--cell", "cpu-py399", "--channel", str(channel))
    assert unknown.code == SelectionError.exit_code and unknown.err.count("\n") == 1
    taken = tmp_path / "taken"
    (taken / "notes.txt").parent.mkdir()
    (taken / "notes.txt").write_text("mine")
    refused = cli("conda", "create", str(taken), "torch", "--channel", str(channel))
    assert refused.code == UsageError.exit_code and "is a directory with other files" in refused.err
    assert not channel.exists() and [p.name for p in taken.iterdir()] == ["notes.txt"]


def _cell(variant: str = "cpu", python: str = "3.11") -> Cell:
    return load_matrix(ROOT / "recipes" / "matrix.toml").cell(f"{variant}-py{python.replace('.', '')}")


VARIANTS = load_matrix(ROOT / "recipes" / "matrix.toml").variants  # the names [variants] may use


def test_a_cells_conda_env_specs_are_every_cells_then_its_variants_with_its_python(recipes_copy: Path) -> None:
    (recipes_copy / "conda" / "envs.toml").write_text(
        'schema = 1\nspecs = ["python {python}.*", "python_abi {python}.* *_cp{nodot}", "ninja"]\n'
        '[variants]\ncuda130 = ["cuda-nvcc 13.0.*", "ninja"]\n'
    )
    cpu = envspec.inputs(recipes_copy, _cell("cpu"), known=VARIANTS)
    cuda = envspec.inputs(recipes_copy, _cell("cuda130", "3.12"), known=VARIANTS)
    assert cpu.specs == ("python 3.11.*", "python_abi 3.11.* *_cp311", "ninja")
    assert (
        cuda.specs == ("python 3.12.*", "python_abi 3.12.* *_cp312", "ninja", "cuda-nvcc 13.0.*")
        and cuda.cell == "cuda130-py312"
    )
    assert cpu.digest != envspec.inputs(recipes_copy, _cell("cpu", "3.12"), known=VARIANTS).digest, "the Python is"


@pytest.mark.parametrize(
    ("text", "says"),
    [("specs = 'python'\n", "specs: not a list of match specs"),
     ('specs = ["python"]\nvariants = 3\n', "variants: not a table"),
     ('specs = ["python"]\n[variants]\ncpu = [""]\n', "variants.cpu: not a list of match specs"),
     ('specs = ["python"]\n[variants]\ncuda13O = ["cuda-nvcc"]\n',
      "variants.cuda13O: the matrix has no variant cuda13O (perhaps you meant 'cuda130'?)"),
     ("specs = [\n", "invalid TOML")],
)  # fmt: skip
def test_a_malformed_conda_env_spec_file_is_one_error_naming_the_file_and_key(
    cli: CliRunner, recipes_copy: Path, text: str, says: str
) -> None:
    (recipes_copy / "conda" / "envs.toml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        envspec.inputs(recipes_copy, _cell(), known=VARIANTS)
    assert str(recipes_copy / "conda" / "envs.toml") in caught.value.message and says in caught.value.message
    with pytest.raises(ConfigError) as validated:  # the lint's `wheelmill validate` reads it the same way
        envspec.check_spec_file(recipes_copy, VARIANTS)
    assert validated.value.message == caught.value.message
    validate = cli("--recipes", str(recipes_copy), "validate")
    assert validate.code == ConfigError.exit_code and validate.err.count("\n") == 1 and says in validate.err


def test_a_conda_lock_reads_back_and_knows_when_its_specs_changed(tmp_path: Path) -> None:
    made = envspec.CondaEnvInputs(cell="cpu-py311", specs=("python 3.11.*", "ninja"))
    packages = [
        envspec.LockedPackage(subdir="linux-64", name="python", version="3.11.7", build="0_cpython", sha256="a" * 64),
        envspec.LockedPackage(
            subdir="linux-64", name="example-cpp-ops", version="0.1.0", build="cpu_py311_0", sha256="b" * 64
        ),
    ]
    lock = tmp_path / "cpu-py311.txt"
    lock.write_text(envspec.lock_text(made, packages))
    read = envspec.read_lock(lock)
    assert recorded_digest(lock) == made.digest and sorted(read, key=lambda p: p.name) == sorted(
        packages, key=lambda p: p.name
    )
    assert [p.spec for p in read] == ["example-cpp-ops ==0.1.0 cpu_py311_0", "python ==3.11.7 0_cpython"]
    assert envspec.mismatch(made, lock) is None
    changed = envspec.CondaEnvInputs(cell="cpu-py311", specs=("python 3.11.*", "ninja", "cmake"))
    assert "was made for other specs" in str(envspec.mismatch(changed, lock))
    lock.write_text(lock.read_text() + "python-3.11.7.tar.bz2\n")
    with pytest.raises(ConfigError, match=r"cpu-py311.txt:5: not a locked package"):
        envspec.read_lock(lock)


def test_the_conda_backends_uv_install_leaves_out_what_the_conda_env_holds(tmp_path: Path) -> None:
    prefix = tmp_path / "env"
    (prefix / "conda-meta").mkdir(parents=True)
    for record in (
        "ninja-1.13.2-py311_0.json",
        "python-3.11.7-0_cpython.json",
        "example-cpp-ops-0.1.0-cpu_py311_0.json",
    ):
        (prefix / "conda-meta" / record).write_text("{}")
    assert conda_names(prefix) == {"ninja", "python", "example-cpp-ops"}
    lock = (
        "ninja==1.13.0 \\\n    --hash=sha256:aa\n"
        "setuptools==80.0 \\\n    --hash=sha256:bb\n    # via -r build.in\nExample_Cpp_Ops==0.1.0\n"
    )
    assert without(lock, conda_names(prefix)) == "setuptools==80.0 \\\n    --hash=sha256:bb\n    # via -r build.in\n"


def test_a_conda_env_is_activated_for_builds_and_a_venv_is_not() -> None:
    assert Env(root=Path("/o/envs/build"), conda=True).activation(lambda p: Path("/wheelmill") / p.name) == {
        "CONDA_PREFIX": "/wheelmill/build", "CONDA_DEFAULT_ENV": "/wheelmill/build",
    }  # fmt: skip
    assert Env(root=Path("/o/envs/build")).activation() == {}


def test_the_repositorys_conda_env_specs_load_for_every_cell(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "recipes" / "matrix.toml")
    for cell in matrix.cells:
        specs = envspec.inputs(repo_root / "recipes", cell, known=matrix.variants).specs
        assert specs[0] == f"python {cell.python}.*" and "{" not in " ".join(specs)
