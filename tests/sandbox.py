"""A repository in a temporary directory where a build runs through its steps in seconds,
with no compiler, GPU toolkit, container or network: for driving the pipeline's error
boundary from the command line in unit tests.

What is real: the pipeline, every step up to the one a test breaks, uv (resolving, locking
and syncing envs offline, from a local index that wheelmill's own store writes), the
cell's Python, cuobjdump, the ELF reader. What stands in, and says so:

- torch: a wheel that carries only ``torch/version.py``, the file wheelmill reads to learn
  which torch it is (the env-checks never import it);
- the C++ compiler and the CUDA/ROCm toolkits: scripts that report a version, which is all
  the pre-checks ask of them before a build runs them;
- the build: a script that zips the files a test put in the recipe's ``payload/``.

``build`` runs a cell of the sandbox from the command line; ``assert_recorded`` checks that
a step failed the way the error boundary promises.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests.channels import pages_dir, tree_channel
from tests.conftest import CliResult, CliRunner
from tests.wheels import make_wheel
from wheelmill.building.context import Outcome, StepContext
from wheelmill.building.products import Repaired, Stamped
from wheelmill.building.steps import BY_KIND
from wheelmill.building.steps.checks_after import named_apart
from wheelmill.index.roots import publish
from wheelmill.machine.process import TRACEBACK_MARK
from wheelmill.planning.spec import RecipeSpec, StepKind

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
PY = PYTHON.replace(".", "")
# A second CPython, for a variant's second cell: pyenv has it on the machines the tests run on.
OTHER_PYTHON = "3.13" if PYTHON != "3.13" else "3.12"
ROOT = Path(__file__).resolve().parent.parent
TORCH = {
    "cpu": ("2.13.0", "cpu", None, None),
    "cuda130": ("2.14.1", "cu130", "13.0", None),
    "rocm62": ("2.5.1", "rocm6.2", None, "6.2.41134-stand-in"),
}

MATRIX = f"""schema = 1
pythons = ["{PYTHON}"]

[torch]
index = "http://127.0.0.1:9/whl/{{label}}"

[build-env]
requires = []

[test-env]
requires = []

[repair]
forbid = ["libcuda.so*"]

[repair.exclude]
all = ["libtorch.so"]

[checks]
max-wheel-size = "1MiB"

[variants.cpu]
family = "cpu"
label = "cpu"
torch = "2.13.0"
glibc = "manylinux_2_28"
pythons = ["{PYTHON}"]

[variants.cuda130]
family = "cuda"
toolkit = "13.0.2"
arch-list = "8.0"
label = "cu130"
torch = "2.14.1"
glibc = "manylinux_2_28"
pythons = ["{PYTHON}"]

[variants.rocm62]
family = "rocm"
toolkit = "6.2.4"
arch-list = "gfx90a"
label = "rocm6.2"
torch = "2.5.1"
glibc = "manylinux_2_28"
pythons = ["{PYTHON}"]
"""

# Zips payload/ into dist/<name>, or writes GARBAGE there: the recipe's whole build. The
# payload's files carry a ".payload" suffix: fetch never copies a *.so from a source tree.
BUILD = """import sys, zipfile, pathlib
dist, name = pathlib.Path(sys.argv[1]), sys.argv[2]
payload = pathlib.Path("payload")
if (payload / "GARBAGE.payload").is_file():
    (dist / name).write_bytes((payload / "GARBAGE.payload").read_bytes())
else:
    with zipfile.ZipFile(dist / name, "w") as zf:
        for path in sorted(p for p in payload.rglob("*.payload") if p.is_file()):
            zf.write(path, path.relative_to(payload).as_posix().removesuffix(".payload"))
"""


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return path


class Sandbox:
    def __init__(
        self, root: Path, *, version_py: Mapping[str, str] | None = None, pythons: Sequence[str] = (PYTHON,)
    ) -> None:
        self.root = root
        self.recipes = root / "recipes"
        self.output = root / "wheels"
        self.recipes.mkdir(parents=True)
        shutil.copytree(ROOT / "containers", root / "containers")
        listed = ", ".join(f'"{python}"' for python in pythons)  # every variant's
        (self.recipes / "matrix.toml").write_text(MATRIX.replace(f'pythons = ["{PYTHON}"]', f"pythons = [{listed}]"))
        self.index = self._torch_index(version_py or {})
        self.bin = root / "bin"
        script(self.bin / "c++", 'echo "c++ (stand-in) 12.2.0"\n')
        script(root / "cuda" / "bin" / "nvcc", 'echo "Cuda compilation tools, release 13.0, V13.0.88 (stand-in)"\n')
        script(root / "rocm" / "bin" / "hipcc", 'echo "HIP version: 6.2.41134-stand-in"\n')

    def _torch_index(self, version_py: Mapping[str, str]) -> str:
        channel = tree_channel(self.root / "stand-in-index", "torch")
        for variant, (version, label, cuda, hip) in TORCH.items():
            text = version_py.get(variant, f"__version__ = '{version}+{label}'\ncuda = {cuda!r}\nhip = {hip!r}\n")
            files = {"torch/__init__.py": b"", "torch/version.py": text.encode()}
            publish(
                channel,
                make_wheel(
                    self.root / "stand-in-wheels", "torch", f"{version}+{label}", files=files, tag="py3-none-any"
                ),
            )
        return pages_dir(channel).as_uri() + "/"

    def recipe(self, name: str, payload: Mapping[str, bytes], *, wheel: str, cells: str = "*") -> None:
        """A recipe whose build zips ``payload`` into a wheel file called ``wheel``."""
        source = self.root / "src" / name
        (source / "build.py").parent.mkdir(parents=True, exist_ok=True)
        (source / "build.py").write_text(BUILD)
        for relative, data in payload.items():
            target = source / "payload" / f"{relative}.payload"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        (self.recipes / f"{name}.toml").write_text(
            f'name = "{name}"\ncells = ["{cells}"]\n\n[source]\npath = "../src/{name}"\n\n'
            f'[build]\ncommand = ["{{python}}", "build.py", "{{dist}}", "{wheel}"]\n'
        )

    def environ(self) -> dict[str, str]:
        """The variables a build in the sandbox runs with."""
        return {
            "WHEELMILL_OUTPUT": str(self.output),
            "WHEELMILL_INDEX_URL": self.index,
            "WHEELMILL_EXTRA_INDEX_URL": "",
            "WHEELMILL_FIND_LINKS": "",
            "WHEELMILL_TORCH_INDEX": "",
            "WHEELMILL_RETRIES": "1",
            "WHEELMILL_DEBIAN_MIRROR": "http://127.0.0.1:9/debian",
            "CXX": str(self.bin / "c++"),
            "CUDA_HOME": str(self.root / "cuda"),
            "ROCM_PATH": str(self.root / "rocm"),
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def cell(self, variant: str, python: str = PYTHON) -> str:
        return f"{variant}-py{python.replace('.', '')}"

    def logs(self, variant: str, python: str = PYTHON) -> dict[str, str]:
        """Each step log of the cell, by file name."""
        return {
            p.name: p.read_text() for p in sorted((self.output / self.cell(variant, python) / "logs").glob("*.log"))
        }


TAG = f"cp{PY}-cp{PY}-linux_x86_64"


def dist_info(name: str, version: str, *, metadata_version: str | None = None) -> dict[str, bytes]:
    directory = f"{name}-{version}.dist-info"
    return {
        f"{directory}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {metadata_version or version}\n".encode()
        ),
        f"{directory}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {TAG}\n".encode(),
    }


def build(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, variant: str, *, engine: str = "none"
) -> CliResult:
    for key, value in sandbox.environ().items():
        monkeypatch.setenv(key, value)
    return cli("--recipes", str(sandbox.recipes), "build", "--cell", sandbox.cell(variant), "--engine", engine)


def repair_as_auditwheel_tags(monkeypatch: pytest.MonkeyPatch, platform: str = "manylinux_2_17") -> None:
    """The repair step as auditwheel ends, the wheel tagged ``platform`` (as for one with no
    library): the sandbox's build env has no auditwheel, and a build past repair needs one."""

    def repair(ctx: StepContext, spec: RecipeSpec) -> Outcome:
        stamped = ctx.done.get(Stamped, spec.name).wheel
        out = ctx.run.layout.build / spec.name / "repaired" / stamped.name.replace("linux_", f"{platform}_")
        if out.parent.exists():
            shutil.rmtree(out.parent)
        out.parent.mkdir(parents=True)
        shutil.copyfile(stamped, out)
        wheel, named = named_apart(ctx, spec, out)  # as the real step does after auditwheel
        return Outcome(checks=named, made=(Repaired(wheel=wheel),))

    monkeypatch.setitem(BY_KIND, StepKind.REPAIR, dataclasses.replace(BY_KIND[StepKind.REPAIR], run=repair))  # type: ignore[arg-type]


def assert_recorded(result: CliResult, sandbox: Sandbox, variant: str, *, step: str, code: int, says: str) -> str:
    """One line on stderr, the error naming the step, and the step's code; no traceback
    shown; the step's record says the same, and its log holds the traceback. Returns the log."""
    assert result.code == code, (result.out + result.err)[-3000:]
    (line,) = result.err.splitlines()
    assert line.startswith("wheelmill: error: ") and step in line and says in line and "; fix: " in line, line
    assert "Traceback" not in result.err + result.out
    report = json.loads((sandbox.output / sandbox.cell(variant) / "report.json").read_text())
    (record,) = [s for s in report["steps"] if s["status"] == "failed"]
    assert (record["recipe"] or "") in step and record["step"] in step and record["exit_code"] == code
    log = Path(record["log"]).read_text()
    assert f"{TRACEBACK_MARK}Traceback (most recent call last):" in log
    return log
