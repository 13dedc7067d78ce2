"""Smoke tests of an image, in tiers, each a container of the image that is removed after:

a. imports: torch (its label the variant's) and every extension, ``pip check`` clean, gloo
   available, the constraint holding (``pip install torch==<other>`` refused), and
   ``wheelmill-doctor`` running on the image's Python (no GPU here: it lists, never fails),
   and every wheel built here that the image installed carrying its SBOM (PEP 770: pip keeps
   the ``.dist-info/sboms/`` it was built with);
b. ``torchrun --standalone --nnodes=1 --nproc-per-node=2``: an all-reduce over gloo;
c. PyTorchJob as Kubeflow's training operator starts it: two containers on one engine
   network, a master and a worker, each given the operator's variables (once the v1
   set, MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK and PET_NNODES/PET_NPROC_PER_NODE/
   PET_NODE_RANK; once Trainer v2's PET_* with PET_MASTER_ADDR/PET_MASTER_PORT), each
   running a bare ``torchrun smoke.py``;
d. on a GPU machine whose engine gives containers its GPUs (docker's NVIDIA runtime, or a
   CDI spec): a CUDA image's one-GPU all-reduce over NCCL under ``torchrun``. Anywhere
   else it is reported as not run, and why: it never passes where it did not run.

A devel image also compiles a tiny extension inside itself and imports it; a runtime
image must hold no compiler. Every tier runs with no network but what it needs.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from packaging.version import Version

from wheelmill.errors import ImageError
from wheelmill.machine.engine import Engine, Mount, left_behind
from wheelmill.machine.process import StepLog, base_environment

SMOKE = Path("/opt/wheelmill-smoke")
TIMEOUT = 600.0
ALLREDUCE = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
expected = world * (world + 1) / 2
assert value.item() == expected, (value.item(), expected)
print(f"all-reduce over gloo: rank {rank} of {world}: sum {value.item():g} (expected {expected:g})", flush=True)
dist.destroy_process_group()
"""
NCCL = """import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
value = torch.tensor([float(rank + 1)], device="cuda")
dist.all_reduce(value)
expected = world * (world + 1) / 2
assert value.item() == expected, (value.item(), expected)
print(f"all-reduce over nccl on {torch.cuda.get_device_name()}: rank {rank} of {world}: sum {value.item():g} "
      f"(expected {expected:g}), NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}", flush=True)
dist.destroy_process_group()
"""
IMPORTS = """import importlib, json, sys, torch, torch.distributed as dist
wanted, modules = sys.argv[1], sys.argv[2:]
assert torch.__version__ == wanted, (torch.__version__, wanted)
assert dist.is_gloo_available(), "gloo"
for name in modules:
    importlib.import_module(name)
print(f"imports: torch {torch.__version__}, gloo available, {' '.join(modules) or 'no extensions'}", flush=True)
"""
# Each wheel built here (name==version) that the image installed, its SBOM in its installed
# .dist-info; with --every, each must be installed. Python 3.9's importlib.metadata (no
# normalized lookup), hence the names compared as PEP 503 normalizes them.
SBOMS = """import importlib.metadata as m, json, re, sys
every, wanted = sys.argv[1] == "--every", sys.argv[2:]
def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()
installed = {norm(d.metadata["Name"] or ""): d for d in m.distributions()}
found, wrong = [], []
for spec in wanted:
    name, _, version = spec.partition("==")
    dist = installed.get(norm(name))
    if dist is None or dist.version != version:
        if every:
            wrong.append(f"{spec} (installed: {dist.version if dist else 'none'})")
        continue
    text = dist.read_text("sboms/wheelmill.cdx.json")
    try:
        ok = text is not None and json.loads(text).get("bomFormat") == "CycloneDX"
    except ValueError:
        ok = False
    (found if ok else wrong).append(spec if ok else f"{spec} (no CycloneDX sboms/wheelmill.cdx.json in its .dist-info)")
if wrong:
    print("sboms: missing: " + "; ".join(wrong), flush=True)
    sys.exit(1)
print(f"sboms: {len(found)} wheel(s) built here carry sboms/wheelmill.cdx.json: {' '.join(found) or 'none installed'}")
"""
EXTENSION = {
    "setup.py": """from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
setup(name="wm-tiny-ext", version="0.1", ext_modules=[CppExtension("wm_tiny_ext", ["tiny.cpp"])], \
cmdclass={"build_ext": BuildExtension})
""",
    "tiny.cpp": """#include <torch/extension.h>
torch::Tensor twice(torch::Tensor x) { return x * 2; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
""",
}
NO_COMPILER = (
    "for c in cc gcc g++ c++ clang; do if command -v $c; then exit 1; fi; done; "
    "echo 'no compiler: cc, gcc, g++, c++, clang absent'"
)


class Smoke:
    """The tiers, run against one image with one engine; every line they print is kept."""

    def __init__(
        self,
        engine: Engine,
        image: str,
        *,
        log: StepLog,
        on_line: Callable[[str], None],
        always: Sequence[Mount] = (),
    ) -> None:
        """``always``: mounted into every container of the image (an emulated aarch64
        image's stand-in of the CPU's sysfs)."""
        self.engine, self.image, self.log, self.on_line = engine, image, log, on_line
        self.always = tuple(always)
        self.said: list[str] = []

    def _run(
        self,
        what: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        expect_failure: bool = False,
        gpus: bool = False,
    ) -> str:
        """Run ``argv`` in a container of the image with the smoke files mounted; its output."""
        with tempfile.TemporaryDirectory(prefix="wheelmill-smoke-") as tmp:
            files = Path(tmp)
            _write_files(files)
            command = self.engine.run(
                image=self.image,
                argv=argv,
                env_keys=sorted(env or {}),
                mounts=[Mount(source=files, target=SMOKE), *mounts, *self.always],
                gpus=gpus,
            )
            done = subprocess.run(
                command,
                env={**base_environment([]), **(env or {})},
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
            )
        output = done.stdout + done.stderr
        self.log.note(f"{what}: exit {done.returncode}\n{output}")
        if (done.returncode == 0) == expect_failure:
            tail = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
            raise ImageError(f"{self.image}: smoke {what} failed: {tail[0][:200]}", fix=f"read {self.log.path}")
        return output

    def say(self, line: str) -> None:
        self.said.append(line)
        self.on_line(line)

    def imports(self, torch: str, modules: Sequence[str]) -> None:
        out = self._run("a/imports", ["python", str(SMOKE / "imports.py"), torch, *modules])
        self.say(_line(out, "imports:"))
        self._run("a/pip-check", ["pip", "check"])
        self.say("pip check: no broken requirements")
        other = _other_version(torch)
        # --no-index: the refusal is the constraint's, decided from what the image holds; an
        # index asked first is unreachable from the smoke's container, and pip's five retries
        # of it cost each image 8 s of waiting.
        argv = ["pip", "install", "--no-index", f"torch=={other}"]
        refused = self._run("a/constraint", argv, expect_failure=True)
        if "(constraint) torch==" not in refused:
            raise ImageError(
                f"{self.image}: pip install torch=={other} failed, but not because of the constraint",
                fix=f"read {self.log.path}",
            )
        self.say(f"constraint: pip install torch=={other} refused by /etc/pip/constraint.txt (torch=={torch})")
        self.say("wheelmill-doctor: " + _line(self._run("a/doctor", ["wheelmill-doctor"]), "summary:"))

    def sboms(self, built: Sequence[str], *, every: bool) -> None:
        """Each wheel built here (``name==version``) that the image installed has its SBOM in
        its installed ``.dist-info`` (``every``: each must be installed, as in an extras
        image); one without fails the tier with a line naming it."""
        out = self._run("a/sboms", ["python", str(SMOKE / "sboms.py"), "--every" if every else "--installed", *built])
        self.say(_line(out, "sboms:"))

    def standalone(self) -> None:
        argv = ["torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=2", str(SMOKE / "allreduce.py")]
        out = self._run("b/torchrun-standalone", argv)
        for line in _reduced(out, ranks=2, what=f"{self.image}: smoke b/torchrun-standalone", log=self.log):
            self.say(f"torchrun --standalone, 2 processes: {line}")

    def pytorchjob(self, *, trainer_v2: bool) -> None:
        """A master and a worker container on one engine network, started as the training
        operator starts them, each running a bare ``torchrun smoke.py``."""
        network = f"wheelmill-smoke-{os.getpid()}"
        subnet, master_ip, worker_ip = "10.254.77.0/24", "10.254.77.2", "10.254.77.3"
        what = "c/pytorchjob-" + ("trainer-v2" if trainer_v2 else "v1")
        # The subnet is fixed: a killed run's network holds it until it is removed.
        mine = [
            n
            for n in subprocess.run(self.engine.networks(), capture_output=True, text=True, check=False).stdout.split()
            if n.startswith("wheelmill-smoke-")
        ]
        for stale in [*left_behind(mine), network]:
            subprocess.run(self.engine.network_remove(stale), capture_output=True, check=False)
        created = subprocess.run(
            self.engine.network_create(network, subnet), capture_output=True, text=True, check=False
        )
        if created.returncode != 0:
            raise ImageError(
                f"smoke {what}: cannot create the engine network {network}: {created.stderr.strip()[-200:]}",
                fix="check the engine's networking",
            )
        try:
            with tempfile.TemporaryDirectory(prefix="wheelmill-smoke-") as tmp:
                _write_files(Path(tmp))
                mount = Mount(source=Path(tmp), target=SMOKE)
                procs = [
                    self._node(rank, network, ip, master_ip, mount, trainer_v2=trainer_v2)
                    for rank, ip in ((0, master_ip), (1, worker_ip))
                ]
                outputs = [_wait(proc) for proc in procs]
        finally:
            subprocess.run(self.engine.network_remove(network), capture_output=True, check=False)
        for rank, (code, out) in enumerate(outputs):
            self.log.note(f"{what} rank {rank}: exit {code}\n{out}")
            if code != 0:
                tail = [line for line in out.splitlines() if line.strip()][-1:] or ["no output"]
                raise ImageError(
                    f"{self.image}: smoke {what} failed on the {'master' if rank == 0 else 'worker'}: {tail[0][:200]}",
                    fix=f"read {self.log.path}",
                )
            (line,) = _reduced(out, ranks=1, what=f"{self.image}: smoke {what}", log=self.log)
            self.say(
                f"PyTorchJob ({'Trainer v2 PET_*' if trainer_v2 else 'v1 MASTER_*/PET_*'}), "
                f"{'master' if rank == 0 else 'worker'}: {line}"
            )

    def _node(
        self, rank: int, network: str, ip: str, master: str, mount: Mount, *, trainer_v2: bool
    ) -> subprocess.Popen[str]:
        env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(rank)}
        if trainer_v2:
            env |= {"PET_MASTER_ADDR": master, "PET_MASTER_PORT": "23456"}
        else:
            env |= {"MASTER_ADDR": master, "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": str(rank)}
        argv = self.engine.run(
            image=self.image,
            argv=["torchrun", str(SMOKE / "allreduce.py")],
            network=network,
            ip=ip,
            env_keys=sorted(env),
            mounts=[mount, *self.always],
        )
        return subprocess.Popen(
            argv, env={**base_environment([]), **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def nccl(self, *, cuda: bool, gpus: Sequence[str], why_none: str) -> None:
        """Tier d: a one-GPU all-reduce over NCCL in the image, on a GPU the engine passes in;
        where it cannot run, one line says so and why."""
        if not cuda:
            why_not: str | None = "a CPU image"
        elif not gpus:
            why_not = f"no GPU visible ({why_none})"
        else:
            why_not = self.engine.gpu_access()
        if why_not is not None:
            self.say(f"tier d (NCCL all-reduce on a GPU): not run: {why_not}")
            return
        argv = ["torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=1", str(SMOKE / "nccl.py")]
        out = self._run("d/nccl", argv, gpus=True)
        self.say(f"tier d on {', '.join(gpus)}: " + _line(out, "all-reduce over nccl"))

    def compiles(self) -> None:
        """The devel image builds an extension against its own torch, offline, and runs it."""
        check = (
            "import torch, wm_tiny_ext; "
            "print('extension built in the image: twice([1, 2]) =', wm_tiny_ext.twice(torch.tensor([1, 2])).tolist())"
        )
        script = (
            f"cp -r {SMOKE}/ext /tmp/ext && pip install --quiet --no-build-isolation --no-deps /tmp/ext && "
            f'cd / && python -c "{check}"'
        )
        out = self._run("devel/compile", ["sh", "-c", script])
        self.say(_line(out, "extension built"))

    def no_compiler(self) -> None:
        out = self._run("runtime/no-compiler", ["sh", "-c", NO_COMPILER])
        self.say(_line(out, "no compiler"))


def _write_files(directory: Path) -> None:
    (directory / "allreduce.py").write_text(ALLREDUCE, encoding="utf-8")
    (directory / "imports.py").write_text(IMPORTS, encoding="utf-8")
    (directory / "nccl.py").write_text(NCCL, encoding="utf-8")
    (directory / "sboms.py").write_text(SBOMS, encoding="utf-8")
    (directory / "ext").mkdir()
    for name, text in EXTENSION.items():
        (directory / "ext" / name).write_text(text, encoding="utf-8")
    for path in directory.rglob("*"):  # readable by whatever user the image runs as
        path.chmod(0o755 if path.is_dir() else 0o644)
    directory.chmod(0o755)


def _wait(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return -9, out + "\n(timed out)"
    return proc.returncode, out


_REDUCED = re.compile(r"all-reduce over gloo: rank (\d+) of (\d+): sum (\S+) \(expected (\S+)\)")


def _reduced(output: str, *, ranks: int, what: str, log: StepLog) -> list[str]:
    """Each rank's all-reduce report, found wherever it is in the output (processes that
    print at once may share a line); every one must be there, with the expected sum."""
    found = {int(m.group(1)): m for m in _REDUCED.finditer(output)}
    if len(found) != ranks or any(m.group(3) != m.group(4) for m in found.values()):
        raise ImageError(
            f"{what}: expected {ranks} all-reduce report(s) with the right sum, got {len(found)}",
            fix=f"read {log.path}",
        )
    return [
        f"all-reduce over gloo: rank {m.group(1)} of {m.group(2)}: sum {m.group(3)} (expected {m.group(4)})"
        for _, m in sorted(found.items())
    ]


def _line(output: str, start: str) -> str:
    return next(
        (line.strip() for line in output.splitlines() if line.strip().startswith(start)),
        output.strip().splitlines()[-1] if output.strip() else "",
    )


def _other_version(torch: str) -> str:
    """A torch version that is not the image's.

    >>> _other_version("2.13.0+cpu")
    '2.12.0'
    """
    release = Version(torch).release
    return f"{release[0]}.{max(release[1] - 1, 0)}.0"
