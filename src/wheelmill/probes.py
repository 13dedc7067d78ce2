"""Small Python programs wheelmill runs inside a level-2 env, passed with ``-c`` so they
work wherever the env is (this machine or a container). Each prints one marked JSON line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wheelmill.context import TorchInfo
from wheelmill.runner import Runner, StepLog

MARK = "WHEELMILL_PROBE "

TORCH = r"""
import importlib.metadata, json, os, site, sys
import torch
print("WHEELMILL_PROBE " + json.dumps({
    "version": torch.__version__,
    "dist_version": importlib.metadata.version("torch"),
    "cuda": torch.version.cuda,
    "hip": getattr(torch.version, "hip", None),
    "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    "lib_dir": os.path.join(os.path.dirname(torch.__file__), "lib"),
    "site_packages": os.path.dirname(os.path.dirname(torch.__file__)),
}))
"""

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


def torch_info(data: dict[str, Any]) -> TorchInfo:
    return TorchInfo(
        version=data["version"],
        dist_version=data["dist_version"],
        cuda=data["cuda"],
        hip=data["hip"],
        cxx11_abi=data["cxx11_abi"],
        lib_dir=Path(data["lib_dir"]),
        site_packages=Path(data["site_packages"]),
    )
