"""What an image build and the GPU stage install is held to its signed provenance first, where
the team's keys are configured: a wheel signed by another key stops either before anything is
built or installed (exit 26, one line naming it on stderr); a good one goes on; with no key,
one line says nothing was verified. And an image's smoke tier finds each wheel built here
that it installed carrying its SBOM. No container, GPU or network: the stage stops at the
first thing after the verification that needs a torch, and the smoke tier's script runs on
this machine's Python through a stand-in engine."""

from __future__ import annotations

import json
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.attest import published_signed, signed_wheel
from tests.channels import tree_channel
from tests.conftest import CliRunner
from tests.reports import write_report
from tests.wheels import make_wheel
from wheelmill.errors import FetchError, ImageError, SignatureError
from wheelmill.images import doctor
from wheelmill.images.editions import built_installed
from wheelmill.images.smoke import Smoke
from wheelmill.index.pages import Project
from wheelmill.index.roots import publish
from wheelmill.machine.engine import Engine, EngineName
from wheelmill.machine.process import StepLog
from wheelmill.provenance.sbom import SBOM_FILE
from wheelmill.provenance.signing import SigningKey, new_signing_key
from wheelmill.releases.attested import Source, local_source
from wheelmill.releases.preinstall import NO_KEY_LINE, NOT_VERIFIED, verify_before_install

ROOT = Path(__file__).resolve().parent.parent.parent
GPU_CELL = "cuda130-py311"
CUDA_TAG = "cp311-cp311-manylinux_2_28_x86_64"


@pytest.fixture(scope="module")
def team() -> SigningKey:
    return new_signing_key("ed25519", source="the team's key")


@pytest.fixture(scope="module")
def stranger() -> SigningKey:
    return new_signing_key("ed25519", source="another key")


@pytest.fixture
def trusting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, team: SigningKey) -> str:
    """WHEELMILL_TRUSTED_KEYS set to the team's public key; the key's id."""
    public = tmp_path / "team.pub"
    public.write_bytes(team.public_pem())
    monkeypatch.setenv("WHEELMILL_TRUSTED_KEYS", str(public))
    return team.key_id


@pytest.fixture(autouse=True)
def no_keys_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WHEELMILL_TRUSTED_KEYS", "WHEELMILL_SIGNING_KEY", "WHEELMILL_SIGNING_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)


# -- the check itself ---------------------------------------------------------------------


def test_only_the_files_an_install_takes_are_verified_and_each_failure_is_a_line(
    tmp_path: Path, team: SigningKey, stranger: SigningKey
) -> None:
    channel = tree_channel(tmp_path / "index", "cpu")
    good = published_signed(channel, tmp_path / "w", "wm-good", "1.0+cpu", key=team)
    bad = published_signed(channel, tmp_path / "w", "wm-bad", "1.0+cpu", key=stranger)
    bare = published_signed(channel, tmp_path / "w", "wm-bare", "1.0+cpu", key=None)
    said: list[str] = []
    ok = verify_before_install(local_source(channel), [good.name], trusted=(team.trusted(),), on_failure=said.append)
    assert (ok.code, ok.verified, said) == (0, (good.name,), [])
    assert ok.record() == {"verified": 1, "files": [good.name], "keys": [team.key_id], "failed": []}
    assert ok.line().startswith(f"provenance: 1 file(s) built here verified ({good.name}); keys sha256:")

    refused = verify_before_install(
        local_source(channel), [good.name, bad.name, bare.name], trusted=(team.trusted(),), on_failure=said.append
    )
    assert refused.code == SignatureError.exit_code == 26
    assert len(said) == 2, said  # in the channel's order
    assert said[0].startswith(f"{bad.name}: statement 1: ") and said[1].startswith(f"{bare.name}: no provenance")
    assert refused.verified == (good.name,) and "2 of 3 file(s) failed" in refused.line()


def test_a_file_to_install_that_the_pages_do_not_list_as_built_is_a_failure(tmp_path: Path, team: SigningKey) -> None:
    channel = tree_channel(tmp_path / "index", "cpu")
    published_signed(channel, tmp_path / "w", "wm-good", "1.0+cpu", key=team)
    said: list[str] = []
    checked = verify_before_install(
        local_source(channel), ["wm_gone-1.0-py3-none-any.whl"], trusted=(team.trusted(),), on_failure=said.append
    )
    assert checked.code == FetchError.exit_code
    assert said == [
        (
            "wm_gone-1.0-py3-none-any.whl: to be installed, but cpu's pages do not list it as built here; "
            "fix: publish it from its build (with its provenance) again"
        )
    ]


def test_with_no_trusted_key_nothing_is_read_and_one_line_says_so() -> None:
    def unread() -> Iterator[Project]:
        raise AssertionError("the channel is read only to verify")

    source = Source(name="cpu", channel="cpu", projects=unread, project=None, fetch=None, provenance=None)  # type: ignore[arg-type]
    checked = verify_before_install(source, ["a.whl"], trusted=(), on_failure=print)
    assert (checked.code, checked.line(), checked.record()) == (0, NO_KEY_LINE, NOT_VERIFIED)
    assert NO_KEY_LINE == "provenance: not verified: no trusted key (WHEELMILL_TRUSTED_KEYS)"


def test_under_required_with_no_trusted_key_nothing_is_installed_and_one_line_says_why() -> None:
    def unread() -> Iterator[Project]:
        raise AssertionError("the channel is read only to verify")

    source = Source(name="cpu", channel="cpu", projects=unread, project=None, fetch=None, provenance=None)  # type: ignore[arg-type]
    said: list[str] = []
    checked = verify_before_install(source, ["a.whl"], trusted=(), on_failure=said.append, required=True)
    assert checked.code == 26 and checked.failures[0].line == said[0]
    why = "WHEELMILL_SIGNATURES=required with no trusted key to verify them"
    assert said == [
        f"1 file(s) built here to be installed, and {why}; fix: set WHEELMILL_TRUSTED_KEYS to the team's public keys"
    ]
    nothing = verify_before_install(source, [], trusted=(), on_failure=said.append, required=True)
    assert nothing.code == 0, "nothing built here to install: nothing to verify"


def test_an_image_under_required_with_no_trusted_key_is_exit_26_before_anything_is_built(
    cli: CliRunner, built_cell: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_with(built_cell, None)
    monkeypatch.setenv("WHEELMILL_SIGNATURES", "required")
    code, _out, err = image_build(cli, built_cell, "--extras")
    assert code == 26 and "WHEELMILL_SIGNATURES=required with no trusted key" in err[0], err


# -- images -------------------------------------------------------------------------------


def test_an_image_installs_the_cells_wheels_only_with_extras_and_a_torch_it_built_always() -> None:
    files = ["ops-1.0+cpu-cp311-cp311-linux_x86_64.whl", "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"]
    assert built_installed(files, extras=True) == files
    assert built_installed(files, extras=False) == files[1:]


def image_build(cli: CliRunner, output: Path, *extra: str) -> tuple[int, str, list[str]]:
    done = cli(
        "--recipes", str(ROOT / "recipes"), "--output", str(output),
        "image", "build", "--cell", "cpu-py311", "--edition", "runtime", *extra,
    )  # fmt: skip
    assert "Traceback" not in done.out + done.err
    return done.code, done.out, done.err.splitlines()


@pytest.fixture
def built_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The output root of a CPU cell's build: its report names one wheel, which its channel
    (``<output>/index/cpu``) holds, torch not among them."""
    monkeypatch.delenv("WHEELMILL_INDEX_ROOT", raising=False)
    return tmp_path / "out"


def build_with(output: Path, key: SigningKey | None) -> Path:
    channel = tree_channel(output / "index", "cpu")
    wheel = published_signed(channel, output / "cpu-py311" / "dist", "app", "1.0+cpu", key=key)
    write_report(output, "cpu-py311", wheels=[("app", wheel, "c" * 64)], torch="2.13.0+cpu")
    return wheel


def test_an_image_of_a_wheel_signed_by_another_key_is_exit_26_before_anything_is_built(
    cli: CliRunner, built_cell: Path, trusting: str, stranger: SigningKey
) -> None:
    wheel = build_with(built_cell, stranger)
    code, out, err = image_build(cli, built_cell, "--extras")
    assert code == 26, err
    (line,) = err
    assert line.startswith(f"wheelmill: error: {wheel.name}: statement 1: ") and "; fix: " in line, line
    assert "provenance: 1 of 1 file(s) failed" in out
    # nothing built, fetched or logged: the cell's directory holds what its build left
    assert sorted(p.name for p in (built_cell / "cpu-py311").iterdir()) == ["dist", "report.json"]


def test_an_image_of_a_wheel_that_verifies_goes_on(
    cli: CliRunner, built_cell: Path, trusting: str, team: SigningKey
) -> None:
    wheel = build_with(built_cell, team)
    code, out, err = image_build(cli, built_cell, "--extras")
    assert f"provenance: 1 file(s) built here verified ({wheel.name}); keys {trusting[:19]}..." in out
    (line,) = err  # on to the next check: this channel has no torch
    assert code == ImageError.exit_code and "channel cpu lacks torch==2.13.0+cpu" in line, err


def test_a_runtime_image_without_extras_installs_nothing_built_here_to_verify(
    cli: CliRunner, built_cell: Path, trusting: str, stranger: SigningKey
) -> None:
    build_with(built_cell, stranger)  # its wheel is not what the runtime image installs
    code, out, err = image_build(cli, built_cell)
    assert "provenance: nothing built here to verify" in out
    assert code == ImageError.exit_code and "lacks torch" in err[0], err


def test_an_image_with_no_trusted_key_says_so_in_a_line_and_goes_on(cli: CliRunner, built_cell: Path) -> None:
    build_with(built_cell, None)
    code, out, err = image_build(cli, built_cell, "--extras")
    assert NO_KEY_LINE in out.splitlines()
    assert code == ImageError.exit_code and "lacks torch" in err[0], err


# -- the smoke tier's SBOM check ----------------------------------------------------------


def stand_in_engine(tmp_path: Path, site: Path) -> Engine:
    """An engine whose "container" is this machine's Python with ``site`` on its path and the
    smoke files where the image would see them."""
    binary = tmp_path / "podman"
    binary.write_text(
        f"#!{sys.executable}\n"
        "import os, subprocess, sys\n"
        "args = sys.argv[1:]\n"
        "mounts = [args[i + 1].split(':') for i, a in enumerate(args) if a == '--volume']\n"
        "smoke = next(source for source, target, *_ in mounts if target == '/opt/wheelmill-smoke')\n"
        "argv = [a.replace('/opt/wheelmill-smoke', smoke) for a in args[args.index('img') + 1 :]]\n"
        f"argv[0] = {sys.executable!r} if argv[0] == 'python' else argv[0]\n"
        f"sys.exit(subprocess.run(argv, env={{**os.environ, 'PYTHONPATH': {str(site)!r}}}).returncode)\n"
    )
    binary.chmod(0o755)
    return Engine(name=EngineName.PODMAN, binary=str(binary))


def installed(site: Path, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # as pip lays a wheel out: its .dist-info, sboms/ with it


def test_the_smoke_tier_finds_each_installed_wheel_built_here_carrying_its_sbom(
    tmp_path: Path, team: SigningKey
) -> None:
    site = tmp_path / "site"
    channel = tree_channel(tmp_path / "index", "cpu")
    installed(site, published_signed(channel, tmp_path / "w", "wm-sbom-one", "1.0+cpu", key=team))
    installed(site, published_signed(channel, tmp_path / "w", "wm_sbom.two", "2.0+cpu", key=team))
    assert (site / "wm_sbom_one-1.0+cpu.dist-info" / SBOM_FILE).is_file()
    said: list[str] = []
    with StepLog(tmp_path / "smoke.log") as log:
        smoke = Smoke(stand_in_engine(tmp_path, site), "img", log=log, on_line=said.append)
        smoke.sboms(["wm-sbom-one==1.0+cpu", "wm-sbom-two==2.0+cpu"], every=True)
        smoke.sboms(["wm-sbom-one==1.0+cpu", "wm-not-here==1.0+cpu"], every=False)  # a runtime image's
    assert said == [
        "sboms: 2 wheel(s) built here carry sboms/wheelmill.cdx.json: wm-sbom-one==1.0+cpu wm-sbom-two==2.0+cpu",
        "sboms: 1 wheel(s) built here carry sboms/wheelmill.cdx.json: wm-sbom-one==1.0+cpu",
    ]


def test_a_wheel_installed_without_its_sbom_fails_the_tier_with_a_line_naming_it(
    tmp_path: Path, team: SigningKey
) -> None:
    site = tmp_path / "site"
    channel = tree_channel(tmp_path / "index", "cpu")
    installed(site, published_signed(channel, tmp_path / "w", "wm-one", "1.0", key=team))
    installed(site, make_wheel(tmp_path / "w", "wm-bare", "1.0"))  # no sboms/ in its .dist-info
    with StepLog(tmp_path / "smoke.log") as log:
        smoke = Smoke(stand_in_engine(tmp_path, site), "img", log=log, on_line=print)
        with pytest.raises(ImageError) as raised:
            smoke.sboms(["wm-one==1.0", "wm-bare==1.0"], every=True)
        with pytest.raises(ImageError, match=r"wm-gone==1\.0 \(installed: none\)"):
            smoke.sboms(["wm-gone==1.0"], every=True)  # an extras image must have installed each
    assert raised.value.one_line().startswith(
        "img: smoke a/sboms failed: sboms: missing: wm-bare==1.0 (no CycloneDX sboms/wheelmill.cdx.json in its "
        ".dist-info)"
    )


# -- the GPU stage ------------------------------------------------------------------------


@pytest.fixture
def gpu_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recipes directory with one recipe (no GPU check) for the CUDA cell; an empty index
    root; a PATH that holds only ``tmp_path/bin`` (no nvidia-smi, no uv)."""
    recipes = tmp_path / "recipes"
    (recipes / "src").mkdir(parents=True)
    matrix = (ROOT / "recipes" / "matrix.toml").read_text()
    (recipes / "matrix.toml").write_text(matrix.replace('requires = ["pytest>=8"]', "requires = []", 1))
    (recipes / "wm-good.toml").write_text(
        'name = "wm-good"\ncells = ["cuda130*-py311"]\n[source]\npath = "src"\n[checks]\nimports = ["wm_good"]\n'
    )
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv(doctor.CAPABILITY_VARIABLE, raising=False)
    return recipes


def publish_gpu_wheel(tmp_path: Path, key: SigningKey | None) -> Path:
    archs = json.dumps({"arch_list": "9.0", "cell": GPU_CELL, "family": "cuda"}).encode()
    channel = tree_channel(tmp_path / "index", "cu130")
    wheel, provenance = signed_wheel(tmp_path / "built", "wm-good", "1.0+cu130", key=key, tag=CUDA_TAG, gpu_archs=archs)
    publish(channel, wheel, provenance=provenance)
    return wheel


def gpu_stage(cli: CliRunner, recipes: Path) -> tuple[int, str, list[str], dict[str, object]]:
    """The stage on a declared H100 (no GPU tool here) over this interpreter, which has no torch."""
    done = cli(
        "--recipes", str(recipes), "test-gpu", "--cell", GPU_CELL, "--python", sys.executable, "--capability", "9.0"
    )
    assert "Traceback" not in done.out + done.err
    report = json.loads((recipes.parent / "wheels" / GPU_CELL / "gpu-report.json").read_text())
    return done.code, done.out, done.err.splitlines(), report


def test_the_gpu_stage_refuses_a_wheel_signed_by_another_key_before_installing_anything(
    cli: CliRunner, gpu_project: Path, tmp_path: Path, trusting: str, stranger: SigningKey
) -> None:
    wheel = publish_gpu_wheel(tmp_path, stranger)
    code, out, err, report = gpu_stage(cli, gpu_project)
    assert code == 26, err
    (line,) = err
    assert line.startswith(f"wheelmill: error: {wheel.name}: statement 1: ") and "; fix: " in line, line
    assert (report["status"], report["exit_code"], report["env"], report["torch"]) == ("stopped", 26, "not made", None)
    provenance = report["provenance"]
    assert isinstance(provenance, dict) and (provenance["verified"], provenance["keys"]) == (0, [trusting])
    assert provenance["failed"] == [line.removeprefix("wheelmill: error: ")]
    assert "env:" not in out and "installing" not in out
    assert not (tmp_path / "wheels" / GPU_CELL / "gpu-stage").exists()  # no env made, nothing fetched
    log = (tmp_path / "wheels" / GPU_CELL / "logs" / "gpu-stage.log").read_text()
    assert "import torch" not in log and sys.executable not in log, log  # nothing ran


def test_the_gpu_stage_goes_on_past_a_wheel_that_verifies(
    cli: CliRunner, gpu_project: Path, tmp_path: Path, trusting: str, team: SigningKey
) -> None:
    wheel = publish_gpu_wheel(tmp_path, team)
    code, out, err, report = gpu_stage(cli, gpu_project)
    assert f"provenance: 1 file(s) built here verified ({wheel.name})" in out
    assert report["provenance"] == {"verified": 1, "files": [wheel.name], "keys": [trusting], "failed": []}
    # on to the env's torch, which this interpreter lacks: the stage's own next error
    assert code == 8 and "import torch" in err[0], err


def test_the_gpu_stage_without_a_key_says_its_wheels_were_not_verified(
    cli: CliRunner, gpu_project: Path, tmp_path: Path
) -> None:
    publish_gpu_wheel(tmp_path, None)
    code, out, _err, report = gpu_stage(cli, gpu_project)
    assert NO_KEY_LINE in out and report["provenance"] == NOT_VERIFIED
    assert code == 8
