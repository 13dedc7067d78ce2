"""Images from the index, planned without an engine: tags that say what is inside and stay
within 128 characters, labels with the channel and every wheel's sha256, the chain of
images, the constraint, and the bad input `wheelmill image build` refuses before building."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.channels import tree_channel
from tests.conftest import CliRunner
from tests.reports import write_report
from tests.sandbox import Sandbox
from tests.wheels import make_wheel
from wheelmill.errors import ConfigError, PrecheckError, ReleaseError
from wheelmill.images.editions import (
    DOCTOR,
    CellOutput,
    Delivered,
    Edition,
    ImageSpec,
    build_context,
    image_tag,
    missing_from_channel,
    plan_images,
    read_cell_output,
    read_release_output,
    too_new,
)
from wheelmill.images.smoke import Smoke
from wheelmill.index.roots import publish
from wheelmill.index.storage import TreeStorage
from wheelmill.inputs.matrix import Matrix, load_matrix
from wheelmill.inputs.versions import Track, VersionRule
from wheelmill.machine.engine import Engine, EngineName, Mount
from wheelmill.machine.process import StepLog
from wheelmill.output.layout import CellLayout
from wheelmill.releases.records import Manifest, ReleasedFile, ReleasedImage, load_manifest, record, record_images

ROOT = Path(__file__).resolve().parent.parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def matrix() -> Matrix:
    return load_matrix(ROOT / "recipes" / "matrix.toml")


def output(matrix: Matrix, cell: str = "cpu-py311", torch: str = "2.13.0+cpu") -> CellOutput:
    (found,) = matrix.select([cell])
    wheels = (
        Delivered(
            project="example-cpp-ops",
            version="0.1.0+cpu",
            filename="example_cpp_ops-0.1.0+cpu-cp311-cp311-manylinux_2_24_x86_64.whl",
            sha256="a" * 64,
        ),
        Delivered(
            project="torchsort",
            version="0.1.10+cpu",
            filename="torchsort-0.1.10+cpu-cp311-cp311-manylinux_2_31_x86_64.whl",
            sha256="b" * 64,
        ),
    )
    return CellOutput(cell=found, channel="cpu", torch=torch, wheels=wheels, closure=None)


def specs_of(
    matrix: Matrix, edition: Edition, *, extras: bool, cell: str = "cpu-py311", torch: str = "2.13.0+cpu"
) -> tuple[ImageSpec, ...]:
    return plan_images(
        output(matrix, cell, torch),
        edition=edition,
        extras=extras,
        commit=COMMIT,
        builder="localhost/wheelmill-builder:builder-py311-0123",
        base="localhost/wheelmill-base:bullseye-minbase",
        runtime_packages=("libssl1.1",),
        index_url="http://127.0.0.1:8080/cpu/simple/",
        containers=ROOT / "containers",
    )


def plan(
    matrix: Matrix, edition: Edition, *, extras: bool, cell: str = "cpu-py311", torch: str = "2.13.0+cpu"
) -> list[dict[str, object]]:
    specs = specs_of(matrix, edition, extras=extras, cell=cell, torch=torch)
    return [
        {
            "kind": s.kind,
            "tag": s.tag,
            "file": s.containerfile.parent.name,
            "args": dict(s.build_args),
            "labels": dict(s.labels),
        }
        for s in specs
    ]


def test_tags_say_what_is_inside(matrix: Matrix) -> None:
    (cuda,) = matrix.select(["cuda130-py311"])
    assert image_tag(COMMIT, "devel", cuda, "2.14.1") == "0123456-devel-cuda13.0.2-torch2.14.1-py3.11"
    (cpu,) = matrix.select(["cpu-py311"])
    assert image_tag(COMMIT, "runtime-extras", cpu, "2.13.0+cpu") == "0123456-runtime-extras-cpu-torch2.13.0-py3.11"
    slim = matrix.cell("cuda130-sm90-py311")
    assert (
        image_tag(COMMIT, "runtime-extras", slim, "2.14.1")
        == "0123456-runtime-extras-cuda13.0.2-sm90-torch2.14.1-py3.11"
    ), "never the parent's tag"


def test_a_tag_over_128_characters_is_refused(matrix: Matrix) -> None:
    (cpu,) = matrix.select(["cpu-py311"])
    with pytest.raises(ConfigError, match=r"would be 1\d\d characters, over the 128 a registry accepts"):
        image_tag(COMMIT, "runtime", cpu, "2.13.0.dev" + "1" * 100)


def test_each_image_is_from_the_one_before_and_installs_from_the_channel_alone(matrix: Matrix) -> None:
    runtime, devel, extras = plan(matrix, Edition.DEVEL, extras=True)
    assert [runtime["kind"], devel["kind"], extras["kind"]] == ["runtime", "devel", "devel-extras"]
    assert runtime["args"]["BASE"] == "localhost/wheelmill-base:bullseye-minbase"  # type: ignore[index]
    assert devel["args"]["RUNTIME"] == f"localhost/wheelmill:{runtime['tag']}"  # type: ignore[index]
    assert extras["args"]["EDITION"] == f"localhost/wheelmill:{devel['tag']}"  # type: ignore[index]
    for spec in (runtime, devel, extras):
        assert spec["args"]["INDEX_URL"] == "http://127.0.0.1:8080/cpu/simple/"  # type: ignore[index]
    # torch and every wheel wheelmill built are pinned in the constraint file pip reads.
    assert runtime["args"]["CONSTRAINTS"] == "torch==2.13.0+cpu example-cpp-ops==0.1.0+cpu torchsort==0.1.10+cpu"  # type: ignore[index]
    assert extras["args"]["WHEELS"] == "example-cpp-ops==0.1.0+cpu torchsort==0.1.10+cpu"  # type: ignore[index]
    labels = extras["labels"]
    assert labels["io.wheelmill.channel"] == "cpu" and labels["org.opencontainers.image.revision"] == COMMIT  # type: ignore[index]
    wheels = json.loads(labels["io.wheelmill.wheels"])  # type: ignore[index]
    assert wheels["torchsort-0.1.10+cpu-cp311-cp311-manylinux_2_31_x86_64.whl"] == "b" * 64


def test_the_runtime_image_carries_the_doctor_from_the_package_and_the_editions_on_it_inherit_it(
    matrix: Matrix,
) -> None:
    specs = plan_images(
        output(matrix),
        edition=Edition.DEVEL,
        extras=True,
        commit=COMMIT,
        builder="b",
        base="base",
        runtime_packages=(),
        index_url="http://127.0.0.1:8080/cpu/simple/",
        containers=ROOT / "containers",
    )
    runtime, devel, extras = specs
    assert (
        dict(runtime.context_files)
        == {"wheelmill-doctor": ROOT / "src" / "wheelmill" / "images" / "doctor.py"}
        == {"wheelmill-doctor": DOCTOR}
    )
    assert not devel.context_files and not extras.context_files  # FROM the runtime image: they have it
    assert "COPY wheelmill-doctor /usr/local/bin/wheelmill-doctor\n" in runtime.containerfile.read_text()
    with build_context(runtime) as context:
        assert sorted(p.name for p in context.iterdir()) == ["Containerfile", "torchrun", "wheelmill-doctor"]
        doctor = context / "wheelmill-doctor"
        assert doctor.read_bytes() == DOCTOR.read_bytes() and doctor.stat().st_mode & 0o777 == 0o755
        assert (context / "torchrun").stat().st_mode & 0o111, "the wrapper stays executable"
    assert not context.exists(), "the temporary context goes after the build"
    with build_context(devel) as context:
        assert context == ROOT / "containers" / "devel"


def test_a_runtime_image_without_extras_is_one_image(matrix: Matrix) -> None:
    assert [s["kind"] for s in plan(matrix, Edition.RUNTIME, extras=False)] == ["runtime"]
    assert [s["kind"] for s in plan(matrix, Edition.RUNTIME, extras=True)] == ["runtime", "runtime-extras"]


def test_the_cuda_devel_image_installs_the_variants_toolkit_wheels(matrix: Matrix) -> None:
    devel = plan(matrix, Edition.DEVEL, extras=False, cell="cuda130-py311", torch="2.14.1")[1]
    assert devel["args"]["TOOLKIT"].split() == list(matrix.variants["cuda130"].toolkit_wheels)  # type: ignore[index]


def test_a_wheel_that_needs_a_newer_glibc_than_the_image_is_named(matrix: Matrix) -> None:
    built = output(matrix)
    assert too_new(built, "2.31") == []
    assert too_new(built, "2.28") == ["torchsort-0.1.10+cpu-cp311-cp311-manylinux_2_31_x86_64.whl needs glibc 2.31"]


def test_what_the_channel_lacks_is_listed(matrix: Matrix, tmp_path: Path) -> None:
    channel = tree_channel(tmp_path / "index", "cpu")
    publish(channel, make_wheel(tmp_path, "torchsort", "0.1.10+cpu", tag="py3-none-any"))
    assert missing_from_channel(output(matrix), channel) == ["example-cpp-ops==0.1.0+cpu", "torch==2.13.0+cpu"]


def test_a_cell_never_built_is_a_one_line_error(matrix: Matrix, tmp_path: Path) -> None:
    (cell,) = matrix.select(["cpu-py311"])
    with pytest.raises(PrecheckError, match=r"cpu-py311: never built here .*") as raised:
        read_cell_output(CellLayout(output=tmp_path, cell="cpu-py311"), cell)
    assert raised.value.fix == "build it first: wheelmill build --cell cpu-py311"


def test_engine_commands_for_images() -> None:
    podman, docker = Engine(name=EngineName.PODMAN, binary="podman"), Engine(name=EngineName.DOCKER, binary="docker")
    built = podman.build(
        tag="t", containerfile=Path("c/Containerfile"), context=Path("c"), build_args={"A": "1"}, labels={"x.y": "z"}
    )
    assert built == [
        "podman",
        "build",
        "--tag",
        "t",
        "--file",
        "c/Containerfile",
        "--network",
        "host",
        "--build-arg",
        "A=1",
        "--label",
        "x.y=z",
        "c",
    ]
    run = docker.run(image="i", argv=["torchrun", "s.py"], network="net", ip="10.0.0.2", env_keys=["RANK"])
    assert run == [
        "docker",
        "run",
        "--rm",
        "--network",
        "net",
        "--ip",
        "10.0.0.2",
        "--env",
        "RANK",
        "i",
        "torchrun",
        "s.py",
    ]
    assert podman.push("r/w:t", digest_file=Path("d"), insecure=True) == [
        "podman",
        "push",
        "--tls-verify=false",
        "--digestfile",
        "d",
        "r/w:t",
    ]
    assert docker.push("r/w:t", digest_file=Path("d"), insecure=True) == ["docker", "push", "r/w:t"]


def test_tier_d_gets_the_gpus_of_each_engine_or_says_why_it_did_not_run(tmp_path: Path) -> None:
    """The NCCL tier runs only where a CUDA image, a visible GPU and an engine that passes
    GPUs in meet; anywhere else its line says it did not run, and why."""
    docker, podman = Engine(name=EngineName.DOCKER, binary="docker"), Engine(name=EngineName.PODMAN, binary="podman")
    assert docker.run(image="img", argv=["true"], gpus=True)[:7] == [
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        "--gpus",
        "all",
    ]
    assert "nvidia.com/gpu=all" in podman.run(image="img", argv=["true"], gpus=True)
    assert "--gpus" not in docker.run(image="img", argv=["true"])
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    assert "no NVIDIA runtime or CDI spec" in str(podman.gpu_access([cdi]))
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    assert podman.gpu_access([cdi]) is None
    said: list[str] = []
    with StepLog(tmp_path / "smoke.log") as log:
        smoke = Smoke(podman, "img", log=log, on_line=said.append)
        smoke.nccl(cuda=False, gpus=["GPU 0 (NVIDIA H100, 9.0)"], why_none="")
        smoke.nccl(cuda=True, gpus=[], why_none="nvidia-smi not found")
    assert said == [
        "tier d (NCCL all-reduce on a GPU): not run: a CPU image",
        "tier d (NCCL all-reduce on a GPU): not run: no GPU visible (nvidia-smi not found)",
    ]


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--edition", "slim"], 2, "argument --edition: invalid choice: 'slim'"),
        (["--edition", "runtime"], 5, "never built here"),
    ],
)
def test_bad_input_to_image_build_is_one_line(
    cli: CliRunner, tmp_path: Path, args: list[str], code: int, says: str
) -> None:
    result = cli(
        "--recipes",
        str(ROOT / "recipes"),
        "--output",
        str(tmp_path / "out"),
        "image",
        "build",
        "--cell",
        "cpu-py311",
        *args,
    )
    assert result.code == code
    (line,) = result.err.splitlines()
    assert says in line and "; fix: " in line, line


def test_a_channel_missing_a_package_is_exit_20_before_anything_is_built(cli: CliRunner, tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path / "repo")
    wheel = make_wheel(sandbox.output / sandbox.cell("cpu") / "dist", "app", "1.0+cpu", tag="py3-none-any")
    write_report(sandbox.output, sandbox.cell("cpu"), wheels=[("app", wheel, "c" * 64)], torch="2.13.0+cpu")
    publish(tree_channel(sandbox.output / "index", "cpu"), wheel)
    result = cli(
        "--recipes",
        str(ROOT / "recipes"),
        "--output",
        str(sandbox.output),
        "image",
        "build",
        "--cell",
        "cpu-py311",
        "--edition",
        "runtime",
    )
    assert result.code == 20, result.err
    (line,) = result.err.splitlines()
    assert (
        "channel cpu lacks torch==2.13.0+cpu" in line
        and "fix: mirror the cell's closure: wheelmill mirror --cell cpu-py311" in line
    )


def test_a_tag_that_would_exceed_128_characters_is_exit_3_before_anything_runs(cli: CliRunner, tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    wheel = make_wheel(output_dir / "cpu-py311" / "dist", "app", "1.0+cpu", tag="py3-none-any")
    torch = "2.13.0.dev" + "2" * 100 + "+cpu"  # a nightly's version, say
    write_report(output_dir, "cpu-py311", wheels=[("app", wheel, "c" * 64)], torch=torch)
    result = cli(
        "--recipes",
        str(ROOT / "recipes"),
        "--output",
        str(output_dir),
        "image",
        "build",
        "--cell",
        "cpu-py311",
        "--edition",
        "runtime",
    )
    assert result.code == 3, result.err
    (line,) = result.err.splitlines()
    assert "over the 128 a registry accepts" in line and "; fix: " in line


def test_a_released_cell_is_read_from_its_record_and_images_are_recorded_in_it(matrix: Matrix, tmp_path: Path) -> None:
    """A promoted final has no build of its own: its images come from the release channel."""
    root = tmp_path / "index"
    wheel = make_wheel(
        tmp_path / "w",
        "example-cpp-ops",
        "0.1.0+cpu",
        requires=["torch==2.13.0+cpu"],
        tag="cp311-cp311-manylinux_2_24_x86_64",
    )
    publish(tree_channel(root, "cpu"), wheel)
    files = (
        ReleasedFile(
            channel="cpu",
            cell="cpu-py311",
            recipe="example-cpp-ops",
            filename=wheel.name,
            sha256="d" * 64,
            rule=VersionRule.REPO,
        ),
    )
    record(TreeStorage(root), Manifest(version="0.1.0", track=Track.RELEASE, commit=COMMIT, tag="v0.1.0", files=files))
    (cell,) = matrix.select(["cpu-py311"])
    released = read_release_output(TreeStorage(root), root, Track.RELEASE, "0.1.0", cell)
    assert (released.channel, released.torch, [w.requirement for w in released.wheels]) == (
        "cpu",
        "2.13.0+cpu",
        ["example-cpp-ops==0.1.0+cpu"],
    )
    image = ReleasedImage(cell="cpu-py311", kind="runtime", reference="registry.example/wheelmill@sha256:" + "e" * 64)
    record_images(TreeStorage(root), Track.RELEASE, "0.1.0", [image])
    assert load_manifest(TreeStorage(root), Track.RELEASE, "0.1.0").images == (image,)
    again = ReleasedImage(cell="cpu-py311", kind="runtime", reference="registry.example/wheelmill@sha256:" + "f" * 64)
    # a newer push replaces it
    record_images(TreeStorage(root), Track.RELEASE, "0.1.0", [again])
    assert load_manifest(TreeStorage(root), Track.RELEASE, "0.1.0").images == (again,)
    (other,) = matrix.select(["cpu-py312"])
    with pytest.raises(ReleaseError, match=r"release 0\.1\.0: no files of cpu-py312"):
        read_release_output(TreeStorage(root), root, Track.RELEASE, "0.1.0", other)


def test_an_aarch64_cells_images_are_built_for_arm64_and_tagged_apart(matrix: Matrix) -> None:
    arm = specs_of(matrix, Edition.DEVEL, extras=True, cell="cpu-aarch64-py311", torch="2.10.0+cpu")
    assert [s.platform for s in arm] == ["linux/arm64"] * 3
    assert all(s.tag.endswith("-py3.11-arm64") for s in arm)
    # PyPI's aarch64 torch file is 2.10.0, though it reports 2.10.0+cpu: pinned by release
    assert arm[0].build_args["TORCH"] == "2.10.0" and arm[0].build_args["CONSTRAINTS"].startswith("torch==2.10.0 ")
    x86 = plan(matrix, Edition.RUNTIME, extras=False)
    assert not str(x86[0]["tag"]).endswith("-arm64")
    assert x86[0]["args"] == {**x86[0]["args"], "TORCH": "2.13.0+cpu"}  # type: ignore[dict-item]


def test_every_smoke_container_gets_the_mounts_the_image_always_needs(tmp_path: Path) -> None:
    """An emulated aarch64 image's tiers run with the CPU stand-in in every container."""
    calls = tmp_path / "calls"
    engine_bin = tmp_path / "podman"
    engine_bin.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    engine_bin.chmod(0o755)
    standin = Mount(source=tmp_path / "cpu", target=Path("/sys/devices/system/cpu"))
    with StepLog(tmp_path / "smoke.log") as log:
        smoke = Smoke(
            Engine(name=EngineName.PODMAN, binary=str(engine_bin)), "img", log=log, on_line=print, always=[standin]
        )
        smoke._run("a/pip-check", ["pip", "check"])
    assert f"--volume {standin.volume()} img pip check" in calls.read_text()
