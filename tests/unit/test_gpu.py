"""``wheelmill test-gpu`` where nvidia-smi is there but its driver does not answer: with a
kernel module and a library of different versions it prints "Failed to initialize NVML:
Driver/library version mismatch", and some versions exit 0 with it. The stage must say that
nvidia-smi failed and what it printed, not take the words for a GPU; exit 22 (no GPU visible:
no kernel can run), with the driver's fix, one line, nothing made but the report and its log.
A stand-in nvidia-smi is the only program on PATH; the stage stops before any env is made."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.channels import tree_channel
from tests.conftest import CliRunner
from tests.sandbox import script
from tests.wheels import make_wheel
from wheelmill.errors import NoGpuError
from wheelmill.images import doctor
from wheelmill.index.roots import publish

ROOT = Path(__file__).resolve().parent.parent.parent
CELL = "cuda130-py311"
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
DRIVER_FIX = (
    "fix: the GPU driver does not answer: reboot, or reload its kernel module (rmmod and modprobe nvidia) so that it "
    "matches the driver's library, then check that nvidia-smi lists the GPUs"
)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recipes directory with one recipe (no GPU check), its wheel published into the
    cell's channel, and a PATH that holds only ``tmp_path/bin``."""
    recipes = tmp_path / "recipes"
    (recipes / "src").mkdir(parents=True)
    matrix = (ROOT / "recipes" / "matrix.toml").read_text()
    (recipes / "matrix.toml").write_text(matrix.replace('requires = ["pytest>=8"]', "requires = []", 1))
    (recipes / "wm-good.toml").write_text(
        'name = "wm-good"\ncells = ["cuda130*-py311"]\n[source]\npath = "src"\n[checks]\nimports = ["wm_good"]\n'
    )
    archs = json.dumps({"arch_list": "9.0", "cell": CELL, "family": "cuda"}).encode()
    wheel = make_wheel(
        tmp_path / "built", "wm-good", "1.0+cu130", tag="cp311-cp311-manylinux_2_28_x86_64", gpu_archs=archs
    )
    publish(tree_channel(tmp_path / "index", "cu130"), wheel)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("WHEELMILL_INDEX_ROOT", str(tmp_path / "index"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv(doctor.CAPABILITY_VARIABLE, raising=False)
    return recipes


def stage(cli: CliRunner, project: Path) -> tuple[int, list[str], dict[str, object]]:
    done = cli("--recipes", str(project), "test-gpu", "--cell", CELL, "--python", sys.executable)
    assert "Traceback" not in done.out + done.err
    report = json.loads((project.parent / "wheels" / CELL / "gpu-report.json").read_text())
    return done.code, done.err.splitlines(), report


@pytest.mark.parametrize(
    ("nvidia_smi", "said"),
    [
        (f'echo "{MISMATCH}"\necho "NVML library version: 580.95"\n', "exit 0"),  # exits 0: only its words tell
        (f'echo "{MISMATCH}" >&2\nexit 18\n', "exit 18"),
    ],
)
def test_an_nvidia_smi_that_cannot_reach_its_driver_is_named_with_what_it_printed(
    cli: CliRunner, project: Path, tmp_path: Path, nvidia_smi: str, said: str
) -> None:
    script(tmp_path / "bin" / "nvidia-smi", nvidia_smi)
    code, err, report = stage(cli, project)
    assert code == NoGpuError.exit_code == 22
    printed = f"{MISMATCH} / NVML library version: 580.95" if said == "exit 0" else MISMATCH
    assert err == [
        (
            f"wheelmill: error: test-gpu: {CELL}: no GPU visible (nvidia-smi failed ({said}): {printed}; "
            f"rocminfo not found); {DRIVER_FIX}"
        )
    ]
    assert "compute capability" not in err[0]
    assert (report["status"], report["gpus"], report["wheels"]) == ("no-gpu", [], [])
    made = sorted(str(p.relative_to(tmp_path / "wheels")) for p in (tmp_path / "wheels").rglob("*"))
    assert made == [CELL, f"{CELL}/gpu-report.json", f"{CELL}/logs", f"{CELL}/logs/gpu-stage.log"], made


def test_no_nvidia_smi_at_all_keeps_the_fix_of_a_machine_without_a_gpu(cli: CliRunner, project: Path) -> None:
    code, err, _report = stage(cli, project)
    assert code == 22
    assert err == [
        (
            f"wheelmill: error: test-gpu: {CELL}: no GPU visible (nvidia-smi not found; rocminfo not found); "
            "fix: run the stage on a machine with a GPU its driver and torch can use (nvidia-smi lists it)"
        )
    ]


def test_a_gpu_listed_beside_a_complaint_of_another_is_still_found() -> None:
    """One GPU fallen off the bus: nvidia-smi complains of it and lists the rest."""
    gpus, notes = doctor.parse_nvidia_smi(
        "Unable to determine the device handle for GPU0000:41:00.0: Unknown Error\n0, NVIDIA H100, 9.0\n"
    )
    assert [g.label for g in gpus] == ["GPU 0 (NVIDIA H100, 9.0)"]
    assert notes == ["nvidia-smi: Unable to determine the device handle for GPU0000:41:00.0: Unknown Error"]
    assert not any(map(doctor.tool_failed, notes))
