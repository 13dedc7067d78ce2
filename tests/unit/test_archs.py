"""Every wheel says which GPUs it runs on: the stamp step writes ``gpu-archs.json`` into its
.dist-info (in RECORD, the same bytes for the same input), the post-repair checks hold the
shipped wheel to it, and the index shows it (JSON, HTML, ``index list``), reading its own
pages back."""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from tests.channels import pages_dir, tree_channel
from tests.conftest import CliRunner
from tests.elves import make_elf
from tests.sandbox import PY, Sandbox, assert_recorded, build, dist_info
from tests.wheels import make_wheel
from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.plan import plan
from wheelmill.building.products import Repaired, Stamped
from wheelmill.building.steps import BY_KIND
from wheelmill.building.steps.build import arch_record
from wheelmill.checks import Verdict
from wheelmill.checks.contents import judge_arch_record
from wheelmill.errors import CheckError, InvalidWheel
from wheelmill.index import pages
from wheelmill.index.objects import render
from wheelmill.index.pages import Project
from wheelmill.index.roots import problems, publish
from wheelmill.inputs.archs import ArchRecord
from wheelmill.inputs.matrix import load_matrix
from wheelmill.inputs.recipes import load_recipes
from wheelmill.inputs.variants import Family
from wheelmill.planning.spec import RecipeSpec, StepKind
from wheelmill.settings import Settings
from wheelmill.wheel.elf import summarize
from wheelmill.wheel.wheelfile import read_wheel, rewrite_metadata

ROOT = Path(__file__).resolve().parent.parent.parent
CUDA = ArchRecord(family=Family.CUDA, arch_list="7.5;8.0;8.6;9.0;10.0;12.0+PTX", cell="cuda130-py311")
MANYLINUX = f"cp{PY}-cp{PY}-manylinux_2_28_x86_64"


def spec(cell: str, recipe: str) -> RecipeSpec:
    matrix = load_matrix(ROOT / "recipes" / "matrix.toml")
    (cell_plan,) = plan(
        matrix, load_recipes(ROOT / "recipes"), matrix.select([cell]), [recipe], Settings.from_environ({})
    )
    return cell_plan.recipe(recipe)


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_the_record_is_written_into_the_dist_info_with_its_record_entry_and_the_same_bytes_every_time(
    tmp_path: Path,
) -> None:
    built = make_wheel(tmp_path, "example-cuda-ops", "0.1.0", files={"example_cuda_ops/_C.so": b"\x7fELF not really"})
    record = CUDA.to_bytes()
    assert record == b'{"arch_list": "7.5;8.0;8.6;9.0;10.0;12.0+PTX", "cell": "cuda130-py311", "family": "cuda"}\n'
    first = rewrite_metadata(
        built, tmp_path / "one", version="0.1.0+cu130", pins={"torch": "2.14.1"}, dist_files={"gpu-archs.json": record}
    )
    second = rewrite_metadata(
        built, tmp_path / "two", version="0.1.0+cu130", pins={"torch": "2.14.1"}, dist_files={"gpu-archs.json": record}
    )
    assert first.read_bytes() == second.read_bytes(), "the same input gives the same bytes"
    files = members(first)
    assert files["example_cuda_ops-0.1.0+cu130.dist-info/gpu-archs.json"] == record
    rows = {
        row[0]: row[1:]
        for row in csv.reader(io.StringIO(files["example_cuda_ops-0.1.0+cu130.dist-info/RECORD"].decode()))
    }
    digest = base64.urlsafe_b64encode(hashlib.sha256(record).digest()).rstrip(b"=").decode()
    assert rows["example_cuda_ops-0.1.0+cu130.dist-info/gpu-archs.json"] == [f"sha256={digest}", str(len(record))]
    assert set(rows) == set(files)
    assert read_wheel(first).arch_record == record


def test_a_record_already_in_the_wheel_is_replaced_not_doubled(tmp_path: Path) -> None:
    built = make_wheel(tmp_path, "pkg", "1.0", gpu_archs=b"stale")
    out = rewrite_metadata(
        built, tmp_path / "out", version=None, pins={}, dist_files={"gpu-archs.json": CUDA.to_bytes()}
    )
    with zipfile.ZipFile(out) as zf:
        assert zf.namelist().count("pkg-1.0.dist-info/gpu-archs.json") == 1
    assert read_wheel(out).arch_record == CUDA.to_bytes()


def test_the_record_is_the_specs_arch_list_where_the_wheel_carries_device_code_and_cpu_where_not(
    tmp_path: Path,
) -> None:
    cuda = spec("cuda130-py311", "example-cuda-ops")
    fat = summarize(make_elf(tmp_path / "fat.so", {".nv_fatbin": b"\x50\xed\x55\xba"}))
    plain = summarize(make_elf(tmp_path / "plain.so", {".text": b"\xc3"}))
    assert arch_record(cuda, [plain, fat]) == CUDA
    # C++ operators built in a CUDA cell carry no device code: they run on any GPU, or none.
    assert arch_record(cuda, [plain]) == ArchRecord(family=Family.CPU, arch_list=None, cell="cuda130-py311")
    rocm = spec("rocm62-py311", "example-cpp-ops")
    hip = summarize(make_elf(tmp_path / "hip.so", {".hip_fatbin": b"__CLANG_OFFLOAD_BUNDLE__"}))
    assert arch_record(rocm, [hip]).describe() == "rocm gfx900;gfx906;gfx908;gfx90a;gfx942;gfx1030;gfx1100;gfx1101"
    assert (
        arch_record(spec("cpu-py311", "example-cpp-ops"), [fat]).to_bytes()
        == b'{"arch_list": null, "cell": "cpu-py311", "family": "cpu"}\n'
    )


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (None, "gpu-archs.json is missing"),
        (b"{not json", "is not an arch record: not JSON"),
        (
            b'{"arch_list": "8.0", "cell": "cuda130-py311", "family": "rocm"}',
            "is not an arch record: '8.0' is not a ROCm target",
        ),
        (
            b'{"arch_list": "8.0;9.0", "cell": "cuda130-py311", "family": "cuda"}',
            "says cuda 8.0;9.0 (cell cuda130-py311), the build is cuda 7.5;",
        ),
    ],
)
def test_a_missing_malformed_or_disagreeing_record_fails_the_check(
    tmp_path: Path, data: bytes | None, says: str
) -> None:
    info = read_wheel(make_wheel(tmp_path, "example-cuda-ops", "0.1.0+cu130", gpu_archs=data))
    result = judge_arch_record(info, CUDA)
    assert result.verdict is Verdict.FAIL
    assert result.detail.startswith(
        "example_cuda_ops-0.1.0+cu130-cp311-cp311-linux_x86_64.whl: "
        "example_cuda_ops-0.1.0+cu130.dist-info/gpu-archs.json"
    )
    assert says in result.detail and result.fix and "rebuild it" in result.fix
    assert (
        judge_arch_record(
            read_wheel(make_wheel(tmp_path / "ok", "example-cuda-ops", "0.1.0+cu130", gpu_archs=CUDA.to_bytes())), CUDA
        ).verdict
        is Verdict.PASS
    )


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path / "repo")


def test_the_stamp_step_writes_the_record_of_what_the_wheel_carries(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, tmp_path: Path
) -> None:
    library = make_elf(tmp_path / "_C.so", {".nv_fatbin": b"\x50\xed\x55\xba" + b"not a fatbinary" * 4}).read_bytes()
    sandbox.recipe("thing", {"thing/_C.so": library, **dist_info("thing", "1.0")}, wheel=f"thing-1.0-{MANYLINUX}.whl")
    # its post-build checks refuse the stand-in fatbinary; the stamp came first
    build(cli, monkeypatch, sandbox, "cuda130")
    (stamped,) = (sandbox.output / sandbox.cell("cuda130") / "build" / "thing" / "stamped").glob("*.whl")
    assert (
        members(stamped)["thing-1.0+cu130.dist-info/gpu-archs.json"]
        == f'{{"arch_list": "8.0", "cell": "cuda130-py{PY}", "family": "cuda"}}\n'.encode()
    )
    report = json.loads((sandbox.output / sandbox.cell("cuda130") / "report.json").read_text())
    (stamp,) = [s for s in report["steps"] if s["step"] == "stamp"]
    assert "gpu-archs.json cuda 8.0" in stamp["checks"][0]["detail"]


@pytest.mark.parametrize(
    ("shipped", "says"),
    [
        (None, f"thing-1.0+cpu-{MANYLINUX}.whl: thing-1.0+cpu.dist-info/gpu-archs.json is missing"),
        (
            CUDA.to_bytes(),
            (
                "gpu-archs.json says cuda 7.5;8.0;8.6;9.0;10.0;12.0+PTX (cell cuda130-py311), "
                f"the build is cpu (cell cpu-py{PY})"
            ),
        ),
    ],
)
def test_a_repair_that_loses_or_changes_the_record_fails_the_post_repair_checks(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, shipped: bytes | None, says: str
) -> None:
    def lossy_repair(ctx: StepContext, spec: RecipeSpec) -> Outcome:
        """auditwheel as it must not be: the .dist-info rewritten without (or with another) record."""
        stamped = ctx.done.get(Stamped, spec.name).wheel
        record = f"{read_wheel(stamped).dist_info}/gpu-archs.json"
        files = {k: v for k, v in members(stamped).items() if k != record} | (
            {record: shipped} if shipped is not None else {}
        )
        out = (
            ctx.run.layout.build
            / spec.name
            / "repaired"
            / stamped.name.replace("linux_x86_64", "manylinux_2_28_x86_64")
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w") as zf:
            for name, data in files.items():
                zf.writestr(name, data)
        return Outcome(made=(Repaired(wheel=out),))

    monkeypatch.setitem(BY_KIND, StepKind.REPAIR, dataclasses.replace(BY_KIND[StepKind.REPAIR], run=lossy_repair))  # type: ignore[arg-type]
    sandbox.recipe(
        "thing",
        {"thing/__init__.py": b"", **dist_info("thing", "1.0")},
        wheel=f"thing-1.0-cp{PY}-cp{PY}-linux_x86_64.whl",
    )
    result = build(cli, monkeypatch, sandbox, "cpu")
    assert_recorded(result, sandbox, "cpu", step="thing/post-repair-checks", code=CheckError.exit_code, says=says)
    assert "fix: gpu-archs: rebuild it with this wheelmill" in result.err


def test_publish_shows_the_archs_in_json_html_and_the_listing_and_reads_its_pages_back(
    cli: CliRunner, tmp_path: Path
) -> None:
    root = tmp_path / "wheels" / "index"
    channel = tree_channel(root, "cu130")
    publish(channel, make_wheel(tmp_path, "example-cuda-ops", "0.1.0+cu130", gpu_archs=CUDA.to_bytes()))
    cpu = ArchRecord(family=Family.CPU, arch_list=None, cell="cuda130-py311").to_bytes()
    publish(channel, make_wheel(tmp_path, "example-cpp-ops", "0.1.0+cu130", gpu_archs=cpu))
    publish(channel, make_wheel(tmp_path, "older-ext", "0.1.0+cu130"))  # built before arch recording
    publish(
        channel,
        make_wheel(tmp_path, "filelock", "3.0", tag="py3-none-any"),
        mirrored_from="https://pypi.example/filelock-3.0-py3-none-any.whl",
    )
    page = pages_dir(channel) / "example-cuda-ops"
    (file,) = json.loads((page / "index.json").read_text())["files"]
    assert file["_gpu-archs"] == "cuda 7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    (anchor,) = pages.links((page / "index.html").read_text())
    assert anchor["data-gpu-archs"] == "cuda 7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    for name in ("older-ext", "filelock"):
        (plain,) = json.loads((pages_dir(channel) / name / "index.json").read_text())["files"]
        assert "_gpu-archs" not in plain
        assert "data-gpu-archs" not in (pages_dir(channel) / name / "index.html").read_text()
    project = channel.project("example-cuda-ops")
    assert project is not None and project.files[0].gpu_archs == "cuda 7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    assert pages.parse_project_json(pages.project_json(project)) == project
    assert problems(channel) == []
    result = cli("--output", str(tmp_path / "wheels"), "index", "list", "--channel", "cu130")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert "example-cuda-ops: 0.1.0+cu130  [built, cuda 7.5;8.0;8.6;9.0;10.0;12.0+PTX]" in lines
    assert "example-cpp-ops: 0.1.0+cu130  [built, cpu]" in lines
    assert "older-ext: 0.1.0+cu130  [built]" in lines
    assert "filelock: 3.0  [mirrored from https://pypi.example/filelock-3.0-py3-none-any.whl]" in lines


def test_an_html_attribute_is_escaped_and_a_page_without_the_key_still_loads() -> None:
    entry = pages.FileEntry(
        filename="x-1.0-py3-none-any.whl",
        version="1.0",
        sha256="a" * 64,
        size=1,
        upload_time="2026-11-22T10:00:00.000000Z",
        requires_python=None,
        metadata_sha256="b" * 64,
        gpu_archs='rocm "gfx90a"',
    )
    html = pages.project_html(Project(name="x", files=(entry,)))
    assert 'data-gpu-archs="rocm &quot;gfx90a&quot;"' in html
    assert pages.links(html)[0]["data-gpu-archs"] == 'rocm "gfx90a"'
    old = json.loads(pages.project_json(Project(name="x", files=(dataclasses.replace(entry, gpu_archs=None),))))
    assert "_gpu-archs" not in old["files"][0]
    assert pages.parse_project_json(json.dumps(old)).files[0].gpu_archs is None


def test_a_malformed_record_makes_a_built_wheel_invalid_and_a_mirrored_ones_is_not_read(tmp_path: Path) -> None:
    channel = tree_channel(tmp_path / "index", "cu130")
    bad = make_wheel(tmp_path, "example-cuda-ops", "0.1.0+cu130", gpu_archs=b'{"family": "cuda"}')
    with pytest.raises(
        InvalidWheel, match=r"gpu-archs.json is not a GPU arch record \(not an object with exactly the keys"
    ) as raised:
        publish(channel, bad)
    assert raised.value.exit_code == 15 and "\n" not in raised.value.one_line()
    assert (
        publish(
            channel,
            make_wheel(tmp_path / "up", "other", "1.0", gpu_archs=b"junk"),
            mirrored_from="https://up.example/o.whl",
        ).outcome.value
        == "added"
    )


def test_render_keeps_the_archs_of_a_project_whose_pages_are_damaged_or_gone(tmp_path: Path) -> None:
    """The archs are in the file's entry, not only on its pages: a render from the entries
    lists them again, whatever became of the pages."""
    channel = tree_channel(tmp_path / "index", "cu130")
    publish(channel, make_wheel(tmp_path, "example-cuda-ops", "0.1.0+cu130", gpu_archs=CUDA.to_bytes()))
    page = pages_dir(channel) / "example-cuda-ops"
    (page / "index.json").write_text("{damaged")
    render(channel)
    project = channel.project("example-cuda-ops")
    assert project is not None and project.files[0].gpu_archs == "cuda 7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    (page / "index.json").write_text("{damaged")
    (page / "index.html").unlink()
    render(channel)
    project = channel.project("example-cuda-ops")
    assert project is not None and project.files[0].gpu_archs == "cuda 7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    assert 'data-gpu-archs="cuda 7.5;8.0;8.6;9.0;10.0;12.0+PTX"' in (page / "index.html").read_text()
    for form in ("index.json", "index.html"):
        (page / form).unlink()
    render(channel)
    project = channel.project("example-cuda-ops")
    assert project is not None and project.files[0].gpu_archs == "cuda 7.5;8.0;8.6;9.0;10.0;12.0+PTX"
    assert problems(channel) == []
