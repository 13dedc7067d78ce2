"""What wheelmill asks of a level-2 env: programs run inside it (passed with ``-c`` so they
work wherever the env is, this machine or a container), each printing one marked JSON
line, and what torch says of itself in its installed files."""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wheelmill.context import TorchInfo
from wheelmill.errors import EnvError
from wheelmill.runner import Runner, StepLog

MARK = "WHEELMILL_PROBE "

# Imports the wheel's modules and looks up its torch operators. ``ns::op@Key`` also asks
# the dispatcher whether a kernel is registered for that key (CUDA kernels can be checked
# on a machine without a GPU this way).
IMPORTS = r"""
import importlib, json, sys, traceback
spec = json.loads(sys.argv[1])
results = []
import torch
for module in spec["imports"]:
    try:
        importlib.import_module(module)
        results.append({"name": "import " + module, "ok": True, "detail": "imported"})
    except Exception as exc:
        results.append({"name": "import " + module, "ok": False, "detail": "%s: %s" % (type(exc).__name__, exc)})
for op in spec["ops"]:
    qualified, _, key = op.partition("@")
    namespace, _, name = qualified.partition("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), name.split(".")[0])
        schemas = [str(s) for s in torch._C._jit_get_schemas_for_operator(namespace + "::" + name.split(".")[0])]
        detail = "registered: " + "; ".join(schemas)
        ok = True
        if key:
            ok = torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)
            detail = ("a %s kernel is registered" % key) if ok else ("no %s kernel is registered" % key)
        results.append({"name": "torch.ops " + op, "ok": ok, "detail": detail})
    except Exception as exc:
        results.append({"name": "torch.ops " + op, "ok": False, "detail": "%s: %s" % (type(exc).__name__, exc)})
print("WHEELMILL_PROBE " + json.dumps(results))
"""


def parse(output: str) -> Any:
    for line in reversed(output.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise ValueError("the probe printed no result")


def run_probe(runner: Runner, python: Path, source: str, args: Sequence[str], *, env: dict[str, str], log: StepLog, cwd: Path | None = None) -> Any:
    result = runner.run([str(python), "-c", source, *args], env=env, log=log, cwd=cwd, keep_output=True)
    return parse(result.output)


def read_torch(env_root: Path) -> TorchInfo:
    """torch's own answer to "which build are you?", read from its installed files.

    ``torch/version.py`` is the module ``torch.version`` (``__version__``, ``cuda``, ``hip``),
    written when torch was built; reading it costs milliseconds where ``import torch`` costs
    seconds. The C++ ABI shows in libc10's symbol names (``std::__cxx11::basic_string``).
    """
    found = sorted(env_root.glob("lib/python3*/site-packages/torch/version.py"))
    if not found:
        raise EnvError(f"{env_root}: torch is not installed in the env", fix="check the lock: it must contain torch")
    package = found[0].parent
    values = _assignments(found[0])
    dist = sorted(package.parent.glob("torch-*.dist-info/METADATA"))
    dist_version = next((line.split(":", 1)[1].strip() for line in dist[0].read_text().splitlines() if line.startswith("Version:")), "") if dist else ""
    return TorchInfo(
        version=str(values.get("__version__", "")),
        dist_version=dist_version or str(values.get("__version__", "")),
        cuda=_optional(values.get("cuda")),
        hip=_optional(values.get("hip")),
        cxx11_abi=_uses_cxx11_abi(package / "lib" / "libc10.so"),
        lib_dir=package / "lib",
        site_packages=package.parent,
    )


def _assignments(path: Path) -> dict[str, object]:
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(node, ast.AnnAssign) else None
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    return values


def _optional(value: object) -> str | None:
    return str(value) if value is not None else None


def _uses_cxx11_abi(libc10: Path) -> bool:
    try:
        return b"St7__cxx11" in libc10.read_bytes()
    except OSError:
        return False
