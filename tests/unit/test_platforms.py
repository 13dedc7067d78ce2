"""The platform axis: aarch64 twins of variants in the matrix, recipes that name their
platforms, builder images and containers of another machine, and the check that this
machine can run its code (qemu-user through binfmt_misc)."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from tests.elves import EM_AARCH64, EM_CUDA, make_elf
from tests.matrix_table import BOOTSTRAP, REGISTRY, table_rows
from wheelmill.building.plan import ContainerSetup, Options, plan_cell
from wheelmill.building.steps.cell import _platform
from wheelmill.building.steps.checks_after import baseline_of
from wheelmill.checks import Verdict
from wheelmill.checks.platform import judge_machine
from wheelmill.errors import SelectionError, UsageError
from wheelmill.images.manifests import Member, list_tag, plan_lists
from wheelmill.inputs.manylinux import manylinux_of
from wheelmill.inputs.matrix import Matrix, load_matrix
from wheelmill.inputs.recipes import load_recipes, resolve, select
from wheelmill.machine.builder_images import BaseKind, choose
from wheelmill.machine.emulation import Execution, cpu_standin, emulation_problem, execution
from wheelmill.machine.engine import Engine, EngineName, Mount
from wheelmill.machine.pins import Pins, load_pins
from wheelmill.machine.tools import pinned_hashes
from wheelmill.planning.groups import group_of
from wheelmill.planning.locks import target
from wheelmill.planning.spec import StepKind
from wheelmill.settings import EnvBackendName, Settings
from wheelmill.wheel.elf import summarize

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return load_matrix(ROOT / "recipes" / "matrix.toml")


def test_an_aarch64_twin_shares_channel_and_label_and_has_its_own_lock(matrix: Matrix) -> None:
    x86, arm = matrix.cell("cpu-py311"), matrix.cell("cpu-aarch64-py311")
    assert (arm.variant.platform, x86.variant.platform) == ("aarch64", "x86_64")
    assert arm.variant.channel == x86.variant.channel == "cpu"
    assert arm.variant.wheel_label == x86.variant.wheel_label == "cpu"
    assert (arm.lock_id, arm.base_id) == ("cpu-aarch64-py311", "cpu-py311")
    assert arm.recipe_ids == ("cpu-py311", "cpu-aarch64-py311") and x86.recipe_ids == ("cpu-py311",)
    # what [variants.cpu.aarch64] says differs: PyPI's aarch64 torch is the CPU build up to 2.10
    assert (arm.variant.torch, arm.variant.torch_requirement) == ("2.10.0", "torch==2.10.0")
    assert x86.variant.torch_requirement == "torch==2.13.0+cpu"
    assert str(target(arm).platform) == "aarch64-manylinux_2_28" and target(x86).platform == "x86_64-manylinux_2_28"
    assert group_of(arm.variant) != group_of(x86.variant), "an aarch64 wheel serves aarch64 cells alone"
    assert "aarch64" in arm.variant.describe() and "aarch64" not in x86.variant.describe()


def test_the_derived_variants_get_twins_with_the_platforms_arch_list(matrix: Matrix) -> None:
    arm = matrix.variant("cuda130-aarch64")
    assert arm.arch_list == "8.0;9.0;10.0;11.0;12.0+PTX" != matrix.variant("cuda130").arch_list
    other = matrix.variant("cuda130-torch2.12-aarch64")
    assert (other.torch, other.arch_list, other.channel) == ("2.12.0", arm.arch_list, "cu130-torch2.12")
    slim = matrix.cell("cuda130-sm90-aarch64-py311")
    assert (slim.variant.arch_list, slim.variant.channel, slim.lock_id) == (
        "9.0",
        "cu130-sm90",
        "cuda130-aarch64-py311",
    )
    assert slim.base_id == "cuda130-py311"
    assert [v.name for v in matrix.variants.values() if v.platform_of] == ["cpu-aarch64", "cuda130-aarch64"]


def test_a_slim_arch_the_platform_lacks_has_no_twin(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    text = (recipes / "matrix.toml").read_text()
    (recipes / "matrix.toml").write_text(text.replace('slim = ["9.0"]', 'slim = ["7.5", "9.0"]'))
    names = set(load_matrix(recipes / "matrix.toml").variants)
    assert {"cuda130-sm75", "cuda130-sm90-aarch64"} <= names and "cuda130-sm75-aarch64" not in names


def test_a_platform_the_variant_does_not_build_is_named(matrix: Matrix) -> None:
    with pytest.raises(SelectionError) as raised:
        matrix.cell("cuda118-aarch64-py311")
    assert "variant cuda118 is not built for aarch64" in str(raised.value)
    assert 'add "aarch64" to variants.cuda118.platforms' in (raised.value.fix or "")


def test_a_recipe_names_its_platforms_and_overrides_select_one_by_glob(matrix: Matrix, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    (tmp_path / "extensions").symlink_to(ROOT / "extensions")
    path = recipes / "example-cpp-ops.toml"
    text = path.read_text()
    (recipes / "x86-only.toml").write_text(
        text.replace('name = "example-cpp-ops"', 'name = "x86-only"\nplatforms = ["x86_64"]', 1)
    )
    path.write_text(text + '\n[[override]]\ncells = ["*-aarch64-*"]\nbuild = { env = { ARM = "1" } }\n')
    loaded = load_recipes(recipes)
    x86, arm = matrix.cell("cpu-py311"), matrix.cell("cpu-aarch64-py311")
    assert loaded["x86-only"].applies_to(x86) and not loaded["x86-only"].applies_to(arm)
    assert "x86-only" not in select(loaded, arm, []) and "x86-only" in select(loaded, x86, [])
    with pytest.raises(SelectionError, match="its platforms: x86_64"):
        select(loaded, arm, ["x86-only"])
    assert resolve(loaded["example-cpp-ops"], arm).env.get("ARM") == "1"
    assert "ARM" not in resolve(loaded["example-cpp-ops"], x86).env


def test_an_aarch64_builder_image_is_bootstrapped_for_arm64_and_tagged_apart(matrix: Matrix) -> None:
    pins = load_pins(ROOT / "containers" / "pins.toml")
    containers = ROOT / "containers"
    x86 = choose(pins, matrix.variant("cpu"), "3.11", containers=containers, policy="auto")
    arm = choose(pins, matrix.variant("cpu-aarch64"), "3.11", containers=containers, policy="auto")
    assert arm.base.kind is BaseKind.BOOTSTRAP and arm.base.reference.endswith("-arm64")
    assert (arm.platform, arm.oci_platform, x86.oci_platform) == ("aarch64", "linux/arm64", None)
    assert arm.base.suite == pins.suite_for("cpu", "aarch64") and "for arm64" in arm.base.description
    assert arm.tag("sha256:same") != x86.tag("sha256:same")
    assert ":builder-arm64-py311-" in arm.tag("sha256:same")
    # the registry bases are x86_64 images: an aarch64 cell keeps to its bootstrapped base
    forced = choose(pins, matrix.variant("cuda130-aarch64"), "3.11", containers=containers, policy="registry")
    assert forced.base.kind is BaseKind.BOOTSTRAP and forced.platform == "aarch64"


def _pinned(pins: Pins) -> Pins:
    """The pins with every registry base pinned by digest, as scripts/update_pins.py leaves them."""
    digest = "sha256:" + "0" * 64
    return replace(pins, bases={key: replace(base, digest=digest) for key, base in pins.bases.items()})


@pytest.mark.parametrize(
    ("policy", "registry_pinned"), [("auto", False), ("auto", True), ("bootstrap", False), ("registry", False)]
)
def test_every_cells_wheels_are_held_to_the_glibc_the_matrix_table_promises(
    matrix: Matrix, policy: str, registry_pinned: bool
) -> None:
    """docs/matrix.md's glibc columns are the baselines the post-repair checks hold each cell's
    wheels to: for every cell, aarch64 and x86_64, under each base policy (and with the
    registry bases pinned or not), the column of the kind of base its plan builds on."""
    shipped = load_pins(ROOT / "containers" / "pins.toml")
    pins = _pinned(shipped) if registry_pinned else shipped
    setup = ContainerSetup(pins=pins, directory=ROOT / "containers", base_policy=policy)
    recipes, rows = load_recipes(ROOT / "recipes"), table_rows()
    held: Counter[tuple[str, str]] = Counter()
    for cell in matrix.cells:
        plan = plan_cell(matrix, recipes, cell, [], Settings(), Options(engine="podman", containers=setup))
        assert plan.image is not None
        column = REGISTRY if plan.image.base.kind is BaseKind.REGISTRY else BOOTSTRAP
        promised = rows[cell.variant.name][column]
        assert baseline_of(plan).tag == promised, (cell.id, column)
        described = [s.detail for s in plan.steps if s.kind is StepKind.POST_REPAIR_CHECKS]
        assert described and all(f"; baseline {promised};" in detail for detail in described), cell.id
        held[cell.variant.platform, column] += 1
    arm = {column for platform, column in held if platform == "aarch64"}
    assert arm == {BOOTSTRAP}, "an aarch64 cell builds on its bootstrapped base alone"
    assert sum(n for (platform, _), n in held.items() if platform == "x86_64") > sum(held.values()) / 2
    assert all(rows[v.name][REGISTRY] == "-" for v in matrix.variants.values() if v.platform == "aarch64")


def test_the_aarch64_cells_promise_their_bootstrapped_suites_glibc(matrix: Matrix) -> None:
    """cpu-aarch64 builds on bookworm (packaged CPython 3.11): its promise is bookworm's glibc."""
    pins, rows = load_pins(ROOT / "containers" / "pins.toml"), table_rows()
    for v in matrix.variants.values():
        if v.platform == "aarch64":
            suite = pins.suite_for(v.base_name, v.platform_tag)
            assert rows[v.name][BOOTSTRAP] == manylinux_of(pins.glibc_of(suite)), v.name
    assert pins.suite_for("cpu", "aarch64") == "bookworm" and rows["cpu-aarch64"][BOOTSTRAP] == "manylinux_2_36"


@pytest.mark.parametrize("name", list(EngineName))
def test_the_engines_are_told_the_platform_of_another_machines_image(name: EngineName) -> None:
    engine = Engine(name=name, binary=name.value)
    build = engine.build(tag="t", containerfile=Path("C"), context=Path(), build_args={}, platform="linux/arm64")
    assert build[build.index("--platform") + 1] == "linux/arm64"
    assert "--platform" not in engine.build(tag="t", containerfile=Path("C"), context=Path(), build_args={})
    run = engine.run_detached(
        container="c", image="i", mounts=[Mount(source=Path("/a"), target=Path("/a"))], cell="x", platform="linux/arm64"
    )
    assert run[run.index("--platform") + 1] == "linux/arm64" and run.index("--platform") < run.index("i")
    imported = engine.import_rootfs(tarball=Path("r.tar"), tag="t", platform="aarch64")
    flag = ["--arch", "arm64"] if name is EngineName.PODMAN else ["--platform", "linux/arm64"]
    assert imported == [name.value, "import", *flag, "r.tar", "t"]
    assert engine.import_rootfs(tarball=Path("r.tar"), tag="t") == [name.value, "import", "r.tar", "t"]


def _binfmt(tmp_path: Path, entry: str | None) -> Path:
    (tmp_path / "status").write_text("enabled\n")
    if entry is not None:
        (tmp_path / "qemu-aarch64").write_text(entry)
    return tmp_path


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (None, "no qemu-user emulation of aarch64 is registered"),
        ("disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\n", "disabled"),
        ("enabled\ninterpreter /usr/bin/qemu-aarch64\nflags: OC\n", "lacks flag F"),
        ("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\n", None),
    ],
)
def test_emulation_needs_a_registered_enabled_entry_with_flag_f(
    tmp_path: Path, entry: str | None, says: str | None
) -> None:
    problem = emulation_problem("aarch64", _binfmt(tmp_path, entry))
    assert problem is None if says is None else says in (problem or "")
    assert "not mounted" in (emulation_problem("aarch64", tmp_path / "none") or "")
    assert execution("aarch64", "x86_64") is Execution.EMULATED and execution("x86_64", "x86_64") is Execution.NATIVE


def test_the_pre_checks_say_how_the_cells_code_runs_here(matrix: Matrix, monkeypatch: pytest.MonkeyPatch) -> None:
    recipes = load_recipes(ROOT / "recipes")
    arm = matrix.cell("cpu-aarch64-py311")
    hostside = plan_cell(matrix, recipes, arm, ["example-cpp-ops"], Settings())
    result = _platform(hostside, "x86_64")
    assert result.verdict is Verdict.FAIL and "without a container (--engine none)" in result.detail
    assert "podman or docker" in (result.fix or "")
    pins = load_pins(ROOT / "containers" / "pins.toml")
    setup = ContainerSetup(pins=pins, directory=ROOT / "containers", base_policy="auto")
    contained = plan_cell(
        matrix, recipes, arm, ["example-cpp-ops"], Settings(), Options(engine="podman", containers=setup)
    )
    monkeypatch.setattr("wheelmill.building.steps.cell.emulation_problem", lambda _: "binfmt_misc is not mounted at /x")
    result = _platform(contained, "x86_64")
    assert result.verdict is Verdict.FAIL and "binfmt_misc is not mounted" in result.detail
    assert "scripts/setup --system" in (result.fix or "")
    monkeypatch.setattr("wheelmill.building.steps.cell.emulation_problem", lambda _: None)
    assert "under qemu-user emulation" in _platform(contained, "x86_64").detail
    assert _platform(contained, "aarch64").detail == "aarch64 code, run natively"


def test_the_conda_env_backend_is_refused_for_another_platform(matrix: Matrix) -> None:
    recipes = load_recipes(ROOT / "recipes")
    conda = Settings(env_backend=EnvBackendName.CONDA)
    plan = plan_cell(matrix, recipes, matrix.cell("cpu-aarch64-py311"), ["example-cpp-ops"], conda)
    result = _platform(plan, "aarch64")
    assert result.verdict is Verdict.FAIL and "solves linux-64 envs alone" in result.detail
    assert result.fix == "set WHEELMILL_ENV_BACKEND=uv"


def test_an_x86_64_library_in_an_aarch64_wheel_is_named(tmp_path: Path) -> None:
    root = tmp_path / "wheel"
    arm = make_elf(root / "thing" / "_C.so", {".text": b"\xc0\x03\x5f\xd6"}, machine=EM_AARCH64)
    x86 = make_elf(root / "thing" / "_prebuilt.so", {".text": b"\xc3"})
    cubin = make_elf(root / "thing" / "k.cubin", {".text": b"\0" * 8}, machine=EM_CUDA)
    elves = [summarize(path) for path in (arm, x86, cubin)]
    result = judge_machine(elves, "aarch64", root=root)
    assert result.verdict is Verdict.FAIL
    assert result.detail == "1 ELF file(s) are not aarch64 code: thing/_prebuilt.so (X86_64)"
    assert judge_machine(elves[:1] + elves[2:], "aarch64", root=root).verdict is Verdict.PASS


def test_the_cpu_standin_gives_aarch64_code_the_registers_it_reads(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "online").write_text("0-1\n")
    (host / "possible").write_text("0-3\n")
    standin = cpu_standin(tmp_path / "standin", host)
    assert (standin / "online").read_text() == "0-1\n" and (standin / "possible").read_text() == "0-3\n"
    for cpu in (0, 1):
        assert (standin / f"cpu{cpu}/regs/identification/midr_el1").read_text() == "0x00000000410fd4f0\n"
    assert not (standin / "cpu2").exists()


def _member(cell: str, platform: str, tag: str, kind: str = "runtime") -> Member:
    return Member(cell=cell, kind=kind, platform=platform, tag=tag, pushed=f"127.0.0.1:5000/wheelmill@sha256:{cell}")


def test_a_manifest_list_joins_one_image_per_platform_under_their_shared_tag() -> None:
    members = [
        _member("cpu-py311", "linux/amd64", "abc1234-runtime-cpu-torch2.13.0-py3.11"),
        _member("cpu-aarch64-py311", "linux/arm64", "abc1234-runtime-cpu-torch2.10.0-py3.11-arm64"),
        _member("cpu-py311", "linux/amd64", "abc1234-devel-cpu-torch2.13.0-py3.11", kind="devel"),
    ]
    (plan,) = plan_lists(members, "127.0.0.1:5000/")
    assert plan.kind == "runtime" and plan.target == "127.0.0.1:5000/wheelmill:abc1234-runtime-cpu-py3.11"
    assert [m.platform for m in plan.members] == ["linux/amd64", "linux/arm64"]
    with pytest.raises(UsageError, match="not one image for several platforms"):
        list_tag(
            [
                members[0],
                _member("cuda130-aarch64-py311", "linux/arm64", "abc1234-runtime-cuda13.0.2-torch2.14.1-py3.11-arm64"),
            ]
        )
    with pytest.raises(UsageError, match="two images for one platform"):
        plan_lists([members[0], _member("cpu-py312", "linux/amd64", "abc1234-runtime-cpu-torch2.13.0-py3.11")], "r")


@pytest.mark.parametrize("name", list(EngineName))
def test_the_engines_make_and_push_a_manifest_list(name: EngineName, tmp_path: Path) -> None:
    engine = Engine(name=name, binary=name.value)
    made = engine.manifest_create(
        "localhost/l:t", "127.0.0.1:5000/wheelmill:t", ["r/w@sha256:a", "r/w@sha256:b"], insecure=True
    )
    pushed = engine.manifest_push(
        "localhost/l:t", "127.0.0.1:5000/wheelmill:t", digest_file=tmp_path / "d", insecure=True
    )
    if name is EngineName.PODMAN:
        assert made[0] == ["podman", "manifest", "create", "localhost/l:t"]
        assert made[1] == ["podman", "manifest", "add", "--tls-verify=false", "localhost/l:t", "docker://r/w@sha256:a"]
        assert pushed[-2:] == ["localhost/l:t", "docker://127.0.0.1:5000/wheelmill:t"] and "--digestfile" in pushed
    else:
        assert made == [
            ["docker", "manifest", "create", "--insecure", "127.0.0.1:5000/wheelmill:t", "r/w@sha256:a", "r/w@sha256:b"]
        ]
        assert pushed == ["docker", "manifest", "push", "--insecure", "127.0.0.1:5000/wheelmill:t"]


def test_the_static_uv_is_checked_against_the_hashes_wheelmills_requirements_pin(tmp_path: Path) -> None:
    pinned = pinned_hashes(ROOT / "requirements" / "dev.txt", "uv")
    assert len(pinned) > 1 and all(len(h) == 64 for h in pinned)
    path = tmp_path / "dev.txt"
    path.write_text(
        "uv==0.1 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via x\nzz==1 \\\n    --hash=sha256:cc\n"
    )
    assert (pinned_hashes(path, "uv"), pinned_hashes(path, "zz"), pinned_hashes(path, "nope")) == (
        ["aa", "bb"],
        ["cc"],
        [],
    )
    assert pinned_hashes(tmp_path / "missing.txt", "uv") == []
