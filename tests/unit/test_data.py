"""The repository's own matrix and recipes, as loaded values."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from packaging.version import Version

from tests.matrix_table import table_block
from wheelmill.cli import main
from wheelmill.errors import SelectionError
from wheelmill.inputs.archs import CudaArchs
from wheelmill.inputs.matrix import load_matrix, matrix_markdown
from wheelmill.inputs.recipes import SdistSource, load_recipes, resolve, select
from wheelmill.inputs.variants import Family
from wheelmill.machine.builder_images import baselines
from wheelmill.machine.pins import load_pins

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def matrix():  # type: ignore[no-untyped-def]
    return load_matrix(ROOT / "recipes" / "matrix.toml")


@pytest.fixture(scope="module")
def recipes():  # type: ignore[no-untyped-def]
    return load_recipes(ROOT / "recipes")


def test_required_cells_exist(matrix) -> None:  # type: ignore[no-untyped-def]
    ids = {c.id for c in matrix.cells}
    assert {"cuda118-py311", "cuda130-py311", "cpu-py311"} <= ids
    assert {v.family for v in matrix.variants.values()} == {Family.CPU, Family.CUDA, Family.ROCM}
    assert sum(v.family is Family.ROCM for v in matrix.variants.values()) >= 2


def test_every_variant_pins_what_follows_from_it(matrix) -> None:  # type: ignore[no-untyped-def]
    for v in matrix.variants.values():
        assert v.glibc.startswith("manylinux_2_")
        if v.family is Family.CUDA:
            assert v.toolkit and v.toolkit.count(".") == 2
            assert v.label == "cu" + v.toolkit_short.replace(".", "")
            CudaArchs.parse(v.arch_list or "")


def test_pytorch_arch_tables(matrix) -> None:  # type: ignore[no-untyped-def]
    assert matrix.variants["cuda130"].arch_list == "7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    assert matrix.variants["cuda128"].arch_list == "7.0;7.5;8.0;8.6;9.0;10.0;12.0"
    assert CudaArchs.parse(matrix.variants["cuda130"].arch_list).ptx == frozenset({"sm_120"})


def test_cell_lookup_and_globs(matrix) -> None:  # type: ignore[no-untyped-def]
    assert matrix.cell("cuda118-py311").variant.toolkit == "11.8.0"
    assert {c.id for c in matrix.select(["cpu-py*"])} == {"cpu-py310", "cpu-py311", "cpu-py312", "cpu-py313"}
    assert {c.id for c in matrix.select(["cpu-*"])} - {c.id for c in matrix.select(["cpu-py*"])} == {
        f"cpu-aarch64-py3{minor}" for minor in (10, 11, 12, 13)
    }
    with pytest.raises(SelectionError, match=r"does not support Python 3\.9"):
        matrix.cell("cpu-py39")


def test_torch_requirement_follows_the_label_rule(matrix) -> None:  # type: ignore[no-untyped-def]
    assert matrix.variants["cuda118"].torch_requirement == "torch==2.7.1+cu118"
    assert matrix.variants["cuda130"].torch_requirement == "torch==2.14.1"  # PyPI's 2.14.1 is the cu130 build
    assert matrix.variants["cpu"].torch_requirement == "torch==2.13.0+cpu"


def test_recipes_load_and_form_a_dag(recipes, matrix) -> None:  # type: ignore[no-untyped-def]
    ecosystem = {"torch", "torchvision", "torchaudio", "flash-attn", "apex", "deepspeed", "xformers", "fbgemm-gpu"}
    assert set(recipes) == {"example-cpp-ops", "example-cuda-ops", "example-stable-ops", "torchsort", *ecosystem}
    assert {name for name, recipe in recipes.items() if recipe.opt_in} == ecosystem
    assert isinstance(recipes["torchsort"].source, SdistSource)
    assert select(recipes, matrix.cell("cuda130-py311"), ["example-cuda-ops"]) == (
        "example-cpp-ops",
        "example-cuda-ops",
    )
    assert select(recipes, matrix.cell("cpu-py311"), []) == ("example-cpp-ops", "example-stable-ops", "torchsort")


def test_overrides_resolve_per_cell(recipes, matrix) -> None:  # type: ignore[no-untyped-def]
    cpu = resolve(recipes["torchsort"], matrix.cell("cpu-py311"))
    cuda = resolve(recipes["torchsort"], matrix.cell("cuda130-py311"))
    assert "torchsort.isotonic_cuda" not in cpu.imports
    assert "torchsort.isotonic_cuda" in cuda.imports
    assert cuda.device_code is True and cpu.device_code is None
    assert cuda.arch_list == "8.0;9.0" and cpu.arch_list is None
    assert cuda.torch_pin and cuda.local_label


def test_a_slim_variant_is_its_parent_with_one_arch(matrix) -> None:  # type: ignore[no-untyped-def]
    slim, parent = matrix.variants["cuda130-sm90"], matrix.variants["cuda130"]
    names = list(matrix.variants)
    assert (
        names.index("cuda130-sm90") == names.index("cuda130") + 2  # after cuda130-torch2.12
        and names.index("rocm64-gfx942") == names.index("rocm64") + 1
    )
    assert (slim.arch_list, slim.channel, slim.wheel_label, slim.slim_of, slim.slim) == (
        "9.0",
        "cu130-sm90",
        "cu130.sm90",
        "cuda130",
        (),
    )
    assert (
        replace(slim, name="cuda130", arch_list=parent.arch_list, slim=("9.0",), slim_of=None, slim_tag=None) == parent
    ), "the rest is the parent's"
    assert slim.torch_requirement == "torch==2.14.1" and slim.label == "cu130"
    rocm = matrix.variants["rocm64-gfx942"]
    assert (rocm.arch_list, rocm.channel, rocm.wheel_label, rocm.label) == (
        "gfx942",
        "rocm6.4-gfx942",
        "rocm6.4.gfx942",
        "rocm6.4",
    )
    assert [c.id for c in matrix.cells if c.variant == slim] == [
        "cuda130-sm90-py310",
        "cuda130-sm90-py311",
        "cuda130-sm90-py312",
        "cuda130-sm90-py313",
    ]
    assert (
        matrix.cell("cuda130-sm90-py311").base_id == "cuda130-py311"
        and matrix.cell("cuda130-py311").base_id == "cuda130-py311"
    )


def test_a_variant_of_another_torch_is_its_parent_with_that_torch(matrix) -> None:  # type: ignore[no-untyped-def]
    parent, other = matrix.variants["cuda130"], matrix.variants["cuda130-torch2.12"]
    names = list(matrix.variants)
    assert names[names.index("cuda130") :][:4] == [
        "cuda130",
        "cuda130-torch2.12",
        "cuda130-sm90",
        "cuda130-sm90-torch2.12",
    ], "each right after what it derives from"
    assert (other.torch, other.channel, other.wheel_label, other.torch_of, other.torch_tag) == (
        "2.12.0",
        "cu130-torch2.12",
        "cu130.torch2.12",
        "cuda130",
        "torch2.12",
    )
    assert replace(other, name="cuda130", torch="2.14.1", other_torch=("2.12.0",), torch_of=None, torch_tag=None) == (
        parent
    ), "the rest is the parent's"
    assert other.torch_requirement == "torch==2.12.0" and other.label == "cu130"
    both = matrix.variants["cuda130-sm90-torch2.12"]
    assert (both.arch_list, both.torch, both.channel, both.wheel_label, both.slim_of, both.torch_of) == (
        "9.0",
        "2.12.0",
        "cu130-sm90-torch2.12",
        "cu130.sm90.torch2.12",
        "cuda130",
        "cuda130-sm90",
    )
    cell = matrix.cell("cuda130-sm90-torch2.12-py311")
    assert (cell.base_id, cell.lock_id) == ("cuda130-py311", "cuda130-torch2.12-py311")
    assert matrix.cell("cuda130-sm90-py311").lock_id == matrix.cell("cuda130-py311").lock_id == "cuda130-py311"
    assert [c.id for c in matrix.select(["cuda130-torch2.12-py3*"])] == [
        f"cuda130-torch2.12-py3{minor}" for minor in (10, 11, 12, 13)
    ]
    assert matrix.cell("cuda130-py311").variant.torch == "2.14.1", "the plain names keep the variant's torch"
    # a variant's aarch64 twin shares its label: the wheel's platform tag keeps their names apart
    names = [(str(Version(f"0.1.0+{v.wheel_label}")), v.platform) for v in matrix.variants.values()]
    assert len(set(names)) == len(names), "no two variants' wheels share a file name"


def test_a_torch_the_variant_does_not_build_is_named_with_the_ones_it_does(matrix) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SelectionError) as raised:
        matrix.cell("cuda130-torch2.9-py311")
    assert "variant cuda130 builds no torch 2.9 (it builds 2.14.1, 2.12.0)" in str(raised.value)
    assert "variants.cuda130.other-torch" in (raised.value.fix or "")


def test_a_cell_of_another_torch_resolves_recipes_as_its_parent(recipes, matrix) -> None:  # type: ignore[no-untyped-def]
    other, parent = matrix.cell("cuda130-torch2.12-py311"), matrix.cell("cuda130-py311")
    assert select(recipes, other, []) == select(recipes, parent, [])
    assert resolve(recipes["torchsort"], other) == resolve(recipes["torchsort"], parent)


def test_a_slim_cell_resolves_recipes_as_its_parent(recipes, matrix) -> None:  # type: ignore[no-untyped-def]
    slim, parent = matrix.cell("cuda130-sm90-py311"), matrix.cell("cuda130-py311")
    assert select(recipes, slim, []) == select(recipes, parent, [])
    assert resolve(recipes["torchsort"], slim) == resolve(recipes["torchsort"], parent), (
        "overrides by the parent's id (the arch rule is the spec's)"
    )


def test_docs_matrix_table_is_in_sync(matrix, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert main(["--recipes", str(ROOT / "recipes"), "matrix", "--markdown"]) == 0
    generated = capsys.readouterr().out.strip()
    assert table_block() == generated, "regenerate with `wheelmill matrix --markdown`"
    pins = load_pins(ROOT / "containers" / "pins.toml")
    promised = {name: (b.registry, b.bootstrap) for name, v in matrix.variants.items() for b in [baselines(pins, v)]}
    assert generated == matrix_markdown(matrix, promised)
